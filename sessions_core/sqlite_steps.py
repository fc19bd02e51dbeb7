"""SQLite: a run's start and finish each write in one statement, as they do on PostgreSQL.

PostgreSQL writes a step's rows in one statement with data-modifying CTEs (run_sql.RunSQL). SQLite
has none; its way to write several tables in one statement is a trigger. So each step here is an
INSERT of one row into a temporary view whose INSTEAD OF trigger makes the step's writes: the run
row, its messages (a JSON array, unpacked with `json_each`), the lease, the state changes. One
statement is atomic by itself in SQLite, trigger included, so a step outside any transaction needs no
BEGIN and COMMIT, and one inside a transaction joins it as any statement does.

The views and triggers are TEMP objects: they live in the connection, never in the database file, so
no migration creates them and nothing outside this process ever sees them. They are made from the
models' own table and column names as each SQLite connection opens (outside any transaction, so a
rolled-back transaction cannot take them away), dropped before a migration on that connection and
made again after it: a table rebuilt by SQLite's schema editor (create, copy, drop, rename) cannot be
renamed while a trigger names the table it replaces. Should they be missing all the same, a step's
statement fails with "no such table" and is run again once they are made.

A trigger's INSERT reports no rows changed, so the connection's `total_changes` (a counter sqlite3
keeps, read without a statement) tells whether a step whose writes are conditional wrote anything.
"""

from __future__ import annotations

from django.db import OperationalError
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate, pre_migrate

from .models import ChatSession, Message, Run, StateChange

# A run row's fields as the hand-written statements write them, in order (here and in run_sql.py).
RUN_FIELDS = ("run_id", "session", "parent_run", "kind", "step_name", "follows", "abandoned", "component_id", "status",
               "input", "content", "content_type", "error", "model_id", "metrics", "history_seqs",
               "cancel_requested", "created_at", "finished_at")
# A message's values in the JSON array a step passes (its session and run come from the step's row).
_MESSAGE_VALUES = ("seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at")
_CHANGE_VALUES = ("session", "run", "version", "patch", "inverse", "source", "created_at")
# A step's (or member's) end written with its root run's finish (RunStore.finish's `children`).
_CHILD_END = ("id", "status", "content", "content_type", "error", "metrics", "finished_at")

START, NEW_SESSION, FINISH = "sessions_core_start_step", "sessions_core_new_session_step", "sessions_core_finish_step"
VIEWS = (START, NEW_SESSION, FINISH)


def _column(model, name: str, quote) -> str:
    return quote(model._meta.get_field(name).column)


def _unpack(names: tuple[str, ...], model, quote) -> tuple[str, str]:
    """The columns of `names` and, for a row of them in a JSON array `j.value`, the values."""
    columns = ", ".join(_column(model, name, quote) for name in names)
    values = ", ".join(f"json_extract(j.value, '$[{number}]')" for number in range(len(names)))
    return columns, values


class SqliteSteps:
    """The views, their triggers and the step statements, for one SQLite connection's names."""

    def __init__(self, connection, run_fields: tuple[str, ...], placeholder: str = "%s"):
        """`run_fields`: a run row's fields in the order of RunStore's run parameters."""
        quote = connection.ops.quote_name
        session, run, message, change = (quote(model._meta.db_table) for model in (ChatSession, Run, Message,
                                                                                      StateChange))
        s = {name: _column(ChatSession, name, quote) for name in (
            "id", "session_id", "session_state", "state_version", "last_seq", "lease_token", "lease_expires_at",
            "last_activity_at", "current_leaf")}
        run_pk, session_column = quote(Run._meta.pk.column), _column(Message, "session", quote)
        run_columns = ", ".join(_column(Run, name, quote) for name in run_fields)
        message_columns, message_values = _unpack(_MESSAGE_VALUES, Message, quote)
        message_columns = f"{session_column}, {_column(Message, 'run', quote)}, {message_columns}"
        change_columns, change_values = _unpack(_CHANGE_VALUES, StateChange, quote)
        self.session_fields = [field for field in ChatSession._meta.concrete_fields
                               if not field.primary_key and field.name != "current_leaf"]
        session_columns = ", ".join(quote(field.column) for field in self.session_fields)

        def view(name: str, columns: list[str]) -> list[str]:
            nulls = ", ".join(["NULL"] * len(columns))
            return [f"CREATE TEMP VIEW IF NOT EXISTS {name} ({', '.join(columns)}) AS SELECT {nulls}",
                    f"INSERT INTO {name} VALUES ({', '.join([placeholder] * len(columns))})"]

        def new(prefix: str, names) -> str:
            return ", ".join(f"NEW.{prefix}{number}" for number in range(len(names)))

        # start: the run (its id drawn beforehand), its first messages, the lease (RunStore.start_run).
        start_columns = ["run_pk", *(f"r{number}" for number in range(len(run_fields))), "messages",
                         "lease_token", "lease_expires_at", "now", "last_seq"]
        start_view, self.start = view(START, start_columns)
        run_session = f"NEW.r{run_fields.index('session')}"
        start_trigger = (
            f"CREATE TEMP TRIGGER IF NOT EXISTS {START} INSTEAD OF INSERT ON {START} BEGIN"
            f" INSERT INTO {run} ({run_pk}, {run_columns}) VALUES (NEW.run_pk, {new('r', run_fields)});"
            f" INSERT INTO {message} ({message_columns}) SELECT {run_session}, NEW.run_pk, {message_values}"
            f" FROM json_each(NEW.messages) AS j;"
            f" UPDATE {session} SET {s['lease_token']} = NEW.lease_token, {s['lease_expires_at']} = NEW.lease_expires_at,"
            f" {s['last_activity_at']} = NEW.now, {s['last_seq']} = NEW.last_seq, {s['current_leaf']} = NEW.run_pk"
            f" WHERE {s['id']} = {run_session};"
            f" END"
        )
        # new session: the session (lease taken, the run its current leaf), the run, its first messages;
        # nothing at all when a session of that id exists (RunStore.start_new_session).
        new_run_fields = tuple(name for name in run_fields if name != "session")
        new_columns = ["session_pk", *(f"s{number}" for number in range(len(self.session_fields))), "run_pk",
                       *(f"r{number}" for number in range(len(new_run_fields))), "messages"]
        new_view, self.new_session = view(NEW_SESSION, new_columns)
        new_session_id = f"NEW.s{[field.name for field in self.session_fields].index('session_id')}"
        new_run_columns = ", ".join(_column(Run, name, quote) for name in new_run_fields)
        new_trigger = (
            f"CREATE TEMP TRIGGER IF NOT EXISTS {NEW_SESSION} INSTEAD OF INSERT ON {NEW_SESSION} BEGIN"
            f" SELECT RAISE(IGNORE) WHERE EXISTS (SELECT 1 FROM {session} WHERE {s['session_id']} = {new_session_id});"
            f" INSERT INTO {session} ({s['id']}, {session_columns}, {s['current_leaf']})"
            f" VALUES (NEW.session_pk, {new('s', self.session_fields)}, NEW.run_pk);"
            f" INSERT INTO {run} ({run_pk}, {_column(Run, 'session', quote)}, {new_run_columns})"
            f" VALUES (NEW.run_pk, NEW.session_pk, {new('r', new_run_fields)});"
            f" INSERT INTO {message} ({message_columns}) SELECT NEW.session_pk, NEW.run_pk, {message_values}"
            f" FROM json_each(NEW.messages) AS j;"
            f" END"
        )
        # finish: all of it only while the run holds the lease and the state is at its base version
        # (RunStore.finish); the state only when it changed (state_text not NULL); the ends of the
        # run's steps or members whose end waited for it.
        finish_run = {name: _column(Run, name, quote) for name in (
            "status", "content", "content_type", "error", "metrics", "state_version", "finished_at")}
        finish_columns = ["session_pk", "token", "base_version", "now", "last_seq", "state_text", "state_version",
                          "changes", "messages", "children", "run_pk", "status", "content", "content_type", "error",
                          "metrics"]
        # Its messages name their run (a step's or a member's, whose end is written with the finish).
        finish_message_columns, finish_message_values = _unpack(("run", *_MESSAGE_VALUES), Message, quote)
        child = [f"json_extract(j.value, '$[{number}]')" for number in range(len(_CHILD_END))]
        child_set = ", ".join(f"{_column(Run, name, quote)} = {value}" for name, value in zip(_CHILD_END[1:], child[1:]))
        finish_view, self.finish = view(FINISH, finish_columns)
        finish_trigger = (
            f"CREATE TEMP TRIGGER IF NOT EXISTS {FINISH} INSTEAD OF INSERT ON {FINISH} BEGIN"
            f" SELECT RAISE(IGNORE) WHERE NOT EXISTS (SELECT 1 FROM {session} WHERE {s['id']} = NEW.session_pk"
            f" AND {s['lease_token']} = NEW.token AND {s['state_version']} = NEW.base_version);"
            f" UPDATE {session} SET {s['lease_token']} = '', {s['lease_expires_at']} = NULL,"
            f" {s['last_activity_at']} = NEW.now, {s['last_seq']} = NEW.last_seq,"
            f" {s['session_state']} = COALESCE(NEW.state_text, {s['session_state']}),"
            f" {s['state_version']} = CASE WHEN NEW.state_text IS NULL THEN {s['state_version']}"
            f" ELSE NEW.state_version END WHERE {s['id']} = NEW.session_pk;"
            f" INSERT INTO {change} ({change_columns}) SELECT {change_values} FROM json_each(NEW.changes) AS j;"
            f" INSERT INTO {message} ({session_column}, {finish_message_columns}) SELECT NEW.session_pk,"
            f" {finish_message_values} FROM json_each(NEW.messages) AS j;"
            f" UPDATE {run} SET {child_set}, {finish_run['state_version']} = NULL FROM json_each(NEW.children) AS j"
            f" WHERE {run}.{run_pk} = {child[0]};"
            f" UPDATE {run} SET {finish_run['status']} = NEW.status, {finish_run['content']} = NEW.content,"
            f" {finish_run['content_type']} = NEW.content_type, {finish_run['error']} = NEW.error,"
            f" {finish_run['metrics']} = NEW.metrics, {finish_run['state_version']} = NEW.state_version,"
            f" {finish_run['finished_at']} = NEW.now WHERE {run_pk} = NEW.run_pk;"
            f" END"
        )
        self.create = [start_view, start_trigger, new_view, new_trigger, finish_view, finish_trigger]
        # The next ids (AUTOINCREMENT: one past the highest ever given), read with the session under
        # the start's write lock, so that the start can insert its rows with them in one statement.
        self.next_ids = (
            f"COALESCE((SELECT seq FROM sqlite_sequence WHERE name = '{ChatSession._meta.db_table}'), 0) + 1,"
            f" COALESCE((SELECT seq FROM sqlite_sequence WHERE name = '{Run._meta.db_table}'), 0) + 1"
        )


def missing(exc: BaseException) -> bool:
    """Whether `exc` is a step statement failing because this connection has not made its views yet."""
    return isinstance(exc, OperationalError) and any(f"no such table: {name}" in str(exc) for name in VIEWS)


_ddl: list[str] = []  # the same for every SQLite connection: made once


def create(connection) -> None:
    """Make the views and triggers on `connection` (Django's wrapper, connected), unless it has them."""
    if not _ddl:
        _ddl.extend(SqliteSteps(connection, RUN_FIELDS).create)
    cursor = connection.connection.cursor()
    try:
        for statement in _ddl:
            cursor.execute(statement)
    finally:
        cursor.close()


def drop(connection) -> None:
    """Drop the views (their triggers go with them) on `connection`, if it has them."""
    cursor = connection.connection.cursor()
    try:
        for name in VIEWS:
            cursor.execute(f"DROP VIEW IF EXISTS temp.{name}")
    finally:
        cursor.close()


def _opened(sender, connection, **kwargs) -> None:
    if connection.vendor == "sqlite":
        create(connection)


def _migrating(using, made: bool) -> None:
    from django.db import connections

    connection = connections[using]
    if connection.vendor == "sqlite" and connection.connection is not None:
        create(connection) if made else drop(connection)


def connect_signals() -> None:
    """Called once, as the app is ready (before any connection opens)."""
    connection_created.connect(_opened, dispatch_uid="sessions_core.sqlite_steps")
    pre_migrate.connect(lambda sender, using=None, **kwargs: _migrating(using, made=False), weak=False,
                        dispatch_uid="sessions_core.sqlite_steps.pre")
    post_migrate.connect(lambda sender, using=None, **kwargs: _migrating(using, made=True), weak=False,
                         dispatch_uid="sessions_core.sqlite_steps.post")
