"""`MemoryManager`: one model call that reads a user's message and the user's memories and adds, updates
or deletes memories with tools, each tool scoped to that one user.

The automatic path (`update_memory_on_run`) gives the model `add_memory`, `update_memory` and
`delete_memory`; the agentic path (the run's `update_user_memory(task)` tool) gives it `add_memory` and
`update_memory`, plus `delete_memory` with `delete_memories=True` and `clear_memory` with
`clear_memories=True` (which clears this user's memories only). A memory id that is not this user's is
"not found" to every tool.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from ..bridge import call_sync
from ..model_api import Model
from . import store
from .accessors import MemoryAccessors
from .record import UserMemory

logger = logging.getLogger("sessions_core")

MAX_MODEL_CALLS = 4  # the manager's model calls per task: its tool calls, their results, then its last word

DEFAULT_CAPTURE = """Memories should capture personal information about the user that is relevant to the current conversation, such as:
- Personal facts: name, age, occupation, location, interests, and preferences
- Opinions and preferences: what the user likes, dislikes, enjoys, or finds frustrating
- Significant life events or experiences shared by the user
- Important context about the user's current situation, challenges, or goals
- Any other details that offer meaningful insight into the user's personality, perspective, or needs"""

INTRO = "You are a Memory Manager that is responsible for managing information and preferences about the user."


def _tool(name: str, description: str, properties: dict) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(properties),
                       "additionalProperties": False}}}


_TEXT = {"type": "string", "description": "The memory: a short statement about the user, in the third person."}
_TOPICS = {"type": "array", "items": {"type": "string"}, "description": "A few topics the memory is about."}
_ID = {"type": "string", "description": "The ID of an existing memory."}
TOOLS = {
    "add_memory": _tool("add_memory", "Add a memory about the user.", {"memory": _TEXT, "topics": _TOPICS}),
    "update_memory": _tool("update_memory", "Replace the text and topics of an existing memory.",
                           {"memory_id": _ID, "memory": _TEXT, "topics": _TOPICS}),
    "delete_memory": _tool("delete_memory", "Delete an existing memory.", {"memory_id": _ID}),
    "clear_memory": _tool("clear_memory", "Delete every memory of this user.", {}),
}


@dataclass
class MemoryWork:
    """What one manager task did: the memories as changed (`UserMemory`, None for a deleted one), how
    (added, updated, deleted) and the model's last word."""

    changes: list[tuple[str, str, UserMemory | None]] = field(default_factory=list)
    reply: str = ""

    @property
    def memories(self) -> list[UserMemory]:
        return [memory for _, _, memory in self.changes if memory is not None]


@dataclass
class _Scope:
    """Who and what a task's tools act for: the owner, the run that asked, how it is recorded."""

    owner: object
    alias: str
    source: str
    run_pk: int | None = None
    input: str = ""
    agent_id: str = ""
    team_id: str = ""


class MemoryManager(MemoryAccessors):
    """Agno's MemoryManager: `model` (default: the agent's), the capture criteria and extra instructions,
    and which tools the agentic path may use. With `db`, it has the memory accessors itself."""

    def __init__(self, model: Model | None = None, system_message: str | None = None,
                 memory_capture_instructions: str | None = None, additional_instructions: str | None = None,
                 db=None, delete_memories: bool = False, update_memories: bool = True, add_memories: bool = True,
                 clear_memories: bool = False, debug_mode: bool = False, user_id=None):
        self.model = model
        self.system_message = system_message
        self.memory_capture_instructions = memory_capture_instructions
        self.additional_instructions = additional_instructions
        self.db = db
        self.delete_memories = delete_memories
        self.update_memories = update_memories
        self.add_memories = add_memories
        self.clear_memories = clear_memories
        self.debug_mode = debug_mode
        self.user_id = user_id

    @property
    def db_alias(self) -> str:
        return getattr(self.db, "alias", self.db) or "default"

    # -- the prompt ----------------------------------------------------------------------------------------

    def tool_names(self, agentic: bool) -> list[str]:
        """The tools of a task: the automatic path's always include delete, never clear."""
        names = [name for name, on in (("add_memory", self.add_memories), ("update_memory", self.update_memories))
                 if on]
        if not agentic or self.delete_memories:
            names.append("delete_memory")
        if agentic and self.clear_memories:
            names.append("clear_memory")
        return names

    def system_prompt(self, existing: list[tuple[str, str]], tool_names: list[str]) -> str:
        """The manager's instructions, with the user's memories as (id, text)."""
        if self.system_message is not None:
            return self.system_message
        capture = self.memory_capture_instructions or DEFAULT_CAPTURE
        lines = [
            INTRO,
            "Your task is to decide whether to add, update or delete memories from the user's message, "
            "or to leave them as they are.",
            "If the user's message says nothing worth keeping, make no change.",
            "Write each memory as a short statement about the user in the third person, one fact per memory, "
            "without repeating a memory that exists. Update a memory when the fact changed, rather than add "
            "a second one, and delete a memory the user asks you to forget or that is no longer true.",
            f"<memories_to_capture>\n{capture}\n</memories_to_capture>",
            "You can use these tools: " + ", ".join(tool_names) + ". You can call multiple tools.",
        ]
        if existing:
            listed = "\n".join(f"ID: {memory_id}\nMemory: {text}" for memory_id, text in existing)
            lines.append(f"<existing_memories>\n{listed}\n</existing_memories>")
        if self.additional_instructions:
            lines.append(self.additional_instructions)
        return "\n\n".join(lines)

    # -- a task ---------------------------------------------------------------------------------------------

    async def arun_task(self, model: Model, message: str, scope: _Scope, agentic: bool) -> MemoryWork:
        """Ask the model about `message` with the user's memories; run its tool calls (scoped to the user)
        until it answers in text. Raises ModelError when the model fails."""
        names = self.tool_names(agentic)
        existing = await call_sync(store.memory_ids_and_texts, scope.owner, scope.alias)
        messages = [{"role": "system", "content": self.system_prompt(existing, names)},
                    {"role": "user", "content": message}]
        tools = [TOOLS[name] for name in names]
        work = MemoryWork()
        for _ in range(MAX_MODEL_CALLS):
            text, calls = await _ask(model, messages, tools)
            if not calls:
                work.reply = text
                break
            messages.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in calls]})
            for call in calls:
                result = await call_sync(self._call, call.name, call.arguments, names, scope, work)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return work

    def _call(self, name: str, arguments: str, allowed: list[str], scope: _Scope, work: MemoryWork) -> str:
        """One tool call of the manager's model, on the user's own memories only; its result text."""
        if name not in allowed:
            return f"Error: there is no tool {name!r} here."
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return "Error: the arguments are not JSON."
        if not isinstance(args, dict):
            return "Error: the arguments must be an object."
        owner, alias, source, run_pk = scope.owner, scope.alias, scope.source, scope.run_pk
        try:
            if name == "add_memory":
                memory = store.add_memory(owner, args.get("memory"), args.get("topics"), alias, source=source,
                                          run_pk=run_pk, input=scope.input, agent_id=scope.agent_id,
                                          team_id=scope.team_id)
                work.changes.append(("added", memory.memory_id, memory))
                return "Memory added successfully"
            if name == "update_memory":
                memory = store.update_memory(owner, str(args.get("memory_id") or ""), args.get("memory"),
                                             args.get("topics"), alias, source=source, run_pk=run_pk)
                if memory is None:
                    return "Memory not found"
                work.changes.append(("updated", memory.memory_id, memory))
                return "Memory updated successfully"
            if name == "delete_memory":
                memory_id = str(args.get("memory_id") or "")
                if not store.delete_memory(owner, memory_id, alias, source=source, run_pk=run_pk):
                    return "Memory not found"
                work.changes.append(("deleted", memory_id, None))
                return "Memory deleted successfully"
            count = store.clear_memories(owner, alias, source=source, run_pk=run_pk)
            work.changes.append(("cleared", "", None))
            return f"Deleted {count} memories of this user"
        except ValueError as exc:  # empty or too long text, topics that are no list
            return f"Error: {exc}"

    # -- Agno's entry points -----------------------------------------------------------------------------

    def _owner(self, user_id, create: bool = False):
        from ..owners import memory_owner

        return memory_owner(user_id if user_id not in (None, "") else self.user_id, self.db_alias, create)

    async def acreate_user_memories(self, message: str | None = None, messages: list | None = None,
                                    user_id=None, agent_id: str | None = None,
                                    team_id: str | None = None) -> MemoryWork:
        """Make memories from a message (or the user messages of `messages`) for one user."""
        text = message or "\n".join(_content(m) for m in messages or [] if _role(m) == "user")
        if not text.strip():
            return MemoryWork()
        owner = await call_sync(self._owner, user_id, True)
        scope = _Scope(owner, self.db_alias, store.Source.RUN, input=text, agent_id=agent_id or "",
                       team_id=team_id or "")
        return await self.arun_task(self._model(), text, scope, agentic=False)

    async def aupdate_memory_task(self, task: str, user_id=None) -> str:
        """The agentic path's work on one user's memories; the model's last word."""
        owner = await call_sync(self._owner, user_id, True)
        scope = _Scope(owner, self.db_alias, store.Source.AGENTIC, input=task)
        return (await self.arun_task(self._model(), task, scope, agentic=True)).reply

    def create_user_memories(self, message: str | None = None, messages: list | None = None, user_id=None,
                             agent_id: str | None = None, team_id: str | None = None) -> MemoryWork:
        from ..bridge import run_sync

        return run_sync(lambda: self.acreate_user_memories(message, messages, user_id, agent_id, team_id))

    def update_memory_task(self, task: str, user_id=None) -> str:
        from ..bridge import run_sync

        return run_sync(lambda: self.aupdate_memory_task(task, user_id))

    def _model(self) -> Model:
        if self.model is None:
            from ..llm import default_model

            self.model = default_model()
        return self.model


async def _ask(model: Model, messages: list[dict], tools: list[dict]):
    """One streamed model call, gathered: (text, tool calls)."""
    parts, calls = [], []
    stream = model.astream(messages, tools or None)
    try:
        async for chunk in stream:
            parts.append(chunk.content)
            calls.extend(chunk.tool_calls)
    finally:
        await stream.aclose()
    return "".join(parts), calls


def _role(message) -> str:
    return message.get("role", "") if isinstance(message, dict) else getattr(message, "role", "")


def _content(message) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    return content if isinstance(content, str) else ""
