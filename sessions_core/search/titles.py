"""Title hits: names holding every term (newest activity first), then names similar to the query
(typos, closest first), which a backend's `similar_titles` finds."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime

from django.db import connections
from django.db.models import BooleanField, F, Func, Q, QuerySet, Value

from ..models import ChatSession
from .cursors import SearchCursor, micros
from .query import ParsedQuery
from .results import TitleHit
from .similarity import TITLE_SIMILARITY
from .snippets import highlight_similar, highlight_terms

FUZZY_CANDIDATES = 200  # names sharing trigrams with the query, scored in Python

SimilarTitles = Callable[[QuerySet, ParsedQuery, "SearchCursor | None", int, str], list[TitleHit]]


class _ILike(Func):
    """`expression ILIKE pattern`: unlike Django's icontains (UPPER(name) LIKE ...) the trigram index serves it."""

    arg_joiner = " ILIKE "
    template = "(%(expressions)s)"
    output_field = BooleanField()


def _contains(field: str, text: str, vendor: str) -> Q:
    if vendor == "postgresql":
        pattern = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return Q(_ILike(F(field), Value(f"%{pattern}%")))
    return Q(**{f"{field}__icontains": text})


def _substring_q(parsed: ParsedQuery, vendor: str) -> Q:
    q = Q()
    for group in parsed.groups:
        any_of = Q()
        for term in group:
            any_of |= _contains("name", term.text, vendor)
        q &= any_of
    return q


def _excluded_q(parsed: ParsedQuery, vendor: str) -> Q:
    q = Q()
    for term in parsed.excluded:
        q |= _contains("name", term.text, vendor)
    return q


def title_hits(sessions: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
               similar_titles: SimilarTitles | None, using: str) -> list[TitleHit]:
    """Up to `n` title hits after `after`: exact ones, then (where the backend has typo search) similar ones."""
    hits: list[TitleHit] = []
    vendor = connections[using].vendor
    candidates = sessions.for_sidebar()
    if parsed.excluded:
        candidates = candidates.exclude(_excluded_q(parsed, vendor))
    if after is None or after.rank == 0:
        exact = candidates.filter(_substring_q(parsed, vendor))
        if after:
            exact = exact.filter(Q(last_activity_at__lt=after.stamp)
                                 | Q(last_activity_at=after.stamp, pk__lt=after.pk))
        hits = [TitleHit(s, highlight_terms(s.name, parsed)) for s in exact[:n]]
    words = parsed.positive_words
    if len(hits) < n and similar_titles and len("".join(words)) >= 3:
        fuzzy_after = after if after and after.rank > 0 else None
        hits += similar_titles(candidates.exclude(_substring_q(parsed, vendor)), parsed, fuzzy_after,
                               n - len(hits), using)
    return hits


def _similarity_rank(similarity: float) -> int:
    # 1 (identical) .. 51 (at the threshold): after exact hits (0). Rounded first: PostgreSQL's figure is
    # a float4 (0.7 comes back as 0.69999999), Python's a float.
    return 101 - math.floor(round(similarity, 4) * 100)


def ranked_similar(scored: Iterable[tuple[ChatSession, float]], words: list[str], after: SearchCursor | None,
                   n: int) -> list[TitleHit]:
    """The candidates (with their `title_similarity`) similar enough to the query, closest first, then
    like the sidebar; the page after `after`."""
    ranked = [(_similarity_rank(similarity), session) for session, similarity in scored
              if similarity >= TITLE_SIMILARITY]

    def key(rank: int, stamp: datetime, pk: int) -> tuple[int, int, int]:
        return rank, -micros(stamp), -pk

    ranked.sort(key=lambda item: key(item[0], item[1].last_activity_at, item[1].pk))
    if after:
        ranked = [item for item in ranked
                  if key(item[0], item[1].last_activity_at, item[1].pk) > key(after.rank, after.stamp, after.pk)]
    return [TitleHit(s, highlight_similar(s.name, words), rank=rank) for rank, s in ranked[:n]]
