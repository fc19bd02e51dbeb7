"""`search_sessions`: one page of a user's sessions matching a query, through the database's backend."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import connections

from ..models import ChatSession
from .basic import message_hits as basic_message_hits
from .cursors import SearchCursor
from .fts5 import MESSAGE_FTS, NAME_TRIGRAMS
from .fts5 import message_hits as fts5_message_hits
from .fts5 import similar_titles as fts5_similar_titles
from .postgresql import message_hits as postgresql_message_hits
from .postgresql import similar_titles as postgresql_similar_titles
from .query import parse_query
from .results import MessageHit, SearchPage
from .titles import SimilarTitles, title_hits


def search_sessions(user, query: str, *, limit: int = 20, cursor: str | None = None,
                    using: str = "default", one_per_session: bool = False) -> SearchPage:
    """One page of `user`'s live sessions matching `query`: title hits, then message hits. With
    `one_per_session`, a session's matching messages are one hit (its newest, counting the others on the
    page in `more`), and the next page starts at the next session."""
    if limit < 1:
        raise ValueError("limit must be positive")
    parsed = parse_query(query)
    after = SearchCursor.decode(cursor) if cursor else None
    page = SearchPage(parsed, first=after is None, continues_messages=bool(after and after.phase == "m"))
    if parsed.is_empty:
        return page
    sessions = ChatSession.objects.using(using).for_user(user).alive()
    if parsed.pinned:
        sessions = sessions.filter(pinned_at__isnull=False)
    if parsed.assistants:  # ids are slugs: accept them as typed or lower-cased
        sessions = sessions.filter(component_id__in={*parsed.assistants, *(a.lower() for a in parsed.assistants)})
    message_hits, similar_titles = backends(using)

    if after is None or after.phase == "t":
        titles = title_hits(sessions, parsed, after, limit + 1, similar_titles, using)
        if len(titles) > limit:
            page.title_hits = titles[:limit]
            last = titles[limit - 1]
            page.next_cursor = SearchCursor("t", rank=last.rank, stamp=last.session.last_activity_at,
                                            pk=last.session.pk).encode()
            return page
        page.title_hits = titles
    if not parsed.groups:  # filters alone list sessions, not messages
        return page
    room = limit - len(page.title_hits)
    message_after = after if after and after.phase == "m" else None
    # Fetch one more than fits: it says whether a further page exists (even when none fits here).
    messages = message_hits(sessions, parsed, message_after, room + 1, using)
    page.message_hits = messages[:room]
    if len(messages) > room:
        last = page.message_hits[-1] if room else None
        ended = SearchCursor("m", stamp=last.session.last_activity_at, pk=last.session.pk,
                             seq=0 if one_per_session else last.seq) if last else SearchCursor("m")
        page.next_cursor = ended.encode()
    if one_per_session:
        page.message_hits = _one_per_session(page.message_hits)
    return page


def _one_per_session(hits: list[MessageHit]) -> list[MessageHit]:
    """Each session's first hit (hits come session by session, newest message first), counting the rest."""
    collapsed: list[MessageHit] = []
    for hit in hits:
        if collapsed and collapsed[-1].session.pk == hit.session.pk:
            collapsed[-1].more += 1
        else:
            collapsed.append(hit)
    return collapsed


def backends(using: str) -> tuple[Callable, SimilarTitles | None]:
    """The functions that find matching messages and similar titles (None: no typo search) on this database."""
    connection = connections[using]
    if getattr(settings, "SESSIONS_SEARCH_BACKEND", "") == "basic":  # force the LIKE fallback
        return basic_message_hits, None
    if connection.vendor == "postgresql":
        return postgresql_message_hits, postgresql_similar_titles
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%s, %s)",
                           [MESSAGE_FTS, NAME_TRIGRAMS])
            tables = {row[0] for row in cursor.fetchall()}
        return (fts5_message_hits if MESSAGE_FTS in tables else basic_message_hits,
                fts5_similar_titles if NAME_TRIGRAMS in tables else None)
    return basic_message_hits, None
