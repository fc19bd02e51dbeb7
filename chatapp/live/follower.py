"""One socket's side of the live view (`Follower`): what a page is sent when its socket (re)connects, and
each streaming reply's token batches applied so that the page ends with every reply whole, none twice.

What a page has of a reply is a `Mark`: the last batch it was sent, and how many elements of the reply it
holds that are completed blocks. A batch is a frame (keep the reply's first `keep` elements, then its
HTML), which applies to a page holding at least `keep` completed elements; any later batch applies to a
page that had the one before it. The channel layer drops what a channel cannot hold, so a batch may find
the page short (a gap), and a page that connects mid-reply has no batch at all. The page is then drawn
anew from what is known of the run:

- a run this process is streaming, from memory (chatapp/live/runner.py): whatever the page is behind on,
  in one frame (the batches that frame covers are skipped), or the whole run so far when its fragment may
  be missing too;
- a run of another process, from the database: the run as stored, with the text the engine checkpoints
  while it streams. Later batches that keep no more than that text's completed blocks apply in order;
  while they do not, the stored run is read again, at most once every STORED_READ_SECONDS.

Processes share nothing beyond the session's group: no socket asks another process for anything. A run's
final form (`chat.run_done`) ends it for the page; later batches are stale. The consumer makes one
Follower per socket, hands it the layer events and the query string, and sends what it returns.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from contextlib import suppress
from urllib.parse import parse_qs

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings

from sessions_core.models import ChatSession, Run, RunStatus

from .. import dbthreads, rendering
from ..broadcast import session_row_html
from . import fragments, leases, queue, streaming
from .streaming import Mark

ID_MAX = 64  # the longest run or queued id a socket may send
NAME_MAX = 300  # the longest session name a socket's query is compared on
STORED_READ_SECONDS = 1.0  # about how often the engine stores a streaming run's text
ANNOUNCE_WAIT_SECONDS = 10.0  # at most this long for a run's final form to be sent after it leaves the runner


def _catch_up_reads(session_pk: int, last_run: str | None, running: str, here: str, elsewhere: bool):
    """A (re)connected page's reads together: the run another process is streaming (when the row says one
    may be) as stored, what the page has not seen (when it said what it shows), the messages waiting."""
    there = ""
    if elsewhere:
        there = (Run.objects.filter(session_id=session_pk, status=RunStatus.RUNNING, parent_run__isnull=True)
                 .order_by("-pk").values_list("run_id", flat=True).first()) or ""
    html, append = "", False
    if last_run is not None or running:
        html, append = fragments.missed(session_pk, last_run, running, here or there)
    stored = fragments.stored_reply(session_pk, there, append) if there else None
    return html, append, queue.waiting(session_pk), there, stored


def _streamed_catch_up(run, calls, append: bool, live_state: ChatSession | None, changed_keys, pending_changes) -> str:
    """A run this process streams, as a page that connects mid-run needs it: the run so far, the status
    line, and the state panel with the run's changes when it made some. Reads the database."""
    html = fragments.streamed_html(run, calls, append) + rendering.render_status(fragments.RUNNING_STATUS)
    if live_state is not None:
        html += fragments.state_html(live_state, changed_keys, pending_changes)
    return html


class Follower:
    """One socket's side of the live view. `send` sends HTML to this socket only; `channel_name` is the
    socket's own channel (for its note to itself, `chat.check_done`)."""

    def __init__(self, session: ChatSession, channel_name: str, send: Callable[[str], Awaitable[None]]):
        self.session = session
        self.channel_name = channel_name
        self.send = send
        self.have: dict[str, Mark] = {}  # run id -> what the page has of its reply
        self.finished: set[str] = set()  # runs shown in their final form: later batches are stale
        self.checking: set[str] = set()  # runs ended here whose final form this socket has not had yet
        self.tasks: set[asyncio.Task] = set()  # those checks
        self.next_read: dict[str, float] = {}  # run id -> when its stored form may be read again
        self.watcher: asyncio.Task | None = None  # watches the lease of a run in another process...
        self.watched = ""  # ...this one
        self.queue_watcher: asyncio.Task | None = None  # takes over queued runs whose process stops

    def close(self) -> None:
        for watcher in (self.watcher, self.queue_watcher):
            if watcher is not None:
                watcher.cancel()
        for task in self.tasks:
            task.cancel()

    async def catch_up(self, query_string: bytes) -> None:
        """Bring a page that just (re)connected up to date; `query_string` is the socket's (see consumers)."""
        params = parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
        first = {key: values[0] for key, values in params.items() if values}
        pk = self.session.pk
        current = streaming.live_run(pk)
        # Taken now: later batches are numbered past its mark, or are skipped.
        snapshot = current.snapshot() if current else None
        # Whether another process runs it, as the row read when the socket connected says (a run that
        # starts elsewhere a moment later is caught up with by its first batch).
        idle = current is None and not self.session.is_running
        settled = ""
        if idle and leases.may_have_abandoned(self.session):
            # A run whose process stopped (a restart mid-reply) is interrupted now, and the page gets
            # its final form below, with the runs it shows as running or has not seen.
            settled = await leases.settle_abandoned(pk)
        last_run = first["last_run"][:ID_MAX] if "last_run" in first else None
        running = first.get("running", "")[: ID_MAX * 4]
        # One trip to a web database thread (not the one the engine's queries use) for all the reads.
        html, append, rows, there, stored = await dbthreads.run(
            _catch_up_reads, pk, last_run, running, current.run_id if current else "", not idle and current is None)
        if html:
            await self.send(html)
        if settled:
            await self.send(rendering.render_status(*fragments.INTERRUPTED_NOTE))
        if first.get("reconnect") or rows:
            await self.send(rendering.render_queue(rows))
        # The panel as stored, when the page's was drawn from an older state or summary (a run that ended
        # while the page loaded), or the page had not seen runs in full (they may have changed the state).
        stamp = rendering.panel_stamp(self.session)
        if first.get("reconnect") or html or first.get("panel", stamp)[:NAME_MAX] != stamp:
            await self.send(await dbthreads.run(fragments.state_panel_html, pk, self.session.owner_id))
        if first.get("shown_name", self.session.name)[:NAME_MAX] != self.session.name[:NAME_MAX]:
            # Named while the page loaded (a new chat's title, made before its socket listened).
            await self.send(await dbthreads.run(session_row_html, pk, self.session.owner_id))
        # Messages queued in a process that has stopped run now, here (the page sees them start); those
        # another process waits for, once their claims run out should it stop.
        if idle and rows:
            await queue.take_over_unclaimed(self.session)
            self._watch_queue()
        if snapshot is not None:
            # The run so far, the status line, and (the page drew the stored state) the run's state changes.
            run, calls, mark = snapshot
            live_state = None
            if current.state is not None:
                live_state = copy.copy(self.session)
                live_state.session_state, live_state.state_version = current.state
            await self.send(await dbthreads.run(_streamed_catch_up, run, calls, append, live_state,
                                                current.changed_keys, current.pending_changes))
            self.have[run.run_id] = mark
        elif stored is not None:
            html, elements = stored
            if elements is not None:
                html += rendering.render_status(fragments.RUNNING_STATUS)
            await self.send(html)
            if elements is None:
                self._ended(there)
            else:
                self.have[there] = Mark(0, elements)
                self.watched = there
                self.watcher = asyncio.create_task(self._watch_lease(there), name=f"chat-lease-watch-{pk}")

    async def _watch_lease(self, run_id: str) -> None:
        """A run of another process: should that process stop, show the run as interrupted when its
        lease runs out (a live process renews it every few seconds until the run is stored)."""
        pk = self.session.pk
        while (left := await leases.lease_left(pk, self.session.owner_id)) is not None:
            await asyncio.sleep(left + settings.CHAT_LEASE_GRACE_SECONDS)  # a deadline, not a wait on a condition
        settled = await leases.settle_abandoned(pk)
        await queue.take_over_unclaimed(self.session)
        self._watch_queue()
        html, _ = await dbthreads.run(fragments.missed, pk, None, run_id, "")  # its final form, whoever ended it
        if html:
            self._ended(run_id)
            await self.send(html + (rendering.render_status(*fragments.INTERRUPTED_NOTE) if settled else ""))

    def _watch_queue(self) -> None:
        if self.queue_watcher is None or self.queue_watcher.done():
            self.queue_watcher = asyncio.create_task(queue.take_over_when_unclaimed(self.session),
                                                     name=f"chat-queue-watch-{self.session.pk}")

    def _ended(self, run_id: str) -> None:
        self.have.pop(run_id, None)
        self.finished.add(run_id)

    async def _apply(self, event: dict) -> None:
        self.have[event["run_id"]] = Mark(event["seq"], event["elements"])
        await self.send(rendering.render_stream_frame(event["run_id"], event["keep"], event["html"]))

    async def tokens(self, event: dict) -> None:
        """`chat.tokens`: a numbered batch of a streaming reply; the socket is sent what it does not show yet."""
        run_id, seq = event["run_id"], event["seq"]
        if run_id in self.finished:
            return
        mark = self.have.get(run_id)
        if mark is not None and seq <= mark.seq:
            return  # covered already: by a frame drawn from the run itself, or by the catch-up
        current = streaming.live_run(self.session.pk)
        if current is not None and current.run_id == run_id:
            await self._draw(current, mark, seq)
        elif event["origin"] == streaming.PROCESS:
            self._check_done(run_id)
        else:
            if mark is None and seq == 1:
                mark = Mark(0, 0)  # its first batch: the run's fragment came just before it
            if mark is not None and event["keep"] <= mark.elements:
                await self._apply(event)
            else:
                await self._from_stored(event)

    async def _draw(self, live: streaming.LiveRun, mark: Mark | None, seq: int) -> None:
        """A run of this process: what the page is behind on, drawn from the run itself."""
        if mark is None and seq > 1:
            # Its first batch never came, so neither may have the run's fragment before it: the whole run
            # so far (it replaces the one on the page, or is added to the transcript).
            run, calls, mark = live.snapshot()
            html = await dbthreads.run(fragments.streamed_html, run, calls)
        else:
            keep, frame = live.stream.frame_for(mark.elements if mark else 0)
            mark, html = live.mark, rendering.render_stream_frame(live.run_id, keep, frame)
        self.have[live.run_id] = mark
        await self.send(html)

    async def _from_stored(self, event: dict) -> None:
        """A batch of another process's run that the page cannot apply: the run as stored, then the batch
        when the stored text has the completed blocks it keeps. Stored text older than the page's is not
        shown; it is read again at the next batch after STORED_READ_SECONDS."""
        run_id = event["run_id"]
        now = asyncio.get_running_loop().time()
        if now < self.next_read.get(run_id, 0.0):
            return
        self.next_read[run_id] = now + STORED_READ_SECONDS
        stored = await dbthreads.run(fragments.stored_reply, self.session.pk, run_id)
        if stored is None:
            return
        html, elements = stored
        mark = self.have.get(run_id)
        if elements is None:  # it has ended meanwhile: its final form
            self._ended(run_id)
            await self.send(html)
        elif event["keep"] <= elements:
            await self.send(html)
            await self._apply(event)
        elif mark is None or elements > mark.elements:
            self.have[run_id] = Mark(mark.seq if mark else 0, elements)
            await self.send(html)

    def _check_done(self, run_id: str) -> None:
        # It ran here and has ended since. Its chat.run_done is behind this batch in the socket's channel,
        # unless the layer dropped it: a note queued behind it to this socket finds out.
        if run_id not in self.checking:
            self.checking.add(run_id)
            task = asyncio.create_task(self._check_done_later(run_id), name=f"chat-check-done-{run_id}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _check_done_later(self, run_id: str) -> None:
        live = streaming.recent_run(run_id)
        if live is not None:  # its final form is being sent: the note must queue behind it
            with suppress(TimeoutError):
                await asyncio.wait_for(live.announced.wait(), ANNOUNCE_WAIT_SECONDS)
            del live
        try:
            await get_channel_layer().send(self.channel_name, {"type": "chat.check_done", "run_id": run_id})
        except ChannelFull:  # this socket is that far behind: its final form was surely dropped
            await self.check_done({"run_id": run_id})

    async def check_done(self, event: dict) -> None:
        """`chat.check_done`: this socket's own note (see `tokens`); the run's final form if it never came."""
        run_id = event["run_id"]
        self.checking.discard(run_id)
        if run_id not in self.finished:
            html, _ = await dbthreads.run(fragments.missed, self.session.pk, None, run_id, "")
            if html:
                self._ended(run_id)
                await self.send(html)

    async def run_done(self, event: dict) -> None:
        """`chat.run_done`: a run's final form."""
        self._ended(event["run_id"])
        if event["run_id"] == self.watched and self.watcher is not None:
            self.watcher.cancel()  # the run ended in its own process: nothing left to watch for
        await self.send(event["html"])
