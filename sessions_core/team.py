"""The Team: a coordinating model that delegates tasks to member agents, all on one session state.

A Team has an Agent's session options (state, history, summaries, accessors, events) and runs on
the same run loop; what it adds is its members and one tool, `delegate_task_to_member(member_id,
task)`, whose call is a member run inside the team's run: a `Run` row under the team's, with its
own messages, working on the team's state dict itself (not a copy merged back, so a member's
deletions stay deleted). The member's reply is the tool's result. A Team also runs as a workflow step.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from .agent import Agent
from .bridge import run_sync
from .config import RunConfig
from .errors import Cancelled, ChildPaused
from .history import ChatMessage, MessageSelection
from .models import RunStatus
from .tools import DELEGATE_TOOL, Function, collect_functions

__all__ = ["Team"]



def delegate_task_to_member(member_id: str, task: str) -> str:
    """Hand a task to one member of your team and get the member's reply back.

    Args:
        member_id: The id of the member, as listed in <team_members>.
        task: What the member should do, in full: the member sees only this.
    """
    raise RuntimeError("run by the team's run loop")  # pragma: no cover - replaced by the child run


class Team(Agent):
    kind = "team"

    def __init__(self, members: list | None = None, name: str | None = None, model=None, **options):
        super().__init__(name=name, model=model, **options)
        self.members = list(members or [])
        ids = [member.id for member in self.members]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Two members of team {self.id!r} have the same id: give them distinct names or ids.")

    async def aget_session_messages(self, session_id: str | None = None, member_ids=None,
                                    last_n_runs: int | None = None, limit: int | None = None, skip_roles=None,
                                    skip_statuses=None, skip_history_messages: bool = True,
                                    skip_member_messages: bool = True, user_id=None) -> list[ChatMessage]:
        """Agno's Team `get_session_messages`: the team's own runs' messages, or with `member_ids` those of
        these members' runs under them, or with `skip_member_messages=False` both; otherwise as the agent's."""
        return await self._amessages(session_id, user_id, MessageSelection.of(
            component_id=self.id, member_ids=member_ids, last_n_runs=last_n_runs, limit=limit, skip_roles=skip_roles,
            skip_statuses=skip_statuses, skip_member_messages=skip_member_messages))

    def get_session_messages(self, session_id: str | None = None, member_ids=None, last_n_runs: int | None = None,
                             limit: int | None = None, skip_roles=None, skip_statuses=None,
                             skip_history_messages: bool = True, skip_member_messages: bool = True,
                             user_id=None) -> list[ChatMessage]:
        return run_sync(lambda: self.aget_session_messages(
            session_id, member_ids, last_n_runs, limit, skip_roles, skip_statuses, skip_history_messages,
            skip_member_messages, user_id))

    def member(self, member_id: str):
        """The member named by `member_id`: its id, or its name in any case."""
        wanted = _slug(str(member_id))
        for member in self.members:
            if wanted in (member.id, _slug(member.name or "")):
                return member
        return None

    def functions(self) -> dict[str, Function]:
        if self._functions is None:
            functions = dict(super().functions())
            if DELEGATE_TOOL in functions:
                raise ValueError(f"{DELEGATE_TOOL!r} is the team's own tool; name yours differently.")
            delegate = replace(Function.from_callable(delegate_task_to_member), child_runner=self._delegate)
            self._functions = {**functions, **collect_functions([delegate])}
        return self._functions

    def base_config(self) -> RunConfig:
        config = super().base_config()
        roster = "\n".join(
            f"- member_id: {member.id} | name: {member.name or member.id}"
            + (f" | role: {member.role}" if getattr(member, "role", None) else "")
            for member in self.members)
        block = (f"You lead a team. Delegate work to its members with {DELEGATE_TOOL}(member_id, task); "
                 f"their replies come back to you.\n<team_members>\n{roster}\n</team_members>")
        return replace(config, description="\n\n".join(part for part in (self.description, block) if part),
                       resume_member=self._resume_member)

    def _member_config(self, loop, member) -> RunConfig:
        return replace(member.base_config(), alias=loop.alias, stream_events=loop.config.stream_events,
                       dependencies={**loop.config.dependencies, **member.dependencies})

    async def _delegate(self, loop, args: dict) -> AsyncIterator:
        """The member run of one delegation, inside the team's run; ends with the tool's result."""
        member_id, task = args.get("member_id"), args.get("task")
        member = self.member(member_id) if member_id else None
        if member is None:
            known = ", ".join(member.id for member in self.members)
            yield f"Error: there is no member {member_id!r} in this team (members: {known})."
            return
        if not isinstance(task, str) or not task.strip():
            yield "Error: the task is empty."
            return
        name = member.name or member.id
        child = loop.child(self._member_config(loop, member), task, step_name=name, source_prefix=f"member:{name}/")
        async with aclosing(self._member_run(loop, child)) as results:
            async for item in results:
                yield item

    async def _resume_member(self, loop, member_id: str, run_id: str, answers: list) -> AsyncIterator:
        """A member run that paused, continued with `answers` inside the team's continued run."""
        member = self.member(member_id)
        if member is None:
            yield f"Error: there is no member {member_id!r} in this team any more."
            return
        name = member.name or member.id
        child = loop.continued_child(self._member_config(loop, member), run_id, answers, step_name=name,
                                     source_prefix=f"member:{name}/")
        async with aclosing(self._member_run(loop, child)) as results:
            async for item in results:
                yield item

    async def _member_run(self, loop, child) -> AsyncIterator:
        """The member run's events, then its reply as the delegation's result; a member that waits for a
        person makes the team wait (ChildPaused) when the team's run can."""
        child.pausable = loop.can_pause
        async with aclosing(child.events()) as events:
            async for event in events:
                yield event
        output, name = child.output, child.step_name
        if hasattr(loop.output, "member_responses"):
            loop.output.member_responses.append(output)
        if output.status == RunStatus.CANCELLED:
            raise Cancelled()
        if output.status == RunStatus.PAUSED:
            raise ChildPaused(child)
        if output.status != RunStatus.COMPLETED:
            yield f"Error: {name} failed: {output.error}"
            return
        yield output.content


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
