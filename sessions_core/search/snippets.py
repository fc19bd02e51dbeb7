"""Snippets are data, not HTML: a `Snippet` is plain text with the (start, end) spans that matched; the
web layer escapes the text and marks the spans.

The databases mark matches in the text they return (ts_headline, snippet()) with two private-use
characters, `OPEN` and `CLOSE`; `from_marked` turns them into spans. Typed by a user, they are removed
from the text first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .query import WORD, ParsedQuery
from .similarity import TITLE_SIMILARITY, title_similarity

OPEN, CLOSE = "\ue000", "\ue001"
_SENTINELS = {ord(OPEN): None, ord(CLOSE): None}
SNIPPET_WORDS = 20


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


def from_marked(marked: str) -> Snippet:
    """The text between the OPEN/CLOSE pairs of `marked` as spans (balanced whatever the input)."""
    parts, spans, length, start = [], [], 0, None
    for piece in re.split(f"([{OPEN}{CLOSE}])", marked):
        if piece == OPEN:
            start = length if start is None else start
        elif piece == CLOSE:
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
    return pattern.sub(lambda m: f"{OPEN}{m.group(0)}{CLOSE}", text)


def _terms_pattern(terms: list[str]) -> re.Pattern | None:
    terms = sorted({t for t in terms if t}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in terms), re.IGNORECASE) if terms else None


def highlight_terms(name: str, parsed: ParsedQuery) -> Snippet:
    """A title with the query's terms marked (a title that holds them all)."""
    return from_marked(_mark_spans(name.translate(_SENTINELS), _terms_pattern(parsed.positive_texts)))


def highlight_similar(name: str, query_words: list[str]) -> Snippet:
    """A title with the words close to a query word marked (the typo's target)."""
    def mark(match: re.Match) -> str:
        word = match.group(0)
        close = any(title_similarity([q], word) >= TITLE_SIMILARITY for q in query_words)
        return f"{OPEN}{word}{CLOSE}" if close else word

    return from_marked(WORD.sub(mark, name.translate(_SENTINELS)))


def excerpt(content: str, terms: list[str], width: int = 160) -> Snippet:
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
    return from_marked(("…" if start else "") + window + ("…" if end < len(content) else ""))
