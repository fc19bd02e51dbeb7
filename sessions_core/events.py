"""Run events, named as in Agno (agent, team and workflow events), plus our StateChanged.

Every event carries the run id and a per-run sequence number (`seq`), so a client that missed
some can tell where it is, and the id of the run it belongs to (`parent_run_id`: the workflow run of
a step, the team run of a member) with the step or member name, so a client can draw the tree live.

A team's and a workflow's own run events are subclasses of the agent's (`TeamRunStartedEvent` is a
`RunStartedEvent`), so code that handles runs handles all three; their `event` names are Agno's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from .requirements import ToolExecution  # noqa: F401 (the tool of the tool-call events)


class RunEvent(str, Enum):
    run_started = "RunStarted"
    run_content = "RunContent"
    tool_call_started = "ToolCallStarted"
    tool_call_completed = "ToolCallCompleted"
    state_changed = "StateChanged"
    run_queued = "RunQueued"
    run_completed = "RunCompleted"
    run_error = "RunError"
    run_cancelled = "RunCancelled"
    run_paused = "RunPaused"
    run_continued = "RunContinued"
    session_summary_started = "SessionSummaryStarted"
    session_summary_completed = "SessionSummaryCompleted"
    memory_update_started = "MemoryUpdateStarted"
    memory_update_completed = "MemoryUpdateCompleted"
    # teams
    team_run_started = "TeamRunStarted"
    team_run_content = "TeamRunContent"
    team_tool_call_started = "TeamToolCallStarted"
    team_tool_call_completed = "TeamToolCallCompleted"
    team_run_completed = "TeamRunCompleted"
    team_run_error = "TeamRunError"
    team_run_cancelled = "TeamRunCancelled"
    team_run_paused = "TeamRunPaused"
    team_run_continued = "TeamRunContinued"
    # workflows
    workflow_started = "WorkflowStarted"
    workflow_completed = "WorkflowCompleted"
    workflow_error = "WorkflowError"
    workflow_cancelled = "WorkflowCancelled"
    step_started = "StepStarted"
    step_completed = "StepCompleted"
    step_error = "StepError"
    step_paused = "StepPaused"
    step_continued = "StepContinued"
    steps_execution_started = "StepsExecutionStarted"
    steps_execution_completed = "StepsExecutionCompleted"
    condition_execution_started = "ConditionExecutionStarted"
    condition_execution_completed = "ConditionExecutionCompleted"
    router_execution_started = "RouterExecutionStarted"
    router_execution_completed = "RouterExecutionCompleted"
    parallel_execution_started = "ParallelExecutionStarted"
    parallel_execution_completed = "ParallelExecutionCompleted"
    loop_execution_started = "LoopExecutionStarted"
    loop_execution_completed = "LoopExecutionCompleted"
    loop_iteration_started = "LoopIterationStarted"
    loop_iteration_completed = "LoopIterationCompleted"

    def __str__(self) -> str:
        return self.value


def _plain(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@dataclass(kw_only=True)
class BaseRunEvent:
    event: ClassVar[RunEvent]
    run_id: str
    session_id: str
    agent_id: str = ""
    agent_name: str = ""
    seq: int = 0
    created_at: float = field(default_factory=time.time)
    parent_run_id: str = ""  # the workflow or team run this step or member run belongs to
    step_name: str = ""  # the step (or member) this run or container ran as

    def to_dict(self) -> dict[str, Any]:
        data = {"event": self.event.value}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = _plain(value)
        return data


@dataclass(kw_only=True)
class RunStartedEvent(BaseRunEvent):
    event = RunEvent.run_started
    model: str = ""
    model_provider: str = ""
    input: str = ""  # the run's input as stored; `created_at` is the run row's



@dataclass(kw_only=True)
class RunQueuedEvent(BaseRunEvent):
    """The session's lease is held by another run: this one is stored `queued` and starts in order."""

    event = RunEvent.run_queued
    input: str = ""


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
class RunPausedEvent(BaseRunEvent):
    """The run waits for a person: `requirements` (RunRequirement) says for what; `continue_run` answers."""

    event = RunEvent.run_paused
    content: str = ""
    tools: list = field(default_factory=list)  # [ToolExecution]: the calls that wait
    requirements: list = field(default_factory=list)  # [RunRequirement]: every one of the run, answered or not

    @property
    def is_paused(self) -> bool:
        return True

    @property
    def active_requirements(self) -> list:
        return [requirement for requirement in self.requirements if not requirement.is_resolved()]


@dataclass(kw_only=True)
class RunContinuedEvent(BaseRunEvent):
    """A paused run goes on (`continue_run`): the first event of its stream, under the same run id."""

    event = RunEvent.run_continued


@dataclass(kw_only=True)
class TeamRunPausedEvent(RunPausedEvent):
    """The team's run waits for a person: its own tool's call, or a member's (the requirement names it)."""

    event = RunEvent.team_run_paused


@dataclass(kw_only=True)
class TeamRunContinuedEvent(RunContinuedEvent):
    event = RunEvent.team_run_continued


@dataclass(kw_only=True)
class StepPausedEvent(RunPausedEvent):
    """The workflow's run waits for a person at step `step_name`: its review, or its agent's or team's
    tool call (`requirements` holds the StepRequirements; the last is the open one)."""

    event = RunEvent.step_paused

    @property
    def step_requirement(self):
        return self.requirements[-1] if self.requirements else None


@dataclass(kw_only=True)
class StepContinuedEvent(RunContinuedEvent):
    """A paused workflow run goes on at step `step_name` (`Workflow.continue_run`)."""

    event = RunEvent.step_continued


@dataclass(kw_only=True)
class SessionSummaryStartedEvent(BaseRunEvent):
    event = RunEvent.session_summary_started


@dataclass(kw_only=True)
class SessionSummaryCompletedEvent(BaseRunEvent):
    event = RunEvent.session_summary_completed
    session_summary: dict | None = None


@dataclass(kw_only=True)
class MemoryUpdateStartedEvent(BaseRunEvent):
    event = RunEvent.memory_update_started


@dataclass(kw_only=True)
class MemoryUpdateCompletedEvent(BaseRunEvent):
    """The memory work after the reply: the memories added or changed (`UserMemory`), the ids deleted,
    and `error` when it failed (the reply stands)."""

    event = RunEvent.memory_update_completed
    memories: list = field(default_factory=list)
    deleted: list = field(default_factory=list)
    error: str = ""


# --- teams: the team's own run, named as in Agno ------------------------------------------------------


@dataclass(kw_only=True)
class TeamRunStartedEvent(RunStartedEvent):
    event = RunEvent.team_run_started


@dataclass(kw_only=True)
class TeamRunContentEvent(RunContentEvent):
    event = RunEvent.team_run_content


@dataclass(kw_only=True)
class TeamToolCallStartedEvent(ToolCallStartedEvent):
    event = RunEvent.team_tool_call_started


@dataclass(kw_only=True)
class TeamToolCallCompletedEvent(ToolCallCompletedEvent):
    event = RunEvent.team_tool_call_completed


@dataclass(kw_only=True)
class TeamRunCompletedEvent(RunCompletedEvent):
    event = RunEvent.team_run_completed


@dataclass(kw_only=True)
class TeamRunErrorEvent(RunErrorEvent):
    event = RunEvent.team_run_error


@dataclass(kw_only=True)
class TeamRunCancelledEvent(RunCancelledEvent):
    event = RunEvent.team_run_cancelled


# --- workflows ---------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class WorkflowStartedEvent(RunStartedEvent):
    event = RunEvent.workflow_started


@dataclass(kw_only=True)
class WorkflowCompletedEvent(RunCompletedEvent):
    """The workflow's outcome, with the final `session_state` (Agno's has none) and the step results."""

    event = RunEvent.workflow_completed
    step_results: list = field(default_factory=list)


@dataclass(kw_only=True)
class WorkflowErrorEvent(RunErrorEvent):
    event = RunEvent.workflow_error


@dataclass(kw_only=True)
class WorkflowCancelledEvent(RunCancelledEvent):
    event = RunEvent.workflow_cancelled


@dataclass(kw_only=True)
class StepStartedEvent(BaseRunEvent):
    """A step begins. `run_id` is the step's own run (for agent, team and function steps)."""

    event = RunEvent.step_started
    step_type: str = "step"  # step, steps, condition, router, parallel, loop
    executor_type: str = ""  # agent, team or function
    executor_name: str = ""
    executor_id: str = ""  # the agent's or team's id, the function's name: its run's component_id


@dataclass(kw_only=True)
class StepCompletedEvent(BaseRunEvent):
    event = RunEvent.step_completed
    step_type: str = "step"
    content: Any = None
    step_output: Any = None  # the StepOutput


@dataclass(kw_only=True)
class StepErrorEvent(BaseRunEvent):
    """A step failed (after its retries); with on_error="skip" the workflow goes on."""

    event = RunEvent.step_error
    error: str = ""


@dataclass(kw_only=True)
class _ContainerEvent(BaseRunEvent):
    step_type: str = ""


@dataclass(kw_only=True)
class StepsExecutionStartedEvent(_ContainerEvent):
    event = RunEvent.steps_execution_started
    steps_count: int = 0


@dataclass(kw_only=True)
class StepsExecutionCompletedEvent(_ContainerEvent):
    event = RunEvent.steps_execution_completed
    step_results: list = field(default_factory=list)


@dataclass(kw_only=True)
class ConditionExecutionStartedEvent(_ContainerEvent):
    event = RunEvent.condition_execution_started
    condition_result: bool | None = None


@dataclass(kw_only=True)
class ConditionExecutionCompletedEvent(_ContainerEvent):
    event = RunEvent.condition_execution_completed
    condition_result: bool | None = None
    branch: str = ""  # "if", "else" or "" (skipped)
    step_results: list = field(default_factory=list)


@dataclass(kw_only=True)
class RouterExecutionStartedEvent(_ContainerEvent):
    event = RunEvent.router_execution_started
    selected_steps: list = field(default_factory=list)


@dataclass(kw_only=True)
class RouterExecutionCompletedEvent(_ContainerEvent):
    event = RunEvent.router_execution_completed
    selected_steps: list = field(default_factory=list)
    step_results: list = field(default_factory=list)


@dataclass(kw_only=True)
class ParallelExecutionStartedEvent(_ContainerEvent):
    event = RunEvent.parallel_execution_started
    parallel_step_count: int = 0


@dataclass(kw_only=True)
class ParallelExecutionCompletedEvent(_ContainerEvent):
    event = RunEvent.parallel_execution_completed
    step_results: list = field(default_factory=list)


@dataclass(kw_only=True)
class LoopExecutionStartedEvent(_ContainerEvent):
    event = RunEvent.loop_execution_started
    max_iterations: int = 0


@dataclass(kw_only=True)
class LoopIterationStartedEvent(_ContainerEvent):
    event = RunEvent.loop_iteration_started
    iteration: int = 0
    max_iterations: int = 0


@dataclass(kw_only=True)
class LoopIterationCompletedEvent(_ContainerEvent):
    event = RunEvent.loop_iteration_completed
    iteration: int = 0
    max_iterations: int = 0
    should_continue: bool = True


@dataclass(kw_only=True)
class LoopExecutionCompletedEvent(_ContainerEvent):
    event = RunEvent.loop_execution_completed
    total_iterations: int = 0
    step_results: list = field(default_factory=list)


# The events a run emits about itself, by the kind of component it runs.
RUN_EVENT_CLASSES = {
    "agent": {"started": RunStartedEvent, "content": RunContentEvent, "tool_started": ToolCallStartedEvent,
              "tool_completed": ToolCallCompletedEvent, "completed": RunCompletedEvent, "error": RunErrorEvent,
              "cancelled": RunCancelledEvent, "paused": RunPausedEvent, "continued": RunContinuedEvent},
    "team": {"started": TeamRunStartedEvent, "content": TeamRunContentEvent,
             "tool_started": TeamToolCallStartedEvent, "tool_completed": TeamToolCallCompletedEvent,
             "completed": TeamRunCompletedEvent, "error": TeamRunErrorEvent, "cancelled": TeamRunCancelledEvent,
             "paused": TeamRunPausedEvent, "continued": TeamRunContinuedEvent},
}
RUN_EVENT_CLASSES["workflow"] = {**RUN_EVENT_CLASSES["agent"], "started": WorkflowStartedEvent,
                                 "completed": WorkflowCompletedEvent, "error": WorkflowErrorEvent,
                                 "cancelled": WorkflowCancelledEvent, "paused": StepPausedEvent,
                                 "continued": StepContinuedEvent}
