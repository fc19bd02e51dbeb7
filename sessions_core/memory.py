"""`InMemoryDb()`: sessions kept in this process only, for quick experiments (Agno's InMemoryDb).

    from sessions_core import Agent, InMemoryDb

    agent = Agent(model=OfflineModel(), db=InMemoryDb(), session_state={"items": []})

Each instance is an in-memory SQLite database of its own, registered as one more Django database
alias and migrated when it is created, so the engine works on it exactly as on the real database:
the same tables, owner checks, history and state changes. It is gone when the process exits.

Meant for one thread at a time: SQLite's shared in-memory databases lock whole tables, and a second
run writing at the same moment fails with "database table is locked" instead of waiting its turn.
Use the Django database for concurrent runs. In Django's test cases, which refuse databases they were
not told about, make it before the class is set up and add its `alias` to `databases`
(tests/test_memory_db.py does).
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

from django.core.management import call_command
from django.db import connections

_numbers = itertools.count(1)
_lock = threading.Lock()


class InMemoryDb:
    def __init__(self):
        with _lock:
            self.alias = f"sessions_core_memory_{next(_numbers)}"
        name = f"file:{self.alias}?mode=memory&cache=shared"
        # The database lives while a connection to it is open: this one is never closed.
        self._keeper = sqlite3.connect(name, uri=True, check_same_thread=False)
        settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": name,
                    "OPTIONS": {"transaction_mode": "IMMEDIATE"}}
        # configure_settings fills in Django's defaults (it insists on seeing a "default" entry).
        connections.settings[self.alias] = connections.configure_settings({"default": {}, self.alias: settings})[
            self.alias
        ]
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._migrate()
        else:  # made inside async code, where Django refuses to run the ORM on the loop's thread
            with ThreadPoolExecutor(max_workers=1) as pool:
                pool.submit(self._migrate).result()

    def _migrate(self) -> None:
        call_command("migrate", database=self.alias, verbosity=0, interactive=False)

    def __repr__(self) -> str:
        return f"InMemoryDb({self.alias!r})"
