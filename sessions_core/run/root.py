"""A root run: the run a caller starts (an agent's, a team's or a workflow's turn).

It waits its turn (stored `queued` while another run holds the session's lease), starts (the lease,
its row and first messages, the merged state and its history, in one transaction), works (the model
loop or the workflow's steps, whose runs are `ChildRun`s inside it), keeps its lease alive, and
finishes (finish.py). See lifecycle.py for the statuses it moves through.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from django.db import DatabaseError, transaction
from django.utils import timezone

from .. import history as history_module
from .. import prompt
from .. import state as state_module
from ..branches import start_branch
from ..bridge import call_sync
from ..errors import QueuedRunTakenError
from ..events import (BaseRunEvent, MemoryUpdateCompletedEvent, MemoryUpdateStartedEvent, RunQueuedEvent,
                      SessionSummaryCompletedEvent, SessionSummaryStartedEvent)
from ..history import ChatMessage
from ..models import ChatSession, Role, Run, RunStatus
from ..owners import owned_session, session_owner
from ..state_tracker import StateTracker
from ..summary import aupdate_session_summary
from ..tools import RunContext
from ..user_memories import store as memory_store
from ..user_memories.run_work import aupdate_after_run
from . import background, finish, lifecycle, registry, store
from .base import BaseRun
from .child import ChildRun
from .model_loop import CHECKPOINT_SECONDS

logger = logging.getLogger("sessions_core")

# What a start reads of its session (the rest of the row stays unread).
START_FIELDS = ("session_state", "state_version", "summary", "lease_token", "lease_expires_at", "last_seq",
                "current_leaf_id")


@dataclass
class Start:
    """What the start step hands back to the run."""

    busy: bool = False  # another run holds the session: this one waits, queued
    cancelled: bool = False  # cancelled while it waited
    session_pk: int = 0
    run_pk: int = 0
    base_version: int = 0
    base_text: str = "{}"  # the stored state before this run, as JSON text
    state: dict = field(default_factory=dict)  # merged working state, no injected keys
    state_text: str = "{}"  # `state` as JSON text
    changes: list = field(default_factory=list)  # [(patch, inverse, source)] made by the merge
    history: list[ChatMessage] = field(default_factory=list)
    summary: dict | None = None
    state_error: str = ""
    memory_owner: object = None  # the user whose memories the run shows and updates (None: no memories)


class RootRun(BaseRun):
    """A run that holds its session's lease; its workflow steps and team members run inside it."""

    child_class = ChildRun

    def __init__(self, config, input, *, session_id: str, user, session_state: dict | None,
                 run_id: str | None = None, branch: tuple[str | None, str] | None = None):
        super().__init__(config, input, session_id=session_id, user=user, run_id=run_id)
        self.root = self
        self.run_state = session_state
        self.branch = branch  # (run id, "regenerate" | "edit"): a sibling of that run (branches.py)
        # `arun(None, run_id=...)` of a queued run whose process stopped takes it over (lifecycle.unclaimed).
        self.taking_over = input is None and run_id is not None and branch is None
        self.lease_token = secrets.token_hex(16)
        self.queued_pk: int | None = None  # its row while it waits
        self.start = Start()
        self.last_seq = 0  # the seq of the tree's last message so far
        self.tracker: StateTracker | None = None  # shared by the runs of its tree
        self.run_context: RunContext | None = None  # likewise
        self.active: set[BaseRun] = set()  # the runs of its tree streaming right now (for a stop)
        self.heartbeat_task: asyncio.Task | None = None

    @property
    def state_error(self) -> str:
        return self.start.state_error

    def events(self) -> AsyncIterator[BaseRunEvent]:
        """Every event of the run, in Agno's order. The run's outcome ends up in `self.output`."""
        return self._events()

    async def _events(self) -> AsyncIterator[BaseRunEvent]:
        self.loop = asyncio.get_running_loop()
        registry.register(self.run_id, self)  # a stop asked in this process reaches it, waiting or running
        try:
            async with aclosing(self._wait_turn()) as waiting:
                async for event in waiting:
                    yield event
            if self.start.cancelled:  # stopped while it waited: it never ran
                self._settle_output(RunStatus.CANCELLED, "")
                yield self.event("cancelled", reason="Run cancelled", content=self.output.content)
                return
            async with aclosing(self._run()) as running:
                async for event in running:
                    yield event
        finally:
            registry.unregister(self.run_id)

    async def _run(self) -> AsyncIterator[BaseRunEvent]:
        # The heartbeat starts after its first interval: most runs are over before it would beat.
        heartbeat = self.loop.call_later(CHECKPOINT_SECONDS, self._start_heartbeat)
        background.awaiting_first_words(self.run_id)
        try:
            yield self.started_event()
            async with aclosing(self._body()) as body:
                async for event in body:
                    yield event
        except (asyncio.CancelledError, GeneratorExit):
            # The task was cancelled or the caller stopped listening: keep what there is, release the lease.
            if not self.finished:
                await asyncio.shield(self._finish(RunStatus.CANCELLED, ""))
            raise
        finally:
            background.heard(self.run_id)
            heartbeat.cancel()
            if self.heartbeat_task is not None:
                self.heartbeat_task.cancel()

    async def _finish(self, status: str, error: str) -> None:
        self.finished = True
        await finish.finish(self, status, error)

    async def _body(self) -> AsyncIterator[BaseRunEvent]:
        async with aclosing(self._execute()) as executed:
            async for event in executed:
                yield event
        status, error, error_type = self.outcome
        await self._finish(status, error)
        background.heard(self.run_id)  # (a run that ends without a model's chunk: a workflow of functions)
        status, error, error_type = self.outcome  # (a pause that a stop turned into a cancellation)
        for event in self._final_events(status, error_type):
            yield event
        if status == RunStatus.COMPLETED and self._updates_memories:
            async with aclosing(self._memory_work()) as work:
                async for event in work:
                    yield event
        if status == RunStatus.COMPLETED and self.config.enable_session_summaries:
            # After RunCompleted, not before it (Agno's order): the reply is never held up by the summary.
            stream_events = self.config.stream_events
            if stream_events:
                yield self._event(SessionSummaryStartedEvent)
            async with background.turn():
                summary = await aupdate_session_summary(self.config, self.start.session_pk, self.session_id,
                                                        self.start.summary)
            if stream_events:
                yield self._event(SessionSummaryCompletedEvent, session_summary=summary and summary.to_dict())

    @property
    def _updates_memories(self) -> bool:
        """Memories are made after this run: on, not left to the model's tool, a user who has them on, and
        something said (Agno's rule: with agentic memory on, the automatic path is off)."""
        config = self.config
        return (config.update_memory_on_run and not config.enable_agentic_memory
                and self.start.memory_owner is not None and bool(self.input.strip()))

    async def _memory_work(self) -> AsyncIterator[BaseRunEvent]:
        """After the reply is stored (the session is free already) and before the run returns."""
        stream_events = self.config.stream_events
        if stream_events:
            yield self._event(MemoryUpdateStartedEvent)
        async with background.turn():
            work, error = await aupdate_after_run(self)
        if stream_events:
            yield self._event(MemoryUpdateCompletedEvent, memories=work.memories, error=error,
                              deleted=[memory_id for action, memory_id, _ in work.changes if action == "deleted"])

    # -- waiting its turn, and the start ------------------------------------------------------------------

    async def _wait_turn(self) -> AsyncIterator[BaseRunEvent]:
        """Start the run, once no other run holds the session; meanwhile it is stored `queued` (and says so
        once, to a caller that streams events). A stop ends the wait with the run cancelled."""
        delay = 0.005
        while True:
            attempt = asyncio.ensure_future(call_sync(self._start_sync))
            try:
                start = await asyncio.shield(attempt)
            except asyncio.CancelledError:
                await self._abandon(await attempt)
                raise
            if start.cancelled:  # stopped while it waited
                self.start = start
                return
            if not start.busy:
                self._begin(start)
                return
            try:
                if self.config.stream_events and not self.seq and self.queued_pk is not None:
                    yield self._event(RunQueuedEvent, input=self.input)
                await registry.wait_for_lease(start.session_pk, delay)
            except (asyncio.CancelledError, GeneratorExit):
                await asyncio.shield(self._abandon(start))
                raise
            delay = min(delay * 2, 0.25)

    async def _abandon(self, start: Start) -> None:
        """The caller went away while the run waited or started: cancel it rather than leave it open."""
        if not start.busy and not start.cancelled:
            self._begin(start)
            await self._finish(RunStatus.CANCELLED, "")
        elif self.queued_pk is not None:
            await call_sync(lifecycle.drop_queued, self.run_id, self.alias)

    def _begin(self, start: Start) -> None:
        self.start = start
        self.run_pk = start.run_pk
        self.started = time.perf_counter()
        self.checkpoint_due = self.started + CHECKPOINT_SECONDS
        self.tracker = StateTracker({**start.state, **self._injected()}, start.state_text,
                                    start.base_version + len(start.changes))
        config = self.config
        self.run_context = RunContext(
            run_id=self.run_id, session_id=self.session_id, user_id=self.user_id,
            session_state=self.tracker.working, dependencies=dict(config.dependencies),
            metadata=dict(config.metadata),
        )
        self.loop = asyncio.get_running_loop()

    def _injected(self) -> dict:
        injected = {"current_session_id": self.session_id, "current_run_id": self.run_id}
        if self.user_id:
            injected = {"current_user_id": self.user_id, **injected}
        if self.config.kind == "workflow":
            injected.update(workflow_id=self.config.component_id, workflow_name=self.config.component_name)
        return injected

    def _start_sync(self) -> Start:
        """One try at the start, in one transaction on the locked session row."""
        alias, now = self.alias, timezone.now()
        with transaction.atomic(using=alias):
            session = owned_session(self.session_id, self.user_ref, alias, lock=True, must_exist=False,
                                    only=START_FIELDS)
            if session is None:
                session, created = store.new_session(self.session_id, self.user_ref, self.config, alias, now)
                if created:  # nothing holds it, nothing waits on it
                    return self._start_on(session, now)
            if self.taking_over:
                self._take_over(session, now)
            if self.queued_pk is not None and (registry.stop_requested(self.run_id)
                                               or not lifecycle.still_queued(self.queued_pk, alias)):
                lifecycle.drop_queued(self.run_id, alias)  # cancelled while it waited (here, or anywhere)
                return Start(cancelled=True, session_pk=session.pk)
            if lifecycle.lease_live(session, now) or lifecycle.queued_ahead(session.pk, self.queued_pk, now, alias):
                if self.queued_pk is None:
                    self.queued_pk = lifecycle.queue(alias, now, **self._row_fields(session)).pk
                return Start(busy=True, session_pk=session.pk)
            if session.lease_token:  # the process that held the lease stopped renewing it: its run is over
                lifecycle.interrupt_abandoned(session, alias, now)
                session.last_seq = store.next_seq_after_crash(session, alias)
            return self._start_on(session, now)

    def _take_over(self, session: ChatSession, now) -> None:
        """Take over the queued run `run_id` of this session, whose process stopped: its stored input runs."""
        run = lifecycle.claim_unclaimed(self.run_id, session.pk, self.alias, now)
        if run is None:
            raise QueuedRunTakenError(self.run_id, self.session_id)
        self.taking_over = False
        self.queued_pk = run.pk
        self.input = self.output.input = self.raw_input = run.input

    def _row_fields(self, session: ChatSession) -> dict:
        config = self.config
        return {"run_id": self.run_id, "session": session, "kind": config.kind, "component_id": config.component_id,
                "input": self.input, "model_id": self.model.id if self.model else ""}

    def _start_on(self, session: ChatSession, now) -> Start:
        """The start on the locked session, whose lease is free: the state, history, run row and lease."""
        alias, config = self.alias, self.config
        state_text, version, follows = json.dumps(session.session_state), session.state_version, session.current_leaf_id
        if self.branch is not None:  # a sibling of an earlier run, from the state as it was when that one began
            run_id, source = self.branch
            target, state_text, version = start_branch(session.pk, run_id, source, alias, now)
            follows = target.follows_id
            if source == "regenerate":
                self.input = self.output.input = self.raw_input = target.input
        start, first = self._opening(session, state_text, version)
        first.append(ChatMessage(role=Role.USER, content=self.input))
        fields = {"follows_id": follows, "input": self.input, "model_id": self.model.id if self.model else "",
                  "history_seqs": [m.seq for m in start.history] if config.store_history_messages else None}
        if self.queued_pk is not None:
            if not lifecycle.start_queued(self.queued_pk, alias, now, **fields):
                return Start(cancelled=True, session_pk=session.pk)
            run = Run(pk=self.queued_pk)
        else:
            fields.update(self._row_fields(session), created_at=now)
            run = lifecycle.start_new(alias, **fields)
        start.run_pk = run.pk
        rows, self.last_seq = store.message_rows(session.pk, run, first, session.last_seq, now, self.run_id)
        store.insert_messages(rows, alias)
        lifecycle.take_lease(session, self.lease_token, run, self.last_seq, now, alias)
        self.output.messages = first[:-1] + start.history + first[-1:]
        self.created_at = now.timestamp()
        self.output.created_at = int(self.created_at)
        return start

    def _opening(self, session: ChatSession, state_text: str, version: int) -> tuple[Start, list[ChatMessage]]:
        """On the locked session: the state merged from `state_text` (at `version`), the history and the
        system message (a list of none or one) that open the run's request."""
        config = self.config
        merged = state_module.merge_for_run(config.session_state, state_text, self.run_state,
                                            config.overwrite_db_session_state)
        start = Start(session_pk=session.pk, base_version=version, summary=session.summary, base_text=state_text,
                      state=merged.state, state_text=merged.text, changes=merged.changes, state_error=merged.error)
        if config.add_history_to_context and session.last_seq:
            read = history_module.history_read(session.pk, config.num_history_runs, config.num_history_messages,
                                               max_tool_calls=config.max_tool_calls_from_history)
            start.history = history_module.read_history(read, self.alias)
        memories = None
        if (config.add_memories_to_context or config.update_memory_on_run) and session.owner_id is not None:
            owner = session_owner(session, self.user_ref)
            if memory_store.memories_enabled(owner, self.alias):
                start.memory_owner = owner
                if config.add_memories_to_context:
                    memories = memory_store.memory_texts(owner, self.alias)
        system = prompt.system_message(config, {**start.state, **self._injected()}, self.user_id, start.summary,
                                       memories)
        return start, [ChatMessage(role=Role.SYSTEM, content=system)] if system else []

    # -- waiting for a person (run/pause.py continues it) -------------------------------------------------

    @property
    def can_pause(self) -> bool:
        """An agent's or team's own run pauses for a tool that waits for a person (a workflow's pauses
        through its steps, steps.py)."""
        return self.config.executor is None

    # -- liveness ----------------------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if not self.finished:
            self.heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        """Every CHECKPOINT_SECONDS: hear about a stop asked from another process (even while waiting for
        the model's first token or inside a tool); every HEARTBEAT_SECONDS: renew the lease."""

        def beat(renew: bool) -> bool:
            if renew:
                lifecycle.renew_lease(self.start.session_pk, self.lease_token, self.alias)
            return lifecycle.cancel_requested(self.start.run_pk, self.alias)

        renewed = time.monotonic()
        while True:
            renew = time.monotonic() - renewed >= lifecycle.HEARTBEAT_SECONDS
            if renew:
                renewed = time.monotonic()
            try:
                stop = await call_sync(beat, renew)
            except DatabaseError as exc:  # the database went away for a moment: beat again at the next interval
                logger.warning("Run %s: the lease could not be renewed (%s: %s)", self.run_id, type(exc).__name__, exc)
                renewed, stop = 0.0, False  # renew at the next beat
            if stop:
                registry.request_cancel(self.run_id)
                return
            await asyncio.sleep(CHECKPOINT_SECONDS)
