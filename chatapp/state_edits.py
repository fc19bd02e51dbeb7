"""Manual edits of a session's state from the panel: a full replacement, checked against the version
the user saw, and recorded through the engine as one "manual" state change."""

from __future__ import annotations

from django.db import transaction

from sessions_core import state as state_module
from sessions_core.models import ChatSession


class TrashedSessionError(Exception):
    """The session is in the trash, which is read-only; nothing was written."""


class StaleStateError(Exception):
    """The state changed since the user loaded it; nothing was written."""

    def __init__(self, current_version: int):
        self.current_version = current_version
        super().__init__(f"The state changed since you opened it (it is now at version {current_version}).")


def replace_state(user, session_id: str, new_state: dict, expected_version: int) -> tuple[ChatSession, list[str]]:
    """Store `new_state` as the session's whole state if it is still at `expected_version`.

    Returns the updated session and the top-level keys that changed. Raises StaleStateError,
    TrashedSessionError, ChatSession.DoesNotExist (not the user's session) or StateNotJSONError.
    """
    new_state = state_module.to_json(state_module.strip_injected(new_state))
    with transaction.atomic():
        session = ChatSession.objects.for_user(user).select_for_update().get(session_id=session_id)
        if session.deleted_at is not None:
            raise TrashedSessionError
        if session.state_version != expected_version:
            raise StaleStateError(session.state_version)
        patch, _ = state_module.diff(session.session_state, new_state)
        session.apply_state_change(new_state, "manual")
    return session, state_module.changed_keys(patch)
