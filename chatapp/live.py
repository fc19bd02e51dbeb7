"""Live runs for the web chat: run them as tasks, stream them to every tab, stop them, queue and catch up.

A run is an asyncio task that outlives the socket which asked for it. Each session with work in
this process has one `SessionRunner`: a FIFO of waiting messages and the run in flight. Every waiting
message is also a `QueuedMessage` row until its run starts, so a process that stops loses none of them:
the next socket to find the session idle adopts them (`adopt_orphans`), and one whose turn comes while a
run of another process holds the session stays stored until that run lets go, so a tab served by any
process can drop it. The task
iterates `agent.arun(..., stream=True, stream_events=True)` and turns every event into HTML sent to
the session's channel group (so every tab of that session sees it):

    RunStarted       the run's `_run.html` fragment appended to #transcript (queued note removed)
    RunContent       the reply so far as sanitized markdown (its completed blocks once, its open block
                     again), a numbered frame about every 30 ms
    ToolCall*        a tool row appended to #tools-<run_id>, then replaced with its result
    StateChanged     the state panel re-rendered with the new state, mid-run
    RunCompleted /   the run re-rendered once from the database (sanitized markdown) replacing
    RunError         #run-<run_id>; the sidebar row to the user's group; a title in the background

Token batches (`chat.tokens`) are numbered per run (`seq`) and carry the frame drawn once for every
socket (chatapp/markdown_stream.py). The channel layer drops what a channel cannot hold, so a batch is
a doorbell as much as a payload: a socket of the process running the reply draws from the run itself
whatever it is behind on, in one frame, and skips the batches that frame covered; a socket of another
process applies batches in order and, on a gap, asks the owning process for the reply so far. A socket
that joined mid-reply and received the text so far (catch-up) skips the batches it already has. A run
owned by another process answers catch-up and stop requests sent to the `session.<pk>.sync` group,
which only the owning run task joins. `Follower` is a socket's side of this: the consumer hands it the
layer events and the query string, and sends what it returns.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import aclose_old_connections
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from sessions_core.run import registry as run_registry
from sessions_core.branches import RunNotFoundError, SessionBusyError
from sessions_core.component import Component
from sessions_core.events import RunEvent, StepStartedEvent, TeamRunStartedEvent, WorkflowStartedEvent
from sessions_core.models import ChatSession, Message, NameSource, Role, Run, RunStatus
from sessions_core.run.lifecycle import LEASE_SECONDS

from . import assistants, dbthreads, rendering, state_view, titles
from .broadcast import asend_to_session, push_row, sync_group
from .markdown_stream import ReplyStream
from .models import QueuedMessage, new_queued_id

logger = logging.getLogger("chatapp.live")

ID_MAX = 64  # the longest run or queued id a socket may send
QUEUED_STATUS = "Your message is queued; it will run after the current reply."
PROCESS = uuid.uuid4().hex  # names this process in the token batches it sends (`origin`)
ANNOUNCE_WAIT_SECONDS = 10.0  # at most this long for a run's final form to be sent after it leaves the runner


# --- the process registry ---------------------------------------------------------------------------


@dataclass
class Pending:
    """A message waiting for its run to start."""

    text: str
    user: object
    queued_id: str = field(default_factory=new_queued_id)
    cancelled: bool = False
    shown_queued: bool = False  # a queued note was sent for it
    row_pk: int | None = None  # its QueuedMessage (only a message that waits has one), deleted when its run starts
    session: ChatSession | None = None  # the row as the socket read it just now (a message that runs at once)
    fallback_title: str = ""  # the unnamed session's name from this message, stored with the run's end
    branch: tuple[str, str] | None = None  # (run id, "regenerate" | "edit"): a new version of that run


@dataclass
class LiveRun:
    """What the browser needs to catch up on a run in flight."""

    run_id: str
    run: Run  # the stored row as it was at the start
    base_messages: list[Message] = field(default_factory=list)  # its user message
    parts: list[str] = field(default_factory=list)
    length: int = 0  # characters in `parts`
    flushed: int = 0  # characters already sent to the group
    last_flush: float = 0.0
    stream: ReplyStream = field(default_factory=ReplyStream)  # the reply drawn as of the last batch
    seq: int = 0  # batches sent
    pace: float = 0.0  # seconds the next batch waits at least (last drawing's CPU time / CHAT_STREAM_DRAW_SHARE)
    announced: asyncio.Event = field(default_factory=asyncio.Event)  # its chat.run_done has been sent

    def __post_init__(self):
        _recent_runs[self.run_id] = self
    tool_messages: list[Message] = field(default_factory=list)
    changed_keys: list[str] = field(default_factory=list)
    pending_changes: list[dict] = field(default_factory=list)  # timeline entries stored when the run ends
    steps: dict[str, bool] = field(default_factory=dict)  # step and member runs shown: run id -> is a member
    ending: bool = False  # a final event arrived: the engine is storing the outcome
    row_pushed: asyncio.Task | None = None  # the sidebar row pushed as the run started (off its first token's path)

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    @property
    def mark(self) -> tuple[int, int]:
        """(batches sent, completed blocks drawn): what a page shown the text so far has of the stream."""
        return self.seq, len(self.stream.segments)

    def add(self, delta: str) -> None:
        self.parts.append(delta)
        self.length += len(delta)

    def flush_wait(self, batch: float, now: float) -> float:
        """Seconds until the next batch is due (<= 0: now); the first text goes at once."""
        return self.last_flush + max(batch, self.pace) - now


@dataclass
class SessionRunner:
    session_pk: int
    owner_pk: int | None
    pending: deque[Pending] = field(default_factory=deque)
    starting: Pending | None = None  # taken from the queue, RunStarted not seen yet
    current: LiveRun | None = None
    task: asyncio.Task | None = None
    reader: asyncio.Task | None = None  # the task reading the current run's events

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


_runners: dict[int, SessionRunner] = {}
# Live runs still referenced (by their task until their final form is sent, or by a socket's check): a run
# of this process missing here has been announced.
_recent_runs: weakref.WeakValueDictionary[str, LiveRun] = weakref.WeakValueDictionary()


def live_run(session_pk: int) -> LiveRun | None:
    runner = _runners.get(session_pk)
    return runner.current if runner else None


def _waiting(session_pk: int):
    """The session's messages waiting for their run, oldest first (in this process or another)."""
    return QueuedMessage.objects.filter(session_id=session_pk).order_by("pk")


async def queued(session_pk: int) -> list[QueuedMessage]:
    return [row async for row in _waiting(session_pk)]


async def wait_idle(timeout: float = 30) -> None:
    """Wait until no run task and no title job of this process is left (tests, shutdown)."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = [r.task for r in _runners.values() if r.task and not r.task.done()] + list(titles.jobs)
        if not tasks:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(tasks)} live task(s) still running")
        await asyncio.wait(tasks, timeout=remaining)


# --- fragments -----------------------------------------------------------------------------------------


def _render_live_run(live: LiveRun, text: str, oob: str = "true") -> str:
    """The run fragment of a run in flight: the stored row with the text and tool calls so far."""
    run = copy.copy(live.run)
    run.content, run.status = text, RunStatus.RUNNING
    run.shown_messages = [*live.base_messages, *live.tool_messages]
    run.shown_children = None  # its steps so far, as stored
    return rendering.render_run(run, oob=oob)


def started_run(session: ChatSession, event) -> Run:
    """The run as the engine stored it at its start, from its RunStarted event (which carries the run's
    input and created_at), without reading the row back."""
    run = Run(run_id=event.run_id, session=session, input=event.input, status=RunStatus.RUNNING,
              created_at=datetime.fromtimestamp(event.created_at, tz=UTC), model_id=getattr(event, "model", ""),
              kind=_started_kind(event), component_id=event.agent_id, step_name=event.step_name)
    run.shown_messages = []  # the fragment shows `input` as the user's message
    run.shown_children = []  # its steps arrive as events of their own
    return run


def _started_kind(event) -> str:
    if isinstance(event, WorkflowStartedEvent):
        return "workflow"
    if isinstance(event, TeamRunStartedEvent):
        return "team"
    return "agent"


# What each engine event means to a live run, whichever kind of component runs it (agent, team, workflow).
_ROLES = {
    **dict.fromkeys((RunEvent.run_started, RunEvent.team_run_started, RunEvent.workflow_started), "started"),
    **dict.fromkeys((RunEvent.run_content, RunEvent.team_run_content), "content"),
    **dict.fromkeys((RunEvent.tool_call_started, RunEvent.tool_call_completed, RunEvent.team_tool_call_started,
                     RunEvent.team_tool_call_completed), "tool"),
    RunEvent.state_changed: "state",
    **dict.fromkeys((RunEvent.run_cancelled, RunEvent.team_run_cancelled, RunEvent.workflow_cancelled), "cancelled"),
    **dict.fromkeys((RunEvent.run_completed, RunEvent.run_error, RunEvent.team_run_completed, RunEvent.team_run_error,
                     RunEvent.workflow_completed, RunEvent.workflow_error), "done"),
    RunEvent.session_summary_completed: "summary",
    RunEvent.step_started: "step",
}


def event_role(event) -> str | None:
    return _ROLES.get(event.event)


def _render_step_started(event) -> str:
    """A step's row (from StepStarted) or a team member's (from its RunStarted), appended to its parent's steps."""
    if isinstance(event, StepStartedEvent):
        run = Run(run_id=event.run_id, kind=event.executor_type or "agent", step_name=event.step_name,
                  component_id=event.executor_id, status=RunStatus.RUNNING)
        member = False
    else:
        run = Run(run_id=event.run_id, kind=_started_kind(event), step_name=event.step_name,
                  component_id=event.agent_id, input=event.input, status=RunStatus.RUNNING)
        member = True
    run.shown_messages, run.shown_children = [], []
    html = rendering.render_step(run, member=member)
    return rendering.render_oob(html, f"beforeend:#steps-{event.parent_run_id}")


def _render_step_done(run_id: str, member: bool) -> str:
    """A finished step's or member's row, as stored, replacing the live one."""
    return rendering.render_step(Run.objects.get(run_id=run_id), oob="true", member=member)


def _render_state(session: ChatSession, live: LiveRun) -> str:
    """The panel mid-run: the reply's state and changes, without the editor (an edit of a state the
    run has not stored yet would have the run's changes applied a second time when it finishes)."""
    return rendering.render_state_panel(session, live.changed_keys, in_flight=True,
                                        pending_changes=live.pending_changes, oob="true")


# --- sending -------------------------------------------------------------------------------------------


async def _to_session(session_pk: int, html: str) -> None:
    await asend_to_session(session_pk, "chat.html", html=html)


# --- submitting --------------------------------------------------------------------------------------


async def lease_left(session: ChatSession) -> float | None:
    """Seconds until the session's run lease expires; None when no run holds it."""
    return await _lease_left(session.pk, session.owner_id)


async def _lease_left(session_pk: int, owner_pk: int | None) -> float | None:
    now = timezone.now()
    expires = await (ChatSession.objects.for_user(owner_pk).filter(pk=session_pk).leased(now)
                     .values_list("lease_expires_at", flat=True).afirst())
    return None if expires is None else (expires - now).total_seconds()


async def running_elsewhere(session: ChatSession) -> bool:
    """A run holds the session's lease (in another process, or just starting here)."""
    return await lease_left(session) is not None


def _settle_abandoned(session_pk: int) -> str:
    """Runs of the session still marked running whose process is gone (their lease has expired), marked
    interrupted as the session's next run would mark them; their final form for the page ("" if none)."""
    runs = Run.objects.filter(session_id=session_pk)
    abandoned = runs.settle_abandoned()
    if not abandoned:
        return ""
    settled = runs.filter(pk__in=abandoned).exclude(status=RunStatus.RUNNING).order_by("pk")
    html = "".join(rendering.render_run(run, oob="true") for run in settled)
    return html and html + rendering.render_status(*INTERRUPTED_NOTE)


async def settle_abandoned(session_pk: int) -> str:
    return await sync_to_async(_settle_abandoned)(session_pk)


def _may_have_abandoned(session: ChatSession) -> bool:
    """Whether the row says a run may have been left running by a process that stopped: its lease is
    still taken but expired (a run that ends, however it ends, clears the lease with its outcome)."""
    return bool(session.lease_token) and not session.is_running


async def submit(session: ChatSession, user, text: str, branch: tuple[str, str] | None = None) -> Pending:
    """Run `text` on the session now, or after the runs already waiting or in flight; with `branch`, as a
    new version of that run (regenerated, or edited to `text`)."""
    runner = _runners.get(session.pk)
    if runner is None:
        runner = _runners[session.pk] = SessionRunner(session.pk, session.owner_id)
    item = Pending(text=text, user=user, branch=branch)
    # It waits behind a run here, or another process's (the lease on the row the socket just read): then it
    # is stored until its run starts, so a process that stops loses none. One that can run now goes to its
    # run at once, which stores it (the engine's start); nothing is written for it before that.
    must_wait = runner.busy or bool(runner.pending) or session.is_running
    if must_wait:
        row = await QueuedMessage.objects.acreate(session_id=session.pk, user=user, text=text,
                                                  queued_id=item.queued_id)
        item.row_pk, item.shown_queued = row.pk, True
    else:
        item.session = session
    if not session.name and (title := titles.fallback_title(text)):
        # Shown with the run's first sidebar row and stored with its end (titles.store_fallback_title).
        session.name, session.name_source, item.fallback_title = title, NameSource.FALLBACK, title
    runner.pending.append(item)
    if must_wait:
        await _to_session(session.pk, rendering.render_oob(rendering.render_queued(item), "beforeend:#queue")
                          + rendering.render_status(QUEUED_STATUS))
    if not runner.busy:
        runner.task = asyncio.create_task(_drain(runner), name=f"chat-session-{session.pk}")
    return item


async def regenerate(session: ChatSession, user, run_id: str, text: str | None = None) -> Pending | None:
    """A new version of one of the session's replies: its input again (or `text`, edited), from the state as
    of that run's start; None if the run is not one of this session's."""
    run = await Run.objects.filter(session_id=session.pk, run_id=run_id, parent_run__isnull=True).only(
        "input").afirst()
    if run is None:
        return None
    branch = (run_id, "edit") if text is not None else (run_id, "regenerate")
    return await submit(session, user, run.input if text is None else text, branch=branch)


async def switch_branch(session: ChatSession, user, run_id: str) -> bool:
    """Show another version of a reply: the session moves to that branch (its state too), in every tab."""
    try:
        agent = assistants.get_assistant(session.component_id)
        await agent.aset_current_branch(run_id, session_id=session.session_id, user_id=user)
    except (KeyError, RunNotFoundError, SessionBusyError):
        return False
    await _to_session(session.pk, await sync_to_async(_render_branch)(session.pk, session.owner_id))
    return True


def _render_branch(session_pk: int, owner_pk: int | None) -> str:
    """The transcript of the session's current branch and its state panel, replacing what the tabs show."""
    session = ChatSession.objects.for_user(owner_pk).get(pk=session_pk)
    return rendering.render_transcript(session) + rendering.render_state_panel(session, oob="true")


async def retry(session: ChatSession, user, run_id: str) -> Pending | None:
    """Send a run's input again as a new run; None if the run is not one of this session's."""
    run = await Run.objects.filter(session_id=session.pk, run_id=run_id).only("input").afirst()
    if run is None or not run.input:
        return None
    return await submit(session, user, run.input)


async def stop(session: ChatSession, run_id: str = "", queued_id: str = "") -> bool:
    """Stop the session's run (the given one, else the one in flight) or drop a queued message."""
    runner = _runners.get(session.pk)
    if queued_id:
        # Dropped from the stored queue, so whichever process holds it skips it.
        deleted, _ = await QueuedMessage.objects.filter(session_id=session.pk, queued_id=queued_id).adelete()
        for item in runner.pending if runner else ():
            if item.queued_id == queued_id:
                item.cancelled = True
                runner.pending.remove(item)
                break
        if deleted:
            await _to_session(session.pk, rendering.render_delete("li", f"queued-{queued_id}")
                              + rendering.render_status("Queued message removed."))
        return bool(deleted)
    current = runner.current if runner else None
    if not run_id and current is None and runner is not None and runner.starting is not None:
        runner.starting.cancelled = True  # stopped before it started: cancelled at RunStarted
        return True
    if not run_id:
        if current is not None:
            run_id = current.run_id
        else:
            run = await Run.objects.filter(session_id=session.pk, status=RunStatus.RUNNING).order_by("-pk").afirst()
            run_id = run.run_id if run else ""
    elif not (current and current.run_id == run_id) and not await Run.objects.filter(
        session_id=session.pk, run_id=run_id, status=RunStatus.RUNNING
    ).aexists():
        return False
    if not run_id:
        return False
    if current is not None and current.run_id == run_id:
        return await _stop_here(runner, current)
    if not await running_elsewhere(session):  # no process is running it any more: it is over already
        html = await settle_abandoned(session.pk)
        if html:
            await _to_session(session.pk, html)
        return bool(html)
    stopped = await Component.acancel_run(run_id)
    # Owned by another process: tell it now rather than at its next checkpoint.
    await get_channel_layer().group_send(
        sync_group(session.pk), {"type": "chat.cancel", "run_id": run_id, "session_pk": session.pk}
    )
    return stopped


async def _stop_here(runner: SessionRunner, live: LiveRun) -> bool:
    """Stop a run of this process: flag it, and if its model stream is stalled (the engine looks at
    the flag only between chunks) cancel the task reading it, which the engine also takes for a stop
    and which closes the model's HTTP stream."""
    await Component.acancel_run(live.run_id)
    reader = runner.reader

    def hard_stop():
        if runner.current is live and reader is not None and not reader.done() and not live.ending:
            reader.cancel()

    asyncio.get_running_loop().call_later(settings.CHAT_STOP_GRACE_SECONDS, hard_stop)
    return True


# --- one session's queue -----------------------------------------------------------------------------


async def _drain(runner: SessionRunner) -> None:
    # While it works, the runner's session is served by this process's listener (see _listen).
    layer, group = get_channel_layer(), sync_group(runner.session_pk)
    channel = await _listener_channel()
    await layer.group_add(group, channel)
    try:
        while runner.pending:
            item = runner.pending.popleft()
            if item.cancelled:
                continue
            runner.starting = item  # from here a Stop without a run id stops it (at its RunStarted)
            try:
                if item.shown_queued:
                    await _wait_for_other_processes(runner)
                if not await _take(item):
                    continue
                await _run_one(runner, item)
            except Exception:
                logger.exception("Run for session %s failed", runner.session_pk)
                await _to_session(runner.session_pk, rendering.render_status("The reply failed unexpectedly.", "error"))
            finally:
                runner.starting, runner.current = None, None
    finally:
        await asyncio.shield(layer.group_discard(group, channel))
        task = asyncio.current_task()
        if runner.pending and not (task and task.cancelling()):
            # A message arrived while this task was closing down: it must not be left waiting.
            runner.task = asyncio.create_task(_drain(runner), name=f"chat-session-{runner.session_pk}")
        elif _runners.get(runner.session_pk) is runner:
            del _runners[runner.session_pk]


async def _wait_for_other_processes(runner: SessionRunner) -> None:
    """While a run of another process holds the session, wait before taking the next message off the
    stored queue, where a tab served by any process can still drop it (the engine would wait for the
    lease all the same, with the message no longer stored). Polled with the engine's back-off."""
    delay = 0.005
    while await _lease_left(runner.session_pk, runner.owner_pk) is not None:
        await run_registry.wait_for_lease(runner.session_pk, delay)
        delay = min(delay * 2, 0.25)


async def _take(item: Pending) -> bool:
    """Take the message off the stored queue to run it now; False if it is gone (dropped, or taken by
    another process that adopted it). A message that never waited has no row: it is this process's."""
    if item.row_pk is None:
        return True
    deleted, _ = await QueuedMessage.objects.filter(pk=item.row_pk).adelete()
    return bool(deleted)


async def adopt_orphans(session: ChatSession) -> bool:
    """Run here the session's stored queue that no process is working through (the process it was sent
    to has stopped), in order. True if there was something to run."""
    runner = _runners.get(session.pk)
    if (runner is not None and (runner.busy or runner.pending)) or await running_elsewhere(session):
        return False
    rows = [row async for row in QueuedMessage.objects.filter(session_id=session.pk).select_related("user")]
    if not rows:
        return False
    runner = _runners.get(session.pk)  # looked up again: this coroutine waited above
    if runner is None:
        runner = _runners[session.pk] = SessionRunner(session.pk, session.owner_id)
    held = {item.row_pk for item in runner.pending}
    runner.pending.extend(Pending(text=row.text, user=row.user, queued_id=row.queued_id, shown_queued=True,
                                  row_pk=row.pk) for row in rows if row.pk not in held)
    if not runner.busy:
        runner.task = asyncio.create_task(_drain(runner), name=f"chat-session-{session.pk}")
    return True


# One listener per process and event loop, never cancelled: cancelling a channel layer's receive()
# can hang (channels_redis waits out its blocking pop), which once left every session's queue stuck.
_listener: tuple[asyncio.AbstractEventLoop, str, asyncio.Task] | None = None


async def _listener_channel() -> str:
    global _listener
    loop = asyncio.get_running_loop()
    if _listener is None or _listener[0] is not loop or _listener[2].done():
        channel = await get_channel_layer().new_channel()
        # Held here (not with the tasks wait_idle() waits on): it runs as long as the loop does.
        _listener = (loop, channel, asyncio.create_task(_listen(channel), name="chat-sync-listener"))
    return _listener[1]


async def _listen(channel: str) -> None:
    """Answer catch-up and stop requests from sockets in other processes, for every runner here."""
    layer = get_channel_layer()
    while True:
        message = await layer.receive(channel)
        runner = _runners.get(message.get("session_pk"))
        live = runner.current if runner else None
        try:
            if message.get("type") == "chat.cancel" and live and live.run_id == message.get("run_id"):
                await _stop_here(runner, live)
            elif message.get("type") == "chat.sync_request" and live and message.get("reply_channel"):
                text, (seq, segments) = live.text, live.mark
                html = await sync_to_async(_render_live_run)(live, text)
                await layer.send(message["reply_channel"], {
                    "type": "chat.sync_reply", "run_id": live.run_id, "html": html, "text_len": len(text),
                    "seq": seq, "segments": segments,
                })
        except Exception:  # one bad request must not stop this process answering the others
            logger.exception("Answering %s for session %s failed", message.get("type"), message.get("session_pk"))


class _End:
    """Marks the end of a run's event stream."""


_FLUSH = object()  # queued by the batch timer: send the text gathered so far


async def _run_one(runner: SessionRunner, item: Pending) -> None:
    pk = runner.session_pk
    session = item.session  # read by the socket a moment ago
    if session is None:  # the message waited (or was adopted): read the row as it is now
        await aclose_old_connections()  # a long-lived server: drop connections that went stale while idle
        session = await ChatSession.objects.for_user(runner.owner_pk).filter(pk=pk).afirst()
        if session is None:
            return
        if item.fallback_title and not session.name:
            session.name, session.name_source = item.fallback_title, NameSource.FALLBACK
    try:
        agent = assistants.get_assistant(session.component_id)
    except KeyError:
        await _to_session(pk, rendering.render_status(
            f"This session's assistant ({session.component_id}) is not available.", "error"))
        return
    if item.shown_queued:
        await _to_session(pk, rendering.render_delete("li", f"queued-{item.queued_id}"))
    if _may_have_abandoned(session):  # a run left by a process that stopped: shown as interrupted
        await _to_session(pk, await settle_abandoned(pk) + rendering.render_status("Waiting for the reply…"))

    events: asyncio.Queue = asyncio.Queue()

    async def pump():
        # The engine's stream is read by a task of its own: the loop below waits on the queue (and
        # the batch timer) without ever interrupting a read, and Stop can cancel just this task.
        options = dict(session_id=session.session_id, user_id=item.user, stream=True, stream_events=True)
        if item.branch is None:
            stream = agent.arun(item.text, **options)
        elif item.branch[1] == "edit":
            stream = agent.aedit_and_rerun(item.branch[0], item.text, **options)
        else:
            stream = agent.aregenerate(item.branch[0], **options)
        try:
            async with aclosing(stream):
                async for event in stream:
                    if event_role(event) == "started" and not event.parent_run_id and item.cancelled:
                        # Stopped before it started: the engine is paused at this event, before
                        # any model call, and sees the flag as soon as it resumes.
                        await Component.acancel_run(event.run_id)
                    events.put_nowait(event)
        except Exception as exc:  # noqa: BLE001 - handed to the loop below, which raises it
            events.put_nowait(exc)
        finally:
            events.put_nowait(_End())

    pump_task = runner.reader = asyncio.create_task(pump(), name=f"chat-run-{pk}")
    batch = settings.CHAT_STREAM_BATCH_SECONDS
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None  # puts _FLUSH in the queue when the batch is due
    live: LiveRun | None = None
    done = False
    try:
        while True:
            event = await events.get()
            if event is _FLUSH:
                timer = None
                await _flush(pk, live)
                continue
            if isinstance(event, _End):
                break
            if isinstance(event, Exception):
                raise event
            kind = event_role(event)
            if live is not None and event.run_id != live.run_id and kind != "state":
                await _step_event(pk, live, kind, event)  # a workflow's step, a team's member
            elif kind == "started":
                live = await _started(runner, item, session, event)
            elif live is None:
                continue
            elif kind == "content":
                live.add(event.content or "")
                wait = live.flush_wait(batch, time.monotonic())
                if wait <= 0 and events.empty():
                    await _flush(pk, live)  # the first text goes at once; later text at most every batch
                elif timer is None:  # (text already waiting in the queue joins this batch)
                    timer = loop.call_later(max(wait, 0), events.put_nowait, _FLUSH)
            elif kind == "tool":
                if event.tool.tool_name != rendering.DELEGATE_TOOL:  # a delegation is shown as the member's row
                    await _flush(pk, live)
                    await _to_session(pk, _note_tool(live, event))
            elif kind == "state":
                await _flush(pk, live)
                live.changed_keys = sorted(set(live.changed_keys) | set(event.changed_keys))
                live.pending_changes.insert(0, state_view.describe_pending_change(event))
                session.session_state, session.state_version = event.session_state, event.state_version
                await _to_session(pk, await sync_to_async(_render_state)(session, live))
            elif kind == "cancelled":
                live.ending = True
                await _flush(pk, live)
            elif kind == "done":
                live.ending = True
                await _flush(pk, live)
                await _finished(runner, item, live, session)
                done = True
            elif kind == "summary":
                # The summary is made after the reply is complete; the panel shows it when it lands: a
                # newer one replaces the one shown, and a first one (which may bring the panel itself
                # into view, for an assistant without state) redraws the panel as stored.
                if session.summary and event.session_summary:
                    await _to_session(pk, rendering.render_session_summary(event.session_summary))
                else:
                    await _to_session(pk, await sync_to_async(_state_panel)(pk, runner.owner_pk))
                session.summary = event.session_summary or session.summary
        if live is not None and not done:  # the stream ended without a final event: show what is stored
            done = True
            await _finished(runner, item, live, session)
    except Exception:
        if live is not None and not done:  # never leave a run shown as running
            with suppress(Exception):
                await _finished(runner, item, live, session)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if not pump_task.done():
            pump_task.cancel()
        with suppress(asyncio.CancelledError):
            await pump_task
        runner.reader = None


async def _step_event(session_pk: int, live: LiveRun, kind: str | None, event) -> None:
    """A step's or member's event: its row appears when it starts and is redrawn as stored when it ends
    (its text and tool calls with it), in every tab alike."""
    if kind == "step" or (kind == "started" and event.run_id not in live.steps):
        live.steps[event.run_id] = kind == "started"  # a member's run has no StepStarted before it
        await _to_session(session_pk, _render_step_started(event))
    elif kind == "done" and event.run_id in live.steps:
        await _to_session(session_pk, await sync_to_async(_render_step_done)(event.run_id, live.steps[event.run_id]))


def _render_branched(session: ChatSession) -> str:
    """The replaced version left the transcript with its branch: the current one redrawn, as stored now."""
    session = ChatSession.objects.for_user(session.owner_id).get(pk=session.pk)
    return rendering.render_transcript(session) + rendering.render_state_panel(session, oob="true")


async def _started(runner: SessionRunner, item: Pending, session: ChatSession, event) -> LiveRun:
    # Rendered here from the event and the row in hand (no query; see started_run), while the engine
    # goes on to the model: no database read and no trip through the thread the engine's queries use.
    run = started_run(session, event)
    if item.branch is not None:
        html = await sync_to_async(_render_branched)(session)
    else:
        html = rendering.render_oob(rendering.render_run(run), "beforeend:#transcript")
    live = LiveRun(run_id=event.run_id, run=run, base_messages=list(run.shown_messages))
    runner.current, runner.starting = live, None
    pk = runner.session_pk
    await _to_session(pk, html + rendering.render_status("Generating a reply…"))
    # The sidebar row, running and at the top (with the fallback title of a new chat), as the engine's
    # start has just stored it (its lease, its last activity): beside the reply's first text rather
    # than before it, and always before the row the run's end pushes (_finished waits for it).
    session.last_activity_at = timezone.now()
    session.lease_expires_at = session.last_activity_at + timedelta(seconds=LEASE_SECONDS)
    live.row_pushed = asyncio.create_task(push_row(session, to_top=True), name=f"chat-row-{pk}")
    if item.cancelled:  # Stop was pressed before the run started
        await _stop_here(runner, live)
    return live


def _note_tool(live: LiveRun, event) -> str:
    """Keep a tool call seen live (as the messages the engine stores at the end) and return its row."""
    tool = event.tool
    started = event.event in (RunEvent.tool_call_started, RunEvent.team_tool_call_started)
    if started:
        live.tool_messages.append(Message(
            role=Role.ASSISTANT, content="",
            tool_calls=[{"id": tool.tool_call_id, "name": tool.tool_name,
                         "arguments": json.dumps(tool.tool_args, ensure_ascii=False)}],
        ))
    else:
        live.tool_messages.append(Message(
            role=Role.TOOL, content=tool.result or "", tool_call_id=tool.tool_call_id, tool_name=tool.tool_name,
            tool_error=tool.tool_call_error,
        ))
    call = rendering.ToolCallView(
        tool.tool_call_id, tool.tool_name, json.dumps(tool.tool_args, indent=2, ensure_ascii=False),
        result=None if started else (tool.result or ""), error=tool.tool_call_error,
    )
    if started:
        return rendering.render_oob(rendering.render_tool_call(live.run_id, call), f"beforeend:#tools-{live.run_id}")
    return rendering.render_tool_call(live.run_id, call, oob="true")


async def _flush(session_pk: int, live: LiveRun | None) -> None:
    """Send the reply text not yet sent as one numbered batch: drawn once here for every socket (the blocks
    completed since the last batch and the open one), with the character range it adds."""
    if live is None or live.flushed >= live.length:
        return
    text = live.text
    start, seen = live.flushed, len(live.stream.segments)
    live.flushed, live.last_flush = len(text), time.monotonic()
    spent = time.thread_time()
    live.stream.feed(text)
    # A long open block (a code block of hundreds of lines) is drawn less often; a paragraph at every batch.
    live.pace = (time.thread_time() - spent) / settings.CHAT_STREAM_DRAW_SHARE
    live.seq += 1
    keep, html = live.stream.frame(seen)
    await asend_to_session(session_pk, "chat.tokens", run_id=live.run_id, seq=live.seq, origin=PROCESS, start=start,
                           end=len(text), keep=keep, html=html, segments=len(live.stream.segments))


_STATUS_NOTES = {
    RunStatus.COMPLETED: ("Reply complete.", "info"),
    RunStatus.CANCELLED: ("Stopped. The partial reply was kept.", "info"),
    RunStatus.ERROR: ("The reply failed. You can retry it.", "error"),
    RunStatus.INTERRUPTED: ("The reply was interrupted.", "error"),
}
INTERRUPTED_NOTE = _STATUS_NOTES[RunStatus.INTERRUPTED]


def _render_finished(live: LiveRun, session: ChatSession, item: Pending) -> tuple[str, str]:
    """The finished run from the database, the new chat's fallback title stored, and the state panel as
    stored now if the run changed the state (a failed run's mid-run state changes were not kept, so the
    panel must show the stored state again); a run that changed nothing leaves the panel as it is."""
    run = rendering.stored_run(run_id=live.run_id, session_id=session.pk)
    if item.fallback_title:
        titles.store_fallback_title(session, item.fallback_title)
    html = rendering.render_run(run, oob="true")
    if live.changed_keys or live.pending_changes:
        stored = ChatSession.objects.for_user(session.owner_id).get(pk=session.pk)
        session.session_state, session.state_version = stored.session_state, stored.state_version
        html += rendering.render_state_panel(stored, live.changed_keys, oob="true")
    return html, run.status


async def _finished(runner: SessionRunner, item: Pending, live: LiveRun, session: ChatSession) -> None:
    pk = runner.session_pk
    if live.row_pushed is not None:  # the running row goes before the finished one (and renders what it had)
        try:
            await live.row_pushed
        except Exception:  # noqa: BLE001 - a row not pushed is redrawn by the one below
            logger.warning("The sidebar row of session %s was not pushed as its run started", pk, exc_info=True)
    html, status = await dbthreads.run(_render_finished, live, session, item)
    runner.current = None
    note, kind = _STATUS_NOTES.get(status, ("Reply finished.", "info"))
    await asend_to_session(pk, "chat.run_done", run_id=live.run_id, html=html + rendering.render_status(note, kind))
    live.announced.set()
    session.lease_expires_at, session.last_activity_at = None, timezone.now()  # as the engine's finish stored it
    if status == RunStatus.COMPLETED and session.name_source in (NameSource.NONE, NameSource.FALLBACK):
        titles.start_title(session, item.user)  # which pushes the row, titled or not, when it is done
    else:
        await push_row(session)


# --- catch-up -----------------------------------------------------------------------------------------


async def live_run_html(live: LiveRun, text: str, append: bool = False) -> str:
    """A run in flight with the whole text so far: replacing its fragment, or appended when new to the page."""
    # On the web's own threads (a workflow's steps so far are read): not on the one the engine's calls use.
    if append:
        html = await dbthreads.run(_render_live_run, live, text, oob="")
        return rendering.render_oob(html, "beforeend:#transcript")
    return await dbthreads.run(_render_live_run, live, text)


def _missed(session_pk: int, last_run: str | None, running: str, skip: str) -> tuple[str, bool]:
    """Runs a page has not seen: newer than `last_run` (None: the page did not say), and the final form
    of runs it shows as running. Also whether the run `skip` (in flight) is new to the page."""
    runs = Run.objects.filter(session_id=session_pk, parent_run__isnull=True)
    parts, skip_is_new = [], False
    if last_run is not None:
        anchor = runs.filter(run_id=last_run).values_list("pk", flat=True).first() if last_run else 0
        if anchor is not None:
            newer = runs.filter(pk__gt=anchor, abandoned=False).annotate(**rendering.BRANCHES)  # the current branch
            newer = list(newer.order_by("-pk")[: rendering.TRANSCRIPT_RUNS])[::-1]
            rendering.place_among_siblings(newer)
            skip_is_new = any(run.run_id == skip for run in newer)
            shown = [rendering.render_run(run) for run in newer if run.run_id != skip]
            if shown:
                parts.append(rendering.render_oob(shown, "beforeend:#transcript"))
    for run_id in filter(None, running.split(",")):
        if run_id != skip:
            run = runs.filter(run_id=run_id).exclude(status=RunStatus.RUNNING).first()
            if run is not None:
                parts.append(rendering.render_run(run, oob="true"))
    return "".join(parts), skip_is_new


async def missed_html(session_pk: int, last_run: str | None, running: str = "", skip: str = "") -> tuple[str, bool]:
    return await dbthreads.run(_missed, session_pk, last_run, running, skip)


def _catch_up_reads(session_pk: int, last_run: str | None, running: str, skip: str):
    """A (re)connected page's reads together: what it has not seen (when it said what it shows) and the
    messages waiting for their run."""
    html, append = _missed(session_pk, last_run, running, skip) if last_run is not None or running else ("", False)
    return html, append, list(_waiting(session_pk))


def _state_panel(session_pk: int, owner_pk: int | None) -> str:
    return rendering.render_state_panel(ChatSession.objects.for_user(owner_pk).get(pk=session_pk), oob="true")


async def state_panel_html(session: ChatSession) -> str:
    return await sync_to_async(_state_panel)(session.pk, session.owner_id)



class Follower:
    """One socket's side of the live view: what it is sent when it connects, and each streamed reply's
    frames, in order, none missed and none twice. The consumer makes one per socket and hands it the
    layer events.

    `send` sends HTML to this socket only; `channel_name` is the socket's own channel, where another
    process answers a catch-up request (`chat.sync_reply`).
    """

    def __init__(self, session: ChatSession, channel_name: str, send: Callable[[str], Awaitable[None]]):
        self.session = session
        self.channel_name = channel_name
        self.send = send
        self.have: dict[str, tuple[int, int]] = {}  # run id -> (its last batch shown, its completed blocks shown)
        self.finished: set[str] = set()  # runs shown in their final form: later batches are stale
        self.checking: set[str] = set()  # runs ended here whose final form this socket has not had yet
        self.tasks: set[asyncio.Task] = set()  # those checks
        self.waiting_sync: str | None = None  # run id whose text another process was asked for
        self.held: list[dict] = []  # chat.tokens received while waiting for that text
        self.watcher: asyncio.Task | None = None  # watches the lease of a run in another process...
        self.watched = ""  # ...this one

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        for task in self.tasks:
            task.cancel()

    async def catch_up(self, query_string: bytes) -> None:
        """Bring a page that just (re)connected up to date; `query_string` is the socket's (see consumers)."""
        params = parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
        first = {key: values[0] for key, values in params.items() if values}
        pk = self.session.pk
        current = live_run(pk)
        # Taken now: later batches are numbered past this mark, or are skipped.
        text, mark = (current.text, current.mark) if current else ("", (0, 0))
        append = False
        settled = ""
        # Whether another process runs it, as the row read when the socket connected says (a run that
        # starts elsewhere a moment later is caught up with by its first batch: a gap, then a sync).
        idle = current is None and not self.session.is_running
        if idle and _may_have_abandoned(self.session):
            # A run whose process stopped (a restart mid-reply) is interrupted now, and the page gets
            # its final form below, with the runs it shows as running or has not seen. (Only a lease
            # left taken can mean one: the row was read as the socket connected.)
            settled = await settle_abandoned(pk)
        last_run = first["last_run"][:ID_MAX] if "last_run" in first else None
        running = first.get("running", "")[: ID_MAX * 4]
        # One trip to a web database thread (not the one the engine's queries use), for both reads.
        html, append, rows = await dbthreads.run(_catch_up_reads, pk, last_run, running,
                                                 current.run_id if current else "")
        if html:
            await self.send(html)
        if settled:
            await self.send(rendering.render_status(*INTERRUPTED_NOTE))
        if first.get("reconnect") or rows:
            await self.send(rendering.render_queue(rows))
        if first.get("reconnect"):
            await self.send(await state_panel_html(self.session))
        # Messages queued in a process that has stopped run now, here (the page sees them start).
        if idle and rows:
            await adopt_orphans(self.session)
        if current is not None:
            await self.send(await live_run_html(current, text, append=append))
            self.have[current.run_id] = mark
        elif not idle:  # current is None here, so a run holds the lease: another process's
            run = await Run.objects.filter(session_id=pk, status=RunStatus.RUNNING).order_by("-pk").afirst()
            if run is not None:
                await self._ask_owner(run.run_id)
                self.watched = run.run_id
                self.watcher = asyncio.create_task(self._watch_lease(run.run_id), name=f"chat-lease-watch-{pk}")

    async def _ask_owner(self, run_id: str) -> None:
        """Ask the process running `run_id` for its reply so far (answered with `chat.sync_reply`);
        batches arriving meanwhile are held until then."""
        pk = self.session.pk
        self.waiting_sync = run_id
        await get_channel_layer().group_send(
            sync_group(pk), {"type": "chat.sync_request", "reply_channel": self.channel_name, "session_pk": pk}
        )
        asyncio.get_running_loop().call_later(settings.CHAT_SYNC_WAIT_SECONDS, self._give_up_sync, run_id)

    async def _watch_lease(self, run_id: str) -> None:
        """A run of another process: should that process stop, show the run as interrupted when its
        lease runs out (a live process renews it every few seconds until the run is stored)."""
        pk = self.session.pk
        while (left := await lease_left(self.session)) is not None:
            await asyncio.sleep(left + settings.CHAT_LEASE_GRACE_SECONDS)  # a deadline, not a wait on a condition
        settled = await settle_abandoned(pk)
        await adopt_orphans(self.session)
        html, _ = await missed_html(pk, None, run_id)  # the run's final form, whoever ended it
        if html:
            self._ended(run_id)
            await self.send(html + (rendering.render_status(*INTERRUPTED_NOTE) if settled else ""))

    def _ended(self, run_id: str) -> None:
        self.have.pop(run_id, None)
        self.finished.add(run_id)
        if run_id == self.waiting_sync:
            self.waiting_sync, self.held = None, []

    async def _show_stored(self, run_id: str) -> None:
        """The run's final form as stored, if it has ended (its own chat.run_done may have been dropped)."""
        html, _ = await missed_html(self.session.pk, None, run_id)
        if html:
            self._ended(run_id)
            await self.send(html)

    def _give_up_sync(self, run_id: str) -> None:
        # The owning process did not answer in time (it may have ended the run, or died, or be busy):
        # show the run as stored if it has ended; otherwise the next batch finds the gap and asks again,
        # and a late answer is still shown (see sync_reply).
        if self.waiting_sync == run_id:
            self.waiting_sync, self.held = None, []
            asyncio.ensure_future(self._show_stored(run_id))

    async def _release_held(self) -> None:
        self.waiting_sync = None
        held, self.held = self.held, []
        for event in held:
            await self.tokens(event)

    async def tokens(self, event: dict) -> None:
        """`chat.tokens`: a numbered batch of a streaming reply; the socket is sent what it does not show yet."""
        run_id, seq = event["run_id"], event["seq"]
        if run_id in self.finished:
            return
        if run_id == self.waiting_sync:
            self.held.append(event)
            return
        shown, segments = self.have.get(run_id, (0, 0))
        if seq <= shown:
            return  # covered already: by a frame drawn from the run itself, or by the catch-up
        current = live_run(self.session.pk)
        if current is not None and current.run_id == run_id and run_id not in self.have and seq > 1:
            # Its first batch never came, so neither may have the run's fragment before it: the whole run
            # so far (it replaces the one on the page, or is added to the transcript).
            text, mark = current.text, current.mark
            html = await live_run_html(current, text)
            self.have[run_id] = mark
            await self.send(html)
        elif current is not None and current.run_id == run_id:
            # Run here: whatever this socket is behind on, in one frame drawn from the run's own state.
            keep, html = current.stream.frame(segments)
            self.have[run_id] = current.mark
            await self.send(rendering.render_stream_frame(run_id, keep, html))
        elif event.get("origin") == PROCESS:
            # It ran here and has ended since. Its chat.run_done is behind this batch in the socket's
            # channel, unless the layer dropped it: a note queued behind it to this socket finds out.
            if run_id not in self.checking:
                self.checking.add(run_id)
                task = asyncio.create_task(self._check_done_later(run_id), name=f"chat-check-done-{run_id}")
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        elif seq == shown + 1:
            self.have[run_id] = (seq, event["segments"])
            await self.send(rendering.render_stream_frame(run_id, event["keep"], event["html"]))
        else:  # batches of another process's run were dropped on the way: ask it for the reply so far
            await self._ask_owner(run_id)
            self.held.append(event)

    async def _check_done_later(self, run_id: str) -> None:
        live = _recent_runs.get(run_id)
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
        self.checking.discard(event["run_id"])
        if event["run_id"] not in self.finished:
            await self._show_stored(event["run_id"])

    async def run_done(self, event: dict) -> None:
        """`chat.run_done`: a run's final form."""
        self._ended(event["run_id"])
        if event["run_id"] == self.watched and self.watcher is not None:
            self.watcher.cancel()  # the run ended in its own process: nothing left to watch for
        await self.send(event["html"])

    async def sync_reply(self, event: dict) -> None:
        """`chat.sync_reply`: another process's answer to this socket's catch-up request. One that comes
        after the socket stopped waiting for it is shown too when it is ahead of the page: a busy process
        answers late, and a run that streams nothing meanwhile (a long tool call, a held model) would
        otherwise be missing from this page until it ends."""
        run_id, seq = event["run_id"], event["seq"]
        stale = run_id in self.finished or (run_id in self.have and seq <= self.have[run_id][0])
        if run_id != self.waiting_sync and stale:
            return  # ended, or the page has as much already
        await self.send(event["html"])
        self.have[run_id] = (seq, event["segments"])
        if run_id == self.waiting_sync:
            await self._release_held()
