"""User memories: facts about a user that outlive sessions, which the user can see and change.

record.py (UserMemory), store.py (rows and their history, scoped to one user), manager.py (MemoryManager:
the model call and its tools), accessors.py (the accessors with async twins), context.py (the memories in
a system message), run_work.py (the work after a run, and the agentic tool).
"""

from .manager import MemoryManager
from .record import UserMemory

__all__ = ["MemoryManager", "UserMemory"]
