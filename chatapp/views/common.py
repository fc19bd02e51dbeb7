"""What every chat view shares: the owner-scoped session lookup and the chat page itself."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import aget_object_or_404, get_object_or_404, render
from django.urls import Resolver404, resolve
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from sessions_core.models import INTERRUPTED_ERROR, ChatSession, RunStatus

from .. import memories, rendering
from ..assistants import assistant_name
from ..live.leases import may_have_abandoned
from ..sidebar import sidebar_page


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _sessions(user, sidebar_only: bool, alive: bool):
    sessions = ChatSession.objects.for_user(user)
    sessions = sessions.alive() if alive else sessions
    return sessions.for_sidebar() if sidebar_only else sessions


def owned_session(request: HttpRequest, session_id: str, sidebar_only: bool = False,
                  alive: bool = False) -> ChatSession:
    """The request user's session with this id (alive or trashed; with `alive`, not in the trash, which is
    read-only: a trashed one is then a 404, as are anyone else's)."""
    return get_object_or_404(_sessions(request.user, sidebar_only, alive), session_id=session_id)


async def aowned_session(request: HttpRequest, session_id: str, sidebar_only: bool = False,
                         alive: bool = False) -> ChatSession:
    """`owned_session` for async views."""
    return await aget_object_or_404(_sessions(await request.auser(), sidebar_only, alive), session_id=session_id)


def next_url(request: HttpRequest, default: str) -> str:
    """Where a plain (non-htmx) POST goes back to: a safe `next`, else `default`."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return default


def current_session_id(request: HtmxHttpRequest) -> str | None:
    """The session whose page sent this htmx request (for aria-current on its sidebar row)."""
    path = request.htmx.current_url_abs_path if request.htmx else None
    if not path:
        return None
    try:
        match = resolve(path.split("?")[0])
    except Resolver404:
        return None
    return match.kwargs.get("session_id") if match.view_name == "chat:session" else None


def is_current(request: HtmxHttpRequest, session: ChatSession) -> bool:
    return current_session_id(request) == session.session_id


def render_chat_page(request: HttpRequest, session: ChatSession, status: int = 200, other_version=None,
                     **panel) -> HttpResponse:
    """The three-pane page for `session`; `other_version`, a run on a version of the chat it does not show (a
    search hit), is offered to be shown; `panel` goes to the state panel (as-of view, form errors)."""
    runs = rendering.transcript_runs(session)
    memories.attach(runs, session.owner_id)
    if may_have_abandoned(session):
        for run in runs:
            if run.status == RunStatus.RUNNING:
                # Its process stopped (a restart mid-reply): over, and shown so. A page writes nothing: the
                # engine stores it interrupted when the page's socket connects or the next run starts. (A
                # session read with no lease at all may have a run that started since: it runs.)
                run.status, run.error = RunStatus.INTERRUPTED, INTERRUPTED_ERROR
    return render(request, "chatapp/session.html", {
        "session": session,
        "page": sidebar_page(request.user),
        "current_session_id": session.session_id,
        "runs": runs,
        "run_views": [rendering.run_view(run) for run in runs],
        "running": any(run.status == RunStatus.RUNNING for run in runs),
        "state_panel": rendering.render_state_panel(session, **panel),
        "context_memories": memories.render_context_memories(memories.context_memories(session, runs)),
        "other_version": other_version,
        "assistant_name": assistant_name(session.component_id),
        "read_only": session.deleted_at is not None,
        "max_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "deleted": just_deleted(request),
    }, status=status)


def just_deleted(request: HttpRequest) -> ChatSession | None:
    """The chat the user was on when it went to the trash (`?deleted=<id>`, from the index): its Undo toast,
    and its unsent draft carried into this page's composer (static/chatapp/chat.js). Only the user's own."""
    session_id = request.GET.get("deleted", "")[:64]
    if not session_id:
        return None
    return ChatSession.objects.for_user(request.user).filter(session_id=session_id, deleted_at__isnull=False).first()
