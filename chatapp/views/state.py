"""The state panel: the current state, the state as of an earlier version, and JSON edits."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from sessions_core.state import StateNotJSONError

from .. import rendering, state_view
from ..broadcast import broadcast_to_session
from ..forms import StateEditForm
from ..state_edits import StaleStateError, TrashedSessionError, replace_state
from .common import HtmxHttpRequest, owned_session, render_chat_page


def _panel(request: HtmxHttpRequest, session, status: int = 200, **panel) -> HttpResponse:
    if request.htmx:
        return HttpResponse(rendering.render_state_panel(session, **panel), status=status)
    return render_chat_page(request, session, status=status, **panel)


@login_required
@require_GET
def state_panel_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    return _panel(request, owned_session(request, session_id))


@login_required
@require_GET
def state_version_hx(request: HtmxHttpRequest, session_id: str, version: int) -> HttpResponse:
    """The state as it was at `version`, read-only."""
    session = owned_session(request, session_id)
    try:
        old_state = session.state_at(version)
    except ValueError as exc:
        raise Http404(str(exc)) from exc
    return _panel(request, session, as_of=version, as_of_tree=state_view.tree(old_state))


@login_required
@require_POST
def state_edit_hx(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Replace the whole state with the posted JSON object, unless it changed since the form was loaded (or the
    chat went to the trash: read-only, a 409)."""
    session = owned_session(request, session_id)
    form = StateEditForm(request.POST)
    if not form.is_valid():
        error = " ".join(message for errors in form.errors.values() for message in errors)
        return _panel(request, session, status=422, edit_error=error, edit_text=request.POST.get("state", ""),
                      edit_version=request.POST.get("version", ""))
    try:
        session, changed = replace_state(request.user, session_id, form.cleaned_data["state"],
                                         form.cleaned_data["version"])
    except StaleStateError as exc:
        session.refresh_from_db()
        message = (f"Not saved: the state changed since you opened it (it is now at version {exc.current_version}). "
                   "The current state is shown above; your text is kept below. Save again to replace it.")
        # The form now carries the current version, so saving again is a deliberate overwrite.
        return _panel(request, session, status=409, edit_error=message, edit_text=form.data["state"],
                      edit_version=exc.current_version)
    except TrashedSessionError:  # the panel, as a chat in the trash shows it: no editor, a note saying why
        session.refresh_from_db()
        return _panel(request, session, status=409)
    except StateNotJSONError as exc:
        return _panel(request, session, status=422, edit_error=str(exc), edit_text=form.data["state"])
    broadcast_to_session(session.pk, rendering.render_state_panel(session, changed, oob="true"))
    if request.htmx:
        return HttpResponse(rendering.render_state_panel(session, changed))
    return redirect("chat:session", session.session_id)
