"""A tool call as a run records it (`ToolExecution`), and what a paused run waits for: one `RunRequirement`
per tool call that needs a person (Agno's names).

A call of a tool marked `requires_confirmation`, `requires_user_input` or `external_execution` pauses
the run before the tool runs; its requirement says what is asked (the tool, its arguments, the input
fields) and takes the answer: `confirm()`, `reject(note=None)`, `provide_user_input({...})` or
`set_external_execution_result(text)`. `continue_run` takes only the answers from the requirements it
is given; what runs (the tool, its arguments) is what the paused run stored. Each requirement is kept
with its run, answered or not: what was asked, the decision, the note, the input, when and by whom.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import limits
from .state import copy_tree
from .storable import replace_unstorable, replace_unstorable_tree

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}


@dataclass(kw_only=True)
class ToolExecution:
    """One tool call of a run: what the model asked for, and what came of it."""

    tool_call_id: str
    tool_name: str
    tool_args: dict = field(default_factory=dict)
    result: str | None = None
    tool_call_error: bool = False
    metrics: dict = field(default_factory=dict)
    # A call that waits for a person (its RunRequirement, below): what it waits for, and the answer.
    requires_confirmation: bool | None = None
    confirmed: bool | None = None
    confirmation_note: str | None = None
    requires_user_input: bool | None = None
    user_input_schema: list | None = None  # [UserInputField]
    answered: bool | None = None
    external_execution_required: bool | None = None
    external_execution_silent: bool | None = None

    @property
    def is_paused(self) -> bool:
        return bool(self.requires_confirmation or self.requires_user_input or self.external_execution_required)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["tool_args"], data["metrics"] = copy_tree(self.tool_args), dict(self.metrics)
        if self.user_input_schema is not None:
            data["user_input_schema"] = [item.to_dict() for item in self.user_input_schema]
        return data

    def snapshot(self) -> ToolExecution:
        """A copy for an event: the call as it is now, unchanged when its result and metrics come.
        Its arguments are parsed JSON (copied container by container), which is much quicker than
        asdict's generic deep copy; this runs twice per tool call of every streamed run."""
        if self.is_paused:  # (seldom) every field, its input fields copied too
            schema = self.user_input_schema and [dataclasses.replace(item) for item in self.user_input_schema]
            return dataclasses.replace(self, tool_args=copy_tree(self.tool_args), metrics=dict(self.metrics),
                                       user_input_schema=schema)
        return ToolExecution(tool_call_id=self.tool_call_id, tool_name=self.tool_name,
                             tool_args=copy_tree(self.tool_args), result=self.result,
                             tool_call_error=self.tool_call_error, metrics=dict(self.metrics))


@dataclass
class UserInputField:
    """An argument of a tool that asks the user: its name, type and description; `value` is the
    model's value until the user gives one."""

    name: str
    field_type: type = str
    description: str | None = None
    value: Any = None

    def to_dict(self) -> dict:
        kind = getattr(self.field_type, "__name__", None) or str(self.field_type)
        return {"name": self.name, "field_type": kind, "description": self.description, "value": self.value}

    @classmethod
    def from_dict(cls, data: dict) -> UserInputField:
        return cls(name=data["name"], field_type=_TYPES.get(data.get("field_type"), str),
                   description=data.get("description"), value=data.get("value"))


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@dataclass(eq=False)
class RunRequirement:
    """One waiting tool call of a paused run, and its answer once given."""

    tool_execution: ToolExecution
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    confirmation: bool | None = None
    confirmation_note: str | None = None
    user_input: dict | None = None  # the values the user gave
    external_execution_result: str | None = None
    # Set when a continuation takes the answer (stored with the run).
    answered_at: datetime | None = None
    answered_by: str | None = None
    # A team member's call (Agno's names): the member, its paused run, and the team's delegation call
    # that the member's run answers once it is continued.
    member_agent_id: str | None = None
    member_agent_name: str | None = None
    member_run_id: str | None = None
    member_call_id: str | None = None

    @property
    def user_input_schema(self) -> list[UserInputField] | None:
        return self.tool_execution.user_input_schema

    @property
    def needs_confirmation(self) -> bool:
        execution = self.tool_execution
        return bool(execution.requires_confirmation) and self.confirmation is None and execution.confirmed is None

    @property
    def needs_user_input(self) -> bool:
        execution = self.tool_execution
        return bool(execution.requires_user_input) and not execution.answered

    @property
    def needs_external_execution(self) -> bool:
        return bool(self.tool_execution.external_execution_required) and self.external_execution_result is None

    @property
    def pause_type(self) -> str:
        execution = self.tool_execution
        if execution.external_execution_required:
            return "external_execution"
        if execution.requires_user_input:
            return "user_input"
        return "confirmation"

    @property
    def label(self) -> str:
        """What it is about, for an error message: the tool's name."""
        return self.tool_execution.tool_name

    def is_resolved(self) -> bool:
        return not (self.needs_confirmation or self.needs_user_input or self.needs_external_execution)

    def confirm(self) -> None:
        if not self.needs_confirmation:
            raise ValueError("This requirement does not require confirmation")
        self.confirmation = self.tool_execution.confirmed = True

    def reject(self, note: str | None = None) -> None:
        if not self.needs_confirmation:
            raise ValueError("This requirement does not require confirmation")
        if note is not None:
            limits.check_size(str(note), "The note")
            note = replace_unstorable(str(note))
        self.confirmation = self.tool_execution.confirmed = False
        self.confirmation_note = self.tool_execution.confirmation_note = note

    def provide_user_input(self, values: dict) -> None:
        """Fill the named input fields; answered once every field has a value."""
        if not self.needs_user_input:
            raise ValueError("This requirement does not require user input")
        schema = {item.name: item for item in self.user_input_schema or []}
        unknown = sorted(set(values) - set(schema))
        if unknown:
            raise ValueError(f"{self.tool_execution.tool_name} has no input field named {', '.join(unknown)}")
        limits.check_tree(values, "The user input")
        values = replace_unstorable_tree(dict(values))
        try:
            json.dumps(values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"The user input must be JSON values ({exc})") from None
        for name, value in values.items():
            schema[name].value = value
        self.user_input = {**(self.user_input or {}), **values}
        if all(item.value is not None for item in schema.values()):
            self.tool_execution.answered = True

    def set_external_execution_result(self, result: str) -> None:
        if not self.needs_external_execution:
            raise ValueError("This requirement does not require external execution")
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        limits.check_size(text, "The external execution result")
        self.external_execution_result = self.tool_execution.result = replace_unstorable(text)

    @classmethod
    def for_call(cls, call_id: str, args: dict, function) -> RunRequirement:
        """The requirement of a call of `function` (a tools.Function that waits for a person) with `args`."""
        execution = ToolExecution(tool_call_id=call_id, tool_name=function.name, tool_args=args)
        if function.requires_confirmation:
            execution.requires_confirmation = True
        elif function.requires_user_input:
            execution.requires_user_input = True
            # A fresh copy per call, with the model's values where it gave them.
            execution.user_input_schema = [UserInputField(item.name, item.field_type, item.description,
                                                          args.get(item.name))
                                           for item in function.user_input_schema or []]
        else:
            execution.external_execution_required = True
            execution.external_execution_silent = function.external_execution_silent or None
        return cls(tool_execution=execution)

    def to_dict(self) -> dict:
        data = {"id": self.id, "created_at": _time(self.created_at), "tool_execution": self.tool_execution.to_dict(),
                "confirmation": self.confirmation, "confirmation_note": self.confirmation_note,
                "user_input": self.user_input, "external_execution_result": self.external_execution_result,
                "answered_at": _time(self.answered_at), "answered_by": self.answered_by,
                "member_agent_id": self.member_agent_id, "member_agent_name": self.member_agent_name,
                "member_run_id": self.member_run_id, "member_call_id": self.member_call_id}
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict) -> RunRequirement:
        return cls(tool_execution=tool_execution_from_dict(data["tool_execution"]), id=data["id"],
                   created_at=_parse_time(data.get("created_at")), confirmation=data.get("confirmation"),
                   confirmation_note=data.get("confirmation_note"), user_input=data.get("user_input"),
                   external_execution_result=data.get("external_execution_result"),
                   answered_at=_parse_time(data.get("answered_at")), answered_by=data.get("answered_by"),
                   member_agent_id=data.get("member_agent_id"), member_agent_name=data.get("member_agent_name"),
                   member_run_id=data.get("member_run_id"), member_call_id=data.get("member_call_id"))

    def for_member(self, member_id: str, member_name: str, member_run_id: str, call_id: str) -> RunRequirement:
        """A copy of this (a member run's requirement) as its team's run lists it: the same id, naming the member."""
        copy = RunRequirement.from_dict(self.to_dict())
        copy.member_agent_id, copy.member_agent_name = member_id, member_name
        copy.member_run_id, copy.member_call_id = member_run_id, call_id
        return copy


def tool_execution_from_dict(data: dict) -> ToolExecution:
    fields = {key: value for key, value in data.items() if key in ToolExecution.__dataclass_fields__}
    if fields.get("user_input_schema") is not None:
        fields["user_input_schema"] = [UserInputField.from_dict(item) for item in fields["user_input_schema"]]
    return ToolExecution(**fields)


_NEEDS = (("confirmation", "needs_confirmation"), ("user input", "needs_user_input"),
          ("external execution", "needs_external_execution"))


def paused_content(requirements: list[RunRequirement]) -> str:
    """A paused run's content, as Agno words it: "I have tools to execute, but I need confirmation." (silent
    external calls say nothing)."""
    needed = [name for name, need in _NEEDS if any(
        getattr(requirement, need) and not requirement.tool_execution.external_execution_silent
        for requirement in requirements)]
    if not needed:
        return ""
    wanted = needed[0] if len(needed) == 1 else " or ".join(needed) if len(needed) == 2 else \
        f"{needed[0]}, {needed[1]}, or {needed[2]}"
    return f"I have tools to execute, but I need {wanted}."
