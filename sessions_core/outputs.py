"""What a finished run hands back: `RunOutput`, `TeamRunOutput`, `WorkflowRunOutput` (Agno's names and fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .requirements import ToolExecution
from .history import ChatMessage
from .models import RunStatus


@dataclass
class RunOutput:
    run_id: str
    session_id: str
    user_id: str | None = None
    agent_id: str = ""
    agent_name: str = ""
    input: str = ""
    content: Any = None
    content_type: str = "str"
    status: str = RunStatus.RUNNING
    error: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    tools: list[ToolExecution] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    session_state: dict = field(default_factory=dict)
    state_version: int = 0
    model: str = ""
    model_provider: str = ""
    created_at: int = 0  # seconds since the epoch, as in Agno
    # A run that waited for a person: every RunRequirement of it, answered or not (requirements.py).
    requirements: list | None = None

    @property
    def is_paused(self) -> bool:
        return self.status == RunStatus.PAUSED

    @property
    def is_cancelled(self) -> bool:
        return self.status == RunStatus.CANCELLED

    @property
    def active_requirements(self) -> list:
        """The requirements still waiting for an answer."""
        return [requirement for requirement in self.requirements or [] if not requirement.is_resolved()]

    def _tool_requirements(self) -> list:
        """The open requirements of tool calls (a workflow's are its steps', review.py)."""
        return [r for r in self.active_requirements if hasattr(r, "tool_execution")]

    @property
    def tools_requiring_confirmation(self) -> list[ToolExecution]:
        return [r.tool_execution for r in self._tool_requirements() if r.needs_confirmation]

    @property
    def tools_requiring_user_input(self) -> list[ToolExecution]:
        return [r.tool_execution for r in self._tool_requirements() if r.needs_user_input]

    @property
    def tools_awaiting_external_execution(self) -> list[ToolExecution]:
        return [r.tool_execution for r in self._tool_requirements() if r.needs_external_execution]


@dataclass
class TeamRunOutput(RunOutput):
    """A team's run: its own reply, and the outputs of the member runs it delegated to."""

    member_responses: list[RunOutput] = field(default_factory=list)

    @property
    def team_id(self) -> str:
        return self.agent_id

    @property
    def team_name(self) -> str:
        return self.agent_name


@dataclass
class WorkflowRunOutput(RunOutput):
    """A workflow's run: the last step's content, every step's result (nested for containers), the final state."""

    step_results: list = field(default_factory=list)

    @property
    def step_requirements(self) -> list:
        """Every StepRequirement of the run (review.py), answered or not."""
        return self.requirements or []

    @property
    def active_step_requirements(self) -> list:
        return self.active_requirements

    @property
    def paused_step_name(self) -> str | None:
        active = self.active_requirements
        return active[-1].step_name if active else None

    @property
    def workflow_id(self) -> str:
        return self.agent_id

    @property
    def workflow_name(self) -> str:
        return self.agent_name


OUTPUT_CLASSES = {"agent": RunOutput, "team": TeamRunOutput, "workflow": WorkflowRunOutput}
