"""The one working state of a run, shared by its steps and member runs, and the record of its changes.

A run (an agent's, a team's or a workflow's) opens one tracker; every step, member run, tool,
executor, evaluator and selector inside it works on `working`, the dict `RunContext.session_state`
is. After each call that may touch it, `record` compares the state with the last recorded one (as
JSON text, in C) and diffs it only when it changed, so every change is a patch with its inverse,
its source and the run that made it (a step's or member's run; the root's finish stores them all).

Calls that touch the state take `lock` one at a time, so two parallel branches never interleave a
read-modify-write. `discard` undoes a failed step's own changes (their inverses, newest first), so
a sibling's changes made meanwhile stay.
"""

from __future__ import annotations

import asyncio
import json
import logging

from . import state as state_module

logger = logging.getLogger("sessions_core")

SOURCE_CHARS = 128  # StateChange.source


class StateTracker:
    def __init__(self, working: dict, state_text: str, first_version: int):
        self.working = working  # injected keys included
        self.state_text = state_text  # the state as of the last recorded change, without injected keys
        self.snapshot: dict | None = None  # the state as of state_text, once something touched it
        self.changes: list[tuple[list, list, str, object | None]] = []  # (patch, inverse, source, run)
        self.first_version = first_version  # the version before the first of `changes`
        self.lock = asyncio.Lock()

    @property
    def version(self) -> int:
        """The version the last recorded change is stored as."""
        return self.first_version + len(self.changes)

    def before_touch(self) -> None:
        """Keep the state as it is before a call touches it, to diff its changes against."""
        if self.snapshot is None:
            self.snapshot = state_module.copy_tree(state_module.strip_injected(self.working))

    def record(self, source: str, run) -> tuple[list, str] | None:
        """Record what changed since the last record, as one change made by `run` (a run; None: the
        run that owns the tracker); (patch, state text) or None.

        Raises StateNotJSONError when a value cannot be stored, StateLimitError (one) when the state
        would be over CHAT_MAX_STATE_BYTES or nested deeper than CHAT_MAX_JSON_DEPTH."""
        live = state_module.strip_injected(self.working)
        after_text = state_module.dumps(live)
        if after_text == self.state_text:
            return None
        if self.snapshot is None:
            self.snapshot = json.loads(self.state_text)
        # Usually straight from the tools' own dicts, without parsing what they left.
        diffed = state_module.diff_onto(self.snapshot, live)  # the patches copy what they hold
        if diffed is None:  # they hold values whose JSON form differs (a tuple, a datetime): parse it
            after = json.loads(after_text)
            diffed = state_module.diff(self.snapshot, after)
            self.snapshot = after
        patch, inverse = diffed
        try:
            state_module.check_patch(patch)  # nested too deep: refused like a value that is not JSON
        except state_module.StateLimitError:
            self.snapshot = json.loads(self.state_text)  # back to the last recorded change
            raise
        self.state_text = after_text
        if not patch:
            return None
        self.changes.append((patch, inverse, source[:SOURCE_CHARS], run))
        return patch, after_text

    def discard(self, changes: list, source: str, run) -> tuple[list, str] | None:
        """Undo `changes` (one step's), newest first, on the state as it is now; recorded as one change."""
        state = json.loads(self.state_text)
        for patch, inverse, change_source, _ in reversed(changes):
            try:
                state = state_module.apply_patch(state, inverse)
            except Exception:  # a later change of another step touched the same place: its value stands
                logger.warning("A change by %s could not be undone after later changes", change_source)
        injected = {key: self.working[key] for key in state_module.INJECTED_KEYS if key in self.working}
        self.working.clear()
        self.working.update(state, **injected)
        return self.record(source, run)
