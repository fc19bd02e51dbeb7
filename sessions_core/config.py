"""What one run is configured with: the frozen `RunConfig` an Agent (or Team, Workflow) hands the run loop.

The run loop reads everything it needs from here and never reaches back into the object that made
it, so one loop serves every kind of component. A component builds its config once
(`base_config`) and each call adjusts a copy with the call's own options (`dataclasses.replace`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model_api import Model


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    # who runs
    component_id: str
    component_name: str = ""
    kind: str = "agent"  # agent / team / workflow: stored on a session the run creates
    alias: str = "default"  # the Django database
    model: Model | None = None
    # tools: offered to the model, called through the hooks; `tool_owner` is what a tool's `agent`
    # (or `team`) parameter receives
    functions: Mapping[str, Any] = field(default_factory=dict)
    tool_hooks: tuple[Callable, ...] = ()
    tool_owner: Any = None
    tool_call_limit: int | None = None  # Agno's: the run's tool calls past it are not run; the model is told
    agentic_state_tool: str | None = None  # the tool whose changes are recorded as "agentic"
    # what is sent to the model
    description: str | None = None
    instructions: Any = None  # a string, a list of strings, or a callable returning either
    system_message: str | None = None
    markdown: bool = False
    resolve_in_context: bool = True
    add_session_state_to_context: bool = False
    add_history_to_context: bool = False
    num_history_runs: int | None = 3
    num_history_messages: int | None = None
    max_tool_calls_from_history: int | None = None  # the N most recent tool calls of the history are kept
    add_session_summary_to_context: bool = False
    output_schema: type | None = None
    dependencies: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # state
    session_state: Mapping[str, Any] = field(default_factory=dict)  # defaults, JSON already
    overwrite_db_session_state: bool = False
    # storage
    introduction: str | None = None  # stored as the first reply of a session the run creates
    store_history_messages: bool = False
    store_tool_messages: bool = True
    session_metadata: Mapping[str, Any] = field(default_factory=dict)  # stored on a session this run creates
    # after the run
    enable_session_summaries: bool = False
    session_summary_manager: Any = None
    # user memories (user_memories/): made after the run, by the model's tool, shown in the system message
    memory_manager: Any = None
    update_memory_on_run: bool = False
    enable_agentic_memory: bool = False
    add_memories_to_context: bool = False
    # events
    stream_events: bool = False
    # what happens between the run's start and its finish: None is the model loop (an agent's or a
    # team's); a workflow's is its steps. An async generator function of the run (run.BaseRun), yielding events.
    executor: Callable | None = None
    # A team's: continue one of its paused member runs (member id, run id, answers) inside a continued
    # team run (run/pause.py); an async iterator of the member's events, then its reply.
    resume_member: Callable | None = None
