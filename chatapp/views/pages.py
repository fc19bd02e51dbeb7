"""Pages: the index redirect, starting a session, the chat page, older runs, and the trash."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods

from sessions_core.branches import SessionBusyError
from sessions_core.models import ChatSession, Run

from .. import rendering
from ..assistants import ASSISTANTS, DEFAULT_ASSISTANT, get_assistant
from ..broadcast import broadcast_to_user
from ..forms import NewSessionForm
from ..ratelimits import NEW_CHATS, by_user, limit_posts
from ..sidebar import trashed_sessions
from .common import HtmxHttpRequest, owned_session, render_chat_page


@login_required
@require_GET
def index(request: HtmxHttpRequest) -> HttpResponse:
    newest = ChatSession.objects.for_user(request.user).alive().for_sidebar().first()
    if newest is None:
        return redirect("chat:new")
    # After the open chat went to the trash: its Undo toast and unsent draft come along (render_chat_page).
    deleted = request.GET.get("deleted", "")[:64]
    return redirect(reverse("chat:session", args=[newest.session_id]) + (f"?{urlencode({'deleted': deleted})}"
                                                                          if deleted else ""))


def _last_used_assistant(user) -> str:
    last = (ChatSession.objects.for_user(user).exclude(component_id="").order_by("-created_at", "-id")
            .values_list("component_id", flat=True).first())
    return last if last in ASSISTANTS else DEFAULT_ASSISTANT


@login_required
@require_http_methods(["GET", "POST"])
@limit_posts((NEW_CHATS, by_user))
def new_session(request: HtmxHttpRequest) -> HttpResponse:
    form = NewSessionForm(request.POST or None, initial={"assistant": _last_used_assistant(request.user)})
    if request.method == "POST" and form.is_valid():
        assistant_id = form.cleaned_data["assistant"]
        with transaction.atomic():
            assistant = get_assistant(assistant_id)
            session = ChatSession.objects.new(owner=request.user, component_id=assistant_id, kind=assistant.kind,
                                              metadata=assistant.metadata)
            # The assistant's defaults go in at once (as version 1): the panel shows them before the first message.
            session.apply_state_change(assistant.session_state, "defaults")
        broadcast_to_user(request.user.pk, rendering.render_session_item_to_top(session))
        return redirect("chat:session", session.session_id)
    # Cancel goes back to a chat; with none yet, the index would only come back here.
    has_chats = ChatSession.objects.for_user(request.user).alive().exists()
    return render(request, "chatapp/new_session.html", {"form": form, "assistants": ASSISTANTS.values(),
                                                        "has_chats": has_chats}, status=400 if form.errors else 200)


@login_required
@require_GET
def session_page(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """The chat; `?run=<run id>` (a search hit) opens the branch that run is on."""
    session = owned_session(request, session_id)
    run_id = request.GET.get("run", "")
    if run_id and not session.deleted_at:
        _open_branch_of(request, session, run_id)
    return render_chat_page(request, session)


def _open_branch_of(request: HtmxHttpRequest, session: ChatSession, run_id: str) -> None:
    """Make the branch holding `run_id` (a reply, or a step or member run inside one) the session's current
    one; a run that is not this session's, or a session with a run in flight, is left as it is."""
    run = Run.objects.filter(session=session, run_id=run_id[:64]).select_related("parent_run__parent_run").first()
    while run is not None and run.parent_run_id is not None:
        run = run.parent_run
    if run is None or not run.abandoned:
        return
    try:
        get_assistant(session.component_id).set_current_branch(run.run_id, session_id=session.session_id,
                                                              user_id=request.user)
    except (KeyError, SessionBusyError):
        return
    session.refresh_from_db()


@login_required
@require_GET
def transcript_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Older runs (before run pk `before`), with their own "Load earlier" link when there are more."""
    session = owned_session(request, session_id)
    before = request.GET.get("before", "")
    if not before.isdigit():
        raise Http404("Missing or bad 'before'.")
    runs = rendering.transcript_runs(session, before=int(before))
    context = {"session": session, "runs": runs, "run_views": [rendering.run_view(run) for run in runs]}
    template = "chatapp/_transcript_runs.html" if request.htmx else "chatapp/transcript_earlier.html"
    return render(request, template, context)


@login_required
@require_GET
def trash(request: HtmxHttpRequest) -> HttpResponse:
    return render(request, "chatapp/trash.html", {"sessions": trashed_sessions(request.user)})
