"""The Agent: Agno's names and defaults on top of the shared run loop and storage.

An Agent turns its options into a `RunConfig` for each run; the run entry points (`run`, `arun`,
`print_response`, ...) and the session accessors, each with its async twin, come from `Component`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from . import state as state_module
from .accessors import AgentSession
from .component import Component
from .config import RunConfig
from .model_api import Model
from .outputs import RunOutput
from .requirements import RunRequirement
from .run.root import RootRun
from .tools import Function, RunContext, collect_functions

logger = logging.getLogger("sessions_core")

__all__ = ["Agent", "AgentSession", "update_session_state_tool"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class Agent(Component):
    kind = "agent"
    run_options = {name: name for name in (
        "add_history_to_context", "add_session_state_to_context", "add_session_summary_to_context",
        "output_schema", "dependencies", "metadata")}

    def __init__(
        self,
        name: str | None = None,
        model: Model | None = None,
        *,
        id: str | None = None,
        role: str | None = None,
        description: str | None = None,
        instructions: str | list[str] | Callable[[], Any] | None = None,
        system_message: str | None = None,
        introduction: str | None = None,
        tools: list | None = None,
        tool_hooks: list[Callable] | None = None,
        tool_call_limit: int | None = None,
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
        max_tool_calls_from_history: int | None = None,
        store_history_messages: bool = False,
        store_tool_messages: bool = True,
        cache_session: bool = False,
        output_schema: type | None = None,
        markdown: bool = False,
        metadata: dict | None = None,
        dependencies: dict | None = None,
        db=None,
        stream: bool | None = None,
        stream_events: bool | None = None,
        enable_session_summaries: bool = False,
        add_session_summary_to_context: bool | None = None,
        session_summary_manager=None,
        search_past_sessions: bool = False,
        num_past_sessions_to_search: int | None = None,
        num_past_session_runs_in_search: int | None = None,
        memory_manager=None,
        update_memory_on_run: bool = False,
        enable_user_memories: bool | None = None,
        enable_agentic_memory: bool = False,
        add_memories_to_context: bool | None = None,
    ):
        self.name = name
        self.model = model
        self.id = id or (_slug(name) if name else "") or self.kind
        self.role = role  # what the agent does as a team member (the team's model reads it)
        self.description = description
        self.instructions = instructions
        self.system_message = system_message
        self.introduction = introduction  # the first reply of every session a run of this agent creates
        self.tools = list(tools or [])
        self.tool_hooks = list(tool_hooks or [])
        self.tool_call_limit = tool_call_limit
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
        self.max_tool_calls_from_history = max_tool_calls_from_history
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
        if enable_user_memories is not None:  # Agno 2's name, accepted as an alias
            update_memory_on_run = enable_user_memories
        self.update_memory_on_run = update_memory_on_run
        self.enable_agentic_memory = enable_agentic_memory
        memories_on = update_memory_on_run or enable_agentic_memory or memory_manager is not None
        if memories_on and memory_manager is None:
            from .user_memories.manager import MemoryManager

            memory_manager = MemoryManager()
        self.memory_manager = memory_manager
        self.add_memories_to_context = memories_on if add_memories_to_context is None else add_memories_to_context
        self._functions: dict[str, Function] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"

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
            if self.enable_agentic_memory:
                from .user_memories.run_work import update_user_memory_tool

                tools.append(update_user_memory_tool)
            self._functions = collect_functions(tools)
        return self._functions

    def base_config(self) -> RunConfig:
        """This agent's options as the run loop reads them (a broken tool list raises here, before any write)."""
        return RunConfig(
            component_id=self.id, component_name=self.name or "", kind=self.kind, alias=self.db_alias,
            model=self.resolved_model(), functions=self.functions(), tool_hooks=tuple(self.tool_hooks),
            tool_owner=self, tool_call_limit=self.tool_call_limit,
            agentic_state_tool="update_session_state" if self.enable_agentic_state else None,
            description=self.description, instructions=self.instructions, system_message=self.system_message,
            markdown=self.markdown, resolve_in_context=self.resolve_in_context,
            add_session_state_to_context=self.add_session_state_to_context,
            add_history_to_context=self.add_history_to_context, num_history_runs=self.num_history_runs,
            num_history_messages=self.num_history_messages,
            max_tool_calls_from_history=self.max_tool_calls_from_history,
            add_session_summary_to_context=self.add_session_summary_to_context, output_schema=self.output_schema,
            dependencies=self.dependencies, metadata=self.metadata, session_state=self.session_state,
            overwrite_db_session_state=self.overwrite_db_session_state, introduction=self.introduction,
            store_history_messages=self.store_history_messages, store_tool_messages=self.store_tool_messages,
            session_metadata=self.metadata, enable_session_summaries=self.enable_session_summaries,
            session_summary_manager=self.session_summary_manager, memory_manager=self.memory_manager,
            update_memory_on_run=self.update_memory_on_run, enable_agentic_memory=self.enable_agentic_memory,
            add_memories_to_context=self.add_memories_to_context,
        )

    def _make_loop(self, config: RunConfig, input, *, session_id, user, session_state, run_id, branch=None) -> RootRun:
        return RootRun(config, input, session_id=session_id, user=user, session_state=session_state, run_id=run_id,
                       branch=branch)

    # -- runs that wait for a person (run/pause.py) --------------------------------------------------

    def continue_run(self, run_response: RunOutput | None = None, *, run_id: str | None = None,
                     requirements: list[RunRequirement] | None = None, session_id: str | None = None,
                     user_id=None, stream: bool | None = None, stream_events: bool | None = None,
                     yield_run_output: bool = False, **options):
        """Continue a paused run with the answers to its requirements: `continue_run(run_response=out)`
        (the requirements answered on it) or `continue_run(run_id=..., session_id=..., requirements=[...])`.
        Returns the run's output (or, with stream=True, its events, RunContinued first), same run id."""
        self._check_options("continue_run", options)
        return self._sync(lambda streaming: self.acontinue_run(
            run_response, run_id=run_id, requirements=requirements, session_id=session_id, user_id=user_id,
            stream=streaming, stream_events=stream_events, yield_run_output=yield_run_output, **options), stream)

    def acontinue_run(self, run_response: RunOutput | None = None, *, run_id: str | None = None,
                      requirements: list[RunRequirement] | None = None, session_id: str | None = None,
                      user_id=None, stream: bool | None = None, stream_events: bool | None = None,
                      yield_run_output: bool = False, **options):
        """Async twin of `continue_run`: await it for the output, or iterate it (stream=True) for events.
        The caller is `user_id` (else the agent's), never the output's: another user's run is refused."""
        self._check_options("acontinue_run", options)
        return self._continue(run_response, run_id, requirements, session_id, user_id, stream, stream_events,
                              yield_run_output, options)

    async def _agenerate_name(self, session_id, user_id) -> tuple[str, bool]:
        """One model call over the last three runs: at most five words (a fallback if the model fails)."""
        return await self._aname_with(self.resolved_model(), session_id, user_id)


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
