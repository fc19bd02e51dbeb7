"""SQLite with FTS5: an external-content FTS5 table (porter stemmer) for messages, with `snippet()`, and an
FTS5 trigram table on names for typo candidates (migrations 0002 and 0005).

Names are indexed by triggers. Messages are indexed here, by the search that first reads them, so a
run's transaction never writes to the index: the messages stored since the last search are indexed
before each message search, and a message is found from the first search after its run is stored.
Delete and update triggers keep indexed messages in step.
"""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models import QuerySet

from ..models import Message
from .cursors import SearchCursor
from .query import ParsedQuery, Term
from .results import SEARCHED_ROLES, MessageHit, TitleHit, as_hits, hit_rows, queryset_sql, raw_scope
from .similarity import title_similarity
from .snippets import CLOSE, OPEN, SNIPPET_WORDS, from_marked
from .titles import FUZZY_CANDIDATES, ranked_similar

MESSAGE_FTS = "sessions_core_message_fts"
MESSAGE_FTS_MARK = "sessions_core_message_fts_mark"  # one row: messages up to this id are indexed
NAME_TRIGRAMS = "sessions_core_chatsession_trgm"
FTS5_DRIVING_LIMIT = 25_000  # below this many matches, start from the FTS5 index; above, walk the sessions


def message_hits(sessions: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
                 using: str) -> list[MessageHit]:
    """Matching messages ordered like the sidebar: common words are found by walking the user's sessions
    in that order, rare ones from the full-text index (SQLite's planner is told which)."""
    index_new_messages(using)
    scope = raw_scope(sessions, after, n, using)
    table = Message._meta.db_table
    match = _fts5_expression(parsed)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM (SELECT 1 FROM {MESSAGE_FTS} WHERE {MESSAGE_FTS} MATCH %s"
                       f" LIMIT {FTS5_DRIVING_LIMIT})", [match])
        if cursor.fetchone()[0] < FTS5_DRIVING_LIMIT:
            # Few matches: start from the index, then sort them.
            joins = (f"{MESSAGE_FTS} AS f JOIN {table} AS m ON m.id = f.rowid"
                     f" JOIN ({scope.sql}) AS s ON s.id = m.session_id")
        else:
            # Many: walk the sessions newest first (CROSS JOIN keeps that order) and stop at n.
            joins = f"({scope.sql}) AS s CROSS JOIN {table} AS m CROSS JOIN {MESSAGE_FTS} AS f"
        cursor.execute(
            f"SELECT m.id FROM {joins} WHERE m.session_id = s.id AND f.rowid = m.id"
            f" AND f.{MESSAGE_FTS} MATCH %s {scope.keyset} {scope.order}",
            [*scope.params, match, *scope.keyset_params],
        )
        ids = [row[0] for row in cursor.fetchall()]
    return _snippeted_hits(ids, match, using)


def index_new_messages(using: str) -> None:
    """Index the user and assistant messages stored since the last search.

    Ids only grow, so one number, the mark, says which messages are indexed. The check takes no lock,
    so a search with nothing to index never waits for a run's transaction. The catch-up reads the mark
    again in a transaction that holds the write lock from its start (settings.py makes SQLite's
    transactions IMMEDIATE): when two searches both saw new messages, the second waits for the first
    and finds nothing left to index.
    """
    connection = connections[using]
    table = Message._meta.db_table
    unindexed = f"{table} WHERE id > (SELECT indexed_upto FROM {MESSAGE_FTS_MARK})"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {unindexed} LIMIT 1")
        if cursor.fetchone() is None:
            return
    roles = ", ".join(["%s"] * len(SEARCHED_ROLES))
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {MESSAGE_FTS}(rowid, content) SELECT id, content FROM {unindexed}"
                       f" AND role IN ({roles}) ORDER BY id", [str(role) for role in SEARCHED_ROLES])
        # System and tool messages up to here are done too: they are never indexed.
        cursor.execute(f"UPDATE {MESSAGE_FTS_MARK} SET indexed_upto = (SELECT COALESCE(MAX(id), 0) FROM {table})")


def _snippeted_hits(ids: list[int], match: str, using: str) -> list[MessageHit]:
    if not ids:
        return []
    with connections[using].cursor() as cursor:
        # Only for the page's rows: snippet() re-reads and re-tokenizes each message.
        cursor.execute(
            f"SELECT rowid, snippet({MESSAGE_FTS}, 0, %s, %s, '…', {SNIPPET_WORDS}) FROM {MESSAGE_FTS}"
            f" WHERE {MESSAGE_FTS} MATCH %s AND rowid IN ({', '.join(['%s'] * len(ids))})",
            [OPEN, CLOSE, match, *ids],
        )
        snippets = dict(cursor.fetchall())
    return as_hits(ids, hit_rows(ids, using), lambda message: from_marked(snippets.get(message.pk, "")))


def _fts5_expression(parsed: ParsedQuery) -> str:
    def phrase(term: Term) -> str:
        return '"{}"'.format(" ".join(term.words).replace('"', '""'))

    expression = " AND ".join("(" + " OR ".join(phrase(t) for t in group) + ")" for group in parsed.groups)
    if parsed.excluded:
        expression = f"({expression}) NOT ({' OR '.join(phrase(t) for t in parsed.excluded)})"
    return expression


def similar_titles(candidates: QuerySet, parsed: ParsedQuery, after: SearchCursor | None, n: int,
                   using: str) -> list[TitleHit]:
    """Titles close to the query: the trigram table finds names sharing trigrams with it, `title_similarity`
    rates them (pg_trgm's word similarity computed here, or typos by edit distance)."""
    words = parsed.positive_words
    grams = sorted({word[i:i + 3] for word in words for i in range(len(word) - 2)})
    if not grams:
        return []
    scope_sql, scope_params = queryset_sql(candidates.values("pk"), using)
    match = " OR ".join('"{}"'.format(gram.replace('"', '""')) for gram in grams)
    with connections[using].cursor() as cursor:
        # `+rowid`: check the scope per match; as an index constraint SQLite would run the MATCH once per session.
        cursor.execute(
            f"SELECT rowid FROM {NAME_TRIGRAMS} WHERE {NAME_TRIGRAMS} MATCH %s AND +rowid IN ({scope_sql})"
            f" ORDER BY rank LIMIT {FUZZY_CANDIDATES}",
            [match, *scope_params],
        )
        ids = [row[0] for row in cursor.fetchall()]
    scored = [(session, title_similarity(words, session.name)) for session in candidates.filter(pk__in=ids)]
    return ranked_similar(scored, words, after, n)
