"""Function-based views: pages and the htmx fragments they swap (fragment-only URLs end in _hx)."""

from .accounts import signup
from .export import export_all, import_chats, session_export_json, session_export_markdown
from .pages import index, new_session, session_page, transcript_hx, trash
from .sessions import (
    session_delete_hx,
    session_destroy_hx,
    session_list_hx,
    session_pin_hx,
    session_rename_hx,
    session_restore_hx,
    session_retitle_hx,
)
from .state import state_edit_hx, state_panel_hx, state_version_hx

__all__ = [
    "signup", "export_all", "import_chats", "session_export_json", "session_export_markdown",
    "index", "new_session", "session_page", "transcript_hx", "trash", "session_delete_hx",
    "session_destroy_hx", "session_list_hx", "session_pin_hx", "session_rename_hx",
    "session_restore_hx", "session_retitle_hx", "state_edit_hx", "state_panel_hx", "state_version_hx",
]
