"""A root run: the run a caller starts (an agent's, a team's or a workflow's turn).

It waits its turn (stored `queued` while another run holds the session's lease), starts (the lease,
its row and first messages, the merged state and its history, in one transaction), works (the model
loop or the workflow's steps, whose runs are `ChildRun`s inside it), keeps its lease alive, and
finishes (its messages, the state and every change of it, its outcome and the lease, in one
transaction). See lifecycle.py for the statuses it moves through.
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

from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.utils import timezone

from .. import history as history_module
from .. import prompt
from .. import state as state_module
from ..branches import start_branch
from ..bridge import call_sync
from ..errors import QueuedRunTakenError
from ..events import BaseRunEvent, RunQueuedEvent, SessionSummaryCompletedEvent, SessionSummaryStartedEvent
from ..history import ChatMessage
from ..models import ChatSession, Role, Run, RunStatus
from ..owners import owned_session
from ..state_tracker import StateTracker
from ..storable import storable
from ..summary import aupdate_session_summary
from ..tools import RunContext
from . import lifecycle, registry, store
from .base import BaseRun
from .child import ChildRun
from .model_loop import CHECKPOINT_SECONDS

logger = logging.getLogger("sessions_core")

FINISH_RETRY_SECONDS = 10.0  # how long storing a run's outcome is tried again while the database is unreachable


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


class RootRun(BaseRun):
    """A run that holds its session's lease; its workflow steps and team members run inside it."""

    child_class = ChildRun

    def __init__(self, config, input, *, session_id: str, user, session_state: dict | None,
                 run_id: str | None = None, branch: tuple[str | None, str] | None = None):
        super().__init__(config, input, session_id=session_id, user=user, run_id=run_id)
        self.root = self
        self.run_state = session_state
        self.branch = branch  # (run id, "regenerate" | "edit"): a sibling of that run (branches.py)
        # `arun(None, run_id=...)` of a queued run whose process stopped takes it over (lifecycle.orphans).
        self.adopting = input is None and run_id is not None and branch is None
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
        async with aclosing(self._wait_turn()) as waiting:
            async for event in waiting:
                yield event
        if self.start.cancelled:  # stopped while it waited: it never ran
            self._settle_output(RunStatus.CANCELLED, "")
            yield self.event("cancelled", reason="Run cancelled", content=self.output.content)
            return
        registry.register(self.run_id, self)
        # The heartbeat starts after its first interval: most runs are over before it would beat.
        heartbeat = asyncio.get_running_loop().call_later(CHECKPOINT_SECONDS, self._start_heartbeat)
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
            heartbeat.cancel()
            if self.heartbeat_task is not None:
                self.heartbeat_task.cancel()
            registry.unregister(self.run_id)

    async def _body(self) -> AsyncIterator[BaseRunEvent]:
        async with aclosing(self._execute()) as executed:
            async for event in executed:
                yield event
        status, error, error_type = self.outcome
        await self._finish(status, error)
        for event in self._final_events(status, error_type):
            yield event
        if status == RunStatus.COMPLETED and self.config.enable_session_summaries:
            # After RunCompleted, not before it (Agno's order): the reply is never held up by the summary.
            stream_events = self.config.stream_events
            if stream_events:
                yield self._event(SessionSummaryStartedEvent)
            summary = await aupdate_session_summary(self.config, self.start.session_pk, self.session_id,
                                                    self.start.summary)
            if stream_events:
                yield self._event(SessionSummaryCompletedEvent, session_summary=summary and summary.to_dict())

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
            if not start.busy:
                self._begin(start)
                return
            try:
                if self.config.stream_events and not self.seq:
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
            session = owned_session(self.session_id, self.user_ref, alias, lock=True, must_exist=False)
            if session is None:
                session = store.new_session(self.session_id, self.user_ref, self.config, alias, now)
            if self.adopting:
                self._adopt(session, now)
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

    def _adopt(self, session: ChatSession, now) -> None:
        """Take over the queued run `run_id` of this session, whose process stopped: its stored input runs."""
        run = lifecycle.claim_orphan(self.run_id, session.pk, self.alias, now)
        if run is None:
            raise QueuedRunTakenError(self.run_id, self.session_id)
        self.adopting = False
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
        merged = state_module.merge_for_run(config.session_state, state_text, self.run_state,
                                            config.overwrite_db_session_state)
        start = Start(session_pk=session.pk, base_version=version, summary=session.summary, base_text=state_text,
                      state=merged.state, state_text=merged.text, changes=merged.changes, state_error=merged.error)
        if config.add_history_to_context and session.last_seq:
            read = history_module.history_read(session.pk, config.num_history_runs, config.num_history_messages)
            start.history = history_module.read_history(read, alias)
        system = prompt.system_message(config, {**start.state, **self._injected()}, self.user_id, start.summary)
        first = [ChatMessage(role=Role.SYSTEM, content=system)] if system else []
        first.append(ChatMessage(role=Role.USER, content=self.input))
        fields = {"follows_id": follows, "input": self.input,
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

    # -- the finish --------------------------------------------------------------------------------------

    async def _finish(self, status: str, error: str) -> None:
        self.finished = True
        out = self.output
        error = storable(error)
        self._settle_output(status, error)
        keep_state = status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
        try:
            out.session_state, out.state_version = await self._store_outcome(status, error, keep_state)
        except DatabaseError as exc:
            # The database refused the outcome: say so on the run and free the session now, rather than
            # leave the run "running" and the next one waiting for the lease to expire.
            logger.exception("Run %s in session %s: its outcome could not be stored", self.run_id, self.session_id)
            error = storable(f"The run's outcome could not be stored ({type(exc).__name__}: {exc}).")
            out.status, out.error, out.content = RunStatus.ERROR, error, error
            try:
                await call_sync(self._finish_failed, error)
            except DatabaseError:  # unreachable still: the run is settled as interrupted when its lease expires
                logger.exception("Run %s: its failure could not be stored either", self.run_id)
            out.session_state, out.state_version = json.loads(self.start.base_text), self.start.base_version
        out.messages.extend(self.new_messages)
        registry.notify_lease_released(self.start.session_pk)

    async def _store_outcome(self, status, error, keep_state) -> tuple[dict, int]:
        """`_finish_sync`, tried again while what fails is the connection (the database server restarting
        or failing over), for up to FINISH_RETRY_SECONDS: each try is one transaction on a new connection
        (call_sync drops the lost one), and none is made once an earlier commit is found to have got
        through before its connection went."""
        deadline, pause, tried = time.monotonic() + FINISH_RETRY_SECONDS, 0.1, False
        while True:
            try:
                stored = await call_sync(self._stored_outcome) if tried else None
                if stored is not None:  # an earlier try's commit got through before its connection went
                    return stored
                tried = True
                return await call_sync(self._finish_sync, status, error, keep_state)
            except (OperationalError, InterfaceError) as exc:
                if time.monotonic() + pause > deadline:
                    raise
                logger.warning("Run %s: storing its outcome is tried again (%s: %s)", self.run_id,
                               type(exc).__name__, exc)
            await asyncio.sleep(pause)  # a back-off between tries, not a wait for a condition
            pause = min(pause * 2, 1.0)

    def _stored_outcome(self) -> tuple[dict, int] | None:
        """The session's state and version if this run's outcome is stored already, else None."""
        if Run.objects.using(self.alias).filter(pk=self.start.run_pk, status=RunStatus.RUNNING).exists():
            return None
        session = ChatSession.objects.using(self.alias).only("session_state", "state_version").get(
            pk=self.start.session_pk)
        return session.session_state, session.state_version

    def _finish_failed(self, error: str) -> None:
        """The run failed to store its outcome: mark it (and its steps) failed and release the lease."""
        now = timezone.now()
        with transaction.atomic(using=self.alias):
            lifecycle.end(self.start.run_pk, RunStatus.ERROR, self.alias, error=error, content=error, finished_at=now)
            lifecycle.end_children(self.start.run_pk, RunStatus.ERROR, self.alias, error=error, finished_at=now)
            lifecycle.release_lease(self.start.session_pk, self.lease_token, self.alias, now)

    def _finish_sync(self, status, error, keep_state) -> tuple[dict, int]:
        """Store the outcome in one transaction. A failed run keeps the state as it was; otherwise the
        state as of the run's last recorded change is stored."""
        alias, start, tracker, now = self.alias, self.start, self.tracker, timezone.now()
        changes = [(*change, None) for change in start.changes] + tracker.changes if keep_state else []
        messages = self.stored_messages()
        with transaction.atomic(using=alias):
            # The usual case: the run still holds the lease (so its seqs are the session's) and nobody
            # edited the state meanwhile (so its changes apply as they are).
            state = json.loads(tracker.state_text if changes else start.base_text)
            first_version, last_seq = start.base_version, self.last_seq + len(messages)
            fields = {"last_seq": last_seq}
            if changes:
                fields.update(session_state=state, state_version=first_version + len(changes))
            if not lifecycle.release_lease(start.session_pk, self.lease_token, alias, now,
                                           at_version=first_version, **fields):
                state, changes, first_version, last_seq = self._finish_contended(keep_state, changes, messages, now)
            rows, _ = store.message_rows(start.session_pk, start.run_pk, messages, last_seq - len(messages), now,
                                         self.run_id)
            store.insert_messages(rows, alias)
            store.insert_changes(start.session_pk, changes, first_version, start.run_pk, now, alias)
            version = first_version + len(changes)
            lifecycle.end(start.run_pk, status, alias, state_version=version, finished_at=now,
                          **self.outcome_fields(error))
        return state, version

    def _finish_contended(self, keep_state, changes, messages, now):
        """The lease was lost or the state was edited during the run: merge onto the locked row. Returns the
        state, the changes as they apply to it, the version before them and the session's new last seq."""
        alias = self.alias
        session = ChatSession.objects.using(alias).select_for_update().only(
            "session_state", "state_version", "lease_token", "last_seq").get(pk=self.start.session_pk)
        state, first_version = session.session_state, session.state_version
        if keep_state:  # replay this run's changes on the state as it is now
            state, changes = self._rebase(state, changes)
        last_seq = max(session.last_seq, self.last_seq) + len(messages)
        fields = {"last_seq": last_seq, "session_state": state, "state_version": first_version + len(changes)}
        if not lifecycle.release_lease(session.pk, self.lease_token, alias, now, **fields):
            # The lease expired and another run took it: store this run's work without touching its lease.
            ChatSession.objects.using(alias).filter(pk=session.pk).update(last_activity_at=now, **fields)
        return state, changes, first_version, last_seq

    @staticmethod
    def _rebase(current: dict, changes: list) -> tuple[dict, list]:
        """Replay `changes` on `current`: the final state, and the changes as they apply to it (each
        diffed again, so its inverse patch undoes exactly that step and state_at() stays exact)."""
        state, rebased = current, []
        for patch, _inverse, source, run in changes:
            try:
                after = state_module.apply_patch(state, patch)
            except Exception:  # jsonpatch conflicts: the later writer's value for those keys stands
                logger.warning("State change from %s no longer applies after a concurrent edit", source)
                continue
            if after != state:
                rebased.append((*state_module.diff(state, after), source, run))
                state = after
        return state, rebased
