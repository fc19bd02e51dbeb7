"""A reply's markdown drawn while it streams, with the renderer and sanitizer of the final render.

The text so far is split into completed top-level blocks and the open last one. A block is complete once
the next one has started: markdown's block structure is decided line by line, so nothing later changes
it (a setext underline, a table's delimiter row, a list's next item or a fence's end belong to the open
block, which is parsed again with each batch). Completed blocks are rendered once, as a segment of the
reply, and are never parsed again; each batch parses and renders only the text from the open block on.
Rendered as it is, concatenated, the whole equals `rendering.render_markdown` of the text so far
(tests/web/test_markdown_stream.py checks it at every prefix of its samples).

One exception: a reference definition (`[x]: https://...`) can turn earlier text into a link, so a reply
that has one is drawn whole from then on (one segment less: the browser is told to keep nothing).

A frame for a browser is (keep, html): keep the reply's first `keep` elements (the completed blocks it
has), then put `html` (the blocks completed since, then the open block) after them. A browser that holds
the reply of any prefix of the text has that prefix's completed blocks right, so any frame that keeps no
more elements than those brings it up to date (chatapp/live/follower.py relies on it).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

from django.utils.safestring import SafeString, mark_safe

from .rendering import markdown_tokens, render_markdown_tokens

_LINE_BREAK = re.compile(r"\r\n?|\n")  # what markdown-it counts as a line break (it normalizes them to \n)


def _top_level(tokens: list) -> list[int]:
    """Indexes of the tokens that open a top-level block (each renders one element of the reply)."""
    return [i for i, token in enumerate(tokens) if token.level == 0 and token.nesting != -1]


def _line_offset(text: str, line: int) -> int:
    """Where line number `line` (0-based, counted as markdown-it counts) starts in `text`."""
    if line == 0:
        return 0
    for number, match in enumerate(_LINE_BREAK.finditer(text), start=1):
        if number == line:
            return match.end()
    return len(text)


@dataclass
class ReplyStream:
    """The rendered state of one streaming reply, updated once per batch (`feed`) for every socket."""

    segments: list[str] = field(default_factory=list)  # sanitized HTML of completed blocks, in order
    elements: list[int] = field(default_factory=lambda: [0])  # elements before each segment (and after the last)
    stable_chars: int = 0  # characters of the text the segments cover
    tail: str = ""  # sanitized HTML of the open block (the text after `stable_chars`)
    whole: bool = False  # a reference definition was seen: the reply is drawn whole from now on

    def feed(self, text: str) -> None:
        """Bring the rendered state up to `text` (the whole reply so far; it only grows)."""
        env: dict = {}
        rest = text[self.stable_chars:]
        tokens = markdown_tokens(rest, env)
        if env.get("references") and not self.whole:
            self.whole, self.segments, self.elements, self.stable_chars = True, [], [0], 0
            rest = text
            tokens = markdown_tokens(rest, env)
        starts = _top_level(tokens)
        if not self.whole and len(starts) > 1:
            last = starts[-1]
            done, tokens = tokens[:last], tokens[last:]
            self.segments.append(render_markdown_tokens(done, env))
            self.elements.append(self.elements[-1] + len(starts) - 1)
            self.stable_chars += _line_offset(rest, tokens[0].map[0])
        self.tail = render_markdown_tokens(tokens, env)

    @property
    def completed(self) -> int:
        """Elements of the completed blocks: what a frame may tell a browser to keep."""
        return self.elements[-1]

    def frame_for(self, kept: int) -> tuple[int, SafeString]:
        """What a browser whose reply starts with `kept` elements of completed blocks needs."""
        return self.frame(bisect_right(self.elements, kept) - 1)

    def frame(self, since: int = 0) -> tuple[int, SafeString]:
        """What a browser that has the first `since` segments needs: (elements to keep, HTML after them)."""
        since = min(since, len(self.segments))
        return self.elements[since], mark_safe("".join(self.segments[since:]) + self.tail)  # noqa: S308 - sanitized parts
