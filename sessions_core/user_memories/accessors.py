"""The memory accessors, each with its async twin, shared by Agent, Team, Workflow, the stores (SqliteDb,
PostgresDb, InMemoryDb) and a MemoryManager given a db.

`get_user_memories`, `get_user_memory`, `add_user_memory`, `update_user_memory`, `delete_user_memory`,
`clear_user_memories` (Agno's names), and ours: `get_user_memory_history`, `get_run_memory_changes`,
`undo_run_memory_changes`, `set_user_memories_enabled`, `get_user_memories_enabled`. The user is the
`user_id` given, else the owner's own `user_id`; no user has no memories. Every one of them works on that
user's memories only (user_memories/store.py), so another user's memory id is "not found".
"""

from __future__ import annotations

from ..bridge import call_sync, run_sync
from ..errors import UserMemoryNotFoundError
from ..owners import memory_owner
from . import store
from .record import UserMemory


class MemoryAccessors:
    """Mixed into anything with `db_alias` (and, optionally, `user_id`)."""

    db_alias: str

    def _memory_owner(self, user_id, create: bool = False):
        """Blocking: the user whose memories the call reads or changes."""
        if user_id in (None, ""):
            user_id = getattr(self, "user_id", None)
        return memory_owner(user_id, self.db_alias, create)

    async def aget_user_memories(self, user_id=None, search: str | None = None,
                                 limit: int | None = None) -> list[UserMemory]:
        """The user's memories, oldest first (`search`: those whose text or topics contain it)."""
        return await call_sync(lambda: store.list_memories(self._memory_owner(user_id), self.db_alias, search, limit))

    def get_user_memories(self, user_id=None, search: str | None = None, limit: int | None = None) -> list[UserMemory]:
        return run_sync(lambda: self.aget_user_memories(user_id, search, limit))

    async def aget_user_memory(self, memory_id: str, user_id=None) -> UserMemory | None:
        """The user's memory with that id; None if the user has none (another user's id included)."""
        return await call_sync(lambda: store.get_memory(self._memory_owner(user_id), memory_id, self.db_alias))

    def get_user_memory(self, memory_id: str, user_id=None) -> UserMemory | None:
        return run_sync(lambda: self.aget_user_memory(memory_id, user_id))

    async def aadd_user_memory(self, memory: UserMemory | str, user_id=None) -> UserMemory:
        """Store a new memory of the user (`memory.user_id` names the user when `user_id` does not); the
        stored memory, with its id. A UserMemory's own id is kept when no memory has it yet."""
        if isinstance(memory, str):
            memory = UserMemory(memory=memory)
        user_id = user_id if user_id not in (None, "") else memory.user_id

        def add():
            owner = self._memory_owner(user_id, create=True)
            return store.add_memory(owner, memory.memory, memory.topics, self.db_alias, source=store.Source.USER,
                                    input=memory.input or "", agent_id=memory.agent_id or "",
                                    team_id=memory.team_id or "", memory_id=memory.memory_id,
                                    created_at=memory.created_at)

        return await call_sync(add)

    def add_user_memory(self, memory: UserMemory | str, user_id=None) -> UserMemory:
        return run_sync(lambda: self.aadd_user_memory(memory, user_id))

    async def aupdate_user_memory(self, memory_id: str | None = None, memory: UserMemory | str | None = None,
                                  topics: list[str] | None = None, user_id=None) -> UserMemory:
        """Change the text (and topics: None keeps them) of the user's memory; a UserMemory gives its id,
        text and topics. UserMemoryNotFoundError if the user has no memory with that id."""
        if isinstance(memory, UserMemory):
            memory_id = memory_id or memory.memory_id
            topics = topics if topics is not None else memory.topics
            user_id = user_id if user_id not in (None, "") else memory.user_id
            memory = memory.memory
        if not memory_id:
            raise ValueError("update_user_memory needs the memory's id.")

        def update():
            changed = store.update_memory(self._memory_owner(user_id), memory_id, memory, topics, self.db_alias,
                                          source=store.Source.USER)
            if changed is None:
                raise UserMemoryNotFoundError(memory_id)
            return changed

        return await call_sync(update)

    def update_user_memory(self, memory_id: str | None = None, memory: UserMemory | str | None = None,
                           topics: list[str] | None = None, user_id=None) -> UserMemory:
        return run_sync(lambda: self.aupdate_user_memory(memory_id, memory, topics, user_id))

    async def adelete_user_memory(self, memory_id: str, user_id=None) -> bool:
        """Delete the user's memory (its history is kept); False if the user has none with that id."""
        return await call_sync(lambda: store.delete_memory(self._memory_owner(user_id), memory_id, self.db_alias,
                                                           source=store.Source.USER))

    def delete_user_memory(self, memory_id: str, user_id=None) -> bool:
        return run_sync(lambda: self.adelete_user_memory(memory_id, user_id))

    async def aclear_user_memories(self, user_id=None) -> int:
        """Delete every memory of this one user (never another's); how many."""
        return await call_sync(lambda: store.clear_memories(self._memory_owner(user_id), self.db_alias,
                                                            source=store.Source.USER))

    def clear_user_memories(self, user_id=None) -> int:
        return run_sync(lambda: self.aclear_user_memories(user_id))

    async def aget_user_memory_history(self, memory_id: str, user_id=None) -> list[store.MemoryChange]:
        """Every change of the user's memory, oldest first: added, updated (from what), deleted; by which run
        or by the user's own edit."""
        return await call_sync(lambda: store.memory_history(self._memory_owner(user_id), memory_id, self.db_alias))

    def get_user_memory_history(self, memory_id: str, user_id=None) -> list[store.MemoryChange]:
        return run_sync(lambda: self.aget_user_memory_history(memory_id, user_id))

    async def aget_run_memory_changes(self, run_id: str, user_id=None) -> list[store.MemoryChange]:
        """The changes a run of the user made to the user's memories."""
        return await call_sync(lambda: store.run_changes(self._memory_owner(user_id), run_id, self.db_alias))

    def get_run_memory_changes(self, run_id: str, user_id=None) -> list[store.MemoryChange]:
        return run_sync(lambda: self.aget_run_memory_changes(run_id, user_id))

    async def aundo_run_memory_changes(self, run_id: str, user_id=None) -> int:
        """Undo what a run of the user did to the user's memories; how many changes were undone."""
        return await call_sync(lambda: store.undo_run(self._memory_owner(user_id), run_id, self.db_alias))

    def undo_run_memory_changes(self, run_id: str, user_id=None) -> int:
        return run_sync(lambda: self.aundo_run_memory_changes(run_id, user_id))

    async def aset_user_memories_enabled(self, enabled: bool, user_id=None) -> None:
        """Turn memories on or off for the user: off, runs learn nothing about them and show a model none."""
        await call_sync(lambda: store.set_memories_enabled(self._memory_owner(user_id, create=True), enabled,
                                                           self.db_alias))

    def set_user_memories_enabled(self, enabled: bool, user_id=None) -> None:
        return run_sync(lambda: self.aset_user_memories_enabled(enabled, user_id))

    async def aget_user_memories_enabled(self, user_id=None) -> bool:
        return await call_sync(lambda: store.memories_enabled(self._memory_owner(user_id), self.db_alias))

    def get_user_memories_enabled(self, user_id=None) -> bool:
        return run_sync(lambda: self.aget_user_memories_enabled(user_id))


ASYNC_NAMES = [name[1:] for name in vars(MemoryAccessors) if name.startswith("a") and name[1:] in vars(MemoryAccessors)]
