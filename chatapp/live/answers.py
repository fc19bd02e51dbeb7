"""A reply that waits for the user (a paused run: a tool call to approve, fields to fill in, a workflow step
to review), answered from its cards: the answers checked against what the run stored, then the run
continued through the one run path (`runner.start` with the answers: the engine's `acontinue_run`), in a
task of its own like any run, streamed to every tab of the session.

    answer(session, user, run_id, answers) -> str   "" once the continuation is handed to its task, else why not

An answer (the socket's `answer` frame, one per card) is {"id": requirement id, "approve": true|false,
"note": "...", "input": {field: value}}; a run is continued once every card of it has one. Another tab
that answered first, a Stop meanwhile, or a run from an imported file: the engine refuses, nothing
changes, and the cards show the run as it is stored.
"""

from __future__ import annotations

from sessions_core.models import ChatSession, Run, RunStatus
from sessions_core.requirements import RunRequirement
from sessions_core.review import StepRequirement, check_value, requirement_from_dict
from sessions_core.run.pause import is_imported

from .. import dbthreads
from . import runner

NOTE_MAX = 2000  # characters of a rejection's note


class AnswerError(ValueError):
    """An answer that cannot be taken; the message is for the user."""


def _paused(session_pk: int, run_id: str) -> Run | None:
    return (Run.objects.filter(session_id=session_pk, run_id=run_id, parent_run__isnull=True,
                               status=RunStatus.PAUSED).only("run_id", "input", "requirements").first())


def _field_spec(field) -> dict:
    """A tool's input field (UserInputField) as a step's field is described: name and type."""
    kind = getattr(field.field_type, "__name__", "str")
    return {"name": field.name, "field_type": kind if kind in ("str", "int", "float", "bool") else "str"}


def _apply(requirement: RunRequirement, given: dict) -> None:
    """One card's answer onto a tool call's requirement (its methods check it)."""
    if requirement.needs_confirmation:
        if not isinstance(given.get("approve"), bool):
            raise AnswerError(f"Approve or reject {requirement.tool_execution.tool_name}.")
        if given["approve"]:
            requirement.confirm()
        else:
            requirement.reject(_note(given))
    elif requirement.needs_user_input:
        values = _values(given, [_field_spec(field) for field in requirement.user_input_schema or []])
        requirement.provide_user_input(values)
        if not requirement.is_resolved():
            raise AnswerError(f"Fill in every field of {requirement.tool_execution.tool_name}.")
    elif requirement.needs_external_execution:
        raise AnswerError(f"{requirement.tool_execution.tool_name} runs outside this app; it cannot be answered here.")


def _apply_step(requirement: StepRequirement, given: dict, answers: dict) -> None:
    """A step's answer: its review (approve or reject, with a note; its input fields), or its executor's
    own requirements, each answered by its own card."""
    if requirement.requires_executor_input:
        for inner in requirement.executor_requirements or []:
            if not inner.is_resolved():
                if inner.id not in answers:
                    raise AnswerError(f"Answer every request of step {requirement.step_name}.")
                _apply(inner, answers[inner.id])
        return
    if requirement.needs_confirmation:
        if not isinstance(given.get("approve"), bool):
            raise AnswerError(f"Approve or reject step {requirement.step_name}.")
        if not given["approve"]:
            requirement.reject(_note(given))
            return
        requirement.confirm()
    if requirement.requires_user_input:
        requirement.set_user_input(**_values(given, requirement.user_input_schema or []))
        if requirement.needs_user_input:
            raise AnswerError(f"Fill in every required field of step {requirement.step_name}.")


def _note(given: dict) -> str | None:
    note = given.get("note")
    if note is None or (isinstance(note, str) and not note.strip()):
        return None
    if not isinstance(note, str) or len(note) > NOTE_MAX:
        raise AnswerError(f"The note is at most {NOTE_MAX} characters of text.")
    return note.strip()


def _values(given: dict, schema: list[dict]) -> dict:
    """The card's input values, each checked against its field (type, allowed values); empty ones left out."""
    values = given.get("input")
    if not isinstance(values, dict):
        raise AnswerError("The form's values are missing.")
    fields = {item["name"]: item for item in schema}
    checked = {}
    for name, value in values.items():
        if name not in fields:
            raise AnswerError(f"There is no field named {name}.")
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        try:
            checked[name] = check_value(fields[name], value)
        except ValueError as exc:
            raise AnswerError(str(exc)) from None
    return checked


def answered(run: Run, answers: list[dict]) -> list:
    """The run's open requirements with `answers` applied (AnswerError if one is missing or refused)."""
    if is_imported(run.requirements):
        raise AnswerError("This request came with an imported chat: its tools are not this app's to run.")
    by_id = {}
    for given in answers:
        if not isinstance(given, dict) or not isinstance(given.get("id"), str):
            raise AnswerError("An answer is not one this page sent.")
        by_id[given["id"]] = given
    requirements = [requirement_from_dict(data) for data in run.requirements or []]
    opened = [requirement for requirement in requirements if requirement.answered_at is None]
    try:
        for requirement in opened:
            if isinstance(requirement, StepRequirement):
                _apply_step(requirement, by_id.get(requirement.id, {}), by_id)
            elif requirement.id not in by_id:
                raise AnswerError(f"Answer {requirement.tool_execution.tool_name} too.")
            else:
                _apply(requirement, by_id[requirement.id])
    except (ValueError, TypeError) as exc:
        raise AnswerError(str(exc)) from None
    return opened


async def answer(session: ChatSession, user, run_id: str, answers: list[dict]) -> str:
    """Continue the session's paused run `run_id` with `answers`; "" once its task has it (it then streams
    to every tab), else why not."""
    run = await dbthreads.run(_paused, session.pk, run_id)
    if run is None:
        return "That request is no longer waiting: it was answered or stopped."
    try:
        requirements = answered(run, answers)
    except AnswerError as exc:
        return str(exc)
    item = runner.Prompt(text=run.input, user=user, run_id=run_id, answers=requirements)
    runner.start(session.pk, session.owner_id, item)
    await item.stored.wait()  # the engine took the continuation (or refused it: its task then says why)
    return ""
