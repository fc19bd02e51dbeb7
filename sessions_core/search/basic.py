"""The fallback on any other database (or SQLite built without FTS5, or SESSIONS_SEARCH_BACKEND = "basic"):
LIKE scans over messages; no typo tolerance, no stemming."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from ..models import Message
from .cursors import SearchCursor
from .query import ParsedQuery
from .results import SEARCHED_ROLES, MessageHit, as_hits, hit_rows
from .snippets import excerpt


def message_hits(sessions: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
                 using: str) -> list[MessageHit]:
    """Messages holding the terms as typed (case-insensitive), ordered like the sidebar."""
    messages = Message.objects.using(using).filter(session__in=sessions.values("pk"), role__in=SEARCHED_ROLES)
    for group in parsed.groups:
        any_of = Q()
        for term in group:
            any_of |= Q(content__icontains=term.text)
        messages = messages.filter(any_of)
    for term in parsed.excluded:
        messages = messages.exclude(content__icontains=term.text)
    if after and after.pk is not None:
        messages = messages.filter(
            Q(session__last_activity_at__lt=after.stamp)
            | Q(session__last_activity_at=after.stamp, session__pk__lt=after.pk)
            | Q(session__last_activity_at=after.stamp, session__pk=after.pk, seq__lt=after.seq))
    messages = messages.order_by("-session__last_activity_at", "-session__pk", "-seq")
    contents = dict(messages.values_list("pk", "content")[:n])
    ids = list(contents)
    terms = parsed.positive_texts
    return as_hits(ids, hit_rows(ids, using), lambda message: excerpt(contents[message.pk], terms))
