"""The Agent: Agno's names and defaults on top of our run loop and storage.

Every public method has an async twin (`run`/`arun`, `get_session_state`/`aget_session_state`, ...).
The async one is the implementation; the sync one is a one-line adapter through `bridge`.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import state as state_module
from .bridge import call_sync, iterate_sync, run_sync
from .errors import SessionIdNotSetError, SessionNotFoundError
from .events import BaseRunEvent, RunEvent
from .history import ChatMessage, chat_history, completed_messages
from .llm import Model
from .models import ChatSession, Message, NameSource, Run, RunStatus, StateChange
from .storable import storable
from .summary import SessionSummary, SessionSummaryManager
from .runtime import RunLoop, RunOutput, load_owned_session, request_cancel, resolve_user, user_label, validate_session_id
from .tools import Function, RunContext, collect_functions

logger = logging.getLogger("sessions_core")

# With stream=True and stream_events=False only these reach the caller (Agno's behaviour).
_CONTENT_ONLY = {RunEvent.run_content, RunEvent.run_error, RunEvent.run_cancelled, RunEvent.run_completed}


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
    _agent: Agent | None = field(default=None, repr=False, compare=False)

    def get_messages(self, last_n_runs: int | None = None) -> list[ChatMessage]:
        """All stored messages of the session (system and tool included), oldest first."""
        return run_sync(lambda: self.aget_messages(last_n_runs=last_n_runs))

    async def aget_messages(self, last_n_runs: int | None = None) -> list[ChatMessage]:
        agent = self._agent

        def load():
            session = agent._owned(self.session_id, self.user_id)
            messages = Message.objects.using(agent.db_alias).filter(session=session)
            if last_n_runs is not None:
                runs = Run.objects.using(agent.db_alias).filter(session=session).order_by("-id").values("id")
                messages = messages.filter(run_id__in=runs[: max(last_n_runs, 0)])
            return [ChatMessage.from_row(row) for row in messages.order_by("seq")]

        return await call_sync(load)

    def get_chat_history(self, last_n_runs: int | None = None) -> list[ChatMessage]:
        return self._agent.get_chat_history(session_id=self.session_id, last_n_runs=last_n_runs, user_id=self.user_id)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class Agent:
    kind = "agent"

    def __init__(
        self,
        name: str | None = None,
        model: Model | None = None,
        *,
        id: str | None = None,
        description: str | None = None,
        instructions: str | list[str] | Callable[[], Any] | None = None,
        system_message: str | None = None,
        tools: list | None = None,
        tool_hooks: list[Callable] | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        session_state: dict | None = None,
        add_session_state_to_context: bool = False,
        enable_agentic_state: bool = False,
        overwrite_db_session_state: bool = False,
        resolve_in_context: bool = True,
        add_history_to_context: bool = False,
        num_history_runs: int | None = None,
        num_history_messages: int | None = None,
        store_history_messages: bool = False,
        store_tool_messages: bool = True,
        cache_session: bool = False,
        output_schema: type | None = None,
        markdown: bool = False,
        metadata: dict | None = None,
        dependencies: dict | None = None,
        db: str | None = None,
        stream: bool | None = None,
        stream_events: bool | None = None,
        enable_session_summaries: bool = False,
        add_session_summary_to_context: bool | None = None,
        session_summary_manager=None,
        search_past_sessions: bool = False,
        num_past_sessions_to_search: int | None = None,
        num_past_session_runs_in_search: int | None = None,
    ):
        self.name = name
        self.model = model
        self.id = id or (_slug(name) if name else "") or "agent"
        self.description = description
        self.instructions = instructions
        self.system_message = system_message
        self.tools = list(tools or [])
        self.tool_hooks = list(tool_hooks or [])
        self.session_id = session_id
        self.user_id = user_id
        self.session_state = state_module.to_json(session_state or {})
        self.add_session_state_to_context = add_session_state_to_context
        self.enable_agentic_state = enable_agentic_state
        self.overwrite_db_session_state = overwrite_db_session_state
        self.resolve_in_context = resolve_in_context
        self.add_history_to_context = add_history_to_context
        if num_history_runs is not None and num_history_messages is not None:
            logger.warning("num_history_messages and num_history_runs cannot be set at the same time. Using num_history_runs.")
            num_history_messages = None
        if num_history_runs is None and num_history_messages is None:
            num_history_runs = 3
        self.num_history_runs = num_history_runs
        self.num_history_messages = num_history_messages
        self.store_history_messages = store_history_messages
        self.store_tool_messages = store_tool_messages
        # Accepted for Agno compatibility. Every run reads the session from the database, which is
        # what keeps concurrent writers from losing each other's updates.
        self.cache_session = cache_session
        self.output_schema = output_schema
        self.markdown = markdown
        self.metadata = metadata or {}
        self.dependencies = dependencies or {}
        self.db = db
        self.stream = stream
        self.stream_events = stream_events
        self.session_summary_manager = session_summary_manager
        self.enable_session_summaries = enable_session_summaries or session_summary_manager is not None
        if add_session_summary_to_context is None:
            add_session_summary_to_context = self.enable_session_summaries
        self.add_session_summary_to_context = add_session_summary_to_context
        self.search_past_sessions = search_past_sessions
        self.num_past_sessions_to_search = num_past_sessions_to_search or 20
        self.num_past_session_runs_in_search = num_past_session_runs_in_search or 3
        self._functions: dict[str, Function] | None = None

    def __repr__(self) -> str:
        return f"<Agent {self.id}>"

    @property
    def db_alias(self) -> str:
        return getattr(self.db, "alias", self.db) or "default"

    def resolved_model(self) -> Model:
        if self.model is None:
            from .llm import default_model

            self.model = default_model()
        return self.model

    def functions(self) -> dict[str, Function]:
        """The tools offered to the model: the developer's, plus the built-in ones switched on."""
        if self._functions is None:
            tools = list(self.tools)
            if self.enable_agentic_state:
                tools.append(update_session_state_tool)
            if self.search_past_sessions:
                from .past_sessions import PAST_SESSION_TOOLS

                tools.extend(PAST_SESSION_TOOLS)
            self._functions = collect_functions(tools)
        return self._functions

    # -- runs -------------------------------------------------------------------------------------

    def _loop(self, input, session_id, user_id, session_state, overrides) -> RunLoop:
        if session_id:
            session_id = validate_session_id(session_id)
        elif self.session_id:
            session_id = validate_session_id(self.session_id)
        else:
            # Agno: a generated id sticks to the agent, so the next call continues the same session.
            session_id = self.session_id = str(uuid.uuid4())
        user = user_id if user_id not in (None, "") else self.user_id

        def pick(name):
            value = overrides.get(name)
            return getattr(self, name) if value is None else value

        options = {
            name: pick(name)
            for name in ("add_history_to_context", "add_session_state_to_context", "output_schema",
                         "add_session_summary_to_context")
        }
        options.update(
            num_history_runs=self.num_history_runs,
            num_history_messages=self.num_history_messages,
            store_history_messages=self.store_history_messages,
            stream_events=bool(overrides.get("stream_events")),
            dependencies={**self.dependencies, **(overrides.get("dependencies") or {})},
            # Agno: the agent's metadata wins over the call's.
            metadata={**(overrides.get("metadata") or {}), **self.metadata},
        )
        return RunLoop(self, input, session_id=session_id, user=user, session_state=session_state, options=options)

    def run(self, input: str, *, session_id: str | None = None, user_id=None, session_state: dict | None = None,
            stream: bool | None = None, stream_events: bool | None = None, **overrides):
        """Run one turn. Returns a RunOutput, or with stream=True an iterator of events."""
        stream = self.stream if stream is None else stream
        if stream:
            return iterate_sync(lambda: self.arun(input, session_id=session_id, user_id=user_id,
                                                  session_state=session_state, stream=True,
                                                  stream_events=stream_events, **overrides))
        return run_sync(lambda: self.arun(input, session_id=session_id, user_id=user_id,
                                          session_state=session_state, **overrides))

    def arun(self, input: str, *, session_id: str | None = None, user_id=None, session_state: dict | None = None,
             stream: bool | None = None, stream_events: bool | None = None, **overrides):
        """Async twin of `run`: await it for a RunOutput, or iterate it (stream=True) for events."""
        stream = self.stream if stream is None else stream
        stream_events = bool(stream and (self.stream_events if stream_events is None else stream_events))
        loop = self._loop(input, session_id, user_id, session_state, {**overrides, "stream_events": stream_events})
        if stream:
            return self._stream(loop, stream_events)
        return self._complete(loop)

    async def _stream(self, loop: RunLoop, stream_events: bool) -> AsyncIterator[BaseRunEvent]:
        async for event in loop.events():
            if stream_events or event.event in _CONTENT_ONLY:
                yield event

    async def _complete(self, loop: RunLoop) -> RunOutput:
        async for _ in loop.events():
            pass
        return loop.output

    def print_response(self, input: str, *, stream: bool | None = None, **kwargs) -> None:
        if stream or (stream is None and self.stream):
            for event in self.run(input, stream=True, **kwargs):
                _print_event(event)
            print()
        else:
            _print_output(self.run(input, **kwargs))

    async def aprint_response(self, input: str, *, stream: bool | None = None, **kwargs) -> None:
        if stream or (stream is None and self.stream):
            async for event in self.arun(input, stream=True, **kwargs):
                _print_event(event)
            print()
        else:
            _print_output(await self.arun(input, **kwargs))

    @staticmethod
    def cancel_run(run_id: str) -> bool:
        """Ask a run to stop. True if it was running; a stop asked of a run in another process lands at its next checkpoint."""
        return run_sync(lambda: Agent.acancel_run(run_id))

    @staticmethod
    async def acancel_run(run_id: str, db: str | None = None) -> bool:
        local = request_cancel(run_id)

        def flag() -> int:
            return Run.objects.using(db or "default").filter(run_id=run_id, status=RunStatus.RUNNING).update(
                cancel_requested=True
            )

        return bool(await call_sync(flag)) or local

    # -- accessors --------------------------------------------------------------------------------

    def _session_id(self, session_id: str | None) -> str:
        session_id = session_id or self.session_id
        if not session_id:
            raise SessionIdNotSetError()
        return session_id

    def _owned(self, session_id: str | None, user_id=None, *, lock: bool = False) -> ChatSession:
        """The caller's session: the one place accessors check the owner (sync, in a DB thread)."""
        session_id = self._session_id(session_id)
        user_ref = user_id if user_id not in (None, "") else self.user_id
        user = resolve_user(user_ref, self.db_alias, create=False)
        session = load_owned_session(session_id, user, self.db_alias, lock=lock)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    def _session_view(self, session: ChatSession) -> AgentSession:
        return AgentSession(
            session_id=session.session_id, user_id=user_label(session.owner) if session.owner_id else None,
            agent_id=session.component_id, session_name=session.name, name_source=session.name_source,
            session_state=session.session_state,
            state_version=session.state_version, summary=session.summary, metadata=session.metadata,
            created_at=session.created_at, updated_at=session.last_activity_at, _agent=self,
        )

    async def aget_session(self, session_id: str | None = None, user_id=None) -> AgentSession:
        def load():
            session = self._owned(session_id, user_id)
            session.owner  # noqa: B018 - loaded here, in the DB thread
            return self._session_view(session)

        return await call_sync(load)

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
                return apply_state_change(session, {**session.session_state, **updates}, source, self.db_alias)

        return await call_sync(update)

    def update_session_state(self, session_state_updates: dict, session_id: str | None = None, user_id=None) -> dict:
        return run_sync(lambda: self.aupdate_session_state(session_state_updates, session_id, user_id))

    async def aget_chat_history(self, session_id: str | None = None, last_n_runs: int | None = None,
                                user_id=None) -> list[ChatMessage]:
        def load():
            session = self._owned(session_id, user_id)
            return chat_history(session.pk, self.db_alias, last_n_runs)

        return await call_sync(load)

    def get_chat_history(self, session_id: str | None = None, last_n_runs: int | None = None,
                         user_id=None) -> list[ChatMessage]:
        return run_sync(lambda: self.aget_chat_history(session_id, last_n_runs, user_id))

    async def aget_last_run_output(self, session_id: str | None = None, user_id=None) -> RunOutput | None:
        def load():
            session = self._owned(session_id, user_id)
            run = (Run.objects.using(self.db_alias).filter(session=session, component_id=self.id,
                                                           parent_run__isnull=True).order_by("-id").first())
            if run is None:
                return None
            if run.status == RunStatus.RUNNING and not session.is_running:  # its process stopped mid-run
                Run.objects.using(self.db_alias).filter(pk=run.pk).interrupt_abandoned()
                run.refresh_from_db(using=self.db_alias)
            messages = [ChatMessage.from_row(row) for row in run.messages.using(self.db_alias).order_by("seq")]
            return RunOutput(
                run_id=run.run_id, session_id=session.session_id, user_id=user_label(session.owner) if session.owner_id else None,
                agent_id=self.id, agent_name=self.name or "", content=run.content, content_type=run.content_type,
                status=run.status, error=run.error, messages=messages, metrics=run.metrics,
                session_state=session.state_at(run.state_version) if run.state_version is not None else {},
                state_version=run.state_version or 0, model=run.model_id,
            )

        return await call_sync(load)

    def get_last_run_output(self, session_id: str | None = None, user_id=None) -> RunOutput | None:
        return run_sync(lambda: self.aget_last_run_output(session_id, user_id))

    async def aupdate_session_summary(self, session_pk: int, session_id: str) -> SessionSummary | None:
        """Regenerate the summary after a successful run. A failure keeps the previous one and is logged."""
        manager = self.session_summary_manager or SessionSummaryManager()
        alias = self.db_alias
        messages = await call_sync(completed_messages, session_pk, alias, manager.last_n_runs)
        try:
            summary = await manager.acreate(self.resolved_model(), messages)
        except Exception:
            logger.exception("Session summary failed for session %s; the previous summary is kept", session_id)
            return None
        await call_sync(
            lambda: ChatSession.objects.using(alias).filter(pk=session_pk).update(summary=summary.to_dict())
        )
        return summary

    async def aget_session_summary(self, session_id: str | None = None, user_id=None) -> SessionSummary | None:
        return await call_sync(lambda: SessionSummary.from_dict(self._owned(session_id, user_id).summary))

    def get_session_summary(self, session_id: str | None = None, user_id=None) -> SessionSummary | None:
        return run_sync(lambda: self.aget_session_summary(session_id, user_id))

    async def aget_session_name(self, session_id: str | None = None, user_id=None) -> str:
        return await call_sync(lambda: self._owned(session_id, user_id).name)

    def get_session_name(self, session_id: str | None = None, user_id=None) -> str:
        return run_sync(lambda: self.aget_session_name(session_id, user_id))

    async def aset_session_name(self, session_id: str | None = None, autogenerate: bool = False,
                                session_name: str | None = None, user_id=None) -> AgentSession:
        """Name the session, or with autogenerate=True ask the model for a name of at most five words."""
        if not autogenerate and not (session_name and session_name.strip()):
            raise ValueError("No session name provided")
        session_name = storable(session_name or "")
        source = NameSource.USER
        if autogenerate:
            from .naming import generate_session_name

            transcript = await self.aget_chat_history(session_id, last_n_runs=3, user_id=user_id)
            session_name, generated = await generate_session_name(self.resolved_model(), transcript)
            source = NameSource.AUTO if generated else NameSource.FALLBACK

        def save():
            with transaction.atomic(using=self.db_alias):
                session = self._owned(session_id, user_id, lock=True)
                # A generated title never replaces one the user chose (checked under the row lock), and a
                # fallback (the model failed) never replaces a title that is already there.
                keep = autogenerate and (session.name_source == NameSource.USER
                                         or (source == NameSource.FALLBACK and session.name))
                if not keep:
                    session.name, session.name_source = session_name.strip()[:200], source
                    session.save(update_fields=["name", "name_source"])
                session.owner  # noqa: B018
                return self._session_view(session)

        return await call_sync(save)

    def set_session_name(self, session_id: str | None = None, autogenerate: bool = False,
                         session_name: str | None = None, user_id=None) -> AgentSession:
        return run_sync(lambda: self.aset_session_name(session_id, autogenerate, session_name, user_id))

    async def adelete_session(self, session_id: str | None = None, user_id=None) -> None:
        """Delete the session and everything in it, for good."""
        await call_sync(lambda: self._owned(session_id, user_id).delete())

    def delete_session(self, session_id: str | None = None, user_id=None) -> None:
        return run_sync(lambda: self.adelete_session(session_id, user_id))

    async def aget_sessions(self, user_id=None, limit: int | None = None) -> list[AgentSession]:
        """This agent's sessions of one user (None: ownerless ones), newest activity first."""
        def load():
            user_ref = user_id if user_id not in (None, "") else self.user_id
            user = resolve_user(user_ref, self.db_alias, create=False)
            if user is not None and user.pk is None:
                return []
            sessions = (ChatSession.objects.using(self.db_alias).for_user(user).alive()
                        .filter(component_id=self.id).select_related("owner").order_by("-last_activity_at", "-id"))
            return [self._session_view(session) for session in (sessions[:limit] if limit else sessions)]

        return await call_sync(load)

    def get_sessions(self, user_id=None, limit: int | None = None) -> list[AgentSession]:
        return run_sync(lambda: self.aget_sessions(user_id, limit))


def _print_event(event) -> None:
    if event.event == RunEvent.run_content:
        print(event.content, end="", flush=True)
    elif event.event == RunEvent.run_error:
        print(f"\n[error] {event.content}")


def _print_output(output: RunOutput) -> None:
    print(output.content if output.status != RunStatus.ERROR else f"[error] {output.error}")


def apply_state_change(session: ChatSession, new_state: dict, source: str, alias: str, run=None) -> dict:
    """Store `new_state` on a locked session row as one recorded, versioned change."""
    new_state = state_module.to_json(new_state)
    if new_state != session.session_state:
        patch, inverse = state_module.diff(session.session_state, new_state)
        session.state_version += 1
        StateChange.objects.using(alias).create(
            session=session, run=run, version=session.state_version, patch=patch, inverse=inverse, source=source,
            created_at=timezone.now(),
        )
        session.session_state = new_state
        session.save(update_fields=["session_state", "state_version"])
    return session.session_state


def update_session_state(session_state_updates: dict, run_context: RunContext) -> str:
    """Update the session state. Pass the keys to change and their new values as one object, for
    example {"shopping_list": ["milk"]}. Each key given replaces the stored value of that key.

    Args:
        session_state_updates: The keys to set and their new values.
    """
    for key, value in session_state_updates.items():
        run_context.session_state[key] = value
    return f"Updated session state: {run_context.session_state!r}"


update_session_state_tool = Function.from_callable(update_session_state)
