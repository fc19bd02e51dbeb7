"""The session accessors every component shares (Agent, Team, Workflow), each with its async twin.

`get_session_state`, `update_session_state`, `get_chat_history`, `get_session_messages`, `get_session`,
`get_last_run_output`, `get_run_output`, `get_session_name`, `set_session_name`, `get_session_summary`,
`delete_session`, `get_sessions`: Agno's names and arguments. Every one of them loads its session through
`owners.owned_session`, so another user's session id is refused the same way everywhere. The async twin
is the implementation; the sync one is a one-line adapter through `bridge`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from . import branches
from . import state as state_module
from .bridge import call_sync, run_sync
from .errors import SessionNotFoundError
from .history import ChatMessage, MessageSelection, chat_history, session_messages
from .models import ChatSession, NameSource, Run, RunStatus
from .outputs import OUTPUT_CLASSES, RunOutput
from .owners import owned_session, required_session_id, sessions_of, user_label, validate_session_id
from .requirements import RunRequirement
from .review import requirement_from_dict
from .run import lifecycle
from .storable import replace_unstorable
from .summary import SessionSummary


@dataclass
class AgentSession:
    """A stored session as the accessors hand it out."""

    session_id: str
    user_id: str | None
    agent_id: str
    session_name: str
    name_source: str
    session_state: dict
    state_version: int
    summary: dict | None
    metadata: dict
    created_at: datetime
    updated_at: datetime
    kind: str = "agent"
    _component: Any = field(default=None, repr=False, compare=False)

    def get_messages(self, *, agent_id: str | None = None, team_id: str | None = None, member_ids=None,
                     last_n_runs: int | None = None, limit: int | None = None, skip_roles=None, skip_statuses=None,
                     skip_history_messages: bool = True, skip_member_messages: bool = True) -> list[ChatMessage]:
        """Agno's `session.get_messages` (SPEC Part 2, 4.4; `history.MessageSelection`): the messages of the
        session's runs on its current branch, of `agent_id` or `team_id` when given, oldest first."""
        return run_sync(lambda: self.aget_messages(
            agent_id=agent_id, team_id=team_id, member_ids=member_ids, last_n_runs=last_n_runs, limit=limit,
            skip_roles=skip_roles, skip_statuses=skip_statuses, skip_history_messages=skip_history_messages,
            skip_member_messages=skip_member_messages))

    async def aget_messages(self, *, agent_id: str | None = None, team_id: str | None = None, member_ids=None,
                            last_n_runs: int | None = None, limit: int | None = None, skip_roles=None,
                            skip_statuses=None, skip_history_messages: bool = True,
                            skip_member_messages: bool = True) -> list[ChatMessage]:
        components = {component_id for component_id in (agent_id, team_id) if component_id}
        if len(components) > 1:  # a run is one component's (Agno: an agent's runs have no team id)
            return []
        selection = MessageSelection.of(
            component_id=next(iter(components), None), member_ids=member_ids, last_n_runs=last_n_runs, limit=limit,
            skip_roles=skip_roles, skip_statuses=skip_statuses, skip_member_messages=skip_member_messages)
        return await self._component._amessages(self.session_id, self.user_id, selection)

    def get_chat_history(self, last_n_runs: int | None = None) -> list[ChatMessage]:
        return self._component.get_chat_history(session_id=self.session_id, last_n_runs=last_n_runs,
                                                user_id=self.user_id)


class SessionAccessors:
    """Mixed into a component with `id`, `name`, `session_id`, `user_id` and `db_alias`."""

    session_id: str | None
    user_id: Any

    def _owned(self, session_id: str | None, user_id=None, *, lock: bool = False) -> ChatSession:
        """The caller's session (blocking: in a database thread)."""
        user_ref = user_id if user_id not in (None, "") else self.user_id
        return owned_session(required_session_id(session_id, self.session_id), user_ref, self.db_alias, lock=lock)

    def _session_view(self, session: ChatSession) -> AgentSession:
        return AgentSession(
            session_id=session.session_id, user_id=user_label(session.owner) if session.owner_id else None,
            agent_id=session.component_id, session_name=session.name, name_source=session.name_source,
            session_state=session.session_state, state_version=session.state_version, summary=session.summary,
            metadata=session.metadata, created_at=session.created_at, updated_at=session.last_activity_at,
            kind=session.kind, _component=self,
        )

    async def aget_session(self, session_id: str | None = None, user_id=None) -> AgentSession:
        return await call_sync(lambda: self._session_view(self._owned(session_id, user_id)))

    def get_session(self, session_id: str | None = None, user_id=None) -> AgentSession:
        return run_sync(lambda: self.aget_session(session_id, user_id))

    async def aget_session_state(self, session_id: str | None = None, user_id=None) -> dict:
        return await call_sync(lambda: self._owned(session_id, user_id).session_state)

    def get_session_state(self, session_id: str | None = None, user_id=None) -> dict:
        return run_sync(lambda: self.aget_session_state(session_id, user_id))

    async def aupdate_session_state(self, session_state_updates: dict, session_id: str | None = None,
                                    user_id=None, source: str = "manual") -> dict:
        """Replace the given top-level keys (shallow, as in Agno); recorded as one state change."""
        updates = state_module.to_json(state_module.strip_injected(dict(session_state_updates)))

        def update():
            with transaction.atomic(using=self.db_alias):
                session = self._owned(session_id, user_id, lock=True)
                return session.apply_state_change({**session.session_state, **updates}, source)

        return await call_sync(update)

    def update_session_state(self, session_state_updates: dict, session_id: str | None = None, user_id=None) -> dict:
        return run_sync(lambda: self.aupdate_session_state(session_state_updates, session_id, user_id))

    async def aget_chat_history(self, session_id: str | None = None, last_n_runs: int | None = None,
                                user_id=None) -> list[ChatMessage]:
        return await call_sync(lambda: chat_history(self._owned(session_id, user_id).pk, self.db_alias, last_n_runs))

    def get_chat_history(self, session_id: str | None = None, last_n_runs: int | None = None,
                         user_id=None) -> list[ChatMessage]:
        return run_sync(lambda: self.aget_chat_history(session_id, last_n_runs, user_id))

    async def aget_session_messages(self, session_id: str | None = None, last_n_runs: int | None = None,
                                    limit: int | None = None, skip_roles=None, skip_statuses=None,
                                    skip_history_messages: bool = True, user_id=None) -> list[ChatMessage]:
        """Agno's `get_session_messages`: the messages of the session's top-level runs on its current branch,
        oldest first; the first system message once; `limit` the latest messages (the system message first,
        counted), `last_n_runs` the latest runs, `skip_roles` and `skip_statuses` (default: paused,
        cancelled, error, interrupted) what to leave out (`history.MessageSelection`). History is never
        stored as messages, so `skip_history_messages` has nothing to skip."""
        return await self._amessages(session_id, user_id, MessageSelection.of(
            last_n_runs=last_n_runs, limit=limit, skip_roles=skip_roles, skip_statuses=skip_statuses))

    def get_session_messages(self, session_id: str | None = None, last_n_runs: int | None = None,
                             limit: int | None = None, skip_roles=None, skip_statuses=None,
                             skip_history_messages: bool = True, user_id=None) -> list[ChatMessage]:
        return run_sync(lambda: self.aget_session_messages(session_id, last_n_runs, limit, skip_roles, skip_statuses,
                                                           skip_history_messages, user_id))

    async def _amessages(self, session_id: str | None, user_id, selection: MessageSelection) -> list[ChatMessage]:
        return await call_sync(lambda: session_messages(self._owned(session_id, user_id).pk, self.db_alias,
                                                        selection))

    async def aget_last_run_output(self, session_id: str | None = None, user_id=None) -> RunOutput | None:
        def load():
            session = self._owned(session_id, user_id)
            runs = Run.objects.using(self.db_alias).begun().filter(session=session, parent_run__isnull=True,
                                                                   abandoned=False)
            run = runs.filter(component_id=self.id).order_by("-id").first()
            if run is None:
                return None
            if run.status == RunStatus.RUNNING and not session.is_running:  # its process stopped mid-run
                lifecycle.settle_abandoned(runs.filter(pk=run.pk))
                run.refresh_from_db(using=self.db_alias)
            return self._run_output(session, run)

        return await call_sync(load)

    def get_last_run_output(self, session_id: str | None = None, user_id=None) -> RunOutput | None:
        return run_sync(lambda: self.aget_last_run_output(session_id, user_id))

    async def aget_run_output(self, run_id: str, session_id: str | None = None, user_id=None) -> RunOutput | None:
        """A stored top-level run of the session (a paused one with its requirements, to answer and pass
        to `continue_run`); None if the session has no such run."""
        def load():
            session = self._owned(session_id, user_id)
            run = Run.objects.using(self.db_alias).begun().filter(session=session, run_id=run_id,
                                                                  parent_run__isnull=True).first()
            return None if run is None else self._run_output(session, run)

        return await call_sync(load)

    def get_run_output(self, run_id: str, session_id: str | None = None, user_id=None) -> RunOutput | None:
        return run_sync(lambda: self.aget_run_output(run_id, session_id, user_id))

    def _run_output(self, session: ChatSession, run: Run) -> RunOutput:
        """A stored top-level run as the RunOutput a run returned."""
        messages = [ChatMessage.from_row(row) for row in run.messages.using(self.db_alias).order_by("seq")]
        requirements = [requirement_from_dict(data) for data in run.requirements or []] or None
        return OUTPUT_CLASSES.get(run.kind, RunOutput)(
            run_id=run.run_id, session_id=session.session_id,
            user_id=user_label(session.owner) if session.owner_id else None, agent_id=self.id,
            agent_name=self.name or "", input=run.input, content=run.content, content_type=run.content_type,
            status=run.status, error=run.error, messages=messages, metrics=run.metrics,
            session_state=session.state_at(run.state_version) if run.state_version is not None else {},
            state_version=run.state_version or 0, model=run.model_id, created_at=int(run.created_at.timestamp()),
            requirements=requirements, tools=[requirement.tool_execution for requirement in requirements or []
                                              if isinstance(requirement, RunRequirement)],
        )

    async def aget_session_summary(self, session_id: str | None = None, user_id=None) -> SessionSummary | None:
        return await call_sync(lambda: SessionSummary.from_dict(self._owned(session_id, user_id).summary))

    def get_session_summary(self, session_id: str | None = None, user_id=None) -> SessionSummary | None:
        return run_sync(lambda: self.aget_session_summary(session_id, user_id))

    async def aget_session_name(self, session_id: str | None = None, user_id=None) -> str:
        return await call_sync(lambda: self._owned(session_id, user_id).name)

    def get_session_name(self, session_id: str | None = None, user_id=None) -> str:
        return run_sync(lambda: self.aget_session_name(session_id, user_id))

    async def _agenerate_name(self, session_id: str | None, user_id) -> tuple[str, bool]:
        """(name, generated) for set_session_name(autogenerate=True); components say how."""
        raise NotImplementedError

    async def _aname_with(self, model, session_id: str | None, user_id) -> tuple[str, bool]:
        """One model call over the last three runs: at most five words (a fallback if the model fails)."""
        from .naming import generate_session_name

        transcript = await self.aget_chat_history(session_id, last_n_runs=3, user_id=user_id)
        return await generate_session_name(model, transcript)

    async def aset_session_name(self, session_id: str | None = None, autogenerate: bool = False,
                                session_name: str | None = None, user_id=None, *, model=None) -> AgentSession:
        """Name the session, or with autogenerate=True let the component make a name. With `model`, the
        name is made by that model from the session's last three runs, whatever the component (the web
        app titles workflow sessions like any other this way)."""
        if not autogenerate and not (session_name and session_name.strip()):
            raise ValueError("No session name provided")
        session_name = replace_unstorable(session_name or "")
        source = NameSource.USER
        if autogenerate:
            if model is not None:
                session_name, generated = await self._aname_with(model, session_id, user_id)
            else:
                session_name, generated = await self._agenerate_name(session_id, user_id)
            source = NameSource.AUTO if generated else NameSource.FALLBACK

        def save():
            session = self._owned(session_id, user_id)
            name = session_name.strip()[:200]
            rows = ChatSession.objects.using(self.db_alias).filter(pk=session.pk)
            if autogenerate:
                # A generated title never replaces one the user chose, and a fallback (the model failed)
                # never replaces a title that is already there: checked by the UPDATE itself, under the
                # row lock it takes, so a rename meanwhile is never overwritten (one statement, no lock
                # held across two).
                rows = rows.exclude(name_source=NameSource.USER)
                if source == NameSource.FALLBACK:
                    rows = rows.filter(name="")
            if rows.update(name=name, name_source=source):
                session.name, session.name_source = name, source
            else:  # kept: the title as it is now (a session deleted a moment ago: not found, as before)
                try:
                    session.refresh_from_db(using=self.db_alias, fields=["name", "name_source"])
                except ChatSession.DoesNotExist:
                    raise SessionNotFoundError(session.session_id) from None
            return self._session_view(session)

        return await call_sync(save)

    def set_session_name(self, session_id: str | None = None, autogenerate: bool = False,
                         session_name: str | None = None, user_id=None, *, model=None) -> AgentSession:
        return run_sync(lambda: self.aset_session_name(session_id, autogenerate, session_name, user_id, model=model))

    # -- branches (branches.py) -------------------------------------------------------------------

    async def aset_current_branch(self, run_id: str, session_id: str | None = None, user_id=None) -> RunOutput:
        """Switch the session to the branch of `run_id` (its newest leaf); the state becomes the state at
        the end of that leaf (a change recorded as "branch:switch"). Returns the leaf's output."""
        def switch():
            with transaction.atomic(using=self.db_alias):
                session = self._owned(session_id, user_id, lock=True)
                leaf = branches.switch_to(session, run_id, self.db_alias)
                session.refresh_from_db(using=self.db_alias)
                return self._run_output(session, leaf)

        return await call_sync(switch)

    def set_current_branch(self, run_id: str, session_id: str | None = None, user_id=None) -> RunOutput:
        return run_sync(lambda: self.aset_current_branch(run_id, session_id, user_id))

    async def afork_session(self, run_id: str | None = None, session_id: str | None = None, user_id=None,
                            new_session_id: str | None = None) -> str:
        """A new session of the same user with the runs up to `run_id` (default: the current branch's last)
        and the state as of that run; its metadata has forked_from_session_id and forked_from_run_id.
        Returns the new session's id."""
        def copy():
            session = self._owned(session_id, user_id)
            new_id = validate_session_id(new_session_id) if new_session_id else None
            return branches.fork(session, run_id, self.db_alias, new_id).session_id

        return await call_sync(copy)

    def fork_session(self, run_id: str | None = None, session_id: str | None = None, user_id=None,
                     new_session_id: str | None = None) -> str:
        return run_sync(lambda: self.afork_session(run_id, session_id, user_id, new_session_id))

    async def adelete_session(self, session_id: str | None = None, user_id=None) -> None:
        """Delete the session and everything in it, for good."""
        await call_sync(lambda: self._owned(session_id, user_id).delete())

    def delete_session(self, session_id: str | None = None, user_id=None) -> None:
        return run_sync(lambda: self.adelete_session(session_id, user_id))

    async def aget_sessions(self, user_id=None, limit: int | None = None) -> list[AgentSession]:
        """This component's sessions of one user (None: ownerless ones), newest activity first."""
        def load():
            user_ref = user_id if user_id not in (None, "") else self.user_id
            sessions = (sessions_of(user_ref, self.db_alias).filter(component_id=self.id)
                        .select_related("owner").order_by("-last_activity_at", "-id"))
            return [self._session_view(session) for session in (sessions[:limit] if limit else sessions)]

        return await call_sync(load)

    def get_sessions(self, user_id=None, limit: int | None = None) -> list[AgentSession]:
        return run_sync(lambda: self.aget_sessions(user_id, limit))
