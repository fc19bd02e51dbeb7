"""Run events, named as in Agno, plus our StateChanged.

Every event carries the run id and a per-run sequence number (`seq`), so a client that missed
some can tell where it is.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar


class RunEvent(str, Enum):
    run_started = "RunStarted"
    run_content = "RunContent"
    tool_call_started = "ToolCallStarted"
    tool_call_completed = "ToolCallCompleted"
    state_changed = "StateChanged"
    run_completed = "RunCompleted"
    run_error = "RunError"
    run_cancelled = "RunCancelled"
    session_summary_started = "SessionSummaryStarted"
    session_summary_completed = "SessionSummaryCompleted"

    def __str__(self) -> str:
        return self.value


@dataclass(kw_only=True)
class ToolExecution:
    tool_call_id: str
    tool_name: str
    tool_args: dict = field(default_factory=dict)
    result: str | None = None
    tool_call_error: bool = False
    metrics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class BaseRunEvent:
    event: ClassVar[RunEvent]
    run_id: str
    session_id: str
    agent_id: str = ""
    agent_name: str = ""
    seq: int = 0
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        data = {"event": self.event.value}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = value.to_dict() if isinstance(value, ToolExecution) else value
        return data


@dataclass(kw_only=True)
class RunStartedEvent(BaseRunEvent):
    event = RunEvent.run_started
    model: str = ""
    model_provider: str = ""
    input: str = ""  # the run's input as stored; `created_at` is the run row's



@dataclass(kw_only=True)
class RunContentEvent(BaseRunEvent):
    event = RunEvent.run_content
    content: str = ""
    content_type: str = "str"


@dataclass(kw_only=True)
class ToolCallStartedEvent(BaseRunEvent):
    event = RunEvent.tool_call_started
    tool: ToolExecution


@dataclass(kw_only=True)
class ToolCallCompletedEvent(BaseRunEvent):
    event = RunEvent.tool_call_completed
    tool: ToolExecution
    content: str = ""


@dataclass(kw_only=True)
class StateChangedEvent(BaseRunEvent):
    """The state changed during the run; `patch` is the RFC 6902 diff from the state before the change."""

    event = RunEvent.state_changed
    patch: list = field(default_factory=list)
    changed_keys: list = field(default_factory=list)
    session_state: dict = field(default_factory=dict)
    source: str = ""
    # The version this change is stored as when the run finishes (if the state is edited meanwhile,
    # the run's changes are replayed after that edit and take the versions after it).
    state_version: int = 0


@dataclass(kw_only=True)
class RunCompletedEvent(BaseRunEvent):
    event = RunEvent.run_completed
    content: Any = None
    content_type: str = "str"
    metrics: dict = field(default_factory=dict)
    session_state: dict = field(default_factory=dict)
    state_version: int = 0
    status: str = "completed"


@dataclass(kw_only=True)
class RunErrorEvent(BaseRunEvent):
    event = RunEvent.run_error
    content: str = ""
    error_type: str = ""


@dataclass(kw_only=True)
class RunCancelledEvent(BaseRunEvent):
    event = RunEvent.run_cancelled
    reason: str = ""
    content: str = ""


@dataclass(kw_only=True)
class SessionSummaryStartedEvent(BaseRunEvent):
    event = RunEvent.session_summary_started


@dataclass(kw_only=True)
class SessionSummaryCompletedEvent(BaseRunEvent):
    event = RunEvent.session_summary_completed
    session_summary: dict | None = None
