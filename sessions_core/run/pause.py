"""A paused run's continuation (`Agent.continue_run`): a new start of the same run.

A run pauses when the model calls a tool that waits for a person (root.py `_pause`); its pause is stored
as a finish is (finish.py): its messages so far, its state changes committed and versioned, the lease
released, the run `paused` with its requirements. `ContinuedRun` starts it again as any run starts, in
one transaction on the locked session row: the owner checked, the run found paused (and this agent's),
the answers taken (every open requirement must have one, and only the answers are taken: the tool and
its arguments are the stored ones), the run moved back to running (`lifecycle.resume`, so of two
continuations exactly one goes on), the session's current state merged, the history read and the lease
taken. Then the answered calls run (or the model reads that they were rejected, or their external
result), and the model loop goes on: the run completes, fails, is cancelled or pauses again, under the
same run id. Nothing of it happens when the start refuses it.

A team's run that paused because a member's did lists the member's requirements, each naming the
member (`member_run_id`); its continuation continues the member run first (`ContinuedChild`: the same
row moved back to running, its messages so far, the answered calls), whose reply becomes the team's
delegation result, then the team's model goes on. A workflow's pause (a step's review, or a step whose
agent or team paused) is resumed at that step by the workflow's executor (review.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..branches import RunNotFoundError
from .. import prompt
from ..errors import ChildPaused, RunNotContinuableError, UnresolvedRequirementsError
from ..events import BaseRunEvent
from ..history import ChatMessage
from ..model_api import ToolCall
from ..models import Role, Run, RunStatus
from ..owners import owned_session
from ..requirements import RunRequirement, ToolExecution
from ..tools import DELEGATE_TOOL
from ..review import StepRequirement, requirement_from_dict
from . import lifecycle, store
from .base import BaseRun
from .child import ChildRun
from .root import RootRun, Start

REJECTED = "Function call was rejected by the user."


class Answering:
    """What a continued run (a root's, or a member's inside a continued team run) does first: each
    answered call, in the order the model made them. A confirmed one (or one with the user's input) runs
    as any call does; a rejected one tells the model so, with the note; an external one's result is its
    result; a member's (a team's requirement naming a member run) continues that member run, whose
    reply is the result of the team's delegation call."""

    answers: list[RunRequirement]

    async def _answer_calls(self, functions, run_context, wire, stream_events) -> AsyncIterator[BaseRunEvent]:
        members: dict[str, list[RunRequirement]] = {}  # member run id: its answered requirements
        for requirement in self.answers:
            execution = requirement.tool_execution
            if requirement.member_run_id:
                members.setdefault(requirement.member_run_id, []).append(requirement)
            elif requirement.confirmation is False:
                note = requirement.confirmation_note
                execution.result = REJECTED + (f" Note: {note}" if note else "")
                execution.tool_call_error = True
                self.tool_result(execution, wire)
            elif execution.external_execution_required:
                execution.result = requirement.external_execution_result
                self.tool_result(execution, wire)
            else:
                args = dict(execution.tool_args)
                args.update({item.name: item.value for item in execution.user_input_schema or []})
                call = ToolCall(execution.tool_call_id, execution.tool_name, json.dumps(args))
                async for event in self._run_tool(call, functions, run_context, wire, stream_events, execution):
                    yield event
        paused = []  # members that paused again: the run pauses again, under the same run id
        for member_run_id, answers in members.items():
            first = answers[0]
            result = ""
            try:
                async for item in self.config.resume_member(self, first.member_agent_id, member_run_id, answers):
                    if isinstance(item, BaseRunEvent):
                        yield item
                    else:
                        result = item
            except ChildPaused as again:
                paused.append((ToolCall(first.member_call_id, "", "{}"), again.child))
                continue
            self.tool_result(_delegation(first.member_call_id, result), wire)
        if paused:
            self._pause([], paused)


def _delegation(call_id: str, result: str) -> ToolExecution:
    """The team's delegation call, answered by its member's continued run."""
    return ToolExecution(tool_call_id=call_id, tool_name=DELEGATE_TOOL, result=result,
                         tool_call_error=result.startswith("Error:"))


class ContinuedRun(Answering, RootRun):
    continued = True

    def __init__(self, config, *, run_id: str, session_id: str, user, answers: list):
        super().__init__(config, None, session_id=session_id, user=user, session_state=None, run_id=run_id)
        self.taking_over = False  # (RootRun takes a run id without input for a queued run to take over)
        self.given = list(answers)
        self.answers: list = []  # the requirements this continuation answers, in order

    def started_event(self) -> BaseRunEvent:
        step = self.answers[0] if self.answers and isinstance(self.answers[0], StepRequirement) else None
        return self.event("continued", **({"step_name": step.step_name} if step else {}))

    def _start_sync(self) -> Start:
        """One try at the start, in one transaction on the locked session row; raises (changing nothing)
        for a run that cannot be continued."""
        alias, now = self.alias, timezone.now()
        with transaction.atomic(using=alias):
            session = owned_session(self.session_id, self.user_ref, alias, lock=True)
            row = self._paused_row(session.pk)
            requirements, answered = take_answers(self.run_id, row.requirements, self.given, self.user_id, now)
            if lifecycle.lease_live(session, now) or lifecycle.queued_ahead(session.pk, None, now, alias):
                return Start(busy=True, session_pk=session.pk)  # it waits its turn, still paused
            if session.lease_token:  # the process that held the lease stopped renewing it: its run is over
                lifecycle.interrupt_abandoned(session, alias, now)
                session.last_seq = store.next_seq_after_crash(session, alias)
            if not lifecycle.resume(row.pk, alias, requirements=[r.to_dict() for r in requirements], content=""):
                raise RunNotContinuableError(self.run_id, "it was continued or cancelled a moment ago")
            start, system = self._opening(session, json.dumps(session.session_state), session.state_version)
            start.run_pk = row.pk
            # The request: the system message and history as of now, then the run's own messages so far.
            self.output.messages = system + start.history + store.run_messages(row.pk, alias)
            lifecycle.take_lease(session, self.lease_token, None, session.last_seq, now, alias)
        self.last_seq = session.last_seq
        self.input = self.output.input = self.raw_input = row.input
        self.output.requirements = requirements
        self.output.tools = [r.tool_execution for r in requirements if isinstance(r, RunRequirement)]
        self.answers = answered
        self.prior_metrics = row.metrics or {}
        self.created_at = row.created_at.timestamp()
        self.output.created_at = int(self.created_at)
        return start

    def _paused_row(self, session_pk: int) -> Run:
        row = (Run.objects.using(self.alias).filter(session_id=session_pk, run_id=self.run_id, parent_run__isnull=True)
               .only("status", "component_id", "input", "requirements", "metrics", "created_at").first())
        if row is None:
            raise RunNotFoundError(self.run_id, self.session_id)
        if row.status != RunStatus.PAUSED:
            raise RunNotContinuableError(self.run_id, f"it is {row.status}, not paused")
        if is_imported(row.requirements):
            raise RunNotContinuableError(self.run_id, "it was imported from a file, and its tools are not this "
                                                      "app's to run")
        if row.component_id != self.config.component_id:
            raise RunNotContinuableError(self.run_id, f"it is a run of {row.component_id!r}, "
                                                      f"not of {self.config.component_id!r}")
        return row


class ContinuedChild(Answering, ChildRun):
    """A paused run inside a continued run (a team's member, a workflow's agent or team step), continued
    with the answers its parent took: the same row moved back to running, its messages so far."""

    continued = True

    def __init__(self, config, *, parent, run_id: str, answers: list[RunRequirement], step_name: str,
                 source_prefix: str):
        super().__init__(config, None, parent=parent, step_name=step_name, source_prefix=source_prefix)
        self.run_id = self.output.run_id = run_id
        self.given = list(answers)
        self.answers: list[RunRequirement] = []

    def started_event(self) -> BaseRunEvent:
        return self.event("continued")

    def _start_sync(self) -> None:
        alias, now = self.alias, timezone.now()
        with transaction.atomic(using=alias):
            row = (Run.objects.using(alias).select_for_update()
                   .filter(run_id=self.run_id, parent_run_id=self.parent.run_pk)
                   .only("status", "input", "requirements", "metrics", "created_at").first())
            if row is None or row.status != RunStatus.PAUSED:
                raise RunNotContinuableError(self.run_id, "its paused run is not there any more")
            requirements, self.answers = take_answers(self.run_id, row.requirements, self.given, self.user_id, now)
            if not lifecycle.resume(row.pk, alias, requirements=[r.to_dict() for r in requirements], content=""):
                raise RunNotContinuableError(self.run_id, "it was continued or cancelled a moment ago")
            messages = store.run_messages(row.pk, alias)
        self.run_pk = row.pk
        system = prompt.system_message(self.config, dict(self.tracker.working), self.user_id, None)
        self.output.messages = ([ChatMessage(role=Role.SYSTEM, content=system)] if system else []) + messages
        self.input = self.output.input = self.raw_input = row.input
        self.output.requirements = requirements
        self.output.tools = [requirement.tool_execution for requirement in requirements]
        self.prior_metrics = row.metrics or {}
        self.created_at = row.created_at.timestamp()
        self.output.created_at = int(self.created_at)


BaseRun.continued_child_class = ContinuedChild


def is_imported(requirements: list | None) -> bool:
    """Whether a stored run's requirements came from an imported file (export.py marks them)."""
    return any(isinstance(item, dict) and item.get("imported") for item in requirements or [])


def take_answers(run_id: str, stored: list | None, given: list, user_id: str | None,
                 now: datetime) -> tuple[list, list]:
    """The run's requirements with the answers of `given` taken onto the open ones, and the open ones.
    Raises when an answer is not for this run or an open requirement has none."""
    requirements = [requirement_from_dict(data) for data in stored or []]
    by_id = {requirement.id: requirement for requirement in requirements}
    by_call = {requirement.tool_execution.tool_call_id: requirement for requirement in requirements
               if isinstance(requirement, RunRequirement)}
    answers = {}
    for answer in given:
        call_id = answer.tool_execution.tool_call_id if isinstance(answer, RunRequirement) else None
        own = by_id.get(answer.id) or by_call.get(call_id)
        if own is None:
            raise RunNotContinuableError(run_id, f"requirement {answer.id} is not one of its requirements")
        answers[own.id] = answer
    opened = [requirement for requirement in requirements if requirement.answered_at is None]
    if not opened:
        raise RunNotContinuableError(run_id, "it waits for no answer")
    unresolved = []
    for requirement in opened:
        if requirement.id in answers:
            answer = answers[requirement.id]
            if isinstance(requirement, StepRequirement):
                requirement.take(answer, _take)
            else:
                _take(requirement, answer)
        if requirement.is_resolved():
            requirement.answered_at, requirement.answered_by = now, user_id
        else:
            unresolved.append(requirement.label)
    if unresolved:
        raise UnresolvedRequirementsError(run_id, unresolved)
    return requirements, opened


def _take(requirement: RunRequirement, answer: RunRequirement) -> None:
    """Copy the answer (only the answer) of `answer` onto the stored `requirement`. A decision set on the
    tool execution (`tool.confirmed = True`, Agno 2's way) counts as one set on the requirement."""
    given = answer.tool_execution
    decision = answer.confirmation if answer.confirmation is not None else given.confirmed
    if requirement.needs_confirmation and decision is not None:
        if decision:
            requirement.confirm()
        else:
            requirement.reject(answer.confirmation_note or given.confirmation_note)
    if requirement.needs_user_input and given.answered:
        values = answer.user_input or {item.name: item.value for item in given.user_input_schema or []
                                       if item.value is not None}
        requirement.provide_user_input(values)
    result = answer.external_execution_result if answer.external_execution_result is not None else given.result
    if requirement.needs_external_execution and result is not None:
        requirement.set_external_execution_result(result)
