"""A workflow that waits for a person (Agno's names): `HumanReview` on a step, `StepRequirement`, and the
walk of a workflow's top-level steps that pauses and resumes.

A step with `human_review=HumanReview(requires_confirmation=True)` (or `requires_user_input=True` with a
`user_input_schema`) pauses the workflow run before the step runs; a top-level agent or team step whose
tool waits for a person pauses it too (the step's requirement then carries the executor's requirements).
The pause is stored as any run's (run/finish.py): the state written by the earlier steps committed, the
requirement with the earlier steps' outputs. `Workflow.continue_run` resumes at that step: confirmed or
given its input, it runs (the input reaches it as `step_input.additional_data["user_input"]`); rejected,
it is skipped (`on_reject="skip"`) or the run ends cancelled (`on_reject="cancel"`); an executor's pause
continues the step's paused run with the answers. The earlier steps do not run again.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import limits
from .errors import Cancelled, ChildPaused, Paused
from .requirements import RunRequirement, _parse_time, _time
from .steps import Step, StepInput, StepOutput, content_text, deepest_content
from .storable import replace_unstorable, replace_unstorable_tree

ON_REJECT = ("skip", "cancel")
FIELD_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


@dataclass
class HumanReview:
    """What a step asks of a person before it runs. `user_input_schema` is a list of dicts: name,
    field_type ("str", "int", "float", "bool"), description, required (default True), allowed_values."""

    requires_confirmation: bool = False
    confirmation_message: str | None = None
    requires_user_input: bool = False
    user_input_message: str | None = None
    user_input_schema: list[dict] | None = None
    on_reject: str = "skip"

    def __post_init__(self):
        if self.on_reject not in ON_REJECT:
            raise ValueError(f"on_reject must be one of {', '.join(ON_REJECT)}, not {self.on_reject!r}.")
        if self.user_input_schema and not self.requires_user_input:
            self.requires_user_input = True
        for item in self.user_input_schema or []:
            if not isinstance(item, dict) or not item.get("name"):
                raise ValueError(f"A user_input_schema field is a dict with a name, not {item!r}.")
            if item.get("field_type", "str") not in FIELD_TYPES:
                raise ValueError(f"Field {item['name']!r}: field_type must be one of {', '.join(FIELD_TYPES)}.")

    @property
    def pauses(self) -> bool:
        return self.requires_confirmation or self.requires_user_input


def check_value(item: dict, value: Any) -> Any:
    """`value` for the user-input field `item`, checked against its type and allowed values (a ValueError
    saying what is wrong otherwise); text for a number is read as one."""
    name, kind = item["name"], FIELD_TYPES[item.get("field_type", "str")]
    if kind in (int, float) and isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be {'a whole number' if kind is int else 'a number'}.") from None
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{name} must be of type {kind.__name__}.")
    if kind is str:
        limits.check_size(value, f"The field {name}")
        value = replace_unstorable(value)
    allowed = item.get("allowed_values")
    if allowed and value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}.")
    return value


@dataclass(eq=False)
class StepRequirement:
    """What a paused workflow run waits for at one of its steps, and the answer once given."""

    step_name: str
    step_index: int
    step_id: str | None = None
    step_type: str = "Step"
    step_input: str | None = None  # what the step will be given, as text
    requires_confirmation: bool = False
    confirmation_message: str | None = None
    confirmed: bool | None = None
    on_reject: str = "skip"
    rejection_feedback: str | None = None
    requires_user_input: bool = False
    user_input_message: str | None = None
    user_input_schema: list[dict] | None = None
    user_input: dict | None = None
    # An agent or team step whose tool waits for a person: its paused run and that run's requirements.
    requires_executor_input: bool = False
    executor_requirements: list[RunRequirement] | None = None
    executor_id: str | None = None
    executor_name: str | None = None
    executor_run_id: str | None = None
    executor_type: str | None = None
    # The outputs of the steps before it ([{step_name, content}]), which the resumed steps read.
    previous_step_outputs: list[dict] = field(default_factory=list)
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    answered_at: datetime | None = None
    answered_by: str | None = None

    @property
    def label(self) -> str:
        return self.step_name

    @property
    def needs_confirmation(self) -> bool:
        return self.requires_confirmation and self.confirmed is None

    @property
    def needs_user_input(self) -> bool:
        if not self.requires_user_input or self.confirmed is False:
            return False
        given = self.user_input or {}
        return any(item.get("required", True) and given.get(item["name"]) is None
                   for item in self.user_input_schema or [])

    @property
    def needs_executor_resolution(self) -> bool:
        return self.requires_executor_input and any(not r.is_resolved() for r in self.executor_requirements or [])

    @property
    def pause_type(self) -> str:
        return ("executor" if self.requires_executor_input else "user_input" if self.requires_user_input
                else "confirmation")

    def is_resolved(self) -> bool:
        """(A method, as RunRequirement's: one check for every requirement of a run.)"""
        return not (self.needs_confirmation or self.needs_user_input or self.needs_executor_resolution)

    def confirm(self) -> None:
        if not self.needs_confirmation:
            raise ValueError("This requirement does not require confirmation")
        self.confirmed = True

    def reject(self, feedback: str | None = None) -> None:
        if not self.needs_confirmation:
            raise ValueError("This requirement does not require confirmation")
        if feedback is not None:
            limits.check_size(str(feedback), "The note")
            feedback = replace_unstorable(str(feedback))
        self.confirmed, self.rejection_feedback = False, feedback

    def set_user_input(self, validate: bool = True, **values) -> None:
        """Give the step's input fields; each value is checked against its field (type, allowed values)."""
        if not self.requires_user_input:
            raise ValueError("This requirement does not require user input")
        schema = {item["name"]: item for item in self.user_input_schema or []}
        unknown = sorted(set(values) - set(schema))
        if unknown:
            raise ValueError(f"Step {self.step_name!r} has no input field named {', '.join(unknown)}")
        if validate:
            values = {name: check_value(schema[name], value) for name, value in values.items()}
        limits.check_tree(values, "The user input")
        self.user_input = {**(self.user_input or {}), **replace_unstorable_tree(values)}

    def get_user_input(self, name: str) -> Any:
        return (self.user_input or {}).get(name)

    def take(self, answer: StepRequirement, take_run_answer: Callable) -> None:
        """Copy the answer of `answer` (only the answer) onto this stored requirement."""
        if self.needs_confirmation and answer.confirmed is not None:
            self.confirm() if answer.confirmed else self.reject(answer.rejection_feedback)
        if self.requires_user_input and answer.user_input and self.confirmed is not False:
            self.set_user_input(**answer.user_input)
        if self.requires_executor_input:
            given = {requirement.id: requirement for requirement in answer.executor_requirements or []}
            for requirement in self.executor_requirements or []:
                if requirement.id in given and not requirement.is_resolved():
                    take_run_answer(requirement, given[requirement.id])

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(kind="step", created_at=_time(self.created_at), answered_at=_time(self.answered_at))
        if self.executor_requirements is not None:
            data["executor_requirements"] = [requirement.to_dict() for requirement in self.executor_requirements]
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_dict(cls, data: dict) -> StepRequirement:
        fields = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        fields["created_at"] = _parse_time(data.get("created_at"))
        fields["answered_at"] = _parse_time(data.get("answered_at"))
        if data.get("executor_requirements") is not None:
            fields["executor_requirements"] = [RunRequirement.from_dict(item) for item in data["executor_requirements"]]
        return cls(**fields)


def requirement_from_dict(data: dict) -> RunRequirement | StepRequirement:
    """A stored requirement: a workflow step's, or a tool call's."""
    return StepRequirement.from_dict(data) if data.get("kind") == "step" else RunRequirement.from_dict(data)


def nested_reviews(steps, top: bool = True) -> list[str]:
    """The names of steps with a human_review below the top level (a workflow pauses only at its top level)."""
    found = []
    for step in steps:
        if not top and getattr(step, "human_review", None) is not None:
            found.append(step.name)
        for attribute in ("steps", "else_steps", "choices"):
            found += nested_reviews(getattr(step, attribute, None) or [], top=False)
    return found


# -- the walk of a workflow's top-level steps -----------------------------------------------------------


def _saved(outputs: list) -> list[dict]:
    return [{"step_name": output.step_name, "content": content_text(output.content)} for output in outputs]


async def run_top_level(steps: list, context, step_input, outputs: list, resume: StepRequirement | None
                        ) -> AsyncIterator:
    """A workflow's top-level steps in order, as `steps.run_sequence` runs them, pausing at a step under
    review or at an agent or team step whose run paused; `resume` (a continued run's answered
    requirement) starts the walk again at its step."""
    loop, previous, content, first = context.loop, {}, step_input.previous_step_content, 0
    if resume is not None:
        first = resume.step_index
        for saved in resume.previous_step_outputs:
            output = StepOutput(step_name=saved["step_name"], content=saved["content"])
            outputs.append(output)
            previous[output.step_name] = output
            content = output.content
    for index in range(first, len(steps)):
        step = steps[index]
        current = StepInput(input=step_input.input, previous_step_content=content,
                            previous_step_outputs=dict(previous), additional_data=step_input.additional_data,
                            workflow_history=step_input.workflow_history)
        answered = resume if resume is not None and index == resume.step_index else None
        review = getattr(step, "human_review", None)
        if answered is not None and not answered.requires_executor_input:
            if answered.confirmed is False:
                if answered.on_reject == "cancel":
                    loop.content_parts.append(f"Workflow cancelled: Step '{step.name}' was rejected")
                    raise Cancelled()
                continue  # skipped: the next step reads the outputs before it
            if answered.user_input:
                current.additional_data = {**(current.additional_data or {}), "user_input": dict(answered.user_input)}
        elif answered is None and review is not None and review.pauses:
            _pause(loop, StepRequirement(
                step_name=step.name, step_index=index, step_id=getattr(step, "step_id", None),
                step_input=_input_text(step, current), requires_confirmation=review.requires_confirmation,
                confirmation_message=review.confirmation_message, on_reject=review.on_reject,
                requires_user_input=review.requires_user_input, user_input_message=review.user_input_message,
                user_input_schema=[dict(item) for item in review.user_input_schema or []] or None,
                previous_step_outputs=_saved(outputs)))
        output = None
        executor = answered if answered is not None and answered.requires_executor_input else None
        try:
            executed = (step.execute(context, current, resume=executor, pausable=True) if isinstance(step, Step)
                        else step.execute(context, current))
            async with aclosing(executed) as items:
                async for item in items:
                    if isinstance(item, StepOutput):
                        output = item
                    else:
                        yield item
        except ChildPaused as paused:
            child = paused.child
            _pause(loop, StepRequirement(
                step_name=step.name, step_index=index, step_id=step.step_id, step_input=child.input,
                requires_executor_input=True,
                executor_requirements=[RunRequirement.from_dict(r.to_dict())
                                       for r in child.output.active_requirements],
                executor_id=child.config.component_id, executor_name=step.executor_name,
                executor_run_id=child.run_id, executor_type=step.executor_type,
                previous_step_outputs=_saved(outputs)))
        outputs.append(output)
        previous[output.step_name or f"step_{len(previous) + 1}"] = output
        content = deepest_content(output)
        if output.stop:
            return


def _input_text(step, step_input) -> str:
    message = step_input.previous_step_content if step_input.previous_step_content not in (None, "") \
        else step_input.input
    text = content_text(message)
    return text if not getattr(step, "description", None) else f"{step.description}\n\n{text}"


def _pause(loop, requirement: StepRequirement) -> None:
    out = loop.output
    out.requirements = [*(out.requirements or []), requirement]
    out.content = requirement.confirmation_message or requirement.user_input_message or \
        f"Step '{requirement.step_name}' waits for a person."
    raise Paused()
