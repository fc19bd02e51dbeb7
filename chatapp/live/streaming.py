"""A run this process is streaming, as the pages following it need it: its text, the numbered token
batches made of it (`chat.tokens`: {"run_id", "seq" (1, 2, ... per run), "origin" (names this process),
"keep", "html" (the frame drawn once here for every socket: keep the reply's first `keep` elements, then
this; see chatapp/markdown_stream.py), "elements" (the reply's completed elements after this batch)}), its
tool rows, and what a page catching up needs (follower.py). The run task (runner.py) feeds it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from django.conf import settings

from .. import rendering
from ..markdown_stream import ReplyStream
from .fragments import StreamedRun

PROCESS = uuid.uuid4().hex  # names this process in the token batches it sends (`origin`)


class Mark(NamedTuple):
    """What a page has of a streaming reply: the last batch it was sent, and the completed elements it holds."""

    seq: int
    elements: int


@dataclass
class LiveRun:
    """A run this process is streaming: what its batches are made of, and what a page catching up needs."""

    run: StreamedRun  # as its start event describes it
    parts: list[str] = field(default_factory=list)
    length: int = 0  # characters in `parts`
    flushed: int = 0  # characters already sent to the group
    last_flush: float = 0.0
    stream: ReplyStream = field(default_factory=ReplyStream)  # the reply drawn as of the last batch
    seq: int = 0  # batches sent
    pace: float = 0.0  # seconds the next batch waits at least (last drawing's CPU time / CHAT_STREAM_DRAW_SHARE)
    tool_calls: dict[str, rendering.ToolCallView] = field(default_factory=dict)  # its tool rows, by call id
    changed_keys: list[str] = field(default_factory=list)
    pending_changes: list[dict] = field(default_factory=list)  # timeline entries stored when the run ends
    state: tuple[dict, int] | None = None  # the state and version its last change made (stored when it ends)
    steps: dict[str, bool] = field(default_factory=dict)  # step and member runs shown: run id -> is a member
    step_text: dict[str, str] = field(default_factory=dict)  # a running step's or member's words so far
    step_sent: dict[str, float] = field(default_factory=dict)  # when its words were last sent (monotonic)
    row_pushed: asyncio.Task | None = None  # the sidebar row pushed as the run started (off its first token's path)
    announced: asyncio.Event = field(default_factory=asyncio.Event)  # its chat.run_done has been sent

    def __post_init__(self):
        _recent_runs[self.run_id] = self

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    @property
    def mark(self) -> Mark:
        """What a page shown the text so far has of the stream."""
        return Mark(self.seq, self.stream.completed)

    def snapshot(self) -> tuple[StreamedRun, list[rendering.ToolCallView], Mark]:
        """The run with its text so far, its tool rows, and what a page shown them has of the stream."""
        return replace(self.run, content=self.text), list(self.tool_calls.values()), self.mark

    def add(self, delta: str) -> None:
        self.parts.append(delta)
        self.length += len(delta)

    def flush_wait(self, batch: float, now: float) -> float:
        """Seconds until the next batch is due (<= 0: now); the first text goes at once."""
        return self.last_flush + max(batch, self.pace) - now

    def next_batch(self) -> dict | None:
        """The text not yet sent as the next numbered batch (the fields of `chat.tokens`), drawn once here
        for every socket: the blocks completed since the last batch and the open one. None if there is none."""
        if self.flushed >= self.length:
            return None
        text = self.text
        seen = len(self.stream.segments)
        self.flushed, self.last_flush = len(text), time.monotonic()
        spent = time.thread_time()
        self.stream.feed(text)
        # A long open block (a code block of hundreds of lines) is drawn less often; a paragraph at every batch.
        self.pace = (time.thread_time() - spent) / settings.CHAT_STREAM_DRAW_SHARE
        self.seq += 1
        keep, html = self.stream.frame(seen)
        return {"run_id": self.run_id, "seq": self.seq, "origin": PROCESS, "keep": keep, "html": html,
                "elements": self.stream.completed}


_live: dict[int, LiveRun] = {}  # session pk -> its run in flight here
# Live runs still referenced (by their task until their final form is sent, or by a socket's check): a run
# of this process missing here has been announced.
_recent_runs: weakref.WeakValueDictionary[str, LiveRun] = weakref.WeakValueDictionary()


def live_run(session_pk: int) -> LiveRun | None:
    """The session's run this process is streaming, if any."""
    return _live.get(session_pk)


def recent_run(run_id: str) -> LiveRun | None:
    """A run of this process whose final form may not have been sent yet."""
    return _recent_runs.get(run_id)


def streaming(session_pk: int, live: LiveRun) -> None:
    """`live` is the session's run in flight here."""
    _live[session_pk] = live


def done_streaming(session_pk: int, live: LiveRun) -> None:
    if _live.get(session_pk) is live:
        del _live[session_pk]
