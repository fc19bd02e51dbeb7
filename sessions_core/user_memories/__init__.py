"""User memories: facts about a user that outlive sessions, which the user can see and change.

record.py (UserMemory), store.py (rows and their history, scoped to one user), manager.py (MemoryManager:
the model call and its tools), accessors.py (the accessors with async twins), context.py (the memories in
a system message), run_work.py (the work after a run, and the agentic tool). The package imports none of
them: `from sessions_core import MemoryManager, UserMemory` names the public classes.
"""
