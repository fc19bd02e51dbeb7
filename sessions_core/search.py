"""Sidebar search over one user's sessions: title hits first, then message hits with highlighted snippets.

    page = search_sessions(user, 'pasta "red sauce" -tomato assistant:general', limit=20)
    page.title_hits, page.message_hits, page.next_cursor

Query syntax is PostgreSQL's websearch syntax (words are ANDed, "quoted phrase", `or`, `-word`) plus two
filters: `pinned:` (pinned sessions only) and `assistant:<id>` (the session's component id; repeat it
for several). Only live sessions of the user count: everything starts from
`ChatSession.objects.for_user(user).alive()`.

Titles match when every term is a substring of the name (case-insensitive), newest activity first;
then come names similar to the query (typos: `title_similarity`, the same on both databases), closest first. Messages (user and assistant only:
system prompts and tool output are not searched) match by full-text search with stemming, ordered like
the sidebar: most recently active session first, newest message first within it. Pages are keyset
cursors. The indexes (migrations 0002 and 0005) are always current when a search reads them, so a
rename, a new message or a delete shows at once:

* PostgreSQL: a stored tsvector column with a GIN index, `websearch_to_tsquery`, `ts_headline`
  snippets, and pg_trgm `word_similarity` (GIN trigram index on the name) for typo candidates. A query made
  only of English stop words ("what is this"), which that configuration drops, is looked for as typed.
* SQLite with FTS5: an external-content FTS5 table (porter stemmer) for messages, with `snippet()`; an
  FTS5 trigram table on names supplies typo candidates. Names
  are indexed by triggers. Messages are indexed here, by the search that first reads them, so a run's
  transaction never writes to the index: the messages stored since the last search are indexed before
  each message search, and a message is found from the first search after its run is stored. Delete
  and update triggers keep indexed messages in step.
* Anything else (or SQLite built without FTS5): LIKE scans; no typo tolerance, no stemming.

Snippets are data, not HTML: a `Snippet` is plain text with the (start, end) spans that matched; the
web layer escapes the text and marks the spans.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone as dt_timezone

from django.conf import settings
from django.contrib.postgres.search import SearchHeadline, SearchQuery, TrigramWordSimilarity
from django.db import connections, transaction
from django.db.models import BooleanField, Case, F, Func, Q, QuerySet, Value, When
from django.db.models.functions import Left, Length

from .models import ChatSession, Message, Role
from .storable import storable

# These four are baked into the index definitions of migration 0002: change both together.
TS_CONFIG = "english"
INDEXED_CHARS = 100_000  # PostgreSQL indexes (and highlights) the first 100,000 characters of a message
MARKUP_CHARS, MARKUP_STANDINS = "<>&", "\ue002\ue003\ue004"
SEARCHED_ROLES = (Role.USER, Role.ASSISTANT)

TITLE_SIMILARITY = 0.5  # title_similarity: pg_trgm's word_similarity (computed in Python) or typos by edit distance
CANDIDATE_SIMILARITY = 0.3  # PostgreSQL: titles this close by word_similarity are scored in Python
FUZZY_CANDIDATES = 200  # SQLite: names sharing trigrams with the query, scored in Python
FTS5_DRIVING_LIMIT = 25_000  # SQLite: below this many matches, start from the FTS5 index; above, walk the sessions
SNIPPET_WORDS = 20
SHORT_MESSAGE_CHARS = 200  # shorter messages are shown whole
MAX_QUERY_CHARS = 500

MESSAGE_FTS = "sessions_core_message_fts"
MESSAGE_FTS_MARK = "sessions_core_message_fts_mark"  # one row: messages up to this id are indexed
NAME_TRIGRAMS = "sessions_core_chatsession_trgm"

# Private-use characters mark the highlighted spans in the text the database returns (ts_headline,
# snippet()); `_snippet` turns them into spans. Typed by a user, they are removed first.
_OPEN, _CLOSE = "\ue000", "\ue001"
_SENTINELS = {ord(_OPEN): None, ord(_CLOSE): None}
_WORD = re.compile(r"[^\W_]+")
_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')
_FILTER = re.compile(r"(?<!\S)(?:(pinned):(\S*)|(assistant):(\S+))", re.IGNORECASE)
_EDGE_PUNCTUATION = ".,;:!?'\"()[]{}"


class InvalidCursor(ValueError):
    pass


# -- the query ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    text: str  # lower-cased, as typed: matched as a substring of titles
    words: tuple[str, ...]  # its words: a phrase for full-text search


@dataclass(frozen=True)
class ParsedQuery:
    raw: str
    text: str = ""  # the query without its filters, for websearch_to_tsquery
    groups: tuple[tuple[Term, ...], ...] = ()  # every group must match, by any one of its terms
    excluded: tuple[Term, ...] = ()
    pinned: bool = False
    assistants: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.groups or self.pinned or self.assistants)

    @property
    def positive_words(self) -> list[str]:
        return [word for group in self.groups for term in group for word in term.words]


def parse_query(raw: str) -> ParsedQuery:
    """Split a search box entry into filters and websearch-style terms."""
    raw = storable((raw or "")[:MAX_QUERY_CHARS])  # as stored: NUL matches the U+FFFD it became
    pinned, assistants = False, []
    for match in _FILTER.finditer(raw):
        if match.group(1):
            pinned = match.group(2).lower() not in ("no", "false", "0")
        else:
            assistants.append(match.group(4))
    text = " ".join(_FILTER.sub(" ", raw).split())
    groups: list[list[Term]] = []
    excluded: list[Term] = []
    pending_or = False
    for negated, phrase, word in _TOKEN.findall(text):
        if not phrase and word.lower() == "or":
            pending_or = bool(groups)
            continue
        if not phrase and word.startswith("-") and len(word) > 1:
            negated, word = "-", word[1:]
        typed = (phrase or word).lower().strip(_EDGE_PUNCTUATION + " ")
        term = Term(typed, tuple(_WORD.findall(typed)))
        if not term.words:
            continue
        if negated:
            excluded.append(term)
        elif pending_or:
            groups[-1].append(term)
        else:
            groups.append([term])
        pending_or = False
    return ParsedQuery(
        raw=raw, text=text, groups=tuple(tuple(g) for g in groups), excluded=tuple(excluded),
        pinned=pinned, assistants=tuple(dict.fromkeys(assistants)),
    )


# -- results -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snippet:
    """Plain text (a title, or an excerpt of a message) and the parts of it that matched: `spans` are
    (start, end) offsets into `text`, in order, not overlapping, never empty."""

    text: str
    spans: tuple[tuple[int, int], ...] = ()

    def segments(self) -> list[tuple[str, bool]]:
        """The text in pieces, each with whether it matched."""
        pieces, at = [], 0
        for start, end in self.spans:
            if start > at:
                pieces.append((self.text[at:start], False))
            pieces.append((self.text[start:end], True))
            at = end
        if at < len(self.text):
            pieces.append((self.text[at:], False))
        return pieces

    def __str__(self) -> str:
        return self.text


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


@dataclass(frozen=True)
class _Cursor:
    """Where a page ended. Titles: (rank, last_activity_at, session pk). Messages: (the session's
    last_activity_at, session pk, message seq); a bare "m" means the first message hit."""

    phase: str  # "t" (titles) or "m" (messages)
    rank: int = 0
    stamp: datetime | None = None
    pk: int | None = None
    seq: int = 0


# -- keyset cursors (the sidebar's too) ----------------------------------------------------------------


def micros(stamp: datetime) -> int:
    """A timestamp as whole microseconds since the epoch, as cursors carry it."""
    return int(stamp.timestamp()) * 1_000_000 + stamp.microsecond


def encode_cursor(*values: str | int | datetime) -> str:
    """Where a keyset page ended, as text: the values joined by dots, datetimes as `micros`."""
    return ".".join(str(micros(value)) if isinstance(value, datetime) else str(value) for value in values)


def parse_id(text: str) -> int | None:
    """`text` as a whole number a database column holds (ASCII digits, at most 2**63 - 1), else None."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > MAX_INTEGER:
        return None
    return int(text)


MAX_INTEGER = 2**63 - 1  # the largest integer both databases store


def decode_cursor(text: str, *kinds: type) -> tuple:
    """The values of an `encode_cursor` text, read as `kinds` (str, int or datetime, one per value);
    InvalidCursor when the text is not such a cursor."""
    parts = (text or "").split(".")
    if len(parts) != len(kinds):
        raise InvalidCursor(f"Not a cursor: {text[:40]!r}")
    values = []
    for part, kind in zip(parts, kinds):
        if kind is str:
            values.append(part)
            continue
        if parse_id(part) is None:
            raise InvalidCursor(f"Not a cursor: {text[:40]!r}")
        if kind is datetime:
            seconds, micro = divmod(int(part), 1_000_000)
            try:
                values.append(datetime.fromtimestamp(seconds, tz=dt_timezone.utc).replace(microsecond=micro))
            except (OverflowError, ValueError, OSError):
                raise InvalidCursor(f"Not a cursor: {text[:40]!r}") from None
        else:
            values.append(int(part))
    return tuple(values)


def _encode(cursor: _Cursor) -> str:
    if cursor.phase == "m":
        return "m" if cursor.pk is None else encode_cursor("m", cursor.stamp, cursor.pk, cursor.seq)
    return encode_cursor("t", cursor.rank, cursor.stamp, cursor.pk)


def _decode(text: str) -> _Cursor:
    phase = text.partition(".")[0]
    if text == "m":
        return _Cursor("m")
    if phase == "m":
        _, stamp, pk, seq = decode_cursor(text, str, datetime, int, int)
        return _Cursor("m", stamp=stamp, pk=pk, seq=seq)
    if phase == "t":
        _, rank, stamp, pk = decode_cursor(text, str, int, datetime, int)
        return _Cursor("t", rank=rank, stamp=stamp, pk=pk)
    raise InvalidCursor(f"Not a search cursor: {text[:40]!r}")


# -- entry point -------------------------------------------------------------------------------------


def search_sessions(user, query: str, *, limit: int = 20, cursor: str | None = None,
                    using: str = "default", one_per_session: bool = False) -> SearchPage:
    """One page of `user`'s live sessions matching `query`: title hits, then message hits. With
    `one_per_session`, a session's matching messages are one hit (its newest, counting the others on the
    page in `more`), and the next page starts at the next session."""
    if limit < 1:
        raise ValueError("limit must be positive")
    parsed = parse_query(query)
    after = _decode(cursor) if cursor else None
    page = SearchPage(parsed, first=after is None, continues_messages=bool(after and after.phase == "m"))
    if parsed.is_empty:
        return page
    sessions = ChatSession.objects.using(using).for_user(user).alive()
    if parsed.pinned:
        sessions = sessions.filter(pinned_at__isnull=False)
    if parsed.assistants:  # ids are slugs: accept them as typed or lower-cased
        sessions = sessions.filter(component_id__in={*parsed.assistants, *(a.lower() for a in parsed.assistants)})
    content, fuzzy = _backends(connections[using])

    if after is None or after.phase == "t":
        titles = _title_hits(sessions, parsed, after, limit + 1, fuzzy, using)
        if len(titles) > limit:
            page.title_hits = titles[:limit]
            last = titles[limit - 1]
            page.next_cursor = _encode(
                _Cursor("t", rank=last.rank, stamp=last.session.last_activity_at, pk=last.session.pk))
            return page
        page.title_hits = titles
    if not parsed.groups:  # filters alone list sessions, not messages
        return page
    room = limit - len(page.title_hits)
    message_after = after if after and after.phase == "m" else None
    # Fetch one more than fits: it says whether a further page exists (even when none fits here).
    messages = _message_hits(content, sessions, parsed, message_after, room + 1, using)
    page.message_hits = messages[:room]
    if len(messages) > room:
        last = page.message_hits[-1] if room else None
        page.next_cursor = _encode(_Cursor("m", stamp=last.session.last_activity_at, pk=last.session.pk,
                                           seq=0 if one_per_session else last.seq) if last else _Cursor("m"))
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


def _backends(connection) -> tuple[str, str | None]:
    """(content search, title typo search) available on this database."""
    if getattr(settings, "SESSIONS_SEARCH_BACKEND", "") == "basic":  # force the LIKE fallback
        return "basic", None
    if connection.vendor == "postgresql":
        return "postgresql", "postgresql"
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%s, %s)",
                           [MESSAGE_FTS, NAME_TRIGRAMS])
            tables = {row[0] for row in cursor.fetchall()}
        return ("fts5" if MESSAGE_FTS in tables else "basic"), ("fts5" if NAME_TRIGRAMS in tables else None)
    return "basic", None


# -- titles ------------------------------------------------------------------------------------------


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


def _title_hits(sessions: QuerySet, parsed: ParsedQuery, after: _Cursor | None, n: int,
                fuzzy: str | None, using: str) -> list[TitleHit]:
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
        hits = [TitleHit(s, _highlight_terms(s.name, parsed)) for s in exact[:n]]
    words = parsed.positive_words
    if len(hits) < n and fuzzy and len("".join(words)) >= 3:
        fuzzy_after = after if after and after.rank > 0 else None
        similar = _similar_titles_pg if fuzzy == "postgresql" else _similar_titles_sqlite
        hits += similar(candidates.exclude(_substring_q(parsed, vendor)), parsed, fuzzy_after, n - len(hits), using)
    return hits


def _similarity_rank(similarity: float) -> int:
    return 101 - math.floor(similarity * 100)  # 1 (identical) .. 51 (at the threshold): after exact hits (0)


def _similar_titles_pg(candidates: QuerySet, parsed: ParsedQuery, after: _Cursor | None, n: int,
                       using: str) -> list[TitleHit]:
    text = " ".join(parsed.positive_words)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # `%>` (the GIN-indexable form of word_similarity >= threshold) reads the threshold from here.
        cursor.execute("SELECT set_config('pg_trgm.word_similarity_threshold', %s, true)",
                       [str(CANDIDATE_SIMILARITY)])
        similar = (candidates.filter(name__trigram_word_similar=text)
                   .annotate(similarity=TrigramWordSimilarity(text, "name")).order_by("-similarity", "-pk"))
        rows = list(similar[:FUZZY_CANDIDATES])
    return _ranked_similar(rows, parsed.positive_words, after, n)


def _similar_titles_sqlite(candidates: QuerySet, parsed: ParsedQuery, after: _Cursor | None, n: int,
                           using: str) -> list[TitleHit]:
    words = parsed.positive_words
    grams = sorted({word[i:i + 3] for word in words for i in range(len(word) - 2)})
    if not grams:
        return []
    scope_sql, scope_params = _sql(candidates.values("pk"), using)
    match = " OR ".join('"{}"'.format(gram.replace('"', '""')) for gram in grams)
    with connections[using].cursor() as cursor:
        # `+rowid`: check the scope per match; as an index constraint SQLite would run the MATCH once per session.
        cursor.execute(
            f"SELECT rowid FROM {NAME_TRIGRAMS} WHERE {NAME_TRIGRAMS} MATCH %s AND +rowid IN ({scope_sql})"
            f" ORDER BY rank LIMIT {FUZZY_CANDIDATES}",
            [match, *scope_params],
        )
        ids = [row[0] for row in cursor.fetchall()]
    return _ranked_similar(candidates.filter(pk__in=ids), words, after, n)


def _ranked_similar(candidates, words: list[str], after: _Cursor | None, n: int) -> list[TitleHit]:
    """The candidates (sessions sharing trigrams with the query) similar enough to it, closest first, then
    like the sidebar; the page after `after`."""
    scored = []
    for session in candidates:
        similarity = title_similarity(words, session.name)
        if similarity >= TITLE_SIMILARITY:
            scored.append((_similarity_rank(similarity), session))

    def key(rank: int, stamp: datetime, pk: int) -> tuple[int, int, int]:
        return rank, -micros(stamp), -pk

    scored.sort(key=lambda item: key(item[0], item[1].last_activity_at, item[1].pk))
    if after:
        scored = [item for item in scored
                  if key(item[0], item[1].last_activity_at, item[1].pk) > key(after.rank, after.stamp, after.pk)]
    return [TitleHit(s, _highlight_similar(s.name, words), rank=rank) for rank, s in scored[:n]]


def title_similarity(words: list[str], name: str) -> float:
    """How close a title is to the query's words, 0 to 1: pg_trgm's word similarity, or, where every word
    of four letters or more is a typo of a word of the title (a letter wrong, missing, extra, or two swapped:
    one such edit per word of up to seven letters, two in a longer one), the share of letters typed right
    (trigrams alone rate a swap low: "panckaes" shares under half of the trigrams of "pancakes")."""
    trigram = text_similarity(" ".join(words), name)
    title_words = _WORD.findall(name.lower())
    edits, letters = 0, 0
    for word in words:
        if len(word) < 4 or not title_words:
            return trigram
        allowed = 1 if len(word) <= 7 else 2
        distance = min(_edit_distance(word, other, allowed) for other in title_words)
        if distance > allowed:
            return trigram
        edits, letters = edits + distance, letters + len(word)
    return max(trigram, 1 - edits / letters) if letters else trigram


def _edit_distance(a: str, b: str, bound: int) -> int:
    """Damerau-Levenshtein distance (optimal string alignment) between a and b, or bound + 1 once over it."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    before, row = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > bound:
            return bound + 1
        before, row = row, current
    return row[-1]


def _trigram_sequence(text: str) -> list[str]:
    """pg_trgm's trigrams in text order: lower-cased words, each padded with two spaces before, one after."""
    grams = []
    for word in _WORD.findall(text.lower()):
        padded = f"  {word} "
        grams += [padded[i:i + 3] for i in range(len(padded) - 2)]
    return grams


def text_similarity(query: str, name: str) -> float:
    """pg_trgm's word_similarity(query, name), in Python: the best match between the query's trigrams and
    any stretch of the name's, where trigrams of the stretch missing from the query count against it."""
    wanted = set(_trigram_sequence(query))
    sequence = _trigram_sequence(name)
    best = 0.0
    # A best stretch starts and ends on a shared trigram, so only those starting points are tried.
    for start in (i for i, gram in enumerate(sequence) if gram in wanted):
        shared, extra = set(), set()
        for gram in sequence[start:]:
            (shared if gram in wanted else extra).add(gram)
            if gram in wanted:
                best = max(best, len(shared) / (len(wanted) + len(extra)))
    return best


# -- messages ----------------------------------------------------------------------------------------


def _message_hits(backend: str, sessions: QuerySet, parsed: ParsedQuery, after: _Cursor | None, n: int,
                  using: str) -> list[MessageHit]:
    """Matching messages ordered like the sidebar: most recently active session first, then newest
    message first within it. Common words are found by walking the user's sessions in that order;
    rare ones from the full-text index (PostgreSQL's planner picks; SQLite is told, see below)."""
    keyset, keyset_params = "", []
    if after and after.pk is not None:
        keyset = "AND (s.last_activity_at, s.id, m.seq) < (%s, %s, %s)"
        stamp = connections[using].ops.adapt_datetimefield_value(after.stamp)
        keyset_params = [stamp, after.pk, after.seq]
    scope_sql, scope_params = _sql(sessions.values("id", "last_activity_at"), using)
    table = Message._meta.db_table
    order = f"ORDER BY s.last_activity_at DESC, s.id DESC, m.seq DESC LIMIT {int(n)}"
    with connections[using].cursor() as cursor:
        if backend == "postgresql":
            query_params = [TS_CONFIG, parsed.text, MARKUP_CHARS + _OPEN + _CLOSE, MARKUP_STANDINS]
            cursor.execute(
                f"SELECT m.id FROM ({scope_sql}) AS s JOIN {table} AS m ON m.session_id = s.id"
                f" WHERE m.search_vector @@ websearch_to_tsquery(%s::regconfig, translate(%s, %s, %s))"
                f" {keyset} {order}",
                [*scope_params, *query_params, *keyset_params],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                # Only stop words ("what is this"): the English configuration drops every one, so the
                # index can find nothing. Look for the words as typed instead, as SQLite's index would.
                cursor.execute("SELECT numnode(websearch_to_tsquery(%s::regconfig, translate(%s, %s, %s)))",
                               query_params)
                if cursor.fetchone()[0] == 0:
                    return _message_hits_basic(sessions, parsed, after, n, using)
            return _headlined_hits(ids, parsed, using)
        if backend == "fts5":
            _index_new_messages(using)
            match = _fts5_expression(parsed)
            cursor.execute(f"SELECT count(*) FROM (SELECT 1 FROM {MESSAGE_FTS} WHERE {MESSAGE_FTS} MATCH %s"
                           f" LIMIT {FTS5_DRIVING_LIMIT})", [match])
            if cursor.fetchone()[0] < FTS5_DRIVING_LIMIT:
                # Few matches: start from the index, then sort them.
                joins = (f"{MESSAGE_FTS} AS f JOIN {table} AS m ON m.id = f.rowid"
                         f" JOIN ({scope_sql}) AS s ON s.id = m.session_id")
            else:
                # Many: walk the sessions newest first (CROSS JOIN keeps that order) and stop at n.
                joins = f"({scope_sql}) AS s CROSS JOIN {table} AS m CROSS JOIN {MESSAGE_FTS} AS f"
            cursor.execute(
                f"SELECT m.id FROM {joins} WHERE m.session_id = s.id AND f.rowid = m.id"
                f" AND f.{MESSAGE_FTS} MATCH %s {keyset} {order}",
                [*scope_params, match, *keyset_params],
            )
            return _snippeted_hits([row[0] for row in cursor.fetchall()], match, using)
    return _message_hits_basic(sessions, parsed, after, n, using)


def _index_new_messages(using: str) -> None:
    """Index the user and assistant messages stored since the last search (SQLite FTS5).

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


def _headlined_hits(ids: list[int], parsed: ParsedQuery, using: str) -> list[MessageHit]:
    query = SearchQuery(_unmarkup(Value(parsed.text)), config=TS_CONFIG, search_type="websearch")
    text = _unmarkup(Left("content", INDEXED_CHARS))
    marks = {"config": TS_CONFIG, "start_sel": _OPEN, "stop_sel": _CLOSE}
    headline = Case(
        # A short message is shown whole; fragments would drop its closing punctuation.
        When(length__lte=SHORT_MESSAGE_CHARS, then=SearchHeadline(text, query, highlight_all=True, **marks)),
        default=SearchHeadline(text, query, max_words=SNIPPET_WORDS, min_words=SNIPPET_WORDS // 2, short_word=2,
                               max_fragments=2, fragment_delimiter=" … ", **marks),
    )
    rows = _hit_rows(ids, using).annotate(length=Length("content"), headline=headline)
    by_pk = {m.pk: m for m in rows}
    standins = str.maketrans(MARKUP_STANDINS, MARKUP_CHARS)
    return [_hit(by_pk[pk], _snippet(by_pk[pk].headline.translate(standins))) for pk in ids if pk in by_pk]


def _snippeted_hits(ids: list[int], match: str, using: str) -> list[MessageHit]:
    if not ids:
        return []
    with connections[using].cursor() as cursor:
        # Only for the page's rows: snippet() re-reads and re-tokenizes each message.
        cursor.execute(
            f"SELECT rowid, snippet({MESSAGE_FTS}, 0, %s, %s, '…', {SNIPPET_WORDS}) FROM {MESSAGE_FTS}"
            f" WHERE {MESSAGE_FTS} MATCH %s AND rowid IN ({', '.join(['%s'] * len(ids))})",
            [_OPEN, _CLOSE, match, *ids],
        )
        snippets = dict(cursor.fetchall())
    by_pk = {m.pk: m for m in _hit_rows(ids, using)}
    return [_hit(by_pk[pk], _snippet(snippets.get(pk, ""))) for pk in ids if pk in by_pk]


def _unmarkup(expression):
    """The text as indexed: markup characters become blanks, so `<b>word</b>` is not a tag to drop,
    and our highlight sentinels are removed (translate() deletes characters it has no match for)."""
    return Func(expression, Value(MARKUP_CHARS + _OPEN + _CLOSE), Value(MARKUP_STANDINS), function="translate")


def _fts5_expression(parsed: ParsedQuery) -> str:
    def phrase(term: Term) -> str:
        return '"{}"'.format(" ".join(term.words).replace('"', '""'))

    expression = " AND ".join("(" + " OR ".join(phrase(t) for t in group) + ")" for group in parsed.groups)
    if parsed.excluded:
        expression = f"({expression}) NOT ({' OR '.join(phrase(t) for t in parsed.excluded)})"
    return expression


def _message_hits_basic(sessions: QuerySet, parsed: ParsedQuery, after: _Cursor | None, n: int,
                        using: str) -> list[MessageHit]:
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
    found = list(messages.values_list("pk", "content")[:n])
    by_pk = {m.pk: m for m in _hit_rows([pk for pk, _ in found], using)}
    terms = [t.text for group in parsed.groups for t in group]
    return [_hit(by_pk[pk], _excerpt(content, terms)) for pk, content in found if pk in by_pk]


def _hit_rows(ids: list[int], using: str) -> QuerySet:
    return (
        Message.objects.using(using).filter(pk__in=ids).select_related("session", "run")
        .only("pk", "seq", "role", "created_at", "session__session_id", "session__name", "session__component_id",
              "session__last_activity_at", "session__pinned_at", "run__run_id")
        .order_by()
    )


def _hit(message: Message, snippet: Snippet) -> MessageHit:
    return MessageHit(session=message.session, message_id=message.pk, run_id=message.run.run_id, seq=message.seq,
                      role=message.role, created_at=message.created_at, snippet=snippet)


def _sql(queryset: QuerySet, using: str) -> tuple[str, tuple]:
    """SQL and parameters of a queryset, to embed in a raw query (FTS5 tables have no model)."""
    return queryset.order_by().query.get_compiler(using=using).as_sql()


# -- highlighting ------------------------------------------------------------------------------------


def _snippet(marked: str) -> Snippet:
    """The text between the sentinel pairs of `marked` as spans (balanced whatever the input)."""
    parts, spans, length, start = [], [], 0, None
    for piece in re.split(f"([{_OPEN}{_CLOSE}])", marked):
        if piece == _OPEN:
            start = length if start is None else start
        elif piece == _CLOSE:
            if start is not None and length > start:
                spans.append((start, length))
            start = None
        elif piece:
            parts.append(piece)
            length += len(piece)
    if start is not None and length > start:
        spans.append((start, length))
    return Snippet("".join(parts), tuple(spans))


def _mark_spans(text: str, pattern: re.Pattern | None) -> str:
    if pattern is None:
        return text
    return pattern.sub(lambda m: f"{_OPEN}{m.group(0)}{_CLOSE}", text)


def _terms_pattern(terms: list[str]) -> re.Pattern | None:
    terms = sorted({t for t in terms if t}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE) if terms else None


def _highlight_terms(name: str, parsed: ParsedQuery) -> Snippet:
    terms = [term.text for group in parsed.groups for term in group]
    return _snippet(_mark_spans(name.translate(_SENTINELS), _terms_pattern(terms)))


def _highlight_similar(name: str, query_words: list[str]) -> Snippet:
    """Mark the words of a title that are close to a query word (the typo's target)."""
    def mark(match: re.Match) -> str:
        word = match.group(0)
        close = any(title_similarity([q], word) >= TITLE_SIMILARITY for q in query_words)
        return f"{_OPEN}{word}{_CLOSE}" if close else word

    return _snippet(_WORD.sub(mark, name.translate(_SENTINELS)))


def _excerpt(content: str, terms: list[str], width: int = 160) -> Snippet:
    """A window of plain text around the first match (the LIKE fallback has no snippet function)."""
    content = content.translate(_SENTINELS)
    pattern = _terms_pattern(terms)
    first = pattern.search(content) if pattern else None
    start = max(0, (first.start() if first else 0) - width // 3)
    if start:
        space = content.find(" ", start)
        start = space + 1 if 0 <= space < start + 20 else start
    end = min(len(content), start + width)
    window = _mark_spans(content[start:end], pattern)
    return _snippet(("…" if start else "") + window + ("…" if end < len(content) else ""))
