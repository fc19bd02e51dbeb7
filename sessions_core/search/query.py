"""The search box's entry as a query: websearch-style terms plus the `pinned:` and `assistant:` filters."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..storable import replace_unstorable

MAX_QUERY_CHARS = 500

WORD = re.compile(r"[^\W_]+")
_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')
_FILTER = re.compile(r"(?<!\S)(?:(pinned):(\S*)|(assistant):(\S+))", re.IGNORECASE)
_EDGE_PUNCTUATION = ".,;:!?'\"()[]{}"


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

    @property
    def positive_texts(self) -> list[str]:
        """Every wanted term as typed (lower-cased), for substring matches."""
        return [term.text for group in self.groups for term in group]


def parse_query(raw: str) -> ParsedQuery:
    """Split a search box entry into filters and websearch-style terms."""
    raw = replace_unstorable((raw or "")[:MAX_QUERY_CHARS])  # as stored: NUL matches the U+FFFD it became
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
        term = Term(typed, tuple(WORD.findall(typed)))
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
