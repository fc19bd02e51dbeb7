"""Agno's storage classes: SqliteDb, PostgresDb, their async twins, and the base InMemoryDb shares.

    from sessions_core import Agent, PostgresDb, SqliteDb

    agent = Agent(model=..., db=SqliteDb(db_file="tmp/agents.db"))
    agent = Agent(model=..., db=PostgresDb(db_url="postgresql+psycopg://ai:ai@localhost:5532/ai",
                                           session_table="sessions"))

A store is one more Django database alias, registered when the object is made; the engine reaches it
through the ORM like any other (`Agent.db_alias` is the store's `alias`). Equal arguments give the same
alias, so agents (and processes) given equal stores share their sessions. The schema is migrated on
first use, once per process: in one transaction, under a lock that makes a second process starting at
the same moment wait and then find the tables made (SQLite: the transaction's BEGIN IMMEDIATE;
PostgreSQL: an advisory lock). A failure leaves nothing half-made and raises a StoreError naming the
store. Connections still open when the process exits are closed then.

`session_table` keeps stores apart on one database. PostgreSQL: a schema of that name (created when
missing) holds the tables; the connections' search_path is that schema, then `public` (where the
pg_trgm extension lives). SQLite: a file next to `db_file`, named after it: `tmp/agents.db` with
`session_table="sessions"` is `tmp/agents.sessions.db`.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import re
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.db.backends.signals import connection_created
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from .bridge import call_sync, run_sync
from .models import ChatSession
from .owners import owned_session, sessions_of, validate_session_id  # the engine's owner check
from .user_memories.accessors import ASYNC_NAMES as MEMORY_ASYNC_NAMES
from .user_memories.accessors import MemoryAccessors

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_PG_SCHEMES = re.compile(r"postgres(ql)?(\+[a-z0-9_]+)?")
_PG_MIGRATE_LOCK = 0x5E55_1045  # the advisory lock every store's first migration takes on a database

_ready: set[str] = set()  # aliases migrated by this process
_setup_lock = threading.Lock()
_open = weakref.WeakSet()  # every connection made to a store's alias, on any thread


class StoreError(Exception):
    """A store cannot be used; the message names it (passwords masked)."""

    def __init__(self, store: BaseDb | str, problem: str):
        self.store = store
        super().__init__(f"{store!r}: {problem}" if not isinstance(store, str) else f"{store}: {problem}")


class StoreConfigError(StoreError, ValueError):
    """The arguments cannot name a store (raised when it is made)."""


class StoreConnectionError(StoreError):
    """The database cannot be reached or opened (raised on first use)."""


class StoreMigrationError(StoreError):
    """The tables could not be made; nothing was left half-made (raised on first use)."""


def _register(alias: str, settings: dict) -> None:
    if alias not in connections.settings:
        # configure_settings fills in Django's defaults (it insists on seeing a "default" entry).
        connections.settings[alias] = connections.configure_settings({"default": {}, alias: settings})[alias]


def _track(sender, connection, **kwargs) -> None:
    if connection.alias.startswith("sessions_core_"):
        _open.add(connection)


def _close_at_exit() -> None:
    for connection in list(_open):
        try:
            connection.inc_thread_sharing()  # made on another thread, closed from this one
            connection.close()
        except Exception:  # the process is ending; a connection already gone is no matter
            pass
    # A statement still held by a reference cycle keeps SQLite's file open (and its -wal and -shm
    # files in place) past close(); collecting finalizes it.
    gc.collect()


connection_created.connect(_track)
atexit.register(_close_at_exit)


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class BaseDb(MemoryAccessors):
    """The base of the storage classes (Agno's name for it): a database the engine uses through a Django
    alias of its own, migrated on first use; it has the memory accessors (`db.get_user_memories(...)`,
    ...) as well as the session ones."""

    _cannot_connect = "cannot connect"

    def __init__(self, alias: str, settings: dict):
        self._alias = alias
        _register(alias, settings)

    @property
    def alias(self) -> str:
        """The Django database alias; the first use in this process migrates the schema."""
        if self._alias not in _ready:
            self._set_up()
        return self._alias

    @property
    def db_alias(self) -> str:
        return self.alias

    def _set_up(self) -> None:
        with _setup_lock:
            if self._alias in _ready:
                return
            # On a thread of its own: the caller may be inside an event loop, where Django refuses the
            # ORM, or inside a transaction of its own on another database.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessions_core-store") as pool:
                pool.submit(self._migrate_here).result()
            _ready.add(self._alias)

    def _migrate_here(self) -> None:
        connection = connections[self._alias]
        try:
            try:
                self._connect(connection)
            except DatabaseError as exc:
                raise StoreConnectionError(self, f"{self._cannot_connect}: {_first_line(exc)}") from exc
            try:
                if self._pending(connection):
                    self._migrate(connection)
            except DatabaseError as exc:
                raise StoreMigrationError(self, f"cannot create its tables (nothing was kept): {_first_line(exc)}") from exc
        finally:
            connection.close()  # this thread ends here
            gc.collect()  # the migration leaves statements in reference cycles; they hold the file open

    def _connect(self, connection) -> None:
        connection.ensure_connection()

    def _pending(self, connection) -> bool:
        executor = MigrationExecutor(connection)
        return bool(executor.migration_plan(executor.loader.graph.leaf_nodes()))

    def _migrate(self, connection) -> None:
        raise NotImplementedError

    # -- the sessions in it, with the engine's owner checks ------------------------------------------

    def _agent(self):
        from .agent import Agent  # AgentSession's helpers reach the store through an agent

        return Agent(db=self)

    def _view(self, session: ChatSession, agent):
        return agent._session_view(session)

    def _owned(self, session_id: str, user_id) -> ChatSession | None:
        return owned_session(validate_session_id(session_id), user_id, self.alias, must_exist=False)

    async def aget_session(self, session_id: str, user_id=None):
        """The session, None when there is none; another user's session raises SessionOwnershipError."""
        agent = self._agent()

        def load():
            session = self._owned(session_id, user_id)
            return self._view(session, agent) if session is not None else None

        return await call_sync(load)

    async def aget_sessions(self, user_id=None, limit: int | None = None, page: int | None = None,
                            component_id: str | None = None) -> list:
        """One user's sessions (None: the ownerless ones), newest activity first; `page` counts from 1."""
        if limit is not None and limit < 1 or page is not None and (page < 1 or limit is None):
            raise ValueError("limit must be at least 1, and page (from 1) needs a limit")
        agent = self._agent()

        def load():
            sessions = sessions_of(user_id, self.alias).select_related("owner")
            if component_id is not None:
                sessions = sessions.filter(component_id=component_id)
            sessions = sessions.order_by("-last_activity_at", "-id")
            if limit is not None:
                start = ((page or 1) - 1) * limit
                sessions = sessions[start:start + limit]
            return [self._view(session, agent) for session in sessions]

        return await call_sync(load)

    async def adelete_session(self, session_id: str, user_id=None) -> bool:
        """Delete the session and everything in it; False when there is none."""
        def delete():
            with transaction.atomic(using=self.alias):
                session = self._owned(session_id, user_id)
                if session is None:
                    return False
                session.delete()
                return True

        return await call_sync(delete)

    def get_session(self, session_id: str, user_id=None):
        return run_sync(lambda: self.aget_session(session_id, user_id))

    def get_sessions(self, user_id=None, limit: int | None = None, page: int | None = None,
                     component_id: str | None = None) -> list:
        return run_sync(lambda: self.aget_sessions(user_id, limit, page, component_id))

    def delete_session(self, session_id: str, user_id=None) -> bool:
        return run_sync(lambda: self.adelete_session(session_id, user_id))


def _safe_table(session_table: str | None, store: str) -> str | None:
    if session_table is not None and not _IDENTIFIER.fullmatch(str(session_table)):
        raise StoreConfigError(store, f"session_table {session_table!r} is not a safe name "
                                      "(a letter or _, then up to 62 letters, digits or _)")
    return session_table


def _digest(*parts) -> str:
    return hashlib.sha256("\0".join(str(part) for part in parts).encode()).hexdigest()[:16]


def migrate_sqlite(connection) -> None:
    """Migrate a SQLite store in one transaction (its BEGIN IMMEDIATE is the lock between processes)."""
    # SQLite's schema editor needs foreign keys off, and they can only be switched outside a transaction.
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA foreign_keys = OFF")
    try:
        # The write lock is taken when the transaction begins: another process migrating the same file
        # waits for it, then finds nothing left to do.
        with transaction.atomic(using=connection.alias):
            call_command("migrate", database=connection.alias, verbosity=0, interactive=False)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA foreign_keys = ON")


OPEN_ATTEMPTS = 30


class SqliteDb(BaseDb):
    """A SQLite file (folders made on first use); `session_table` picks a file of its own next to it."""

    _cannot_connect = "cannot open"

    def __init__(self, db_file: str | Path | None = None, session_table: str | None = None):
        if db_file is None or not str(db_file).strip() or str(db_file) == ":memory:":
            raise StoreConfigError(f"{type(self).__name__}({db_file!r})", "db_file must name a file "
                                   "(InMemoryDb() keeps sessions in memory)")
        self.db_file, self.session_table = str(db_file), None
        self.session_table = _safe_table(session_table, repr(self))
        path = Path(db_file).expanduser().absolute()
        if session_table:
            path = path.with_name(f"{path.stem}.{session_table}{path.suffix}")
        self.path = path
        super().__init__(f"sessions_core_sqlite_{_digest(path)}", {
            "ENGINE": "django.db.backends.sqlite3", "NAME": str(path),
            # As the project's own SQLite database: writers queue instead of failing, readers work in WAL.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        })

    def __repr__(self) -> str:
        table = f", session_table={self.session_table!r}" if self.session_table else ""
        return f"{type(self).__name__}({self.db_file}{table})"

    def _connect(self, connection) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreConnectionError(self, f"cannot open: cannot make the folder {self.path.parent} "
                                             f"({exc.strerror or exc})") from exc
        # A new file's first connection switches it to WAL, which needs the file to itself: a second process
        # doing the same at that moment gets "database is locked" at once (SQLite does not wait on the busy
        # timeout there). It is tried again, for up to OPEN_ATTEMPTS x the growing pause (about 5 s).
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            try:
                connection.ensure_connection()
                return
            except DatabaseError as exc:
                if "locked" not in str(exc) or attempt == OPEN_ATTEMPTS:
                    raise
                connection.close()
                time.sleep(0.01 * attempt)

    def _migrate(self, connection) -> None:
        migrate_sqlite(connection)


def _async_accessors(cls):
    """The store's accessors (sessions and memories) as coroutines under their plain names."""
    for name in ("get_session", "get_sessions", "delete_session", *MEMORY_ASYNC_NAMES):
        setattr(cls, name, getattr(BaseDb, f"a{name}"))
    return cls


@_async_accessors
class AsyncSqliteDb(SqliteDb):
    """SqliteDb for async code, as Agno's: its own accessors are coroutines (`await db.get_session(...)`)."""


class PostgresDb(BaseDb):
    """A PostgreSQL database by URL (postgresql+psycopg://, postgresql://, postgres://); `session_table`
    is a schema of that name."""

    def __init__(self, db_url: str | None = None, session_table: str | None = None):
        self.db_url, self.session_table = str(db_url or ""), None
        scheme, _, rest = self.db_url.partition("://")
        parts = urlsplit(f"postgresql://{rest}")  # urlsplit takes no "_" in a scheme (psycopg_async)
        if not _PG_SCHEMES.fullmatch(scheme) or not rest or not parts.hostname and not parts.path.strip("/"):
            raise StoreConfigError(repr(self), "db_url is not a PostgreSQL URL "
                                   "(postgresql+psycopg://user:password@host:port/database)")
        self.session_table = _safe_table(session_table, repr(self))
        options = dict(parse_qsl(parts.query))
        options.setdefault("connect_timeout", "10")
        if "prepare_threshold" in options:  # psycopg takes a number of uses (0: at once) or None (never), not text
            threshold = options["prepare_threshold"].strip().lower()
            if not threshold.isdigit() and threshold != "none":
                raise StoreConfigError(repr(self), "prepare_threshold in db_url must be a whole number of uses "
                                       "before a statement is prepared (0: at once) or none (never)")
            options["prepare_threshold"] = int(threshold) if threshold.isdigit() else None
        if session_table:
            # The schema first, where tables are made and found; then public, where pg_trgm lives.
            options["options"] = f'{options.get("options", "")} -c search_path="{session_table}",public'.strip()
        settings = {
            "ENGINE": "django.db.backends.postgresql", "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""), "PASSWORD": unquote(parts.password or ""),
            "HOST": unquote(parts.hostname or ""), "PORT": str(parts.port or ""), "OPTIONS": options,
        }
        where = [settings[key] for key in ("HOST", "PORT", "NAME", "USER", "PASSWORD")]
        super().__init__(f"sessions_core_pg_{_digest(*where, sorted(options.items()))}", settings)

    def __repr__(self) -> str:
        parts = urlsplit(f"postgresql://{self.db_url.partition('://')[2]}")
        url = self.db_url
        if parts.password is not None:
            url = url.replace(f":{parts.password}@", ":***@", 1)
        table = f", session_table={self.session_table!r}" if self.session_table else ""
        return f"{type(self).__name__}({url}{table})"

    def _pending(self, connection) -> bool:
        if self.session_table and not self._has_own_migrations_table(connection):
            return True
        return super()._pending(connection)

    def _has_own_migrations_table(self, connection) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s)", [f'"{self.session_table}".django_migrations'])
            return cursor.fetchone()[0] is not None

    def _migrate(self, connection) -> None:
        # DDL is transactional here: the schema, the extension and every table commit together or not at all.
        with transaction.atomic(using=connection.alias):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PG_MIGRATE_LOCK])
                if self.session_table:
                    cursor.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.session_table}"')
                    cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA public")
            if self.session_table and not self._has_own_migrations_table(connection):
                # Django would take public's django_migrations (visible through the search_path) for
                # this schema's and skip every migration: the schema gets its own first.
                with connection.schema_editor() as editor:
                    editor.create_model(MigrationRecorder(connection).Migration)
            call_command("migrate", database=connection.alias, verbosity=0, interactive=False)


@_async_accessors
class AsyncPostgresDb(PostgresDb):
    """PostgresDb for async code, as Agno's: its own accessors are coroutines (`await db.get_session(...)`)."""
