"""Function-based views: the pages, and the targets of htmx requests.

A view named `*_hx` is what htmx calls: it answers an htmx request with a fragment. Those a form can
also reach without JavaScript (the sidebar actions, the state panel, older runs) answer a plain request
with a redirect or the whole page; the others (`session_list_hx`, `search_hx`) answer with the fragment.
"""

from .accounts import account_settings, signup
from .export import export_all, import_chats, session_export_json, session_export_markdown, transfer, transfer_download
from .memories import memories_forget, memories_page, memories_setting, memory_add, memory_delete, memory_edit, memory_undo
from .pages import index, new_session, session_page, session_version, transcript_hx, trash
from .search import search_hx
from .sessions import (
    fork,
    session_delete_hx,
    session_destroy_hx,
    session_list_hx,
    session_pin_hx,
    session_rename_hx,
    session_restore_hx,
    session_retitle_hx,
    trash_empty_hx,
)
from .state import state_edit_hx, state_panel_hx, state_version_hx

__all__ = [
    "account_settings", "fork", "signup", "export_all", "import_chats", "session_export_json", "session_export_markdown",
    "transfer", "transfer_download", "index", "new_session", "session_page", "session_version", "transcript_hx", "trash", "search_hx", "session_delete_hx",
    "session_destroy_hx", "session_list_hx", "session_pin_hx", "session_rename_hx",
    "session_restore_hx", "session_retitle_hx", "state_edit_hx", "state_panel_hx", "state_version_hx",
    "trash_empty_hx", "memories_forget", "memories_page", "memories_setting", "memory_add", "memory_delete",
    "memory_edit", "memory_undo",
]
