"""A session as a document to keep: JSON (everything the user may take away) or Markdown (to read),
and the JSON back again as new sessions of a user.

    for part in export_json(session): ...
    for part in export_markdown(session): ...
    sessions = import_json(data, user)  # raises ImportRefused, having written nothing
    chats = read_import(data); sessions = store_import(chats, user)  # the same in two steps, written in batches

A whole-account export (`export_all_json` given the user's memories) carries the user's memories too, each
with its history, and its import restores them (`sessions.memories` counts those added).

Both stream: the runs are read in batches with their messages, so a session of 10,000 runs costs the
memory and the queries of a batch at a time, never of the whole session. The caller has checked that
the session is the user's (`ChatSession.objects.for_user`). System prompts are left out: they are the
assistant's instructions, not the conversation.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Annotated, Literal

import pydantic
from django.db import connection, transaction
from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.utils import timezone

from . import limits
from . import state as state_module
from .model_api import TOOL_FIELD_CHARS
from .models import ChatSession, Message, NameSource, Role, Run, RunKind, RunStatus, SessionKind, StateChange
from .storable import replace_unstorable, replace_unstorable_tree

BATCH_RUNS = 200
FORMAT_VERSION = 1


def _shown(prefix: str = "") -> Prefetch:
    return Prefetch(f"{prefix}messages", queryset=Message.objects.exclude(role=Role.SYSTEM).order_by("seq"),
                    to_attr="shown")


def _steps(prefix: str = "") -> Prefetch:
    return Prefetch(f"{prefix}children", queryset=Run.objects.order_by("pk"), to_attr="steps")


def _top_level_runs(sessions, agents_only: bool):
    """The top-level runs that have begun of `sessions` (a queryset's filter value), each with `shown` (its
    messages but the system prompt, by seq) and, unless `agents_only`, `steps` (a workflow's step runs, a
    team's member runs, and theirs)."""
    runs = Run.objects.begun().filter(session__in=sessions, parent_run__isnull=True).select_related("follows").only(
        *(f.name for f in Run._meta.concrete_fields), "follows__run_id")
    prefetch = [_shown()]
    if not agents_only:  # only then: an agent session's export stays at two queries a batch
        prefetch += [_steps(), _shown("steps__"), _steps("steps__"), _shown("steps__steps__")]
    return runs.prefetch_related(*prefetch)


def _runs(session: ChatSession, current_branch: bool = False) -> Iterator[Run]:
    """The session's top-level runs (of every branch, or of the current one), oldest first, BATCH_RUNS at a time."""
    runs = _top_level_runs([session.pk], agents_only=session.kind == "agent").order_by("pk")
    if current_branch:
        runs = runs.filter(abandoned=False)
    return runs.iterator(chunk_size=BATCH_RUNS)


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _message(message: Message) -> dict:
    data = {"seq": message.seq, "role": message.role, "content": message.content,
            "created_at": _time(message.created_at)}
    if message.tool_calls:
        data["tool_calls"] = message.tool_calls
    if message.role == Role.TOOL:
        data.update(tool_call_id=message.tool_call_id, tool_name=message.tool_name, tool_error=message.tool_error)
    return data


def _run(run: Run) -> dict:
    data = {
        "run_id": run.run_id, "kind": run.kind, "status": run.status, "input": run.input, "content": run.content,
        "error": run.error, "model": run.model_id,
        "created_at": _time(run.created_at), "finished_at": _time(run.finished_at), "metrics": run.metrics,
        "state_version": run.state_version, "messages": [_message(message) for message in run.shown],
    }
    if run.requirements:  # what it waited for (or waits for) and every answer
        data["requirements"] = run.requirements
    if run.parent_run_id is None:  # where it sits in the tree of branches
        data.update(follows=run.follows.run_id if run.follows_id else None, abandoned=run.abandoned)
    steps = getattr(run, "steps", None) or []
    if steps:
        data["steps"] = [{"step_name": step.step_name, "component": step.component_id, **_run(step)} for step in steps]
    return data


def session_header(session: ChatSession) -> dict:
    """What a session is, without its runs."""
    return {
        "session_id": session.session_id, "name": session.name, "assistant": session.component_id,
        "kind": session.kind,
        "created_at": _time(session.created_at), "last_activity_at": _time(session.last_activity_at),
        "session_state": session.session_state, "state_version": session.state_version,
        "summary": session.summary, "metadata": session.metadata,
    }


def export_json(session: ChatSession) -> Iterator[str]:
    """The session as one JSON object: its header, then `runs` (each with its messages), oldest first."""
    return _session_json(session, _runs(session))


def _session_json(session: ChatSession, runs: Iterable[Run]) -> Iterator[str]:
    header = json.dumps({"format": "sessions_core.session", "version": FORMAT_VERSION, **session_header(session)},
                        ensure_ascii=False)
    yield header[:-1] + ', "runs": ['
    for number, run in enumerate(runs):
        yield ("," if number else "") + json.dumps(_run(run), ensure_ascii=False)
    yield "]}"


EXPORT_CHATS_PER_READ = 100  # sessions read at a time by an export of several


def export_all_json(sessions: QuerySet[ChatSession], username: str, now: datetime, user=None,
                    on_read: Callable[[int, int], None] | None = None) -> Iterator[str]:
    """Several sessions (a user's: `sessions` is scoped to them) as one JSON object, in the queryset's order:
    `{"user", "exported_at", "sessions": [...]}`; given the `user`, their memories follow (`"memories": [...]`,
    each with its `history`). `on_read(written, total)` after each group of sessions.

    Read a group at a time, with no cursor left open between them: the sessions' ids first, then
    EXPORT_CHATS_PER_READ sessions per query and the runs of as many of them as hold BATCH_RUNS runs in one
    query with their messages (a session of more runs streams on its own, a batch at a time). So 20,000
    one-run chats cost a few hundred queries, and a slow download holds no transaction open."""
    yield json.dumps({"format": "sessions_core.export", "version": FORMAT_VERSION, "user": username,
                      "exported_at": now.isoformat()}, ensure_ascii=False)[:-1] + ', "sessions": ['
    ids = list(sessions.values_list("pk", flat=True))
    number = 0
    for start in range(0, len(ids), EXPORT_CHATS_PER_READ):
        chunk = ids[start:start + EXPORT_CHATS_PER_READ]
        found = sessions.filter(pk__in=chunk).in_bulk()  # a session deleted since is left out
        for group in _groups([found[pk] for pk in chunk if pk in found]):
            for session, runs in group:
                yield ("," if number else "") + "".join(_session_json(session, runs))
                number += 1
        if on_read is not None:
            on_read(number, len(ids))
    if user is None:
        yield "]}"
        return
    yield '], "memories": ' + json.dumps(_memories(user), ensure_ascii=False) + "}"


def _memories(user) -> list[dict]:
    """The user's memories, oldest first, each with its history (two queries)."""
    from .user_memories import store as memory_store

    listed = memory_store.list_memories(user, "default")
    history = memory_store.histories(user, [memory.memory_id for memory in listed], "default")
    return [{**{key: value for key, value in memory.to_dict().items() if key != "user_id"},
             "history": [{"action": change.action, "memory": change.memory, "previous": change.previous,
                          "source": change.source, "run_id": change.run_id, "created_at": _time(change.created_at)}
                         for change in history.get(memory.memory_id, [])]}
            for memory in listed]


def _groups(sessions: list[ChatSession]) -> Iterator[list[tuple[ChatSession, Iterable[Run]]]]:
    """The sessions with their runs, in groups whose runs are read in one query (about BATCH_RUNS runs)."""
    counts = dict(Run.objects.begun().filter(session__in=sessions, parent_run__isnull=True)
                  .values_list("session").annotate(Count("pk")).order_by())
    group, total = [], 0
    for session in sessions + [None]:
        size = counts.get(session.pk, 0) if session else 0
        if group and (session is None or total + size > BATCH_RUNS):
            runs_by_session = defaultdict(list)
            for run in _top_level_runs([member.pk for member in group],
                                       agents_only=all(member.kind == "agent" for member in group)).order_by("pk"):
                runs_by_session[run.session_id].append(run)
            yield [(member, runs_by_session[member.pk]) for member in group]
            group, total = [], 0
        if session is not None and size > BATCH_RUNS:
            yield [(session, _runs(session))]
        elif session is not None:
            group.append(session)
            total += size


def export_markdown(session: ChatSession, assistant_name: str = "") -> Iterator[str]:
    """The conversation to read: who said what, tool calls as quoted lines, the state at the end."""
    yield f"# {_line(session.name) or 'Untitled chat'}\n\n"
    assistant = assistant_name or session.component_id
    facts = [f"Assistant: {assistant}"] if assistant else []
    facts += [f"started {session.created_at:%Y-%m-%d %H:%M} UTC",
              f"last active {session.last_activity_at:%Y-%m-%d %H:%M} UTC"]
    yield " · ".join(facts) + "\n"
    for run in _runs(session, current_branch=True):  # the conversation as it reads now; the JSON has every branch
        for message in run.shown:
            yield from _markdown_message(message)
        if run.status in _ENDINGS:
            yield f"\n*{_ENDINGS[run.status]}{': ' + _line(run.error) if run.error else '.'}*\n"
    if session.session_state:
        state = json.dumps(session.session_state, indent=2, ensure_ascii=False)
        yield f"\n---\n\n## Session state (version {session.state_version})\n\n```json\n{state}\n```\n"


_ENDINGS = {RunStatus.ERROR: "The reply failed", RunStatus.CANCELLED: "The reply was stopped",
            RunStatus.INTERRUPTED: "The reply was interrupted", RunStatus.PAUSED: "The reply waits for a person"}
MARKDOWN_TOOL_CHARS = 1000  # a tool's arguments or result, in the Markdown (the JSON has them whole)


def _markdown_message(message: Message) -> Iterator[str]:
    when = f"{message.created_at:%H:%M}"
    if message.role == Role.USER:
        yield f"\n---\n\n**You** · {when}\n\n{message.content}\n"
    elif message.role == Role.ASSISTANT:
        if message.tool_calls:
            for call in message.tool_calls:
                yield f"\n> Tool {_code(call.get('name', ''))} called with {_code(call.get('arguments', ''))}\n"
        if message.content:
            yield f"\n**Assistant** · {when}\n\n{message.content}\n"
    elif message.role == Role.TOOL:
        outcome = "failed" if message.tool_error else "returned"
        yield f"\n> Tool {_code(message.tool_name)} {outcome}: {_clip(_line(message.content))}\n"


def _line(text: str) -> str:
    """Text kept to one line (a title, a tool's arguments or result inside a quote)."""
    return " ".join(str(text).split())


def _clip(text: str) -> str:
    return text if len(text) <= MARKDOWN_TOOL_CHARS else text[:MARKDOWN_TOOL_CHARS] + "…"


def _code(text: str) -> str:
    """Inline code that holds any text: fenced by more backticks than any run of them inside."""
    text = _clip(_line(text))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}" if longest else f"`{text}`"


# -- import ------------------------------------------------------------------------------------------


class ImportRefused(ValueError):
    """The document is not one this module wrote (or it is damaged): says where, and nothing is stored."""


# The same bounds as the engine's own writes: counts (tokens, model calls) are whole numbers, durations
# seconds; times are ISO dates a database stores on every backend.
MAX_COUNT = 10**12 - 1
MAX_SECONDS = 10.0**9
EARLIEST = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
LATEST = datetime(9000, 1, 1, tzinfo=dt_timezone.utc)


def _in_range(value: datetime) -> datetime:
    """A time from the document, aware (one without a zone is taken as UTC) and between EARLIEST and LATEST."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value, dt_timezone.utc)
    try:
        in_utc = value.astimezone(dt_timezone.utc)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the year 1 in UTC
        in_utc = None
    if in_utc is None or not EARLIEST <= in_utc < LATEST:
        raise ValueError(f"a time between {EARLIEST:%Y} and {LATEST:%Y} is expected")
    return value


_Time = Annotated[datetime, pydantic.AfterValidator(_in_range)]
_Metric = (Annotated[pydantic.StrictInt, pydantic.Field(ge=0, le=MAX_COUNT)]
           | Annotated[pydantic.StrictFloat, pydantic.Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)])


class _ToolCallIn(pydantic.BaseModel):
    id: str
    name: str
    arguments: str


class _MessageIn(pydantic.BaseModel):
    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str = ""
    tool_name: str = ""
    tool_error: bool = False
    created_at: _Time | None = None


class _RunIn(pydantic.BaseModel):
    kind: RunKind = RunKind.AGENT
    step_name: str = ""
    component: str | None = None
    status: RunStatus
    input: str | None = None
    content: str | None = None
    error: str = ""
    model: str = ""
    created_at: _Time | None = None
    finished_at: _Time | None = None
    metrics: dict[str, _Metric] = {}
    requirements: list[dict] | None = None
    messages: list[_MessageIn] = []
    steps: list[_RunIn] = []  # a workflow's steps, a team's members
    run_id: str | None = None  # the exported id, which `follows` names; the import gives the run a new one
    follows: str | None = None
    abandoned: bool = False


class _SummaryIn(pydantic.BaseModel):
    summary: str
    topics: list[str] = []
    updated_at: _Time | None = None


class _SessionIn(pydantic.BaseModel):
    format: Literal["sessions_core.session"]
    version: Literal[1]
    name: str = ""
    assistant: str = ""
    kind: SessionKind = SessionKind.AGENT
    created_at: _Time | None = None
    last_activity_at: _Time | None = None
    session_state: dict = {}
    summary: _SummaryIn | None = None
    metadata: dict = {}
    runs: list[_RunIn] = []


class _MemoryIn(pydantic.BaseModel):
    memory: str
    topics: list[str] = []
    input: str | None = None
    created_at: datetime | None = None


class _ExportIn(pydantic.BaseModel):
    format: Literal["sessions_core.export"]
    version: Literal[1]
    sessions: list[_SessionIn]
    memories: list[_MemoryIn] = []


class Imported(list):
    """The sessions an import made, and how many memories it added (`memories`); as `read_import` returns
    it, the chats to store, and the document's memories."""

    memories = 0


_DOCUMENT = pydantic.TypeAdapter(Annotated[_ExportIn | _SessionIn, pydantic.Field(discriminator="format")])
ImportedSession = _SessionIn  # a chat of a document `read_import` checked, to store with `store_import`

# An import is written a batch of chats at a time, each batch its own transaction of about this many rows
# (a chat, its runs and their messages), so no other writer waits long for the database.
IMPORT_BATCH_ROWS = 250
# Between two batches an import pauses as long as the batch took, so it takes at most half of its process's
# time and other users' requests there do not queue behind it for the interpreter's lock. On SQLite, whose
# one writer at a time is the whole database, the pause is at least this long (more than a writer that
# waited a batch's length sleeps between two tries), so other users' writes get their turn.
SQLITE_PAUSE_SECONDS = 0.1


def import_json(data: bytes | str, user, on_batch: Callable[[int, int], None] | None = None) -> list[ChatSession]:
    """New sessions of `user` from a document `export_json` or `export_all_json` wrote: `read_import`, then
    `store_import`. All of them, or none and ImportRefused saying why."""
    return store_import(read_import(data), user, on_batch=on_batch)


def read_import(data: bytes | str) -> list[ImportedSession]:
    """The chats of a document `export_json` or `export_all_json` wrote, every field checked by type and range
    (and each state against CHAT_MAX_STATE_BYTES); ImportRefused, saying where, for anything else. Writes nothing."""
    try:  # deeper than CHAT_MAX_JSON_DEPTH: refused before the (recursive) parser sees it
        limits.check_depth(data, "The file")
    except limits.LimitExceeded as exc:
        raise ImportRefused(str(exc)) from None
    try:  # strict JSON: NaN and Infinity, which Python's parser takes, no column would store
        parsed = json.loads(data, parse_constant=_refuse_constant)
    except ValueError as exc:  # a decoding error too
        raise ImportRefused(f"Not a JSON file: {exc}.") from None
    try:
        document = _DOCUMENT.validate_python(parsed)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        where = " → ".join(str(part) for part in error["loc"][1:]) or "the document"
        raise ImportRefused(f"Not a chat export this app wrote: {where}: {error['msg']}.") from None
    sessions = document.sessions if isinstance(document, _ExportIn) else [document]
    for session in sessions:
        session.session_state = replace_unstorable_tree(session.session_state)
        try:
            state_module.dumps(session.session_state)  # over CHAT_MAX_STATE_BYTES: the whole import is refused
        except state_module.StateLimitError as exc:
            raise ImportRefused(f"The chat “{_line(session.name) or 'untitled'}”: {exc}") from None
    chats = Imported(sessions)
    chats.memories = document.memories if isinstance(document, _ExportIn) else []
    return chats


def store_import(sessions: list[ImportedSession], user, on_batch: Callable[[int, int], None] | None = None,
                 in_batch: Callable[[list[ChatSession], int], None] | None = None,
                 batch_rows: int | None = None) -> list[ChatSession]:
    """The chats `read_import` returned as new sessions of `user`, a batch at a time (`batch_rows`, by default
    IMPORT_BATCH_ROWS), each batch committed on its own; `in_batch(its sessions, stored so far)` inside each
    batch's transaction (to record them with it), `on_batch(stored, total)` after each. Should a write fail,
    the chats already stored are deleted again and the error raised: the import is whole or not at all.

    Every session, run and message gets a new id (a document cannot reach another user's rows or
    collide with any), the state becomes version 1 (its change recorded as "import"), runs that were
    still running count as interrupted, and text goes through `replace_unstorable`.
    """
    stored: list[ChatSession] = []
    imported = Imported()
    try:
        for chats in _batches(sessions, batch_rows or IMPORT_BATCH_ROWS):
            began = time.monotonic()
            batch = _ImportBatch(chats, user)  # built first: the transaction (SQLite's write lock) only inserts
            with transaction.atomic():
                stored += batch.store()
                if in_batch is not None:
                    in_batch(stored[-len(chats):], len(stored))
            if on_batch is not None:
                on_batch(len(stored), len(sessions))
            if len(stored) < len(sessions):
                least = SQLITE_PAUSE_SECONDS if connection.vendor == "sqlite" else 0
                time.sleep(max(least, time.monotonic() - began))
        if getattr(sessions, "memories", None):  # a whole-account export's
            with transaction.atomic():
                imported.memories = _import_memories(sessions.memories, user)
    except BaseException:
        for start in range(0, len(stored), 100):
            with transaction.atomic():
                ChatSession.objects.filter(pk__in=[session.pk for session in stored[start:start + 100]]).delete()
        raise
    imported.extend(stored)
    return imported


def _batches(sessions: list[ImportedSession], batch_rows: int) -> Iterator[list[ImportedSession]]:
    """The chats in groups of about `batch_rows` rows (a chat larger than that is a batch of its own)."""
    batch, rows = [], 0
    for session in sessions:
        size = 1 + _rows(session.runs)
        if batch and rows + size > batch_rows:
            yield batch
            batch, rows = [], 0
        batch.append(session)
        rows += size
    if batch:
        yield batch


def _rows(runs: list[_RunIn]) -> int:
    return sum(1 + len(run.messages) + _rows(run.steps) for run in runs)


def _import_memories(memories: list[_MemoryIn], user) -> int:
    """The memories of the document the user does not have yet (the same text counts as had), each added
    with its topics and the time it was first learnt, and recorded as imported. How many were added."""
    from .user_memories import store as memory_store

    had = {memory.memory for memory in memory_store.list_memories(user, "default")}
    added = 0
    for memory in memories:
        text = replace_unstorable(memory.memory).strip()
        if not text or text in had:
            continue
        try:
            memory_store.add_memory(user, text, memory.topics, "default", source=memory_store.Source.IMPORT,
                                    input=replace_unstorable(memory.input or ""), created_at=_aware(memory.created_at))
        except ValueError as exc:
            raise ImportRefused(f"The memory “{text[:60]}”: {exc}") from None
        had.add(text)
        added += 1
    return added


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


class _ImportBatch:
    """One batch of chats as the unsaved rows of new sessions of `user`, every value worked out here (the
    text made storable, the state's change, each message's seq), so that `store()`, in the batch's
    transaction, only inserts them: a bulk insert per table (and per level of steps)."""

    def __init__(self, chats: list[_SessionIn], user):
        now = timezone.now()
        self.sessions = [_imported_session(data, user, now) for data in chats]
        self.state_changes = [  # the state becomes version 1, recorded as "import"
            StateChange(session=session, version=1, patch=patch, inverse=inverse, source="import", created_at=now)
            for session in self.sessions if session.session_state
            for patch, inverse in [state_module.diff({}, session.session_state)]]
        self.levels: list[list[tuple[_RunIn, Run, ChatSession]]] = []  # the top-level runs, their steps, theirs
        self.messages: list[Message] = []
        seq = [0] * len(chats)
        level = [(run, None, number) for number, data in enumerate(chats) for run in data.runs]
        while level:
            built = [(run, _imported_run(self.sessions[number], run, parent, now), number) for run, parent, number in level]
            self.levels.append([(run, stored, self.sessions[number]) for run, stored, number in built])
            for run, stored, number in built:
                for message in run.messages:
                    seq[number] += 1
                    self.messages.append(Message(
                        session=self.sessions[number], run=stored, seq=seq[number], role=message.role,
                        content=replace_unstorable(message.content),
                        tool_calls=message.tool_calls and [replace_unstorable_tree(call.model_dump()) for call in message.tool_calls],
                        tool_call_id=replace_unstorable(message.tool_call_id)[:TOOL_FIELD_CHARS],
                        tool_name=replace_unstorable(message.tool_name)[:TOOL_FIELD_CHARS], tool_error=message.tool_error,
                        created_at=message.created_at or stored.created_at,
                    ))
            level = [(step, stored, number) for run, stored, number in built for step in run.steps]

    def store(self) -> list[ChatSession]:
        """The rows inserted (each row's foreign keys taken from the rows it names, inserted before it)."""
        sessions = ChatSession.objects.bulk_create(self.sessions)
        StateChange.objects.bulk_create(self.state_changes)
        for level in self.levels:
            Run.objects.bulk_create(stored for _, stored, _ in level)
        _link_branches(self.levels[0] if self.levels else [])
        Message.objects.bulk_create(self.messages, batch_size=500)
        return sessions


def _imported_session(data: _SessionIn, user, now) -> ChatSession:
    name = replace_unstorable(_line(data.name))[:200]
    state = data.session_state  # storable, and within CHAT_MAX_STATE_BYTES (`read_import`)
    return ChatSession.objects.build(
        owner=user, component_id=replace_unstorable(data.assistant)[:128], kind=data.kind, metadata=replace_unstorable_tree(data.metadata),
        name=name, name_source=NameSource.USER if name else NameSource.NONE,
        summary=data.summary and replace_unstorable_tree(data.summary.model_dump(mode="json")), created_at=data.created_at or now,
        last_activity_at=data.last_activity_at or data.created_at or now,
        session_state=state, state_version=1 if state else 0, last_seq=_messages(data.runs))


def _messages(runs: list[_RunIn]) -> int:
    return sum(len(run.messages) + _messages(run.steps) for run in runs)


def _link_branches(runs: list[tuple[_RunIn, Run, ChatSession]]) -> None:
    """The imported runs' trees: each follows the run its `follows` names (a document without branches, the
    one before it), and each session's leaf is the last run of its current branch (the newest one kept)."""
    by_old_id, previous, following = {}, {}, []
    for run, stored, session in runs:
        if run.run_id:
            by_old_id[session.pk, run.run_id] = stored
        if run.follows:
            follows = by_old_id.get((session.pk, run.follows))
        else:
            follows = None if run.run_id else previous.get(session.pk)
        if follows is not None:
            stored.follows = follows
            following.append(stored)
        previous[session.pk] = stored
        if not run.abandoned:
            session.current_leaf = stored
    Run.objects.bulk_update(following, ["follows"], batch_size=500)
    kept = Run.objects.filter(session=OuterRef("pk"), parent_run__isnull=True, abandoned=False).order_by("-pk")
    ChatSession.objects.filter(pk__in=previous).update(current_leaf=Subquery(kept.values("pk")[:1]))


def _imported_run(session: ChatSession, run: _RunIn, parent: Run | None, now) -> Run:
    return Run(
        session=session, parent_run=parent, kind=run.kind, step_name=replace_unstorable(run.step_name)[:200],
        component_id=replace_unstorable(run.component if run.component is not None else session.component_id)[:128],
        status=RunStatus.INTERRUPTED if run.status == RunStatus.RUNNING else run.status,
        input=replace_unstorable(run.input if run.input is not None else _first_user_text(run)),
        content=replace_unstorable(run.content if run.content is not None else _reply_text(run)),
        error=replace_unstorable(run.error), model_id=replace_unstorable(run.model)[:128], metrics=replace_unstorable_tree(run.metrics),
        abandoned=run.abandoned and parent is None,
        requirements=_imported_requirements(run.requirements),
        created_at=run.created_at or now,
        finished_at=None if run.status == RunStatus.PAUSED else run.finished_at or run.created_at or now)


def _imported_requirements(requirements: list[dict] | None) -> list[dict] | None:
    """A run's requirements as the document has them, each marked imported: an imported paused run is
    shown waiting, and cannot be continued (its tools are not this app's to run)."""
    if not requirements:
        return None
    return [{**replace_unstorable_tree(requirement), "imported": True} for requirement in requirements]


def _aware(value: datetime | None) -> datetime | None:
    """A time from the document; one without a zone is taken as UTC."""
    if value is None or timezone.is_aware(value):
        return value
    return timezone.make_aware(value, dt_timezone.utc)


def _first_user_text(run: _RunIn) -> str:
    return next((message.content for message in run.messages if message.role == "user"), "")


def _reply_text(run: _RunIn) -> str:
    return "".join(message.content for message in run.messages if message.role == "assistant")
