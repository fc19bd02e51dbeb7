"""Reading earlier messages of a session: bounded queries whose cost does not grow with its length."""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass, replace
from typing import NamedTuple

from django.db import connections
from django.db.models import Q, Subquery
from django.utils import timezone

from .models import Message, Role, Run, RunStatus


class HistoryRead(NamedTuple):
    """A history read: the last `num_runs` runs, else the last `num_messages` messages, of the session's
    completed top-level runs on its branch or, with `component_id`, of one step agent's (or team
    member's) own completed runs; with `max_tool_calls`, only that many of their most recent tool calls."""

    session_pk: int
    num_runs: int | None
    num_messages: int | None
    component_id: str | None = None
    max_tool_calls: int | None = None


@dataclass
class ChatMessage:
    """One message as the engine hands it out (RunOutput.messages, get_chat_history, ...)."""

    role: str
    content: str | None = ""
    tool_calls: list | None = None
    tool_call_id: str = ""
    tool_name: str = ""
    tool_error: bool = False
    from_history: bool = False
    seq: int | None = None
    run_id: str = ""
    created_at: datetime.datetime | None = None

    @classmethod
    def from_row(cls, row: Message, from_history: bool = False) -> ChatMessage:
        return cls(
            role=row.role, content=row.content, tool_calls=row.tool_calls, tool_call_id=row.tool_call_id,
            tool_name=row.tool_name, tool_error=row.tool_error, from_history=from_history, seq=row.seq,
            created_at=row.created_at,
        )

    def to_wire(self) -> dict:
        """The OpenAI chat format."""
        if self.role == Role.TOOL:
            return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content or ""}
        message = {"role": self.role, "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
                for call in self.tool_calls
            ]
        elif message["content"] is None:
            message["content"] = ""
        return message


HISTORY_FIELDS = ("seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at")


def _messages(rows, from_history: bool = False) -> list[ChatMessage]:
    """ChatMessages from rows of `HISTORY_FIELDS` (no model instances: this is a hot path)."""
    return [
        ChatMessage(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id, tool_name=tool_name,
                    tool_error=tool_error, from_history=from_history, seq=seq, created_at=created_at)
        for seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, created_at in rows
    ]


def history_read(session_pk: int, num_runs: int | None, num_messages: int | None,
                 component_id: str | None = None, max_tool_calls: int | None = None) -> HistoryRead | None:
    """The read a run's start makes (`read_history`); None when that window holds nothing."""
    if num_runs is not None:
        if num_runs <= 0:
            return None
    elif not num_messages or num_messages <= 0:
        return None
    return HistoryRead(session_pk, num_runs, num_messages, component_id, max_tool_calls)


def read_history(read: HistoryRead | None, alias: str) -> list[ChatMessage]:
    """What an earlier part of the session contributes to a run's request, oldest first: one statement
    whose cost does not grow with the session's length. System messages are never replayed.

    It runs at every run's start, and the ORM spends many times the statement's own time building this
    read (a subquery with its own order and limit), so it is plain SQL through Django's cursor, written
    once per database from the models' names (`_history_sql`); tests/engine/test_history.py holds it to the
    ORM's answer."""
    if read is None:
        return []
    connection = connections[alias]
    by_runs = read.num_runs is not None
    params = [read.session_pk, RunStatus.COMPLETED]
    if read.component_id is not None:
        params.append(read.component_id)
    params += [read.num_runs if by_runs else read.num_messages, Role.SYSTEM]
    if not by_runs:
        params.append(read.num_messages)
    with connection.cursor() as cursor:
        cursor.execute(_history_sql(connection.vendor, by_runs, read.component_id is not None), params)
        rows = cursor.fetchall()
    if not by_runs:
        rows.reverse()  # read newest first
    return replayed([_typed(row, connection) for row in rows], read)


@functools.cache
def _history_sql(vendor: str, by_runs: bool, of_component: bool) -> str:
    """The statement `read_history` runs (`vendor` keys the cache: the quoting is the database's)."""
    from django.db import connection

    quote = connection.ops.quote_name

    def column(model, name):
        return quote(model._meta.get_field(name).column)

    message, run = quote(Message._meta.db_table), quote(Run._meta.db_table)
    fields = ", ".join(f"m.{column(Message, name)}" for name in HISTORY_FIELDS)
    if of_component:  # a step agent's (or member's) own completed runs
        runs = (f"r.{column(Run, 'parent_run')} IS NOT NULL AND r.{column(Run, 'component_id')} = %s")
    else:  # the completed top-level runs of the branch the session is on
        runs = f"r.{column(Run, 'parent_run')} IS NULL AND NOT r.{column(Run, 'abandoned')}"
    last_runs = (f"SELECT r.{column(Run, 'id')} FROM {run} r WHERE r.{column(Run, 'session')} = %s"
                 f" AND r.{column(Run, 'status')} = %s AND {runs} ORDER BY r.{column(Run, 'id')} DESC LIMIT %s")
    # Run by run (a run's messages together, in order): a run continued after a pause has messages on
    # both sides of the runs made meanwhile, and a tool call must be followed by its results.
    run_then_seq = f"m.{column(Message, 'run')}{{0}}, m.{column(Message, 'seq')}{{0}}"
    sql = (f"SELECT {fields} FROM {message} m WHERE m.{column(Message, 'run')} IN ({last_runs})"
           f" AND m.{column(Message, 'role')} <> %s ORDER BY ")
    if by_runs:
        return sql + run_then_seq.format("")
    # By messages: the last N among its last N runs (each run has a message at least), newest first.
    return sql + run_then_seq.format(" DESC") + " LIMIT %s"


def _typed(row: tuple, connection) -> tuple:
    """A row of `_history_sql` with the values the ORM would give: JSON decoded, an aware datetime, a bool."""
    seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, created_at = row
    if isinstance(tool_calls, str):
        tool_calls = json.loads(tool_calls)
    if isinstance(created_at, str):  # SQLite
        created_at = datetime.datetime.fromisoformat(created_at)
    if created_at is not None and timezone.is_naive(created_at):
        created_at = timezone.make_aware(created_at, datetime.UTC)
    return seq, role, content, tool_calls, tool_call_id, tool_name, bool(tool_error), created_at


def replayed(rows: list[tuple], read: HistoryRead) -> list[ChatMessage]:
    """The messages of `read`'s rows, oldest first; with a window of messages, leading tool results
    are dropped (their call is outside it); then only the `max_tool_calls` most recent tool calls stay."""
    messages = _messages(rows, from_history=True)
    while read.num_runs is None and messages and messages[0].role == Role.TOOL:
        messages.pop(0)
    if read.max_tool_calls is not None:
        messages = recent_tool_calls(messages, read.max_tool_calls)
    return messages


def recent_tool_calls(messages: list[ChatMessage], limit: int) -> list[ChatMessage]:
    """Agno's `max_tool_calls_from_history` (SPEC Part 2, 4.2 step 8): when the messages hold more than
    `limit` tool results, only the `limit` most recent stay, and each assistant message keeps only the
    calls of those; one left with no call stays for its text, or goes when it has none."""
    results = [message.tool_call_id for message in messages if message.role == Role.TOOL]
    if len(results) <= limit:
        return messages
    with_ids = [call_id for call_id in results if call_id]
    kept_ids = set(with_ids[-limit:]) if limit > 0 else set()
    kept = []
    for message in messages:
        if message.role == Role.TOOL:
            if message.tool_call_id in kept_ids:
                kept.append(message)
        elif message.role == Role.ASSISTANT and message.tool_calls:
            calls = [call for call in message.tool_calls if call.get("id") in kept_ids]
            if calls or message.content:
                kept.append(replace(message, tool_calls=calls or None))
        else:
            kept.append(message)
    return kept


def chat_history(session_pk: int, alias: str, last_n_runs: int | None = None) -> list[ChatMessage]:
    """User and assistant messages of the session's runs of every status on its current branch, oldest first."""
    messages = Message.objects.using(alias).filter(
        session_id=session_pk, role__in=(Role.USER, Role.ASSISTANT), run__parent_run__isnull=True,
        run__abandoned=False,
    )
    if last_n_runs is not None:
        run_ids = (
            Run.objects.using(alias).begun().filter(session_id=session_pk, parent_run__isnull=True, abandoned=False)
            .order_by("-id").values("id")[: max(last_n_runs, 0)]
        )
        messages = messages.filter(run_id__in=run_ids)
    rows = messages.select_related("run").only(*HISTORY_FIELDS, "run__run_id").order_by("seq")
    return [_with_run_id(ChatMessage.from_row(row), row.run.run_id) for row in rows]


# Runs whose messages `session_messages` leaves out unless told otherwise: Agno's (paused, cancelled,
# error; its "regenerated" ones are our abandoned runs, never read) and ours of a process that stopped.
SKIPPED_STATUSES = (RunStatus.PAUSED, RunStatus.CANCELLED, RunStatus.ERROR, RunStatus.INTERRUPTED)


@dataclass(frozen=True)
class MessageSelection:
    """Which messages `session_messages` reads, with the arguments of Agno's `get_messages` (SPEC Part 2,
    4.4). The runs: the session's top-level runs on its current branch (of `component_id` only, when
    given); with `member_ids`, instead the runs of those members under them (a team's member runs);
    with `with_members`, both. Of their statuses, `skip_statuses` (default SKIPPED_STATUSES) are left out;
    a queued run never counts. Then the last `last_n_runs` of them, and of their messages, those not of
    `skip_roles`, the first system message alone of its kind, the last `limit` alone."""

    component_id: str | None = None
    member_ids: tuple[str, ...] | None = None
    with_members: bool = False
    last_n_runs: int | None = None
    limit: int | None = None
    skip_roles: tuple[str, ...] = ()
    skip_statuses: tuple[str, ...] = SKIPPED_STATUSES

    @classmethod
    def of(cls, *, component_id: str | None = None, member_ids=None, last_n_runs: int | None = None,
           limit: int | None = None, skip_roles=None, skip_statuses=None,
           skip_member_messages: bool = True) -> MessageSelection:
        """A selection from the arguments of Agno's `get_messages`."""
        return cls(component_id=component_id, member_ids=None if member_ids is None else tuple(member_ids),
                   with_members=not skip_member_messages, last_n_runs=last_n_runs, limit=limit,
                   skip_roles=tuple(skip_roles or ()), skip_statuses=_statuses(skip_statuses))

    def runs(self, prefix: str = "") -> Q:
        """The selected runs, as a filter of Run (`prefix` "") or of Message (`prefix` "run__")."""
        def q(**lookups):
            return Q(**{prefix + key: value for key, value in lookups.items()})

        top = q(parent_run__isnull=True, abandoned=False)
        members = q(parent_run__parent_run__isnull=True, parent_run__abandoned=False)
        if self.component_id is not None:
            top &= q(component_id=self.component_id)
            members &= q(parent_run__component_id=self.component_id)
        if self.member_ids is not None:
            scope = members & q(component_id__in=self.member_ids)
        else:
            scope = top | members if self.with_members else top
        return scope & ~q(status__in=(RunStatus.QUEUED, *self.skip_statuses))


def _statuses(skip_statuses) -> tuple[str, ...]:
    """`skip_statuses` as our statuses: ours, or Agno's (its RunStatus members or their names, any case)."""
    if skip_statuses is None:
        return SKIPPED_STATUSES
    named = {str(getattr(status, "value", status)).lower() for status in skip_statuses}
    unknown = named - set(RunStatus.values) - {"regenerated", "pending"}  # Agno's: never read here anyway
    if unknown:
        raise ValueError(f"Unknown run status {', '.join(sorted(unknown))}; known: {', '.join(RunStatus.values)}")
    return tuple(sorted(named & set(RunStatus.values)))


def session_messages(session_pk: int, alias: str, selection: MessageSelection) -> list[ChatMessage]:
    """Agno's `get_messages`: the selected messages, oldest first, in one statement. Without a limit, all
    of them (the first system message at its place); with one, the first system message first, counting
    toward the limit, then the latest messages, leading tool results dropped (their call is outside the
    window; Agno keeps those that follow a system message). With a limit the statement reads a few rows
    by key, however long the session."""
    if selection.last_n_runs is not None and selection.last_n_runs <= 0:
        return []
    messages = Message.objects.using(alias).filter(session_id=session_pk)
    if selection.last_n_runs is not None:
        last_runs = (Run.objects.using(alias).filter(selection.runs(), session_id=session_pk).order_by("-id")
                     .values("id")[: selection.last_n_runs])
        messages = messages.filter(run_id__in=last_runs)
    else:
        messages = messages.filter(selection.runs("run__"))
    if selection.skip_roles:
        messages = messages.exclude(role__in=selection.skip_roles)
    first_system = Subquery(messages.filter(role=Role.SYSTEM).order_by("seq").values("seq")[:1])
    fields = (*HISTORY_FIELDS, "run__run_id")
    if selection.limit is None:
        rows = messages.filter(~Q(role=Role.SYSTEM) | Q(seq=first_system)).order_by("seq").values_list(*fields)
    else:
        # Two lookups by key, each of a few rows: the latest `limit` others, read backwards from the end,
        # and the first system message (message_system_idx finds it at once).
        window = messages.exclude(role=Role.SYSTEM).order_by("-seq").values("pk")[: max(selection.limit, 0)]
        latest = Message.objects.using(alias).filter(pk__in=window) if selection.limit > 0 else Message.objects.none()
        first = Message.objects.using(alias).filter(session_id=session_pk, seq=first_system)
        rows = (latest.order_by().values_list(*fields)
                .union(first.order_by().values_list(*fields), all=True).order_by("seq"))
    found = [ChatMessage(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id,
                         tool_name=tool_name, tool_error=tool_error, seq=seq, run_id=run_id, created_at=created_at)
             for seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, created_at, run_id in rows]
    if selection.limit is None:
        return found
    system = [message for message in found if message.role == Role.SYSTEM]
    latest = [message for message in found if message.role != Role.SYSTEM]
    room = selection.limit - len(system)
    latest = latest[-room:] if room > 0 else []
    while latest and latest[0].role == Role.TOOL:
        latest.pop(0)
    return system + latest


def _with_run_id(message: ChatMessage, run_id: str) -> ChatMessage:
    message.run_id = run_id
    return message


def completed_messages(session_pk: int, alias: str, last_n_runs: int | None = None) -> list[ChatMessage]:
    """Messages of the completed top-level runs on the session's branch (the last `last_n_runs`), oldest
    first, run by run."""
    runs = Run.objects.using(alias).filter(session_id=session_pk, status=RunStatus.COMPLETED, parent_run__isnull=True,
                                           abandoned=False)
    if last_n_runs is not None:
        runs = runs.order_by("-id")[:last_n_runs]
    rows = Message.objects.using(alias).filter(run_id__in=runs.values("id")).exclude(role=Role.SYSTEM)
    return _messages(rows.order_by("run_id", "seq").values_list(*HISTORY_FIELDS))
