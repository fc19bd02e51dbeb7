"""PostgreSQL: a stored tsvector column with a GIN index (migration 0002), `websearch_to_tsquery`,
`ts_headline` snippets, and pg_trgm's `word_similarity` (GIN trigram index on the name) for typos.

A query made only of English stop words ("what is this"), which the configuration drops, is looked for
as typed (`basic.py`), as SQLite's index would find it.
"""

from __future__ import annotations

from django.contrib.postgres.search import SearchHeadline, SearchQuery, TrigramWordSimilarity
from django.db import connections, transaction
from django.db.models import Case, Func, QuerySet, Value, When
from django.db.models.functions import Left, Length

from ..models import Message
from .basic import message_hits as message_hits_as_typed
from .cursors import SearchCursor
from .query import ParsedQuery
from .results import MessageHit, TitleHit, as_hits, hit_rows, raw_scope
from .similarity import title_similarity
from .snippets import CLOSE, OPEN, SNIPPET_WORDS, from_marked
from .titles import FUZZY_CANDIDATES, ranked_similar

# These four are baked into the index definitions of migration 0002: change both together.
TS_CONFIG = "english"
INDEXED_CHARS = 100_000  # PostgreSQL indexes (and highlights) the first 100,000 characters of a message
MARKUP_CHARS, MARKUP_STANDINS = "<>&", "\ue002\ue003\ue004"

CANDIDATE_SIMILARITY = 0.3  # titles this close by word_similarity are scored by title_similarity
SHORT_MESSAGE_CHARS = 200  # shorter messages are shown whole


def message_hits(sessions: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
                 using: str) -> list[MessageHit]:
    """Matching messages ordered like the sidebar. The planner picks whether to walk the user's sessions
    in that order (common words) or to start from the full-text index (rare ones)."""
    scope = raw_scope(sessions, after, n, using)
    query_params = [TS_CONFIG, parsed.text, MARKUP_CHARS + OPEN + CLOSE, MARKUP_STANDINS]
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT m.id FROM ({scope.sql}) AS s JOIN {Message._meta.db_table} AS m ON m.session_id = s.id"
            f" WHERE m.search_vector @@ websearch_to_tsquery(%s::regconfig, translate(%s, %s, %s))"
            f" {scope.keyset} {scope.order}",
            [*scope.params, *query_params, *scope.keyset_params],
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            # Only stop words ("what is this"): the English configuration drops every one, so the
            # index can find nothing. Look for the words as typed instead, as SQLite's index would.
            cursor.execute("SELECT numnode(websearch_to_tsquery(%s::regconfig, translate(%s, %s, %s)))",
                           query_params)
            if cursor.fetchone()[0] == 0:
                return message_hits_as_typed(sessions, parsed, after, n, using)
    return _headlined_hits(ids, parsed, using)


def _headlined_hits(ids: list[int], parsed: ParsedQuery, using: str) -> list[MessageHit]:
    query = SearchQuery(_unmarkup(Value(parsed.text)), config=TS_CONFIG, search_type="websearch")
    text = _unmarkup(Left("content", INDEXED_CHARS))
    marks = {"config": TS_CONFIG, "start_sel": OPEN, "stop_sel": CLOSE}
    headline = Case(
        # A short message is shown whole; fragments would drop its closing punctuation.
        When(length__lte=SHORT_MESSAGE_CHARS, then=SearchHeadline(text, query, highlight_all=True, **marks)),
        default=SearchHeadline(text, query, max_words=SNIPPET_WORDS, min_words=SNIPPET_WORDS // 2, short_word=2,
                               max_fragments=2, fragment_delimiter=" … ", **marks),
    )
    rows = hit_rows(ids, using).annotate(length=Length("content"), headline=headline)
    standins = str.maketrans(MARKUP_STANDINS, MARKUP_CHARS)
    return as_hits(ids, rows, lambda message: from_marked(message.headline.translate(standins)))


def _unmarkup(expression):
    """The text as indexed: markup characters become blanks, so `<b>word</b>` is not a tag to drop,
    and our highlight sentinels are removed (translate() deletes characters it has no match for)."""
    return Func(expression, Value(MARKUP_CHARS + OPEN + CLOSE), Value(MARKUP_STANDINS), function="translate")


def similar_titles(candidates: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
                   using: str) -> list[TitleHit]:
    """Titles close to the query: pg_trgm finds and rates them, `title_similarity` adds typos by edit distance."""
    words = parsed.positive_words
    text = " ".join(words)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # `%>` (the GIN-indexable form of word_similarity >= threshold) reads the threshold from here.
        cursor.execute("SELECT set_config('pg_trgm.word_similarity_threshold', %s, true)",
                       [str(CANDIDATE_SIMILARITY)])
        similar = (candidates.filter(name__trigram_word_similar=text)
                   .annotate(similarity=TrigramWordSimilarity(text, "name")).order_by("-similarity", "-pk"))
        rows = list(similar[:FUZZY_CANDIDATES])
    scored = [(session, title_similarity(words, session.name, trigram=session.similarity)) for session in rows]
    return ranked_similar(scored, words, after, n)
