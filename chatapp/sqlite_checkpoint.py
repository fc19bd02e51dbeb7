"""SQLite's WAL checkpoints, moved off the requests' and runs' path.

In WAL mode, a commit appends the pages it changed to the `-wal` file; a checkpoint copies them back
into the database file and syncs it. By default the connection whose commit takes the WAL past 1,000
pages runs that checkpoint itself, inside its commit: the run that happens to cross that line pays
for it, and so does every request queued behind it on Django's one executor thread.

Here each process keeps one thread per SQLite database file that runs a PASSIVE checkpoint every
CHECKPOINT_SECONDS (it never waits for a lock and never holds up a writer), and the app's connections
leave checkpointing to it until the WAL reaches FALLBACK_PAGES, where a writer does it itself (a
safety net for bursts, or should the thread be gone).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

logger = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 0.5
FALLBACK_PAGES = 4000  # about 16 MB of WAL at SQLite's 4 KB pages

_checkpointers: dict[tuple[int, str], Checkpointer] = {}
_lock = threading.Lock()


def on_connection_created(sender, connection, **kwargs) -> None:
    """`connection_created` receiver: a new SQLite connection to a file leaves checkpoints to the thread."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return
    Checkpointer.for_path(str(connection.settings_dict["NAME"]))
    connection.connection.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_PAGES}")


class Checkpointer:
    """The checkpointing thread of one database file in this process."""

    def __init__(self, path: str):
        self.path = path
        self.wake = threading.Event()
        self.done = threading.Condition()
        self.checkpoints = 0  # how many have run, for callers that wait for the next one
        self.thread = threading.Thread(target=self._loop, name=f"sqlite-checkpoint {os.path.basename(path)}",
                                       daemon=True)

    @classmethod
    def for_path(cls, path: str) -> Checkpointer:
        """This process's checkpointer for `path`, started on first use (a forked child starts its own)."""
        key = (os.getpid(), path)
        with _lock:
            checkpointer = _checkpointers.get(key)
            if checkpointer is None or not checkpointer.thread.is_alive():
                checkpointer = _checkpointers[key] = cls(path)
                checkpointer.thread.start()
            return checkpointer

    def checkpoint_now(self, timeout: float = 10.0) -> bool:
        """Ask for a checkpoint at once and wait until one has run; False if none ran within `timeout`."""
        with self.done:
            target = self.checkpoints + 1
            self.wake.set()
            self.done.wait_for(lambda: self.checkpoints >= target or not self.thread.is_alive(), timeout)
            return self.checkpoints >= target

    def _loop(self) -> None:
        try:
            # mode=rw: a database file that has gone (a test database, dropped) is not created again.
            connection = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            logger.warning("No background checkpoints for %s: %s", self.path, exc)
            return
        try:
            while True:
                self.wake.wait(CHECKPOINT_SECONDS)
                self.wake.clear()
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                with self.done:
                    self.checkpoints += 1
                    self.done.notify_all()
        except sqlite3.Error as exc:  # writers checkpoint again from here on (past FALLBACK_PAGES)
            # A file that was removed (a test database, dropped at the end) is no news; anything else is.
            level = logging.WARNING if os.path.exists(self.path) else logging.DEBUG
            logger.log(level, "Background checkpoints for %s stopped: %s", self.path, exc)
        finally:
            connection.close()
            with self.done:
                self.done.notify_all()
