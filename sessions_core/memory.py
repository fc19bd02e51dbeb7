"""`InMemoryDb()`: sessions kept in this process only, for quick experiments (Agno's InMemoryDb).

    from sessions_core import Agent, InMemoryDb

    agent = Agent(model=OfflineModel(), db=InMemoryDb(), session_state={"items": []})

Each instance is an in-memory SQLite database of its own, a store like SqliteDb (sessions_core/stores.py):
registered as one more Django database alias and migrated, here when it is made, so the engine works on
it exactly as on the real database: the same tables, owner checks, history and state changes. It is gone
when the process exits.

Meant for one thread at a time: SQLite's shared in-memory databases lock whole tables, and a second
run writing at the same moment fails with "database table is locked" instead of waiting its turn.
Use the Django database for concurrent runs. In Django's test cases, which refuse databases they were
not told about, make it before the class is set up and add its `alias` to `databases`
(tests/engine/test_memory_db.py does).
"""

from __future__ import annotations

import itertools
import sqlite3
import threading

from .stores import BaseDb, migrate_sqlite

_numbers = itertools.count(1)
_lock = threading.Lock()


class InMemoryDb(BaseDb):
    def __init__(self):
        with _lock:
            alias = f"sessions_core_memory_{next(_numbers)}"
        name = f"file:{alias}?mode=memory&cache=shared"
        # The database lives while a connection to it is open: this one is never closed.
        self._keeper = sqlite3.connect(name, uri=True, check_same_thread=False)
        super().__init__(alias, {"ENGINE": "django.db.backends.sqlite3", "NAME": name,
                                 "OPTIONS": {"transaction_mode": "IMMEDIATE"}})
        self.alias  # noqa: B018 - migrated now, as Agno's is ready when made

    def _migrate(self, connection) -> None:
        migrate_sqlite(connection)

    def __repr__(self) -> str:
        return f"InMemoryDb({self._alias!r})"
