"""SQLite's WAL checkpoints run in a thread of their own (chatapp/sqlite_checkpoint.py).

On a throwaway SQLite file of each test's own, so these run the same whatever database the suite uses.
"""

import sqlite3

import pytest
from django.db import connections
from django.db.backends.sqlite3.base import DatabaseWrapper

from chatapp import sqlite_checkpoint
from chatapp.sqlite_checkpoint import FALLBACK_PAGES, Checkpointer


def wrapper(name: str) -> DatabaseWrapper:
    """A Django connection to `name` with the app's SQLite settings (WAL), not registered anywhere."""
    settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": name,
                "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}}
    return DatabaseWrapper(connections.configure_settings({"default": {}, "db": settings})["db"], alias="db")


def rows_in_the_database_file(path) -> int:
    """Rows of table t as the database file itself holds them, leaving the WAL out (immutable=1)."""
    reader = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return reader.execute("SELECT count(*) FROM t").fetchone()[0]
    finally:
        reader.close()


@pytest.fixture(autouse=True)
def _own_databases(django_db_blocker):
    """These connections are the tests' own, not the suite's test database."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "checkpoints.sqlite3"
    connection = wrapper(str(path))
    connection.ensure_connection()  # connection_created: the thread starts, checkpoints are left to it
    yield path, connection
    connection.close()


def test_commits_leave_their_pages_in_the_wal_until_the_thread_checkpoints_them(database):
    path, connection = database
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, text TEXT)")
    checkpointer = Checkpointer.for_path(str(path))
    assert checkpointer.checkpoint_now()
    assert rows_in_the_database_file(path) == 0

    with connection.cursor() as cursor:
        for _ in range(800):  # 800 commits of a 4 KB row: over 1,000 pages, past SQLite's default threshold
            cursor.execute("INSERT INTO t (text) VALUES (%s)", ["x" * 4000])
    assert rows_in_the_database_file(path) == 0  # the writer did not checkpoint, as it would by default

    assert checkpointer.checkpoint_now()
    assert rows_in_the_database_file(path) == 800


def test_app_connections_checkpoint_only_past_the_fallback(database):
    _path, connection = database
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == FALLBACK_PAGES


def test_one_thread_per_database_file(database, tmp_path):
    path, _connection = database
    other = wrapper(str(tmp_path / "other.sqlite3"))
    other.ensure_connection()
    again = wrapper(str(path))
    again.ensure_connection()
    try:
        assert Checkpointer.for_path(str(path)) is Checkpointer.for_path(str(path))
        assert Checkpointer.for_path(str(path)).thread.is_alive()
        assert Checkpointer.for_path(str(tmp_path / "other.sqlite3")) is not Checkpointer.for_path(str(path))
    finally:
        other.close()
        again.close()


def test_in_memory_databases_get_no_thread():
    before = dict(sqlite_checkpoint._checkpointers)
    memory = wrapper("file:checkpoint-test?mode=memory&cache=shared")
    memory.ensure_connection()
    try:
        assert sqlite_checkpoint._checkpointers == before
        with memory.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint")
            assert cursor.fetchone()[0] == 1000  # SQLite's own default, untouched
    finally:
        memory.close()


def test_a_database_file_that_is_gone_is_not_created_again(tmp_path):
    path = tmp_path / "gone.sqlite3"
    checkpointer = Checkpointer.for_path(str(path))
    checkpointer.thread.join(timeout=10)
    assert not checkpointer.thread.is_alive()
    assert not path.exists()
    assert not checkpointer.checkpoint_now(timeout=1)
