"""A stored requirement (a tool call's or a workflow step's, as a run's `requirements` keeps it) told in
plain words: what was asked and what came of it. Admin and the chat's cards read it from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Decision:
    id: str
    kind: str  # "confirmation", "user_input", "external_execution", "review" (a step's), "executor" (a step's tool)
    title: str  # the tool's or the step's name
    arguments: dict = field(default_factory=dict)  # a tool call's arguments
    message: str = ""  # what the step's review says, or what the step will do
    fields: list[dict] = field(default_factory=list)  # input fields: name, field_type, description, required,
    #                                                   allowed_values, value
    member: str = ""  # the team member whose call it is
    outcome: str = "waiting"  # waiting, approved, rejected, answered
    note: str = ""
    user_input: dict = field(default_factory=dict)
    answered_by: str = ""
    answered_at: datetime | None = None
    imported: bool = False  # from an imported file: it cannot be answered here
    inner: list[Decision] = field(default_factory=list)  # a step's executor's own requirements
    needs_confirmation: bool = False

    @property
    def summary(self) -> str:
        """One line: "delete_file — rejected by ann at 2026-12-07 14:02: not today"."""
        if self.outcome == "waiting":
            return f"{self.title} — waiting"
        said = f"{self.outcome} by {self.answered_by or 'someone'}"
        if self.answered_at:
            said += f" at {self.answered_at:%Y-%m-%d %H:%M}"
        if self.note:
            said += f": {self.note}"
        if self.user_input:
            said += " (" + ", ".join(f"{key}={value}" for key, value in self.user_input.items()) + ")"
        return f"{self.title} — {said}"


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def decision(data: dict) -> Decision:
    """The Decision of one stored requirement (`RunRequirement.to_dict()` or `StepRequirement.to_dict()`)."""
    if data.get("kind") == "step":
        return _step(data)
    execution = data.get("tool_execution") or {}
    kind = ("external_execution" if execution.get("external_execution_required")
            else "user_input" if execution.get("requires_user_input") else "confirmation")
    fields = [{"name": item.get("name"), "field_type": item.get("field_type") or "str",
               "description": item.get("description") or "", "required": True, "value": item.get("value")}
              for item in execution.get("user_input_schema") or []]
    outcome = "waiting"
    if data.get("answered_at"):
        outcome = {True: "approved", False: "rejected"}.get(data.get("confirmation"), "answered")
    return Decision(
        id=data.get("id", ""), kind=kind, title=execution.get("tool_name", ""), arguments=execution.get("tool_args") or {},
        fields=fields, member=data.get("member_agent_name") or "", outcome=outcome,
        note=data.get("confirmation_note") or "", user_input=data.get("user_input") or {},
        answered_by=data.get("answered_by") or "", answered_at=_when(data.get("answered_at")),
        imported=bool(data.get("imported")), needs_confirmation=kind == "confirmation")


def _step(data: dict) -> Decision:
    executor = bool(data.get("requires_executor_input"))
    outcome = "waiting"
    if data.get("answered_at"):
        outcome = {True: "approved", False: "rejected"}.get(data.get("confirmed"), "answered")
    message = data.get("confirmation_message") or data.get("user_input_message") or ""
    return Decision(
        id=data.get("id", ""), kind="executor" if executor else "review", title=data.get("step_name", ""),
        message=message, fields=[{"required": True, "description": "", "field_type": "str", **item}
                                 for item in data.get("user_input_schema") or []],
        outcome=outcome, note=data.get("rejection_feedback") or "", user_input=data.get("user_input") or {},
        answered_by=data.get("answered_by") or "", answered_at=_when(data.get("answered_at")),
        imported=bool(data.get("imported")), needs_confirmation=bool(data.get("requires_confirmation")),
        inner=[decision(item) for item in data.get("executor_requirements") or []],
        arguments={"input": data["step_input"]} if data.get("step_input") else {})


def decisions(requirements: list | None) -> list[Decision]:
    return [decision(item) for item in requirements or [] if isinstance(item, dict)]
