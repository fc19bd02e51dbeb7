"""Pages: the index redirect, the new chat (a landing that creates the chat with its first message), the chat
page, older runs, and the trash."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sessions_core.branches import SessionBusyError
from sessions_core.models import ChatSession, Run
from sessions_core.search import parse_id

from .. import memories, new_chats, rendering
from ..assistants import ASSISTANTS, DEFAULT_ASSISTANT, get_assistant
from ..broadcast import broadcast_to_user
from ..forms import FirstMessageForm
from ..sidebar import sidebar_page, trashed_sessions
from .common import HtmxHttpRequest, just_deleted, owned_session, render_chat_page


@login_required
@require_GET
def index(request: HtmxHttpRequest) -> HttpResponse:
    newest = ChatSession.objects.for_user(request.user).alive().for_sidebar().first()
    # After the open chat went to the trash: its Undo toast and unsent draft come along (just_deleted).
    deleted = request.GET.get("deleted", "")[:64]
    target = reverse("chat:session", args=[newest.session_id]) if newest else reverse("chat:new")
    return redirect(target + (f"?{urlencode({'deleted': deleted})}" if deleted else ""))


def _last_used_assistant(user) -> str:
    last = (ChatSession.objects.for_user(user).exclude(component_id="").order_by("-created_at", "-id")
            .values_list("component_id", flat=True).first())
    return last if last in ASSISTANTS else DEFAULT_ASSISTANT


@login_required
@require_http_methods(["GET", "POST"])
def new_session(request: HtmxHttpRequest) -> HttpResponse:
    """A new chat: the chat page with nothing stored yet, the assistant picked in its header. Nothing is
    created until the first message is sent: over the page's socket (chatapp/consumers.py), or as a POST
    of `assistant` and `text` when the page has no socket; a refused message (empty, too long, over a rate
    limit) comes back in the composer with the reason."""
    form = FirstMessageForm(request.POST if request.method == "POST" else None,
                            initial={"assistant": _last_used_assistant(request.user)})
    status, error = 200, ""
    if request.method == "POST":
        if not form.is_valid():
            status, error = 400, next(iter(form.errors.values()))[0]
        elif refused := new_chats.refusal(request.user):
            status, error = 429, refused[0]
        else:
            session, _ = new_chats.start_chat(request.user, form.cleaned_data["assistant"], form.cleaned_data["text"])
            broadcast_to_user(request.user.pk, rendering.render_session_item_to_top(session))
            return redirect("chat:session", session.session_id)
    picked = form["assistant"].value()
    response = render(request, "chatapp/new_session.html", {
        "page": sidebar_page(request.user),
        "assistants": ASSISTANTS.values(),
        "picked": ASSISTANTS.get(picked) or ASSISTANTS[DEFAULT_ASSISTANT],
        "text": request.POST.get("text", ""),
        "error": error,
        "deleted": just_deleted(request),
        "max_chars": settings.CHAT_MAX_MESSAGE_CHARS,
    }, status=status)
    if status == 429:
        response["Retry-After"] = str(refused[1])
    return response


@login_required
@require_GET
def session_page(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """The chat; `?run=<run id>` (a search hit) on another version of the chat offers to show that version."""
    session = owned_session(request, session_id)
    other_version = _top_level_run(session, request.GET.get("run", ""))
    if other_version is not None and not other_version.abandoned:
        other_version = None  # on the version shown: the page scrolls to it
    return render_chat_page(request, session, other_version=other_version)


@login_required
@require_POST
def session_version(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Show the version of the chat that holds run `run_id` (a reply, or a step or member run inside one): that
    branch becomes the session's current one, and its state with it."""
    session = owned_session(request, session_id)
    run = _top_level_run(session, request.POST.get("run_id", ""))
    if run is None or session.deleted_at:
        raise Http404("No such reply in this chat.")
    if run.abandoned:
        try:
            get_assistant(session.component_id).set_current_branch(run.run_id, session_id=session.session_id,
                                                                  user_id=request.user)
        except (KeyError, SessionBusyError):  # a reply in flight: the chat stays on its version
            pass
    return redirect(reverse("chat:session", args=[session.session_id]) + f"#run-{run.run_id}")


def _top_level_run(session: ChatSession, run_id: str) -> Run | None:
    """The session's top-level run holding run `run_id` (itself, or the reply a step or member run is part of)."""
    if not run_id:
        return None
    run = Run.objects.filter(session=session, run_id=run_id[:64]).select_related("parent_run__parent_run").first()
    while run is not None and run.parent_run_id is not None:
        run = run.parent_run
    return run


@login_required
@require_GET
def transcript_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Older runs (before run pk `before`), with their own "Load earlier" link when there are more."""
    session = owned_session(request, session_id)
    before = parse_id(request.GET.get("before", ""))
    if before is None:
        return HttpResponseBadRequest("Missing or bad 'before': a run's number.")
    runs = rendering.transcript_runs(session, before=before)
    memories.attach(runs, session.owner_id)
    context = {"session": session, "runs": runs, "run_views": [rendering.run_view(run) for run in runs],
               "read_only": session.deleted_at is not None}
    template = "chatapp/_transcript_runs.html" if request.htmx else "chatapp/transcript_earlier.html"
    return render(request, template, context)


@login_required
@require_GET
def trash(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "chatapp/trash.html", {"sessions": trashed_sessions(request.user)})
