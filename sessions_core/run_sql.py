"""The statements of a run's start and finish, as SQL written once per database.

Every run makes the same handful of statements (load the session, read its history, insert the
run, insert its messages, take and release the lease). Through the ORM each costs about 250 us of
query building and row conversion on a small machine, against about 15 us for the statement
itself, which made the ORM most of the engine's own time per run (see bench/engine.py). So these
few statements are plain SQL, built once per database from the models' own table and column names
and run on the connection Django holds for the thread. Everything else, including the rare paths of a
run (a new session, a lost lease, a concurrent state edit), uses the ORM. tests/test_run_sql.py
checks each statement against its ORM equivalent on SQLite and PostgreSQL.

Unless something watches Django's cursor (query logging: DEBUG, assertNumQueries,
CaptureQueriesContext; or an execute wrapper), the statements go to the database driver's cursor
directly (on PostgreSQL one that binds parameters on the server), with Django's error translation
kept, and a step outside any `atomic` block opens and
commits its transaction itself. Django's cursor and `atomic` layers cost about 0.35 ms per run on a
small machine when the interpreter's caches are cold, as they are after each model call (measured
within one process, alternating runs; bench/engine.py). Inside an `atomic` block (a caller's, or a
test's) a step takes a savepoint through Django as before.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from contextlib import contextmanager
from functools import lru_cache
from typing import NamedTuple

import orjson
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, transaction

from .models import ChatSession, Message, Role, Run, RunStatus, StateChange


class SessionRow(NamedTuple):
    """What a run needs of its session row."""

    pk: int
    owner_id: int | None
    owner_name: str | None  # the owner's username
    state_text: str  # the stored state as JSON text
    state_version: int
    summary: dict | None
    last_seq: int
    lease_token: str
    lease_live: bool  # a lease is held and has not expired
    current_leaf: int | None = None  # the run the next one follows


class HistoryRead(NamedTuple):
    """A history read (history.history, history.step_history): the last `num_runs` runs, else the last
    `num_messages` messages, of the session's top-level runs or, with `component_id`, of one step
    agent's (or team member's) own runs."""

    session_pk: int
    num_runs: int | None
    num_messages: int | None
    component_id: str | None = None


class HistoryRow(NamedTuple):
    seq: int
    role: str
    content: str
    tool_calls: list | None
    tool_call_id: str
    tool_name: str
    tool_error: bool
    created_at: datetime.datetime


def _table(model, connection, alias: str = "") -> str:
    name = connection.ops.quote_name(model._meta.db_table)
    return f"{name} {alias}" if alias else name


def _typed_row(model, connection, names: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"CAST(%s AS {model._meta.get_field(name).db_type(connection)})" for name in names) + ")"


def _columns(model, connection, names: tuple[str, ...], prefix: str = "") -> list[str]:
    quote = connection.ops.quote_name
    return [f"{prefix}{quote(model._meta.get_field(name).column)}" for name in names]


_MESSAGE_FIELDS = ("session", "run", "seq", "role", "content", "tool_calls", "tool_call_id", "tool_name",
                   "tool_error", "created_at")
_HISTORY_FIELDS = ("seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at")
_RUN_FIELDS = ("run_id", "session", "parent_run", "kind", "step_name", "follows", "abandoned", "component_id", "status",
               "input", "content", "content_type", "error", "model_id", "metrics", "history_seqs",
               "cancel_requested", "created_at", "finished_at")
_CHANGE_FIELDS = ("session", "run", "version", "patch", "inverse", "source", "created_at")


class RunSQL:
    """The statements for one database vendor (they differ in row locking and in the JSON column type)."""

    def __init__(self, connection):
        quote = connection.ops.quote_name
        User = get_user_model()
        session, run, message = (_table(ChatSession, connection), _table(Run, connection),
                                 _table(Message, connection))
        s = {name: quote(ChatSession._meta.get_field(name).column) for name in (
            "id", "owner", "session_id", "session_state", "state_version", "summary", "last_seq", "lease_token",
            "lease_expires_at", "last_activity_at", "current_leaf")}
        r = {name: quote(Run._meta.get_field(name).column) for name in ("id", "session", "status", "parent_run",
                                                                          "abandoned", "component_id")}
        m = {name: quote(Message._meta.get_field(name).column) for name in ("session", "run", "seq", "role")}
        lock = " FOR UPDATE OF s" if connection.features.has_select_for_update_of else ""
        # ChatSession.objects.select_for_update(of=("self",)).select_related("owner").filter(session_id=...)
        self.load_session = (
            f"SELECT s.{s['id']}, s.{s['owner']}, u.{quote(User._meta.get_field(User.USERNAME_FIELD).column)},"
            f" s.{s['session_state']}, s.{s['state_version']}, s.{s['summary']}, s.{s['last_seq']},"
            f" s.{s['lease_token']}, CASE WHEN s.{s['lease_expires_at']} > %s THEN 1 ELSE 0 END, s.{s['current_leaf']}"
            f" FROM {_table(ChatSession, connection, 's')}"
            f" LEFT OUTER JOIN {_table(User, connection, 'u')} ON u.{quote(User._meta.pk.column)} = s.{s['owner']}"
            f" WHERE s.{s['session_id']} = %s{lock}"
        )
        history_columns = ", ".join(_columns(Message, connection, _HISTORY_FIELDS, "m."))
        # Completed top-level runs of the branch the session is on.
        completed = (f"r.{r['status']} = '{RunStatus.COMPLETED.value}' AND r.{r['parent_run']} IS NULL"
                     f" AND NOT r.{r['abandoned']}")
        # history.history(num_runs=N): messages of the last N completed top-level runs, no system messages.
        self.history_by_runs = (
            f"SELECT {history_columns} FROM {_table(Message, connection, 'm')}"
            f" WHERE m.{m['run']} IN (SELECT r.{r['id']} FROM {_table(Run, connection, 'r')}"
            f" WHERE r.{r['session']} = %s AND {completed}"
            f" ORDER BY r.{r['id']} DESC LIMIT %s) AND m.{m['role']} <> '{Role.SYSTEM.value}' ORDER BY m.{m['seq']}"
        )
        # history.history(num_messages=N): the last N such messages, newest first.
        self.history_by_messages = (
            f"SELECT {history_columns} FROM {_table(Message, connection, 'm')}"
            f" INNER JOIN {_table(Run, connection, 'r')} ON r.{r['id']} = m.{m['run']}"
            f" WHERE m.{m['session']} = %s AND {completed}"
            f" AND m.{m['role']} <> '{Role.SYSTEM.value}' ORDER BY m.{m['seq']} DESC LIMIT %s"
        )
        # history.step_history: the same, of one step agent's (or member's) own earlier runs in the session.
        step_runs = (f"r.{r['status']} = '{RunStatus.COMPLETED.value}' AND r.{r['parent_run']} IS NOT NULL"
                     f" AND r.{r['component_id']} = %s")
        self.step_history_by_runs = (
            f"SELECT {history_columns} FROM {_table(Message, connection, 'm')}"
            f" WHERE m.{m['run']} IN (SELECT r.{r['id']} FROM {_table(Run, connection, 'r')}"
            f" WHERE r.{r['session']} = %s AND {step_runs}"
            f" ORDER BY r.{r['id']} DESC LIMIT %s) AND m.{m['role']} <> '{Role.SYSTEM.value}' ORDER BY m.{m['seq']}"
        )
        self.step_history_by_messages = (
            f"SELECT {history_columns} FROM {_table(Message, connection, 'm')}"
            f" WHERE m.{m['run']} IN (SELECT r.{r['id']} FROM {_table(Run, connection, 'r')}"
            f" WHERE r.{r['session']} = %s AND {step_runs}"
            f" ORDER BY r.{r['id']} DESC LIMIT %s) AND m.{m['role']} <> '{Role.SYSTEM.value}'"
            f" ORDER BY m.{m['seq']} DESC LIMIT %s"
        )
        # SQLite hands over the new row's id as the cursor's lastrowid: RETURNING would cost a fetch.
        self.returns_id = connection.vendor != "sqlite"
        returning = " RETURNING " + quote(Run._meta.pk.column) if self.returns_id else ""
        self._insert_runs = f"INSERT INTO {run} ({', '.join(_columns(Run, connection, _RUN_FIELDS))}) VALUES "
        self._run_values = f"({', '.join(['%s'] * len(_RUN_FIELDS))})"
        self.insert_run = f"{self._insert_runs}{self._run_values}{returning}"
        message_columns = ", ".join(_columns(Message, connection, _MESSAGE_FIELDS))
        self.insert_message = f"INSERT INTO {message} ({message_columns}) VALUES "
        self.message_values = "(" + ", ".join(["%s"] * len(_MESSAGE_FIELDS)) + ")"
        change_columns = ", ".join(_columns(StateChange, connection, _CHANGE_FIELDS))
        self.insert_change = f"INSERT INTO {_table(StateChange, connection)} ({change_columns}) VALUES "
        self.change_values = "(" + ", ".join(["%s"] * len(_CHANGE_FIELDS)) + ")"
        # The run taking the lease is the session's current leaf from now on (None: keep the leaf).
        self.take_lease = (
            f"UPDATE {session} SET {s['lease_token']} = %s, {s['lease_expires_at']} = %s,"
            f" {s['last_activity_at']} = %s, {s['last_seq']} = %s,"
            f" {s['current_leaf']} = COALESCE(%s, {s['current_leaf']}) WHERE {s['id']} = %s"
        )
        # The usual finish: this run still holds the lease and nobody changed the state meanwhile.
        release = (f"UPDATE {session} SET {s['lease_token']} = '', {s['lease_expires_at']} = NULL,"
                   f" {s['last_activity_at']} = %s, {s['last_seq']} = %s")
        where = f" WHERE {s['id']} = %s AND {s['lease_token']} = %s AND {s['state_version']} = %s"
        self.release_lease = release + where
        # The state arrives as JSON text: CAST makes it jsonb on PostgreSQL (text on SQLite).
        state_type = ChatSession._meta.get_field("session_state").db_type(connection)
        self.release_lease_with_state = (
            release + f", {s['session_state']} = CAST(%s AS {state_type}), {s['state_version']} = %s" + where
        )
        run_columns = {name: quote(Run._meta.get_field(name).column) for name in (
            "status", "content", "content_type", "error", "metrics", "state_version", "finished_at")}
        self.finish_run = (
            f"UPDATE {run} SET {', '.join(f'{column} = %s' for column in run_columns.values())}"
            f" WHERE {r['id']} = %s"
        )
        # A new session and its first run (RunStore.start_new_session): the session is inserted with the
        # lease taken and the run's id as its current leaf, that id drawn before the run is inserted.
        self._session_fields = [field for field in ChatSession._meta.concrete_fields
                                if not field.primary_key and field.name != "current_leaf"]
        session_columns = ", ".join([quote(field.column) for field in self._session_fields] + [s["current_leaf"]])
        session_values = ", ".join(["%s"] * len(self._session_fields))
        run_pk_column = quote(Run._meta.pk.column)
        if connection.vendor == "postgresql":
            next_run_pk = f"nextval(pg_get_serial_sequence('{run}', '{Run._meta.pk.column}'))"
        else:  # AUTOINCREMENT: the next id is one past the highest ever given (the write lock is held)
            next_run_pk = (f"COALESCE((SELECT seq FROM sqlite_sequence WHERE name = '{Run._meta.db_table}'), 0) + 1")
        conflict = f" ON CONFLICT ({s['session_id']}) DO NOTHING RETURNING {s['id']}, {s['current_leaf']}"
        self.insert_new_session = (f"INSERT INTO {session} ({session_columns}) VALUES ({session_values},"
                                   f" ({next_run_pk})){conflict}")
        self.insert_run_with_pk = (
            f"INSERT INTO {run} ({run_pk_column}, {', '.join(_columns(Run, connection, _RUN_FIELDS))})"
            f" VALUES (%s, {', '.join(['%s'] * len(_RUN_FIELDS))})"
        )
        if connection.vendor == "postgresql":
            self._together = {}
            self._next_run_pk = next_run_pk
            self._new_session_returns = (s["id"], s["current_leaf"])
            self._new_session = (f"INSERT INTO {session} ({session_columns}) VALUES ({session_values},"
                                 f" (SELECT pk FROM ids)){conflict}")
            self._new_run_names = [name for name in _RUN_FIELDS if name != "session"]
            self._new_run_row = _typed_row(Run, connection, tuple(self._new_run_names))
            self._new_run_columns = ", ".join([run_pk_column, *_columns(Run, connection, ("session",)),
                                               *_columns(Run, connection, tuple(self._new_run_names))])
            self._new_message_names = [name for name in _MESSAGE_FIELDS if name not in ("session", "run")]
            self._new_message_row = _typed_row(Message, connection, tuple(self._new_message_names))
            self._take_lease_after_new_run = self.take_lease.replace(
                "COALESCE(%s, ", f"COALESCE((SELECT {quote(Run._meta.pk.column)} FROM new_run), ", 1)
            self._release, self._release_where, self._session_id = release, where, s["id"]
            self._state_set = f", {s['session_state']} = CAST(%s AS {state_type}), {s['state_version']} = %s"
            # In a VALUES list that feeds INSERT ... SELECT, each value needs its column's type.
            self._change_row = _typed_row(StateChange, connection, _CHANGE_FIELDS)
            # With steps whose rows the finish inserts, a change row may name its run by run id instead.
            self._change_row_by_id = (self._change_row[:-1]
                                      + f", CAST(%s AS {Run._meta.get_field('run_id').db_type(connection)}))")
            self._new_child_row = _typed_row(Run, connection, _RUN_FIELDS)
            self._new_child_columns = ", ".join(_columns(Run, connection, _RUN_FIELDS))
            self._run_id = quote(Run._meta.get_field("run_id").column)
            self._change_select = ", ".join(f"COALESCE(v.run, new_children.{quote(Run._meta.pk.column)})"
                                            if name == "run" else f"v.{name}" for name in _CHANGE_FIELDS)
            self._message_row = _typed_row(Message, connection, _MESSAGE_FIELDS)
            self._change_columns, self._message_columns = change_columns, message_columns
            # A child's end (`finish_run`'s values by id): its state version stays NULL, the root's has it.
            self._child_names = ["id", *(name for name in run_columns if name != "state_version")]
            self._child_row = _typed_row(Run, connection, tuple(self._child_names))
            self._run_pk = quote(Run._meta.pk.column)
            self._seq = m["seq"]
            self._finish_children = (
                f"UPDATE {run} r SET {', '.join(f'{column} = v.{name}' for name, column in run_columns.items() if name != 'state_version')}"
                f", {run_columns['state_version']} = NULL")
            self._tables = (_table(StateChange, connection), message, run)
            # A run's first messages take the new run's id, so their VALUES leave the run column out.
            self._first_names = [name for name in _MESSAGE_FIELDS if name != "run"]
            self._first_row = _typed_row(Message, connection, tuple(self._first_names))
            self._first_select = ", ".join("new_run." + quote(Run._meta.pk.column) if name == "run" else f"v.{name}"
                                           for name in _MESSAGE_FIELDS)

    def start_together(self, messages: int, history: str | None = None) -> str:
        """PostgreSQL: insert the run, its first `messages` messages and take the lease as one
        statement, which returns the run's id. One round trip instead of three. With `history` (a
        history statement), see `_run_with_messages`."""
        return self._run_with_messages("start", messages, f", leased AS ({self._take_lease_after_new_run})", history)

    def start_child_together(self, messages: int, history: str | None = None, held: tuple[int, int, int] = (0, 0, 0)) -> str:
        """PostgreSQL: insert a step's or member's run and its first `messages` messages as one
        statement, which returns the run's id. One round trip instead of four (BEGIN, two INSERTs, COMMIT).
        With `history` (a history statement), see `_run_with_messages`. With `held` (children,
        children's messages, new children), it also stores what earlier children left for the tree's
        next write, as `finish_together` does: the ends of `children` steps (by id), `children's
        messages` messages, and the rows of `new children` steps stored only now, inserted before the
        run's own row (so their ids come first: start order); each row returned then has their ids
        after the run's, as an array that ends with the run's id."""
        return self._run_with_messages("child", messages, history=history, held=held)

    def _run_with_messages(self, kind: str, messages: int, then: str = "", history: str | None = None,
                           held: tuple[int, int, int] = (0, 0, 0)) -> str:
        """With `history`, the statement also reads the run's history (that statement's parameters
        follow the writes'), in the statement's one snapshot, which the new rows are not part of: it
        returns one row per message read, oldest first, each the run's id then the message's columns
        (one row of the id and NULLs when none is). One round trip instead of two."""
        key = (kind, messages, history, held)
        statement = self._together.get(key)
        if statement is None:
            children, children_messages, new_children = held
            pk = self._run_pk
            if new_children:  # one INSERT: its ids are drawn in its rows' order, the run's row last
                parts = [f"WITH inserted AS ({self._insert_runs}{', '.join([self._run_values] * (new_children + 1))}"
                         f" RETURNING {pk}), new_run AS (SELECT max({pk}) AS {pk} FROM inserted)"]
            else:
                parts = [f"WITH new_run AS ({self.insert_run})"]
            parts.append(f", new_messages AS (INSERT INTO {self._tables[1]} ({self._message_columns})"
                         f" SELECT {self._first_select} FROM new_run,"
                         f" (VALUES {', '.join([self._first_row] * messages)}) AS v({', '.join(self._first_names)})){then}")
            if children_messages:
                parts.append(f", held_messages AS ({self.insert_message}"
                             f"{', '.join([self.message_values] * children_messages)})")
            if children:
                parts.append(self._children_ended(children))
            ids = f", (SELECT array_agg({pk} ORDER BY {pk}) FROM inserted)" if new_children else ""
            parts.append(f" SELECT new_run.{pk}{ids} FROM new_run" if history is None else
                         f" SELECT new_run.{pk}{ids}, h.* FROM new_run LEFT JOIN ({history}) AS h ON TRUE"
                         f" ORDER BY h.{self._seq}")
            statement = self._together[key] = "".join(parts)
        return statement

    def _children_ended(self, children: int, condition: str = "") -> str:
        """The CTE that stores the ends of `children` steps or members (by id) whose end waited."""
        return (f", children AS ({self._finish_children} FROM (VALUES {', '.join([self._child_row] * children)})"
                f" AS v({', '.join(self._child_names)}) WHERE r.{self._run_pk} = v.id{condition})")

    def start_new_session(self, messages: int) -> str:
        """PostgreSQL: insert a new session (lease taken), its first run and that run's first `messages`
        messages as one statement, which returns (session id, run id), or nothing when a session of that
        id exists already (then nothing is written)."""
        key = ("new", messages)
        statement = self._together.get(key)
        if statement is None:
            pk, leaf = self._new_session_returns
            message_select = ", ".join([f"new_session.{pk}", f"new_session.{leaf}",
                                        *(f"v.{name}" for name in self._new_message_names)])
            statement = self._together[key] = (
                f"WITH ids AS (SELECT {self._next_run_pk} AS pk)"
                f", new_session AS ({self._new_session})"
                f", new_run AS (INSERT INTO {self._tables[2]} ({self._new_run_columns})"
                f" SELECT new_session.{leaf}, new_session.{pk}, v.* FROM new_session,"
                f" (VALUES {self._new_run_row}) AS v)"
                f", new_messages AS (INSERT INTO {self._tables[1]} ({self._message_columns})"
                f" SELECT {message_select} FROM new_session,"
                f" (VALUES {', '.join([self._new_message_row] * messages)}) AS v({', '.join(self._new_message_names)}))"
                f" SELECT {pk}, {leaf} FROM new_session"
            )
        return statement

    def finish_together(self, changes: int, messages: int, with_state: bool, children: int = 0,
                        new_children: int = 0) -> str:
        """PostgreSQL: the usual finish as one statement, for `changes` state changes and `messages`
        messages. Its lease release, as `release_lease` does, goes through only while the run holds the
        lease and the state is at its base version; the rows and the run's outcome are written only
        when it went through (data-modifying CTEs see the release's RETURNING). It returns the number
        of sessions released: 1, or 0 when nothing at all was written. One round trip instead of six.
        With `children`, it also stores the outcomes of that many steps or members (by id, as
        `finish_run` does) whose end waited for this finish, and with `new_children` inserts the rows of
        that many steps stored only now; the change rows then name their run by id or by run id."""
        key = (changes, messages, with_state, children, new_children)
        statement = self._together.get(key)
        if statement is None:
            released = "EXISTS (SELECT 1 FROM released)"
            parts = [f"WITH released AS ({self._release}{self._state_set if with_state else ''}{self._release_where}"
                     f" RETURNING {self._session_id})"]
            if new_children:
                parts.append(f", new_children AS (INSERT INTO {self._tables[2]} ({self._new_child_columns})"
                             f" SELECT * FROM (VALUES {', '.join([self._new_child_row] * new_children)}) AS v"
                             f" WHERE {released} RETURNING {self._run_pk}, {self._run_id})")
                if changes:
                    parts.append(
                        f", new_changes AS (INSERT INTO {self._tables[0]} ({self._change_columns})"
                        f" SELECT {self._change_select} FROM (VALUES {', '.join([self._change_row_by_id] * changes)})"
                        f" AS v({', '.join(_CHANGE_FIELDS)}, run_uuid)"
                        f" LEFT JOIN new_children ON new_children.{self._run_id} = v.run_uuid WHERE {released})")
                    changes = 0
            for name, count, row, columns, table in (
                ("changes", changes, self._change_row, self._change_columns, self._tables[0]),
                ("messages", messages, self._message_row, self._message_columns, self._tables[1]),
            ):
                if count:
                    parts.append(f", new_{name} AS (INSERT INTO {table} ({columns})"
                                 f" SELECT * FROM (VALUES {', '.join([row] * count)}) AS v WHERE {released})")
            if children:
                parts.append(self._children_ended(children, f" AND {released}"))
            parts.append(f", finished AS ({self.finish_run} AND {released})")
            parts.append(" SELECT count(*) FROM released")
            statement = self._together[key] = "".join(parts)
        return statement


_statements: dict[tuple[str, bool], RunSQL] = {}


def _statements_for(connection, qmark: bool) -> RunSQL:
    """The vendor's statements, with `?` placeholders for the sqlite3 driver's own cursor."""
    key = (connection.vendor, qmark)
    sql = _statements.get(key)
    if sql is None:
        sql = RunSQL(connection)
        if qmark:  # no statement holds a literal % or ?, so this swaps placeholders only
            for name, value in vars(sql).items():
                if isinstance(value, str):
                    setattr(sql, name, value.replace("%s", "?"))
        _statements[key] = sql
    return sql


class RunStore:
    """A run's reads and writes on database `alias`, on the calling thread's connection.

    Use it as a context manager: one cursor serves all the statements of a step.
    """

    def __init__(self, alias: str):
        self.alias = alias
        self.connection = connections[alias]
        self.cursor = None
        self._django_cursor = None
        self._own_cursor = None  # PostgreSQL, direct: the server-binding cursor opened here
        self._direct = False
        ops = self.connection.ops
        self._adapt_datetime = ops.adapt_datetimefield_value
        self._adapted: tuple = (None, None)  # a step stamps every row with one `now`: adapt it once
        self._json = lambda value: None if value is None else ops.adapt_json_value(value, None)
        if self.connection.vendor == "sqlite" and settings.USE_TZ and self.connection.timezone_name == "UTC":
            self._adapt_datetime, self._json = _sqlite_adapters(ops)
        # SQLite hands back naive datetimes for Django to make aware; psycopg hands back aware ones.
        convert = getattr(ops, "convert_datetimefield_value", None)
        self._read_datetime = (
            (lambda value: convert(value, None, self.connection)) if convert else (lambda value: value)
        )

    def _datetime(self, value: datetime.datetime | None):
        if value is not self._adapted[0]:
            self._adapted = (value, self._adapt_datetime(value))
        return self._adapted[1]

    def __enter__(self) -> RunStore:
        connection = self.connection
        self._django_cursor = connection.cursor()  # Django's checks (thread, allowed databases) apply
        self._direct = not (connection.queries_logged or connection.execute_wrappers)
        sqlite = connection.vendor == "sqlite"
        self.sql = _statements_for(connection, qmark=self._direct and sqlite)
        self.cursor = self._django_cursor.cursor if self._direct else self._django_cursor
        if self._direct and connection.vendor == "postgresql":
            # Parameters bound by the server: psycopg's client-side binding (Django's default) quotes
            # every parameter into the statement's text in Python; bound by the server, they are dumped
            # in C. Every parameter here has a type from its column or its CAST. A raw cursor, given
            # PostgreSQL's own $1 placeholders (_numbered): psycopg's own cursors parse again on every
            # call a statement over 4 KB or of more than 50 parameters, as a finish storing steps is.
            # Prepared by the server as the connection's prepare_threshold (an OPTIONS key) says:
            # Django's default is never (poolers), psycopg's after the 5th use.
            self.cursor = self._own_cursor = _server_cursor(connection.connection)
            execute = self.cursor.execute
            self._execute = lambda sql, params: execute(_numbered(sql), params)
            return self
        # Django's SQLite cursor rewrites %s to ? on every call; the statements here come rewritten.
        self._execute = (sqlite3.Cursor.execute.__get__(self.cursor) if self._direct and sqlite
                         else self.cursor.execute)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._own_cursor is not None:
            self._own_cursor.close()
        self._django_cursor.close()
        self.cursor = self._django_cursor = self._own_cursor = None

    def execute(self, sql: str, params=()):
        if self._direct:
            with self.connection.wrap_database_errors:  # driver errors become django.db's, as usual
                self._execute(sql, params)
        else:
            self._execute(sql, params)
        return self.cursor

    @contextmanager
    def atomic(self, one_statement: bool = False):
        """One transaction for a step. Outside any `atomic` block, none at all for a step of
        `one_statement` (atomic by itself); with direct statements it is begun and ended here; otherwise
        it is Django's `atomic` (a savepoint inside a caller's block). When begun here, Django does not know
        of it: plain ORM statements inside join it, but nothing that needs a transaction of Django's
        (`atomic`, `select_for_update`) may run inside."""
        connection = self.connection
        outside = not connection.in_atomic_block and connection.get_autocommit()
        if one_statement and outside:  # with query logging on too: one statement in autocommit is atomic
            yield
            return
        if not self._direct or not outside:
            with transaction.atomic(using=self.alias):
                yield
            return
        mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")  # SQLite: IMMEDIATE here
        self.execute(f"BEGIN {mode}" if mode and connection.vendor == "sqlite" else "BEGIN")
        try:
            yield
            self.execute("COMMIT")
        except BaseException:
            try:
                self.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def load_session(self, session_id: str, now: datetime.datetime) -> SessionRow | None:
        """The session row, locked for this transaction, with its owner's username."""
        row = self.execute(self.sql.load_session, (self._datetime(now), session_id)).fetchone()
        if row is None:
            return None
        pk, owner_id, owner_name, state, version, summary, last_seq, token, live, leaf = row
        return SessionRow(pk, owner_id, owner_name, state or "{}", version, _load(summary), last_seq, token,
                          bool(live), leaf)

    def history(self, session_pk: int, num_runs: int | None, num_messages: int | None,
                component_id: str | None = None) -> list[HistoryRow]:
        """See history.history: the same rows, oldest first (before orphaned tool results are dropped).
        With `component_id`, a step agent's (or team member's) own earlier runs (history.step_history)."""
        statement, params, newest_first = self._history_statement(
            HistoryRead(session_pk, num_runs, num_messages, component_id))
        rows = self.execute(statement, params).fetchall()
        if newest_first:
            rows.reverse()
        return self._history_rows(rows)

    def _history_statement(self, read: HistoryRead) -> tuple[str, tuple, bool]:
        """The statement of a history read, its parameters and whether its rows come newest first."""
        sql, session_pk, num_runs, num_messages = self.sql, read.session_pk, read.num_runs, read.num_messages
        if read.component_id is not None:
            if num_runs is not None:
                return sql.step_history_by_runs, (session_pk, read.component_id, num_runs), False
            # at most one message per run is needed to reach N messages
            return sql.step_history_by_messages, (session_pk, read.component_id, num_messages, num_messages), True
        if num_runs is not None:
            return sql.history_by_runs, (session_pk, num_runs), False
        return sql.history_by_messages, (session_pk, num_messages), True

    def _history_rows(self, rows) -> list[HistoryRow]:
        read_datetime = self._read_datetime
        return [
            HistoryRow(seq, role, content, _load(tool_calls), tool_call_id, tool_name, bool(tool_error),
                       read_datetime(created_at))
            for seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, created_at in rows
        ]

    def _started_with_history(self, statement_for, params: list, history: HistoryRead | None,
                              held_ids: bool = False) -> tuple[int, list, list[int]]:
        """Run a start statement built by `statement_for(history statement or None)`: (run id, history
        rows, the ids of the new children it inserted when `held_ids`)."""
        statement, history_params = None, ()
        if history is not None:
            statement, history_params, _ = self._history_statement(history)
        rows = self.execute(statement_for(statement), [*params, *history_params]).fetchall()
        first = 2 if held_ids else 1  # the history's columns
        read = [] if history is None else self._history_rows([row[first:] for row in rows if row[first] is not None])
        return rows[0][0], read, list(rows[0][1][:-1]) if held_ids else []

    def insert_run(self, *, run_id: str, session_pk: int, component_id: str, input: str, model_id: str,
                   history_seqs: list | None, now: datetime.datetime, kind: str = "agent", parent_pk: int | None = None,
                   step_name: str = "", follows_pk: int | None = None, **outcome) -> int:
        """A run row, running; with `outcome` (status, content, content_type, error, metrics and
        finished_at, as `finish_run` writes them), a row that is over already."""
        params = self._run_params(run_id, session_pk, component_id, input, model_id, history_seqs, now, kind,
                                  parent_pk, step_name, follows_pk, **outcome)
        cursor = self.execute(self.sql.insert_run, params)
        return cursor.fetchone()[0] if self.sql.returns_id else cursor.lastrowid

    def _run_params(self, run_id, session_pk, component_id, input, model_id, history_seqs, now, kind="agent",
                    parent_pk=None, step_name="", follows_pk=None, *, status=RunStatus.RUNNING, content="",
                    content_type="str", error="", metrics=None, finished_at=None) -> tuple:
        return (run_id, session_pk, parent_pk, str(kind), step_name, follows_pk, False, component_id, str(status),
                input, content, content_type, error, model_id, self._json(metrics or {}), self._json(history_seqs),
                False, self._datetime(now), None if finished_at is None else self._adapt_datetime(finished_at))

    def insert_messages(self, rows: list[tuple]) -> None:
        """Rows of (session_pk, run_pk, seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, now)."""
        if rows:
            self.execute(self.sql.insert_message + ", ".join([self.sql.message_values] * len(rows)),
                         self._message_params(rows))

    def _message_params(self, rows: list[tuple], without_run: bool = False,
                        without_session_and_run: bool = False) -> list:
        params = []
        for session_pk, run_pk, seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, now in rows:
            keys = () if without_session_and_run else (session_pk,) if without_run else (session_pk, run_pk)
            params += (*keys, seq, str(role), content, self._json(tool_calls), tool_call_id, tool_name, tool_error,
                       self._datetime(now))
        return params

    def insert_changes(self, rows: list[tuple]) -> None:
        """Rows of (session_pk, run_pk, version, patch, inverse, source, now)."""
        if rows:
            self.execute(self.sql.insert_change + ", ".join([self.sql.change_values] * len(rows)),
                         self._change_params(rows))

    def _change_params(self, rows: list[tuple], by_run_id: bool = False) -> list:
        """With `by_run_id` (RunSQL._change_row_by_id), a row's run is its pk, or its run id (a str)."""
        params = []
        for session_pk, run, version, patch, inverse, source, now in rows:
            run_pk, run_id = (None, run) if isinstance(run, str) else (run, None)
            params += (session_pk, run_pk, version, self._json(patch), self._json(inverse), source,
                       self._datetime(now))
            if by_run_id:
                params.append(run_id)
        return params

    def take_lease(self, session_pk: int, token: str, expires_at, now, last_seq: int, leaf: int | None = None) -> None:
        self.execute(self.sql.take_lease, self._lease_params(session_pk, token, expires_at, now, last_seq, leaf))

    def _lease_params(self, session_pk, token, expires_at, now, last_seq, leaf=None, together=False) -> tuple:
        leaf_param = () if together else (leaf,)
        return (token, self._datetime(expires_at), self._datetime(now), last_seq, *leaf_param, session_pk)

    def release_lease(self, session_pk: int, token: str, base_version: int, now, last_seq: int,
                      state_text: str | None = None, state_version: int | None = None) -> bool:
        """Release the lease (and store the new state) if this run still holds it and the state is
        still at `base_version`; False when either has changed (the caller merges then)."""
        statement = self.sql.release_lease if state_text is None else self.sql.release_lease_with_state
        params = self._release_params(session_pk, token, base_version, now, last_seq, state_text, state_version)
        return self.execute(statement, params).rowcount == 1

    def _release_params(self, session_pk, token, base_version, now, last_seq, state_text, state_version) -> tuple:
        params = (self._datetime(now), last_seq)
        if state_text is not None:
            params += (state_text, state_version)
        return (*params, session_pk, token, base_version)

    def finish_run(self, run_pk: int, *, status: str, content: str, content_type: str, error: str, metrics: dict,
                   state_version: int, now) -> None:
        self.execute(self.sql.finish_run, self._finish_params(run_pk, status, content, content_type, error, metrics,
                                                              state_version, now))

    def _finish_params(self, run_pk, status, content, content_type, error, metrics, state_version, now) -> tuple:
        return (str(status), content, content_type, error, self._json(metrics), state_version, self._datetime(now),
                run_pk)

    def _child_end_params(self, pk: int, at, end: dict) -> tuple:
        """A child's end as `RunSQL._child_row` takes it: (id, status, content, content_type, error,
        metrics, finished_at)."""
        values = self._finish_params(pk, state_version=None, now=at, **end)
        return (pk, *values[:5], values[6])

    def start_run(self, *, run: dict, messages: list[tuple], lease: tuple,
                  history: HistoryRead | None = None) -> tuple[int, list[HistoryRow]]:
        """The usual start's writes: insert the run (`run`: the arguments of `insert_run`), its first
        messages (rows as for `insert_messages`, whose run is filled in) and take the lease (`lease`:
        the arguments of `take_lease`), after reading `history` (rows as `history` gives; none when
        None). Returns (the run's id, the history rows). One statement on PostgreSQL
        (`RunSQL.start_together`); elsewhere the statements one by one. Call it inside `atomic()`."""
        if self.writes_in_one_statement and messages:
            params = [*self._run_params(**run), *self._message_params(messages, without_run=True),
                      *self._lease_params(*lease, together=True)]
            run_pk, rows, _ = self._started_with_history(
                lambda statement: self.sql.start_together(len(messages), statement), params, history)
            return run_pk, rows
        rows = [] if history is None else self.history(*history)
        run_pk = self.insert_run(**run)
        self.insert_messages([(row[0], run_pk, *row[2:]) for row in messages])
        self.take_lease(*lease, leaf=run_pk)
        return run_pk, rows

    def start_child(self, *, run: dict, messages: list[tuple], history: HistoryRead | None = None,
                    children: list[tuple] = (), children_messages: list[tuple] = (),
                    new_children: list[dict] = ()) -> tuple[int, list[HistoryRow], list[int]]:
        """A step's or member's start: insert its run (`run`: the arguments of `insert_run`) and its first
        messages (rows as for `insert_messages`, whose run is filled in), after reading `history` as
        `start_run` does. With them, what earlier children left for the tree's next write, as `finish`
        takes it: the ends of `children` ((run pk, when, outcome)), their `children_messages` and the
        rows of `new_children` (inserted before this run's row, so in start order); the history is read
        before those writes too. Returns (the run's id, the history rows, the ids of `new_children`).
        One statement on PostgreSQL (`RunSQL.start_child_together`), atomic by itself; elsewhere the
        statements one by one: call it inside `atomic()` then."""
        if self.writes_in_one_statement and messages:
            params = [parameter for row in new_children for parameter in self._run_params(**row)]
            params += [*self._run_params(**run), *self._message_params(messages, without_run=True),
                       *self._message_params(children_messages)]
            for pk, at, end in children:
                params += self._child_end_params(pk, at, end)
            held = (len(children), len(children_messages), len(new_children))
            return self._started_with_history(
                lambda statement: self.sql.start_child_together(len(messages), statement, held), params, history,
                held_ids=bool(new_children))
        rows = [] if history is None else self.history(*history)
        stored = [self.insert_run(**row) for row in new_children]
        self.insert_messages(list(children_messages))
        for pk, at, end in children:
            self.finish_run(pk, state_version=None, now=at, **end)
        run_pk = self.insert_run(**run)
        self.insert_messages([(row[0], run_pk, *row[2:]) for row in messages])
        return run_pk, rows, stored

    def start_new_session(self, *, session: ChatSession, run: dict, messages: list[tuple]) -> tuple[int, int] | None:
        """A new session's first start, written at once: insert `session` (unsaved, its lease already
        set: ChatSession.objects.build) with the run's id as its current leaf, the run (`run`: the
        arguments of `insert_run` but the session) and its first messages (rows as for `insert_messages`,
        whose session and run are filled in). Returns (session id, run id), or None, having written
        nothing, when a session of that id exists already. One statement on PostgreSQL
        (`RunSQL.start_new_session`); elsewhere the statements one by one. Call it inside `atomic()`."""
        connection = self.connection
        values = [field.get_db_prep_save(getattr(session, field.attname), connection)
                  for field in self.sql._session_fields]
        if self.writes_in_one_statement and messages:
            run_params = self._run_params(session_pk=None, **run)  # the session's id is the new one's
            params = [*values, run_params[0], *run_params[2:],
                      *self._message_params(messages, without_session_and_run=True)]
            row = self.execute(self.sql.start_new_session(len(messages)), params).fetchone()
            return None if row is None else (row[0], row[1])
        row = self.execute(self.sql.insert_new_session, values).fetchone()
        if row is None:
            return None
        session_pk, run_pk = row
        self.execute(self.sql.insert_run_with_pk, (run_pk, *self._run_params(session_pk=session_pk, **run)))
        self.insert_messages([(session_pk, run_pk, *message[2:]) for message in messages])
        return session_pk, run_pk

    @property
    def writes_in_one_statement(self) -> bool:
        """Whether `start_run` and `finish` each write in one statement (PostgreSQL: data-modifying
        CTEs, one round trip each). SQLite runs in process, where a round trip costs nothing."""
        return self.connection.vendor == "postgresql"

    def finish(self, *, session_pk: int, token: str, base_version: int, last_seq: int, state_text: str | None,
               state_version: int, changes: list[tuple], messages: list[tuple], run_pk: int, status: str,
               content: str, content_type: str, error: str, metrics: dict, now, children: list[tuple] = (),
               new_children: list[dict] = ()) -> bool:
        """The usual finish: release the lease (storing the new state), insert the state changes and the
        messages (rows as for `insert_changes` and `insert_messages`), store the ends of `children`
        (steps or members whose end waited for this: (run pk, when, outcome as `finish_run` takes it),
        their messages among `messages`), insert the rows of `new_children` (steps stored only now, as
        the arguments of `insert_run`; a change row may name one of them by its run id instead of its
        run pk) and store the run's outcome, all only if the run still holds the lease and the state is
        still at `base_version`. False, having written nothing, when either has changed (the caller
        merges then).

        One statement on PostgreSQL (`RunSQL.finish_together`), so a single round trip, atomic by itself.
        Elsewhere the statements one by one: call it inside `atomic()`."""
        if self.writes_in_one_statement:
            statement = self.sql.finish_together(len(changes), len(messages), state_text is not None, len(children),
                                                 len(new_children))
            params = [*self._release_params(session_pk, token, base_version, now, last_seq, state_text, state_version)]
            for row in new_children:
                params += self._run_params(**row)
            params += [*self._change_params(changes, by_run_id=bool(new_children)), *self._message_params(messages)]
            for pk, at, end in children:
                params += self._child_end_params(pk, at, end)
            params += self._finish_params(run_pk, status, content, content_type, error, metrics, state_version, now)
            return self.execute(statement, params).fetchone()[0] == 1
        if not self.release_lease(session_pk, token, base_version, now, last_seq, state_text, state_version):
            return False
        if new_children:
            stored = {row["run_id"]: self.insert_run(**row) for row in new_children}
            changes = [(change[0], stored.get(change[1], change[1]), *change[2:]) for change in changes]
        self.insert_changes(changes)
        self.insert_messages(messages)
        for pk, at, end in children:
            self.finish_run(pk, state_version=None, now=at, **end)
        self.finish_run(run_pk, status=status, content=content, content_type=content_type, error=error,
                        metrics=metrics, state_version=state_version, now=now)
        return True


# orjson hands what it would convert on its own terms (datetimes, dataclasses, subclasses of str, int,
# dict and list) back to the json module's rules, by raising.
_ORJSON_STRICT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def _sqlite_adapters(ops):
    """What Django's SQLite backend makes of an aware UTC datetime and of a JSON value, without its
    layers of calls (a run adapts a dozen of them): the datetime as naive UTC text, the value as JSON
    text. Anything else (another zone, a value orjson would write otherwise than the json module: NaN
    as null, a huge int, a lone surrogate) goes to Django's own adaptation."""
    utc = datetime.timezone.utc

    def adapt_datetime(value):
        if value is not None and value.tzinfo is utc:
            return str(value.replace(tzinfo=None))
        return ops.adapt_datetimefield_value(value)

    def adapt_json(value):
        if value is None:
            return None
        try:
            text = orjson.dumps(value, option=_ORJSON_STRICT)
        except TypeError:
            return ops.adapt_json_value(value, None)
        if b"null" in text:  # maybe a NaN or an infinity, which the json module writes as such
            return ops.adapt_json_value(value, None)
        return text.decode()

    return adapt_datetime, adapt_json


def _server_cursor(raw_connection):
    import psycopg  # PostgreSQL only

    return psycopg.RawCursor(raw_connection)


@lru_cache(maxsize=256)
def _numbered(sql: str) -> bytes:
    """A statement with %s placeholders in PostgreSQL's numbered ones ($1, $2...), as bytes: what
    psycopg would make of it, made once per statement (no statement here holds a literal %)."""
    first, *rest = sql.split("%s")
    return "".join([first, *(f"${number}{part}" for number, part in enumerate(rest, start=1))]).encode()


def _load(value):
    """A JSON column as both backends hand it over here: text (Django reads jsonb as text), or None."""
    if value is None or not isinstance(value, (str, bytes)):
        return value
    return json.loads(value)
