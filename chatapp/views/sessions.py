"""Sidebar actions on one session (rename, pin, delete, restore, delete forever, retitle), emptying the trash,
and the list pages. A chat in the trash is read-only: rename, pin and retitle find only live chats (a
trashed one is a 404, as for fork); it can be restored or deleted for good.

Each change re-renders the affected fragment for the requesting tab and broadcasts it to the
user's other tabs through the user's channel group.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from sessions_core.models import ChatSession, NameSource, Run
from sessions_core.search import InvalidCursor

from .. import ratelimits, rendering, titles
from ..ratelimits import too_many
from ..assistants import get_assistant
from ..broadcast import broadcast_to_user
from ..forms import RenameForm
from ..sidebar import sidebar_page, trashed_sessions
from .common import HtmxHttpRequest, aowned_session, current_session_id, is_current, next_url, owned_session


def _row(request: HtmxHttpRequest, session: ChatSession, status: int = 200, **extra) -> HttpResponse:
    html = rendering.render_session_item(session, current=is_current(request, session), **extra)
    return HttpResponse(html, status=status)


def _list_html(request: HtmxHttpRequest) -> str:
    return rendering.render_session_list(request.user, current_session_id=current_session_id(request))


def _back(request: HtmxHttpRequest, session: ChatSession) -> HttpResponse:
    return redirect(next_url(request, reverse("chat:session", args=[session.session_id])))


@login_required
@require_POST
def fork(request: HtmxHttpRequest) -> HttpResponse:
    """"Fork to a new chat": the runs up to this one and the state as of it, in a new chat of the user's."""
    run = get_object_or_404(Run.objects.select_related("session").only("run_id", "session__session_id"),
                            run_id=request.POST.get("run_id", ""), parent_run__isnull=True,
                            session__in=ChatSession.objects.for_user(request.user).alive())
    new_id = get_assistant(run.session.component_id).fork_session(run.run_id, session_id=run.session.session_id,
                                                                  user_id=request.user)
    copy = ChatSession.objects.for_user(request.user).get(session_id=new_id)
    copy.name = titles.fork_title(copy)
    copy.save(update_fields=["name"])
    broadcast_to_user(request.user.pk, rendering.render_session_item_to_top(copy))
    if request.htmx:
        return HttpResponseClientRedirect(reverse("chat:session", args=[new_id]))
    return redirect("chat:session", new_id)


@login_required
@require_GET
def session_list_hx(request: HtmxHttpRequest) -> HttpResponse:
    """A further page of the sidebar (after `cursor`), or the first page."""
    try:
        page = sidebar_page(request.user, cursor=request.GET.get("cursor") or None)
    except InvalidCursor:
        return HttpResponseBadRequest("Invalid cursor.")
    template = "chatapp/_session_list.html" if page.first else "chatapp/_session_page.html"
    return render(request, template, {"page": page, "current_session_id": current_session_id(request)})


@login_required
@require_POST
def session_rename_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    session = owned_session(request, session_id, sidebar_only=True, alive=True)
    form = RenameForm(request.POST)
    if not form.is_valid():
        error = form.errors["name"][0]
        if request.htmx:
            return _row(request, session, status=422, editing=True, error=error)
        messages.error(request, error)
        return _back(request, session)
    session.name, session.name_source = form.cleaned_data["name"], NameSource.USER
    session.save(update_fields=["name", "name_source"])
    broadcast_to_user(request.user.pk, rendering.render_session_item(session, oob="true"))
    return _row(request, session) if request.htmx else _back(request, session)


@login_required
@require_POST
def session_pin_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    session = owned_session(request, session_id, sidebar_only=True, alive=True)
    # The form says which state it wants, so two tabs clicking at once agree instead of toggling twice.
    session.pinned_at = timezone.now() if request.POST.get("pinned") == "1" else None
    session.save(update_fields=["pinned_at"])
    broadcast_to_user(request.user.pk, rendering.render_session_list(request.user, oob="outerHTML"))
    return HttpResponse(_list_html(request)) if request.htmx else _back(request, session)


@login_required
@require_POST
def session_delete_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Move a session to the trash (soft delete); the toast's Undo restores it."""
    session = owned_session(request, session_id, sidebar_only=True)
    if session.deleted_at is None:
        session.deleted_at = timezone.now()
        session.save(update_fields=["deleted_at"])
    broadcast_to_user(request.user.pk, rendering.render_delete("li", f"session-item-{session.pk}"))
    if request.htmx and is_current(request, session):
        # The open chat: go on to the next one, which shows the Undo toast and keeps the unsent draft.
        return HttpResponseClientRedirect(f"{reverse('chat:index')}?{urlencode({'deleted': session.session_id})}")
    if request.htmx:
        return HttpResponse(render_to_string("chatapp/_undo_toast.html", {"s": session}, request=request))
    messages.success(request, f"Moved “{session.name or 'New chat'}” to the trash.")
    return redirect("chat:index")


@login_required
@require_POST
def session_restore_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    session = owned_session(request, session_id, sidebar_only=True)
    if session.deleted_at is not None:
        session.deleted_at = None
        session.save(update_fields=["deleted_at"])
    broadcast_to_user(request.user.pk, rendering.render_session_list(request.user, oob="outerHTML"))
    if not request.htmx:
        return _back(request, session)
    if request.htmx.target == "session-list":  # the Undo toast: the refreshed list, and the toast gone
        return HttpResponse(_list_html(request) + rendering.render_delete("div", f"toast-{session.pk}"))
    return HttpResponse("")  # a trash row: removed (the Trash page has no toast to remove)


@login_required
@require_POST
def session_destroy_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Delete a trashed session for good (runs, messages and state changes go with it)."""
    session = owned_session(request, session_id, sidebar_only=True)
    if session.deleted_at is None:
        return HttpResponse("Move the session to the trash first.", status=409)
    title = session.name or "New chat"
    session.delete()
    if request.htmx:
        return HttpResponse("")
    messages.success(request, f"Deleted “{title}” for good.")
    return redirect("chat:trash")


@login_required
@require_POST
def trash_empty_hx(request: HtmxHttpRequest) -> HttpResponse:
    """"Empty trash": the user's trashed chats deleted for good, those the page listed (trashed up to `upto`,
    the newest it showed); a chat trashed since, in another tab, stays, as do the user's live chats."""
    upto = parse_datetime(request.POST.get("upto", ""))
    if upto is None:
        return HttpResponseBadRequest("Missing or bad 'upto'.")
    _, deleted = ChatSession.objects.for_user(request.user).trashed().filter(deleted_at__lte=upto).delete()
    count = deleted.get(ChatSession._meta.label, 0)
    note = f"Deleted {count} chat{'' if count == 1 else 's'} for good." if count else "The trash was already empty."
    if request.htmx:
        return render(request, "chatapp/_trash_list.html", {"sessions": trashed_sessions(request.user), "note": note})
    messages.success(request, note)
    return redirect("chat:trash")


@login_required
@require_POST
async def session_retitle_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Regenerate the title with the model: the job is started and the row returned as it is now; the
    new title reaches every tab of the user (this one too) through the user's group when it arrives."""
    session = await aowned_session(request, session_id, sidebar_only=True, alive=True)
    user = await request.auser()
    if refused := await ratelimits.refuse(ratelimits.TITLES, user):
        return await sync_to_async(too_many)(request, *refused)
    titles.start_regenerate_title(session, user)
    return _row(request, session) if request.htmx else _back(request, session)
