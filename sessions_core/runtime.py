"""One run, step by step: take the lease, merge state, build the request, stream the model, run
tools, persist, emit. See DESIGN.md "One run".

The loop is configured by a frozen `RunConfig` and never reaches back into the Agent (or Team,
Workflow) that made it. All database work happens in three kinds of short blocking calls (start,
checkpoint, finish) made through `bridge.call_sync`, so a run costs a fixed number of queries
however long its session is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

import pydantic
from pydantic import BaseModel
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, transaction
from django.utils import timezone

from . import history as history_module
from . import limits
from . import prompt
from . import run_registry
from . import state as state_module
from .branches import start_branch
from .bridge import call_sync
from .config import RunConfig
from .errors import Cancelled, RunFailed
from .events import (
    RUN_EVENT_CLASSES,
    BaseRunEvent,
    SessionSummaryCompletedEvent,
    SessionSummaryStartedEvent,
    StateChangedEvent,
    ToolExecution,
)
from .history import ChatMessage
from .model_api import ModelChunk, ModelError
from .models import ChatSession, Role, Run, RunStatus
from .outputs import OUTPUT_CLASSES, RunOutput
from .state_tracker import StateTracker
from .owners import check_owner, owner_known, resolve_user, user_label
from .run_sql import RunStore, SessionRow
from .storable import storable, storable_tree
from .summary import aupdate_session_summary
from .tools import RunContext, call_tool, result_text, timed

logger = logging.getLogger("sessions_core")

LEASE_SECONDS = 30
HEARTBEAT_SECONDS = 10
CHECKPOINT_SECONDS = 1.0
FINISH_RETRY_SECONDS = 10.0  # how long storing a run's outcome is tried again while the database is unreachable
MAX_MODEL_CALLS = 25

__all__ = ["RunLoop", "RunOutput"]




def new_run_id() -> str:
    """A new run's id: a random (version 4) UUID as text, as `str(uuid.uuid4())` writes it, made without
    the UUID object (which costs a run more than its random bytes do)."""
    value = int.from_bytes(os.urandom(16), "big")
    value = value & ~(0xF000 << 64) | (0x4000 << 64)  # version 4
    value = value & ~(0xC000 << 48) | (0x8000 << 48)  # the RFC 4122 variant
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class _Deferred(NamedTuple):
    """A finished child's writes, held for the tree's next write: its messages and its end (its row
    exists: `run_pk`), or, for a function step (`child`), its whole row, stored only then."""

    messages: list[tuple]
    run_pk: int
    ended: datetime
    outcome: dict
    child: RunLoop | None = None
    component_id: str = ""  # whose run ended (a step agent's, a member's): its history may read it


@dataclass
class _Start:
    """What the start step hands back to the run loop."""

    busy: bool = False
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


class RunLoop:
    """One run of a component. Create it, then iterate `events()`; the outcome ends up in `output`.

    A run made by `child()` is a step of a workflow run or a member run of a team run: it works inside
    its root run (the one holding the session's lease) on the root's state, stores its own row and
    messages, and leaves the state, its changes and the lease to the root's finish.
    """

    def __init__(self, config: RunConfig, input, *, session_id: str, user, session_state: dict | None,
                 run_id: str | None = None, parent: RunLoop | None = None, step_name: str = "",
                 source_prefix: str = "", branch: tuple[str | None, str] | None = None, row_at_end: bool = False,
                 defer_finish: bool = False):
        self.config = config
        self.alias = config.alias
        self.model = config.model
        self.input = "" if input is None else storable(input if isinstance(input, str) else _input_text(input))
        self.session_id = session_id
        self.user_ref = user  # a username, a User or None; resolved to a User when a session is created
        self.user_id = user_label(user)
        self.run_state = session_state
        self.run_id = str(run_id) if run_id else new_run_id()
        self.parent = parent
        self.root: RunLoop = parent.root if parent is not None else self
        self.branch = branch  # (run id, "regenerate" | "edit"): a sibling of that run (branches.py)
        self.step_name = step_name
        # A child whose row is stored only after it ended, with its outcome, by the tree's next write (a
        # function step outside a Parallel: it has no messages, and nothing starts beside it to be
        # listed after it).
        self.row_at_end = row_at_end
        # A child whose messages and outcome are written with the tree's next write (the next step's
        # start, the run's finish): a workflow's step outside a Parallel, when the next write comes at once.
        self.defer_finish = defer_finish and not row_at_end
        self.pending: deque[_Deferred] = deque()  # root: the writes of finished children, held
        self.source_prefix = source_prefix  # "step:<name>/" or "member:<name>/" on the state changes it makes
        self.event_classes = RUN_EVENT_CLASSES.get(config.kind, RUN_EVENT_CLASSES["agent"])
        self.lease_token = secrets.token_hex(16) if parent is None else ""  # a child works under its root's
        self.seq = 0
        self.output = OUTPUT_CLASSES.get(config.kind, RunOutput)(
            run_id=self.run_id, session_id=session_id, user_id=self.user_id, agent_id=config.component_id,
            agent_name=config.component_name, input=self.input, model=self.model.id if self.model else "",
            model_provider=self.model.provider if self.model else "",
        )
        self.run_pk = 0  # the run's row, once stored
        self.tracker: StateTracker | None = None  # the root's; children share it
        self.run_context: RunContext | None = None  # one per root run; children share it
        self.active: set[RunLoop] = set()  # root: the runs of its tree streaming right now (for a stop)
        self.outcome: tuple[str, str, str] = (RunStatus.COMPLETED, "", "")  # status, error, error type
        self.step_output = None  # a function step's StepOutput
        self.step_input = self.step_context = None  # a workflow step's StepInput and StepContext (steps.py)
        self.raw_input = input  # as given (a workflow's steps see it unchanged: text, a dict, a model)
        self.additional_data: dict | None = None  # a workflow run's, for its steps
        # Set by the start step (`_begin`).
        self.start = self.root.start if parent is not None else _Start()  # a child works on its root's
        self.started = 0.0
        self.checkpoint_due = 0.0
        self.last_seq = 0  # the seq of the run's last message so far
        self.created_at = 0.0  # the run row's created_at, in seconds since the epoch
        self.start_time = None  # the same as a datetime, for a row stored only as the run ends
        self.loop: asyncio.AbstractEventLoop | None = None
        # Set while the model streams.
        self.reader: asyncio.Task | None = None  # the task, while it waits for the model's next chunk
        self.new_messages: list[ChatMessage] = []
        self.content_parts: list[str] = []
        self.current_reply: list[str] = []  # text of the model call in flight
        self.finished = False
        self.heartbeat_task: asyncio.Task | None = None
        self.saving: asyncio.Future | None = None  # the checkpoint's write in flight

    # -- events -----------------------------------------------------------------------------------

    def _event(self, cls, **kwargs) -> BaseRunEvent:
        self.seq += 1
        return cls(run_id=self.run_id, session_id=self.session_id, agent_id=self.config.component_id,
                   agent_name=self.config.component_name, seq=self.seq,
                   parent_run_id=self.parent.run_id if self.parent is not None else "", step_name=self.step_name,
                   **kwargs)

    def event(self, name: str, **kwargs) -> BaseRunEvent:
        """One of this run's own events by role ("started", "content", "completed", ...), named for its kind."""
        return self._event(self.event_classes[name], **kwargs)

    def container_event(self, cls, step_name: str, **kwargs) -> BaseRunEvent:
        """An event of a step container (Steps, Condition, ...), which has no run of its own: this run's."""
        self.seq += 1
        return cls(run_id=self.run_id, session_id=self.session_id, agent_id=self.config.component_id,
                   agent_name=self.config.component_name, seq=self.seq, parent_run_id=self.run_id,
                   step_name=step_name, **kwargs)

    def events(self) -> AsyncIterator[BaseRunEvent]:
        """Every event of the run, in Agno's order. The run's outcome ends up in `self.output`."""
        return self._child_events() if self.parent is not None else self._root_events()

    async def _root_events(self) -> AsyncIterator[BaseRunEvent]:
        start = await self._acquire()
        self._begin(start)
        run_registry.register(self.run_id, self)
        # The heartbeat starts after its first interval: most runs are over before it would beat.
        heartbeat = asyncio.get_running_loop().call_later(CHECKPOINT_SECONDS, self._start_heartbeat, start.session_pk)
        try:
            yield self.event("started", model=self.model.id if self.model else "",
                             model_provider=self.model.provider if self.model else "", input=self.input,
                             created_at=self.created_at)
            async with aclosing(self._body(start)) as body:
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
            run_registry.unregister(self.run_id)

    async def _execute(self) -> AsyncIterator[BaseRunEvent]:
        """What happens between start and finish (the model loop, or the config's executor: a workflow's
        steps); how it ended goes to `self.outcome`."""
        status, error, error_type = RunStatus.COMPLETED, "", ""
        executor = self.config.executor or RunLoop._model_loop
        try:
            if self.start.state_error:
                status, error, error_type = RunStatus.ERROR, self.start.state_error, "state_error"
            else:
                async with aclosing(executor(self)) as executed:
                    async for event in executed:
                        yield event
        except state_module.StateNotJSONError as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "state_error"
        except limits.LimitExceeded as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "limit_exceeded"
        except ModelError as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "model_provider_error"
        except RunFailed as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "run_failed"
        except Cancelled:
            status = RunStatus.CANCELLED
        except Exception as exc:  # a bug in a hook or in us: the run fails loudly and nothing is lost
            logger.exception("Run %s in session %s failed", self.run_id, self.session_id)
            status, error, error_type = RunStatus.ERROR, f"{type(exc).__name__}: {exc}", "internal_error"
        self.outcome = (status, error, error_type)

    def _final_events(self, status: str, error_type: str, completed: bool = True) -> list[BaseRunEvent]:
        """How the run ended: its error, or its cancellation and (unless not `completed`) its completion."""
        out = self.output
        if out.status == RunStatus.ERROR:  # the run's failure, or the database refusing its outcome
            return [self.event("error", content=out.error,
                               error_type=error_type if status == RunStatus.ERROR else "storage_error")]
        events = []
        if status == RunStatus.CANCELLED:
            events.append(self.event("cancelled", reason="Run cancelled", content=out.content or ""))
        if not completed:
            return events
        extra = {"step_results": list(out.step_results)} if hasattr(out, "step_results") else {}
        events.append(self.event(
            "completed", content=out.content, content_type=out.content_type, metrics=out.metrics,
            session_state=out.session_state, state_version=out.state_version, status=out.status, **extra,
        ))
        return events

    async def _body(self, start: _Start) -> AsyncIterator[BaseRunEvent]:
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
            summary = await aupdate_session_summary(self.config, start.session_pk, self.session_id, start.summary)
            if stream_events:
                yield self._event(SessionSummaryCompletedEvent, session_summary=summary and summary.to_dict())

    def _injected(self) -> dict:
        injected = {"current_session_id": self.session_id, "current_run_id": self.run_id}
        if self.user_id:
            injected = {"current_user_id": self.user_id, **injected}
        if self.config.kind == "workflow":
            injected.update(workflow_id=self.config.component_id, workflow_name=self.config.component_name)
        return injected

    # -- start ------------------------------------------------------------------------------------

    def _begin(self, start: _Start) -> None:
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

    async def _acquire(self) -> _Start:
        delay = 0.005
        while True:
            attempt = asyncio.ensure_future(call_sync(self._start_sync))
            try:
                start = await asyncio.shield(attempt)
            except asyncio.CancelledError:
                # The start step goes on in its thread: if it took the lease, end the run it began now
                # rather than leave it "running" until the lease expires.
                start = await attempt
                if not start.busy:
                    self._begin(start)
                    await self._finish(RunStatus.CANCELLED, "")
                raise
            if not start.busy:
                return start
            await run_registry.wait_for_lease(start.session_pk, delay)
            delay = min(delay * 2, 0.25)

    def _start_sync(self) -> _Start:
        alias, now = self.alias, timezone.now()
        with RunStore(alias) as store:
            with store.atomic():
                session = self._load_for_run(store, now)
                if session is None and self.branch is None and owner_known(self.user_ref):
                    # A new session, written with its first run at once (nothing to read: no history,
                    # no summary, no lease); None if another run created it a moment ago.
                    start = self._start_new(store, now)
                    if start is not None:
                        return start
                    session = self._load_for_run(store, now)
                if session is not None:
                    return self._start_on(store, session, now)
            # A new session of a user named by id (found or created with the ORM), inside Django's
            # transaction (a lost race rolls back a savepoint).
            with transaction.atomic(using=alias):
                session = self._load_for_run(store, now) or self._create_session(store, now)
                return self._start_on(store, session, now)

    def _start_on(self, store: RunStore, session: SessionRow, now) -> _Start:
        """The start step on a loaded, locked session: the lease, the run row and its first messages."""
        alias = self.alias
        if session.lease_live:
            return _Start(busy=True, session_pk=session.pk)
        elif session.lease_token:
            # The process that held the lease stopped renewing it: its run is over.
            Run.objects.using(alias).filter(session_id=session.pk).interrupt_abandoned(now)
        follows = session.current_leaf
        if self.branch is not None:  # a sibling of an earlier run, from the state as it was when that one began
            run_id, source = self.branch
            target, state_text, version = start_branch(session.pk, run_id, source, alias, now)
            session = session._replace(state_text=state_text, state_version=version)
            follows = target.follows_id
            if source == "regenerate":
                self.input = self.output.input = self.raw_input = target.input
        start, first, rows, run = self._prepare_start(store, session, follows, now)
        # Its history is read by its start's own statement (unless _prepare_start read it already).
        read = None if self.config.store_history_messages else self._history_read(session)
        start.run_pk, history_rows = store.start_run(
            run={"session_pk": session.pk, **run}, messages=rows,
            lease=(session.pk, self.lease_token, now + timedelta(seconds=LEASE_SECONDS), now, self.last_seq),
            history=read,
        )
        if read:
            start.history = history_module.replayed(history_rows, read)
        self._started(start, first, now)
        return start

    def _history_read(self, session: SessionRow):
        """The history this run replays from `session`, as a read (None: nothing to read)."""
        config = self.config
        if not config.add_history_to_context or not session.last_seq:  # no messages yet: no history
            return None
        return history_module.history_read(session.pk, config.num_history_runs, config.num_history_messages)

    def _start_new(self, store: RunStore, now) -> _Start | None:
        """The start step on a session that does not exist yet: the session (its lease taken), the run
        row and its first messages inserted together; None, having written nothing, if it exists now."""
        config = self.config
        empty = SessionRow(pk=0, owner_id=None, owner_name=None, state_text="{}", state_version=0, summary=None,
                           last_seq=0, lease_token="", lease_live=False)
        start, first, rows, run = self._prepare_start(store, empty, None, now)
        session = ChatSession.objects.using(self.alias).build(
            session_id=self.session_id, owner=resolve_user(self.user_ref, self.alias), kind=config.kind,
            component_id=config.component_id, metadata=config.session_metadata, now=now,
            lease_token=self.lease_token, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS),
            last_seq=self.last_seq,
        )
        created = store.start_new_session(session=session, run=run, messages=rows)
        if created is None:
            return None
        start.session_pk, start.run_pk = created
        self._started(start, first, now)
        return start

    def _prepare_start(self, store: RunStore, session: SessionRow, follows: int | None, now):
        """The merged state, history and first messages of a run starting on `session` (pk 0: a new
        one), with its message rows and run row as the start step writes them (the session's id aside)."""
        config = self.config
        merged = state_module.merge_for_run(config.session_state, session.state_text, self.run_state,
                                            config.overwrite_db_session_state)
        start = _Start(session_pk=session.pk, base_version=session.state_version, summary=session.summary,
                       base_text=session.state_text, state=merged.state, state_text=merged.text,
                       changes=merged.changes, state_error=merged.error)
        # Read here only when its messages' seqs go on the run row; otherwise by the start's statement.
        if config.store_history_messages and (read := self._history_read(session)):
            start.history = history_module.replayed(store.history(*read), read)
        system = prompt.system_message(config, {**start.state, **self._injected()}, self.user_id, start.summary)
        first = [ChatMessage(role=Role.SYSTEM, content=system)] if system else []
        first.append(ChatMessage(role=Role.USER, content=self.input))
        rows, self.last_seq = self._message_rows(session.pk, None, first, session.last_seq, now)  # run: filled in
        run = {"run_id": self.run_id, "component_id": config.component_id, "input": self.input,
               "model_id": self.model.id if self.model else "", "now": now, "kind": config.kind,
               "follows_pk": follows,
               "history_seqs": [m.seq for m in start.history] if config.store_history_messages else None}
        return start, first, rows, run

    def _started(self, start: _Start, first: list[ChatMessage], now) -> None:
        self.output.messages = first[:-1] + start.history + first[-1:]
        self.created_at = now.timestamp()
        self.output.created_at = int(self.created_at)

    def _create_session(self, store: RunStore, now) -> SessionRow:
        """A new session for this run; if another run created it a moment ago, that one (checked and locked)."""
        config = self.config
        user = resolve_user(self.user_ref, self.alias)
        try:
            with transaction.atomic(using=self.alias):  # a savepoint: a lost race rolls back only this
                session = ChatSession.objects.using(self.alias).new(
                    session_id=self.session_id, owner=user, kind=config.kind, component_id=config.component_id,
                    metadata=config.session_metadata, now=now,
                )
        except IntegrityError:
            return self._load_for_run(store, now)
        return SessionRow(pk=session.pk, owner_id=session.owner_id, owner_name=user_label(user),
                          state_text=json.dumps(session.session_state), state_version=session.state_version,
                          summary=None, last_seq=session.last_seq, lease_token="", lease_live=False)

    def _load_for_run(self, store: RunStore, now) -> SessionRow | None:
        """The session row, locked, with its owner's name; refuses anyone but the owner."""
        session = store.load_session(self.session_id, now)
        if session is not None:
            check_owner(self.session_id, session.owner_id, session.owner_name, self.user_ref)
        return session

    # -- runs inside this run: a workflow's steps, a team's members ----------------------------------

    def child(self, config: RunConfig, input, *, step_name: str, source_prefix: str, row_at_end: bool = False,
              defer_finish: bool = False) -> RunLoop:
        """A run inside this one (a step, a member): same session, user, state and lease. With
        `row_at_end`, its row is stored only after it ended, with the tree's next write (a function
        step); with `defer_finish`, its end is (a workflow's step outside a Parallel)."""
        return RunLoop(config, input, session_id=self.session_id, user=self.user_ref, session_state=None,
                       parent=self, step_name=step_name, source_prefix=self.source_prefix + source_prefix,
                       row_at_end=row_at_end and config.kind == "function", defer_finish=defer_finish)

    async def _child_events(self) -> AsyncIterator[BaseRunEvent]:
        root = self.root
        self.tracker, self.run_context, self.start = root.tracker, root.run_context, root.start
        self.loop = asyncio.get_running_loop()
        self.started = time.perf_counter()
        self.checkpoint_due = self.started + CHECKPOINT_SECONDS
        self.check_cancelled()
        defaults_changed = await self._fill_defaults()
        if self.row_at_end:
            if root.pending:  # an earlier step's end is stored before this one runs
                await call_sync(self._flush_sync)
            self.start_time = timezone.now()
            self.created_at = self.start_time.timestamp()
            self.output.created_at = int(self.created_at)
        else:
            await call_sync(self._start_child_sync)
        # Its own start and completion are made only for a caller that streams events (as a plain run's
        # tool events are); its error and cancellation always, as any run's.
        streamed = root.config.stream_events
        try:
            if streamed:
                yield self.event("started", model=self.model.id if self.model else "",
                                 model_provider=self.model.provider if self.model else "", input=self.input,
                                 created_at=self.created_at)
            if defaults_changed and self.config.stream_events:
                yield self.state_changed_event(*defaults_changed)
            async with aclosing(self._execute()) as executed:
                async for event in executed:
                    yield event
            status, error, error_type = self.outcome
            await self._finish_child(status, error)
            for event in self._final_events(status, error_type, completed=streamed):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            if not self.finished:
                await asyncio.shield(self._finish_child(RunStatus.CANCELLED, ""))
            raise

    async def _fill_defaults(self) -> tuple[list, str] | None:
        """A step agent's or member's own state defaults fill keys missing from the shared state."""
        defaults = self.config.session_state
        tracker = self.tracker
        if not defaults or not state_module.fills_in(defaults, tracker.working):
            return None
        async with tracker.lock:
            tracker.before_touch()
            merged = state_module.merge_owned(state_module.to_json(defaults), tracker.working, None)
            tracker.working.update({key: value for key, value in merged.items() if key not in tracker.working})
            return tracker.record(self.source_prefix + "defaults", None)

    def _start_child_sync(self) -> None:
        config, root, now = self.config, self.root, timezone.now()
        pending = root.pending
        read, history = None, []
        if config.add_history_to_context:
            read = history_module.history_read(root.start.session_pk, config.num_history_runs,
                                               config.num_history_messages, config.component_id)
        # Earlier steps' ends, when held, go with its start, which reads its history before them: when
        # that read is to see one (an earlier run of this same agent, in a Loop), they are stored first.
        flush_first = bool(pending) and read is not None and (config.store_history_messages or any(
            entry.component_id == config.component_id for entry in pending))
        with RunStore(self.alias) as store:
            # Its history read, run row, first messages and the held ends are one statement on PostgreSQL,
            # and a function step's row alone is one anywhere: atomic by itself, no transaction around it
            # (the history read needs none: the root holds the lease).
            folds = store.writes_in_one_statement and config.kind != "function"
            alone = (folds and not flush_first) or (not pending and (config.kind == "function" or folds))
            with store.atomic(one_statement=alone):
                if flush_first:
                    self._flush_pending(store)
                if read and config.store_history_messages:  # its seqs go on the run row: read it first
                    read, history = None, history_module.replayed(store.history(*read), read)
                first = []
                if config.kind != "function":  # a function step's input is its run's `input`; it has no messages
                    system = prompt.system_message(config, dict(self.tracker.working), self.user_id, None)
                    first = [ChatMessage(role=Role.SYSTEM, content=system)] if system else []
                    first.append(ChatMessage(role=Role.USER, content=self.input))
                rows, root.last_seq = self._message_rows(root.start.session_pk, None, first, root.last_seq, now)
                held = list(pending)
                pending.clear()
                new_children = [entry for entry in held if entry.child is not None]
                self.run_pk, history_rows, stored = store.start_child(run={
                    "run_id": self.run_id, "session_pk": root.start.session_pk, "component_id": config.component_id,
                    "input": self.input, "model_id": self.model.id if self.model else "", "now": now,
                    "kind": config.kind, "parent_pk": self.parent.run_pk, "step_name": self.step_name[:200],
                    "history_seqs": [m.seq for m in history] if config.store_history_messages else None,
                }, messages=rows, history=read,  # read by the start's own statement
                    children=[(entry.run_pk, entry.ended, entry.outcome) for entry in held if entry.child is None],
                    children_messages=[row for entry in held for row in entry.messages],
                    new_children=[entry.child._stored_row(entry) for entry in new_children])
                for entry, run_pk in zip(new_children, stored):
                    entry.child.run_pk = run_pk
                if read:
                    history = history_module.replayed(history_rows, read)
        self.output.messages = first[:-1] + history + first[-1:] if first else history
        self.created_at = now.timestamp()
        self.output.created_at = int(self.created_at)

    async def _finish_child(self, status: str, error: str) -> None:
        """Store this run's messages and outcome; the state and its changes wait for the root's finish."""
        self.finished = True
        out = self.output
        self._settle_output(status, storable(error))
        messages = self.new_messages
        if not self.config.store_tool_messages:
            messages = [m for m in messages if m.role != Role.TOOL and not m.tool_calls]
        if self.row_at_end:  # no messages: its row, with its outcome, goes with the tree's next write
            self.root.pending.append(_Deferred([], 0, timezone.now(), self._outcome(status, out.error), self))
        elif self.defer_finish:
            root, now = self.root, timezone.now()
            rows, root.last_seq = self._message_rows(root.start.session_pk, self.run_pk, messages, root.last_seq, now)
            root.pending.append(_Deferred(rows, self.run_pk, now, self._outcome(status, out.error),
                                          component_id=self.config.component_id))
        else:
            await call_sync(self._finish_child_sync, status, out.error, messages)
        out.session_state = json.loads(self.tracker.state_text)
        out.state_version = self.tracker.version
        out.messages.extend(self.new_messages)

    def _finish_child_sync(self, status: str, error: str, messages: list[ChatMessage]) -> None:
        root, now = self.root, timezone.now()
        with RunStore(self.alias) as store, store.atomic(one_statement=not messages):
            rows, root.last_seq = self._message_rows(root.start.session_pk, self.run_pk, messages, root.last_seq, now)
            store.insert_messages(rows)
            store.finish_run(self.run_pk, state_version=None, now=now, **self._outcome(status, error))

    def _flush_sync(self) -> None:
        pending = self.root.pending
        # One function step's row alone is one INSERT, atomic by itself: no transaction around it.
        alone = len(pending) == 1 and pending[0].child is not None
        with RunStore(self.alias) as store, store.atomic(one_statement=alone):
            self._flush_pending(store)

    def _flush_pending(self, store: RunStore) -> None:
        """Write the deferred ends of the tree's finished children (in the caller's transaction)."""
        pending = self.root.pending
        if not pending:
            return
        ended = []
        while pending:
            ended.append(pending.popleft())
        store.insert_messages([row for entry in ended for row in entry.messages])
        for entry in ended:
            if entry.child is not None:
                entry.child.run_pk = store.insert_run(**entry.child._stored_row(entry))
            else:
                store.finish_run(entry.run_pk, state_version=None, now=entry.ended, **entry.outcome)

    def _stored_row(self, entry: _Deferred) -> dict:
        """The arguments of `RunStore.insert_run` for this child's row, held until after it ended."""
        return dict(run_id=self.run_id, session_pk=self.root.start.session_pk, component_id=self.config.component_id,
                    input=self.input, model_id="", now=self.start_time, kind=self.config.kind,
                    parent_pk=self.parent.run_pk, step_name=self.step_name[:200], history_seqs=None,
                    finished_at=entry.ended, **entry.outcome)

    def _insert_messages(self, store: RunStore, session_pk: int, run_pk: int, messages: list[ChatMessage],
                         last_seq: int, now) -> int:
        rows, last_seq = self._message_rows(session_pk, run_pk, messages, last_seq, now)
        store.insert_messages(rows)
        return last_seq

    def _message_rows(self, session_pk: int, run_pk: int, messages: list[ChatMessage], last_seq: int,
                      now) -> tuple[list[tuple], int]:
        """The rows of `messages`, numbered after `last_seq`, and the last number."""
        rows = []
        for message in messages:
            last_seq += 1
            message.seq, message.created_at, message.run_id = last_seq, now, self.run_id
            rows.append((session_pk, run_pk, last_seq, message.role, message.content or "", message.tool_calls,
                         message.tool_call_id, message.tool_name, message.tool_error, now))
        return rows, last_seq

    # -- the model loop ---------------------------------------------------------------------------

    async def _model_loop(self) -> AsyncIterator[BaseRunEvent]:
        config = self.config
        functions = config.functions
        tools = [function.to_openai() for function in functions.values()] or None
        wire = [message.to_wire() for message in self.output.messages]
        response_format = prompt.response_format(config)
        stream_events = config.stream_events
        run_context = self.run_context
        # Token counts are what the server reported; a call that reported none (a stopped or failed
        # stream) makes the run's figure unknown: the keys are left out rather than a false 0.
        metrics = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
        self.output.metrics = metrics
        token_keys = ("input_tokens", "output_tokens", "total_tokens")
        content_event = self.event_classes["content"]
        for _ in range(MAX_MODEL_CALLS):
            self.check_cancelled()
            metrics["model_calls"] += 1
            self.current_reply = reply_parts = []
            final = None
            stream = self.model.astream(wire, tools, response_format)
            self.root.active.add(self)  # a stop interrupts its reads (`interrupt`)
            try:
                # Per token: a stop asked meanwhile is heard by the next `_next_chunk`, before any wait.
                while (chunk := await self._next_chunk(stream)) is not None:
                    if content := chunk.content:
                        if "time_to_first_token" not in metrics:
                            metrics["time_to_first_token"] = round(time.perf_counter() - self.started, 6)
                        reply_parts.append(content)
                        self.content_parts.append(content)
                        yield self._event(content_event, content=content)
                        if time.perf_counter() >= self.checkpoint_due:
                            self._checkpoint()
                    if chunk.finish_reason is not None or chunk.tool_calls or chunk.usage:
                        final = chunk
            finally:
                self.root.active.discard(self)
                # Closing the stream closes the HTTP response: a stopped run stops the provider too.
                await stream.aclose()
                if final is not None and final.usage and "input_tokens" in metrics:
                    for key in token_keys:
                        metrics[key] += final.usage.get(key, 0) or 0
                else:
                    for key in token_keys:
                        metrics.pop(key, None)
            calls = final.tool_calls if final is not None else []
            reply = "".join(reply_parts)
            self.current_reply = []
            assistant = ChatMessage(role=Role.ASSISTANT, content=reply,
                                    tool_calls=[call.as_dict() for call in calls] or None)
            self.new_messages.append(assistant)
            wire.append(assistant.to_wire())
            if not calls:
                self._set_content(reply)
                return
            for call in calls:
                async for event in self._run_tool(call, functions, run_context, wire, stream_events):
                    yield event
        raise ModelError(f"The model kept calling tools after {MAX_MODEL_CALLS} requests; the run was stopped.")

    def _set_content(self, reply: str) -> None:
        schema = self.config.output_schema
        if schema is None:
            # All the text of the run, as streamed (Agno's content): what was said before a tool call counts too.
            self.output.content = "".join(self.content_parts)
            return
        try:
            self.output.content = schema.model_validate_json(reply)
        except pydantic.ValidationError as exc:
            raise ModelError(f"The model's reply does not match {schema.__name__}: {exc.errors()[0]['msg']}") from exc
        self.output.content_type = schema.__name__

    async def _run_tool(self, call, functions, run_context, wire, stream_events) -> AsyncIterator[BaseRunEvent]:
        execution = ToolExecution(tool_call_id=call.id, tool_name=call.name)
        self.output.tools.append(execution)
        function = functions.get(call.name)
        refused = None  # an input over a limit (limits.py): the run fails once the call is on record
        try:
            limits.check_text(call.arguments or "{}", f"The arguments for {call.name}")
            # NUL and lone surrogates (JSON escapes carry both) become U+FFFD before a tool sees them.
            args = storable_tree(json.loads(call.arguments or "{}"))
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except limits.LimitExceeded as exc:
            args, error, refused = {}, f"Error: {exc}", exc
        except ValueError as exc:
            args, error = {}, f"Error: the arguments for {call.name} are not a valid JSON object ({exc})."
        else:
            error = None if function else f"Error: there is no tool named {call.name!r}."
        execution.tool_args = args
        if stream_events:
            yield self.event("tool_started", tool=execution.snapshot())
        elapsed = timed()
        tracker = self.tracker
        recorded, state_error = None, None
        if error is None and function.child_runner is not None:
            # A tool that is another run (a team's delegation to a member): its events are this run's too.
            result = ""
            async with aclosing(function.child_runner(self, args)) as child_events:
                async for item in child_events:
                    if isinstance(item, BaseRunEvent):
                        yield item
                    else:
                        result = item
            execution.result = result_text(result)
            execution.tool_call_error = execution.result.startswith("Error:")
        elif error is None:
            async with tracker.lock:  # one state-touching call at a time in the whole run
                tracker.before_touch()
                try:
                    result = await limits.within_tool_timeout(
                        call_tool(function, args, run_context, self.config.tool_owner, list(self.config.tool_hooks)),
                        call.name)
                    execution.result = result_text(result)
                except limits.LimitExceeded as exc:  # a result over a limit fails the run
                    execution.result, execution.tool_call_error, refused = storable(f"Error: {exc}"), True, exc
                except Exception as exc:  # a failing (or timed out) tool or hook is reported to the model
                    execution.result = storable(f"Error: {type(exc).__name__}: {exc}")
                    execution.tool_call_error = True
                # A tool may rebind run_context.session_state to a new dict: that dict is the state now.
                tracker.working = run_context.session_state
                source = "agentic" if call.name == self.config.agentic_state_tool else f"tool:{call.name}"
                try:
                    recorded = tracker.record(self.source_prefix + source, self)
                except state_module.StateNotJSONError as exc:  # the run fails, once the call is on record
                    state_error = exc
        else:
            execution.result, execution.tool_call_error = error, True
        execution.metrics = {"duration": elapsed()}
        self.new_messages.append(ChatMessage(role=Role.TOOL, content=execution.result, tool_call_id=call.id,
                                             tool_name=call.name, tool_error=execution.tool_call_error))
        wire.append(self.new_messages[-1].to_wire())
        if stream_events:
            yield self.event("tool_completed", tool=execution.snapshot(),
                             content=f"{call.name}() completed in {execution.metrics['duration']:.4f}s.")
        if state_error is not None or refused is not None:
            raise state_error or refused
        if recorded and stream_events:
            yield self.state_changed_event(*recorded)

    def state_changed_event(self, patch: list, state_text: str) -> BaseRunEvent:
        """StateChanged for the change just recorded (the tracker's last)."""
        source = self.tracker.changes[-1][2]
        return self._event(StateChangedEvent, patch=patch, changed_keys=state_module.changed_keys(patch),
                           session_state=json.loads(state_text), source=source, state_version=self.tracker.version)

    async def _next_chunk(self, stream) -> ModelChunk | None:
        """The model's next chunk (None at the end). A stop asked in this process meanwhile interrupts the wait."""
        # A stop that came while the run was busy elsewhere (its caller handling the last event, a checkpoint).
        self.check_cancelled()
        task = self.reader = asyncio.current_task()
        try:
            return await anext(stream)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self.stop_requested() and task.uncancel() == 0:  # our interrupt, not a real cancel
                raise Cancelled() from None
            raise
        finally:
            self.reader = None

    def interrupt(self) -> None:
        """From any thread: stop waiting for the model now (a stop was requested), here and in every run
        of this run's tree that is streaming (a workflow's steps, a team's members)."""

        def cancel_reads():
            for run in {self, *self.active}:
                if run.reader is not None:
                    run.reader.cancel()

        try:
            self.loop.call_soon_threadsafe(cancel_reads)
        except RuntimeError:  # the loop has closed: the run is over
            pass

    def stop_requested(self) -> bool:
        """A stop was asked of this run or of its root run."""
        return run_registry.stop_requested(self.run_id) or (
            self.root is not self and run_registry.stop_requested(self.root.run_id))

    def check_cancelled(self) -> None:
        if self.stop_requested():
            raise Cancelled()


    def _checkpoint(self) -> None:
        """Save the text so far, beside the stream rather than in its way: the model's next chunks are
        read while the write waits its turn on the thread for the engine's queries (behind every other
        run's, under load). One write at a time; a write that comes after the run's end changes nothing
        (it is for a running run only). A stop asked from another process is heard by the root's
        heartbeat, which asks the database every CHECKPOINT_SECONDS."""
        self.checkpoint_due = time.perf_counter() + CHECKPOINT_SECONDS
        if self.saving is None or self.saving.done():
            self.saving = asyncio.ensure_future(self._save_partial("".join(self.content_parts)))

    async def _save_partial(self, partial: str) -> None:
        try:
            await call_sync(lambda: Run.objects.using(self.alias).filter(
                pk=self.run_pk, status=RunStatus.RUNNING).update(content=partial))
        except DatabaseError as exc:  # the text is kept here and stored at the end; the next checkpoint tries again
            logger.warning("Run %s: a checkpoint could not be stored (%s: %s)", self.run_id, type(exc).__name__, exc)

    async def _heartbeat(self, session_pk: int) -> None:
        """Every second: hear about a stop asked from another process (even while waiting for the
        model's first token or inside a tool); every HEARTBEAT_SECONDS: renew the lease."""

        def beat(renew: bool) -> bool:
            if renew:
                ChatSession.objects.using(self.alias).filter(pk=session_pk, lease_token=self.lease_token).update(
                    lease_expires_at=timezone.now() + timedelta(seconds=LEASE_SECONDS)
                )
            return Run.objects.using(self.alias).filter(pk=self.start.run_pk, cancel_requested=True).exists()

        renewed = time.monotonic()
        while True:
            renew = time.monotonic() - renewed >= HEARTBEAT_SECONDS
            if renew:
                renewed = time.monotonic()
            try:
                stop = await call_sync(beat, renew)
            except DatabaseError as exc:  # the database went away for a moment: beat again at the next interval
                logger.warning("Run %s: the lease could not be renewed (%s: %s)", self.run_id, type(exc).__name__, exc)
                renewed, stop = 0.0, False  # renew at the next beat
            if stop:
                run_registry.request_cancel(self.run_id)
                return
            await asyncio.sleep(CHECKPOINT_SECONDS)

    def _start_heartbeat(self, session_pk: int) -> None:
        if not self.finished:
            self.heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat(session_pk))

    # -- finish -----------------------------------------------------------------------------------

    async def _finish(self, status: str, error: str) -> None:
        self.finished = True
        out = self.output
        error = storable(error)
        self._settle_output(status, error)
        keep_state = status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
        messages = self.new_messages
        if not self.config.store_tool_messages:
            messages = [m for m in messages if m.role != Role.TOOL and not m.tool_calls]
        try:
            out.session_state, out.state_version = await self._store_outcome(status, error, keep_state, messages)
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
        run_registry.notify_lease_released(self.start.session_pk)

    def _settle_output(self, status: str, error: str) -> None:
        """The output's status, error and content as the run ends; a reply cut off part-way is kept."""
        out = self.output
        out.status, out.error = status, error
        partial = "".join(self.current_reply)
        if partial:  # the reply of a model call that was stopped or failed part-way
            self.new_messages.append(ChatMessage(role=Role.ASSISTANT, content=partial))
        if status == RunStatus.CANCELLED:
            out.content = "".join(self.content_parts) or f"Run {self.run_id} was cancelled"
        elif status == RunStatus.ERROR:
            out.content = error
        out.metrics["duration"] = round(time.perf_counter() - self.started, 6)

    async def _store_outcome(self, status, error, keep_state, messages) -> tuple[dict, int]:
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
                return await call_sync(self._finish_sync, status, error, keep_state, messages)
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
        """The run failed to store its outcome: mark it failed and release the lease (its replies are lost)."""
        now = timezone.now()
        held = [entry for entry in self.pending if entry.child is not None]
        self.pending.clear()
        with transaction.atomic(using=self.alias):
            if held:  # function steps that ended, whose rows were to go with the outcome
                with RunStore(self.alias) as store:
                    for entry in held:
                        entry.child.run_pk = store.insert_run(**entry.child._stored_row(entry))
            Run.objects.using(self.alias).filter(pk=self.start.run_pk).update(
                status=RunStatus.ERROR, error=error, content=error, finished_at=now)
            # Steps whose end was still to be written with it end with it.
            Run.objects.using(self.alias).filter(parent_run_id=self.start.run_pk, status=RunStatus.RUNNING).update(
                status=RunStatus.ERROR, error=error, finished_at=now)
            ChatSession.objects.using(self.alias).filter(pk=self.start.session_pk, lease_token=self.lease_token).update(
                lease_token="", lease_expires_at=None, last_activity_at=now)

    def _finish_sync(self, status, error, keep_state, messages) -> tuple[dict, int]:
        """Store the outcome. A failed run keeps the state as it was; otherwise the state as of the
        run's last recorded change is stored (written only if it changed)."""
        now, alias = timezone.now(), self.alias
        tracker = self.tracker
        changes = [(*change, None) for change in self.start.changes] + tracker.changes if keep_state else []
        with RunStore(alias) as store:
            # The usual case, written at once: this run still holds the lease (so it knows last_seq) and
            # nobody changed the state meanwhile (so its changes apply as they are).
            version = self.start.base_version + len(changes)
            # The ends of steps that waited for this write go with it; they stay queued until it went
            # through (a finish tried again, or merged below, writes them then).
            pending = list(self.pending)
            with store.atomic(one_statement=store.writes_in_one_statement):
                message_rows, last_seq = self._message_rows(self.start.session_pk, self.start.run_pk, messages,
                                                            self.last_seq, now)
                if store.finish(
                    session_pk=self.start.session_pk, token=self.lease_token, base_version=self.start.base_version,
                    last_seq=last_seq, state_text=tracker.state_text if changes else None, state_version=version,
                    changes=self._change_rows(changes, self.start.base_version, now),
                    messages=[row for entry in pending for row in entry.messages] + message_rows,
                    children=[(entry.run_pk, entry.ended, entry.outcome) for entry in pending if entry.child is None],
                    new_children=[entry.child._stored_row(entry) for entry in pending if entry.child is not None],
                    run_pk=self.start.run_pk, now=now, **self._outcome(status, error),
                ):
                    self.pending.clear()
                    if changes and tracker.snapshot is not None:
                        return tracker.snapshot, version  # the run is over: the caller may have it
                    return json.loads(tracker.state_text if changes else self.start.base_text), version
            # The lease was lost or the state was edited during the run: merge with the ORM.
            with transaction.atomic(using=alias):
                self._flush_pending(store)
                state, version, changes, last_seq = self._finish_contended(keep_state, changes, messages, now)
                store.insert_changes(self._change_rows(changes, version - len(changes), now))
                self._insert_messages(store, self.start.session_pk, self.start.run_pk, messages, last_seq, now)
                store.finish_run(self.start.run_pk, state_version=version, now=now, **self._outcome(status, error))
            return state, version

    def _finish_contended(self, keep_state, changes, messages, now):
        """The lease was lost or the state was edited during the run: lock the row and merge onto it."""
        session = ChatSession.objects.using(self.alias).select_for_update().get(pk=self.start.session_pk)
        state, version = session.session_state, session.state_version
        if keep_state:
            # Someone changed the state during the run (a manual edit): replay our changes on theirs.
            state, changes = self._rebase(session.session_state, changes)
            version += len(changes)
        last_seq = max(session.last_seq, self.last_seq)  # a workflow's steps have stored messages of their own
        fields = {"session_state": state, "state_version": version, "last_activity_at": now,
                  "last_seq": last_seq + len(messages)}
        if session.lease_token == self.lease_token:
            fields.update(lease_token="", lease_expires_at=None)
        ChatSession.objects.using(self.alias).filter(pk=session.pk).update(**fields)
        return state, version, changes, last_seq

    def _change_rows(self, changes: list, first_version: int, now) -> list[tuple]:
        """StateChange rows: each names the run that made it (a step's or a member's), else this run; a
        step whose row is not stored yet by its run id (`RunStore.finish` stores it with them)."""
        session_pk, run_pk = self.start.session_pk, self.start.run_pk
        return [(session_pk, run_pk if change_run is None else change_run.run_pk or change_run.run_id,
                 first_version + number, patch, inverse, source, now)
                for number, (patch, inverse, source, change_run) in enumerate(changes, start=1)]

    def _outcome(self, status, error) -> dict:
        content = self.output.content
        if isinstance(content, BaseModel):
            content = content.model_dump_json()
        return {"status": status, "content": content if isinstance(content, str) else json.dumps(content, default=str),
                "content_type": self.output.content_type, "error": error, "metrics": self.output.metrics}

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


def _input_text(value) -> str:
    """A step's input that is not text (a model's structured output, a dict): as JSON."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
