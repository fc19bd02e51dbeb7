"""A run inside a root run: a workflow's step or a team's member run.

It works under its root's lease on the root's state (one `StateTracker` for the whole tree), and
stores its own row and messages as it starts and ends. The state and every change of it, each
naming the run that made it, are stored by the root's finish, so a failed workflow leaves the stored
state as it was.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from django.db import transaction
from django.utils import timezone

from .. import history as history_module
from .. import prompt
from .. import state as state_module
from ..bridge import call_sync
from ..events import BaseRunEvent
from ..history import ChatMessage
from ..models import Role, RunStatus
from ..storable import replace_unstorable
from . import lifecycle, store
from .base import BaseRun
from .model_loop import CHECKPOINT_SECONDS


class ChildRun(BaseRun):
    def __init__(self, config, input, *, parent: BaseRun, step_name: str, source_prefix: str):
        super().__init__(config, input, session_id=parent.session_id, user=parent.user_ref, step_name=step_name,
                         source_prefix=source_prefix)
        self.parent = parent
        self.root = parent.root
        # Set by its parent when a pause of this run can pause the parent too (a team's member, a
        # workflow's top-level agent or team step); otherwise a tool that waits for a person is refused.
        self.pausable = False

    @property
    def can_pause(self) -> bool:
        return self.pausable and self.config.executor is None

    @property
    def tracker(self):
        return self.root.tracker

    @property
    def run_context(self):
        return self.root.run_context

    @property
    def start(self):
        return self.root.start

    def events(self) -> AsyncIterator[BaseRunEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[BaseRunEvent]:
        self.loop = asyncio.get_running_loop()
        self.started = time.perf_counter()
        self.checkpoint_due = self.started + CHECKPOINT_SECONDS
        self.check_cancelled()
        defaults_changed = await self._fill_defaults()
        await call_sync(self._start_sync)
        # Its own start and completion are made only for a caller that streams events (as a plain run's
        # tool events are); its error and cancellation always, as any run's.
        streamed = self.root.config.stream_events
        try:
            if streamed:
                yield self.started_event()
            if defaults_changed and self.config.stream_events:
                yield self.state_changed_event(*defaults_changed)
            async with aclosing(self._execute()) as executed:
                async for event in executed:
                    yield event
            status, error, error_type = self.outcome
            await self._finish(status, error)
            for event in self._final_events(status, error_type, completed=streamed):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            if not self.finished:
                await asyncio.shield(self._finish(RunStatus.CANCELLED, ""))
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

    def _start_sync(self) -> None:
        """Its row, history and first messages (a function step has none: its input is on its row)."""
        config, root, alias, now = self.config, self.root, self.alias, timezone.now()
        session_pk = root.start.session_pk
        history = []
        if config.add_history_to_context:
            read = history_module.history_read(session_pk, config.num_history_runs, config.num_history_messages,
                                               config.component_id, config.max_tool_calls_from_history)
            history = history_module.read_history(read, alias)
        first = []
        if config.kind != "function":
            system = prompt.system_message(config, dict(self.tracker.working), self.user_id, None)
            first = [ChatMessage(role=Role.SYSTEM, content=system)] if system else []
            first.append(ChatMessage(role=Role.USER, content=self.input))
        with transaction.atomic(using=alias):
            run = lifecycle.start_new(
                alias, run_id=self.run_id, session_id=session_pk, parent_run_id=self.parent.run_pk, kind=config.kind,
                step_name=self.step_name[:200], component_id=config.component_id, input=self.input,
                model_id=self.model.id if self.model else "", created_at=now,
                history_seqs=[m.seq for m in history] if config.store_history_messages else None)
            self.run_pk = run.pk
            rows, root.last_seq = store.message_rows(session_pk, run, first, root.last_seq, now, self.run_id)
            store.insert_messages(rows, alias)
        self.output.messages = first[:-1] + history + first[-1:] if first else history
        self.created_at = now.timestamp()
        self.output.created_at = int(self.created_at)

    async def _finish(self, status: str, error: str) -> None:
        """Store this run's messages and outcome; the state and its changes wait for the root's finish."""
        self.finished = True
        out = self.output
        self._settle_output(status, replace_unstorable(error))
        await call_sync(self._finish_sync, status, out.error, self.stored_messages())
        out.session_state = json.loads(self.tracker.state_text)
        out.state_version = self.tracker.version
        out.messages.extend(self.new_messages)

    def _finish_sync(self, status: str, error: str, messages: list[ChatMessage]) -> None:
        root, alias, now = self.root, self.alias, timezone.now()
        if status == RunStatus.PAUSED:  # its continuation sends the tool traffic, whatever store_tool_messages says
            messages = self.new_messages
        with transaction.atomic(using=alias):
            rows, root.last_seq = store.message_rows(root.start.session_pk, self.run_pk, messages, root.last_seq, now,
                                                     self.run_id)
            store.insert_messages(rows, alias)
            if status == RunStatus.PAUSED:  # it waits with its root, which stores the pause
                lifecycle.pause(self.run_pk, alias, state_version=None, **self.outcome_fields(error))
                return
            if self.continued and not self.config.store_tool_messages:  # what it kept while it waited
                store.drop_tool_messages(self.run_pk, alias)
            lifecycle.end(self.run_pk, status, alias, state_version=None, finished_at=now,
                          **self.outcome_fields(error))


ChildRun.child_class = ChildRun
