"""Sidebar search over one user's sessions: title hits first, then message hits with highlighted snippets.

    page = search_sessions(user, 'pasta "red sauce" -tomato assistant:general', limit=20)
    page.title_hits, page.message_hits, page.next_cursor

Query syntax (`query.py`) is PostgreSQL's websearch syntax (words are ANDed, "quoted phrase", `or`,
`-word`) plus two filters: `pinned:` (pinned sessions only) and `assistant:<id>` (the session's component
id; repeat it for several). Only live sessions of the user count: everything starts from
`ChatSession.objects.for_user(user).alive()` (`sessions.py`).

Titles (`titles.py`) match when every term is a substring of the name (case-insensitive), newest activity
first; then come names similar to the query (typos: `similarity.title_similarity`), closest first.
Messages (user and assistant only: system prompts and tool output are not searched) match by full-text
search with stemming, ordered like the sidebar: most recently active session first, newest message first
within it. Pages are keyset cursors (`cursors.py`). The indexes (migrations 0002 and 0005) are always
current when a search reads them, so a rename, a new message or a delete shows at once. One module per
backend: `postgresql.py`, `fts5.py` (SQLite with FTS5) and `basic.py` (LIKE scans, anywhere else).
Snippets (`snippets.py`) are plain text with the spans that matched; the web layer escapes and marks them.
"""

from .cursors import InvalidCursor, SearchCursor, decode_cursor, encode_cursor, micros, parse_id
from .fts5 import MESSAGE_FTS, MESSAGE_FTS_MARK, NAME_TRIGRAMS
from .postgresql import INDEXED_CHARS, MARKUP_CHARS, MARKUP_STANDINS, TS_CONFIG
from .query import MAX_QUERY_CHARS, ParsedQuery, Term, parse_query
from .results import SEARCHED_ROLES, MessageHit, SearchPage, TitleHit
from .sessions import search_sessions
from .similarity import TITLE_SIMILARITY, title_similarity
from .snippets import Snippet

__all__ = [
    "INDEXED_CHARS", "MARKUP_CHARS", "MARKUP_STANDINS", "MAX_QUERY_CHARS", "MESSAGE_FTS", "MESSAGE_FTS_MARK",
    "NAME_TRIGRAMS", "SEARCHED_ROLES", "TITLE_SIMILARITY", "TS_CONFIG", "InvalidCursor", "MessageHit",
    "ParsedQuery", "SearchCursor", "SearchPage", "Snippet", "Term", "TitleHit", "decode_cursor", "encode_cursor",
    "micros", "parse_id", "parse_query", "search_sessions", "title_similarity",
]
