"""What a search returns (title hits, message hits, the page) and the helpers every backend builds them with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.db import connections
from django.db.models import QuerySet

from ..models import ChatSession, Message, Role
from .cursors import SearchCursor
from .query import ParsedQuery
from .snippets import Snippet

# Only what the user and the assistant said: system prompts and tool output are not searched. Baked into
# the index definitions of migrations 0002 and 0005: change them together.
SEARCHED_ROLES = (Role.USER, Role.ASSISTANT)


@dataclass
class TitleHit:
    session: ChatSession
    snippet: Snippet  # the name, with the matching parts
    rank: int = 0  # 0: every term is in the name; 1..51: similar (typo), lower is closer

    @property
    def fuzzy(self) -> bool:
        return self.rank > 0


@dataclass
class MessageHit:
    session: ChatSession
    message_id: int
    run_id: str
    seq: int
    role: str
    created_at: datetime
    snippet: Snippet
    more: int = 0  # with one_per_session: other matching messages of this session on the page, collapsed into it

    @property
    def role_label(self) -> str:
        return "You" if self.role == Role.USER else "Assistant"


@dataclass
class SearchPage:
    query: ParsedQuery
    title_hits: list[TitleHit] = field(default_factory=list)
    message_hits: list[MessageHit] = field(default_factory=list)
    next_cursor: str | None = None
    first: bool = True  # no cursor was given
    continues_messages: bool = False  # this page starts inside the message hits

    @property
    def is_empty(self) -> bool:
        return not (self.title_hits or self.message_hits)


def hit_rows(ids: list[int], using: str) -> QuerySet:
    """The messages `ids` with what a hit shows of them (a backend may annotate its snippet)."""
    return (
        Message.objects.using(using).filter(pk__in=ids).select_related("session", "run")
        .only("pk", "seq", "role", "created_at", "session__session_id", "session__name", "session__component_id",
              "session__last_activity_at", "session__pinned_at", "run__run_id")
        .order_by()
    )


def as_hits(ids: list[int], rows, snippet_of: Callable[[Message], Snippet]) -> list[MessageHit]:
    """`rows` (from `hit_rows`) as hits in the order of `ids`, each with its snippet."""
    by_pk = {message.pk: message for message in rows}
    return [MessageHit(session=m.session, message_id=m.pk, run_id=m.run.run_id, seq=m.seq, role=m.role,
                       created_at=m.created_at, snippet=snippet_of(m))
            for m in (by_pk[pk] for pk in ids if pk in by_pk)]


class RawScope(NamedTuple):
    """The pieces of a raw message query over the sessions in scope, for the full-text backends:
    `FROM ({sql}) AS s ... WHERE ... {keyset} {order}` with `params` and `keyset_params`."""

    sql: str
    params: tuple
    keyset: str
    keyset_params: list
    order: str


def raw_scope(sessions: QuerySet, after: SearchCursor | None, n: int, using: str) -> RawScope:
    """Messages ordered like the sidebar (most recently active session first, then newest message first
    within it), after `after`, at most `n`."""
    keyset, keyset_params = "", []
    if after and after.pk is not None:
        keyset = "AND (s.last_activity_at, s.id, m.seq) < (%s, %s, %s)"
        keyset_params = [connections[using].ops.adapt_datetimefield_value(after.stamp), after.pk, after.seq]
    sql, params = queryset_sql(sessions.values("id", "last_activity_at"), using)
    order = f"ORDER BY s.last_activity_at DESC, s.id DESC, m.seq DESC LIMIT {int(n)}"
    return RawScope(sql, params, keyset, keyset_params, order)


def queryset_sql(queryset: QuerySet, using: str) -> tuple[str, tuple]:
    """SQL and parameters of a queryset, to embed in a raw query (FTS5 tables have no model)."""
    return queryset.order_by().query.get_compiler(using=using).as_sql()
