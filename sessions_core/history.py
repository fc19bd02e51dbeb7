"""Reading earlier messages of a session: bounded queries whose cost does not grow with its length."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from .models import Message, Role, Run, RunStatus
from .run_sql import HistoryRead, HistoryRow, RunStore


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


_HISTORY_FIELDS = ("seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at")


def _messages(rows, from_history: bool = False) -> list[ChatMessage]:
    """ChatMessages from rows of `_HISTORY_FIELDS` (no model instances: this is a hot path)."""
    return [
        ChatMessage(role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id, tool_name=tool_name,
                    tool_error=tool_error, from_history=from_history, seq=seq, created_at=created_at)
        for seq, role, content, tool_calls, tool_call_id, tool_name, tool_error, created_at in rows
    ]


def history(store: RunStore, session_pk: int, num_runs: int | None, num_messages: int | None) -> list[ChatMessage]:
    """What an earlier part of the session contributes to the next request: one query.

    The last `num_runs` completed top-level runs, or the last `num_messages` of their messages
    (leading tool results dropped so none is orphaned). System messages are never replayed.
    """
    read = history_read(session_pk, num_runs, num_messages)
    return replayed(store.history(*read), read) if read else []


def history_read(session_pk: int, num_runs: int | None, num_messages: int | None,
                 component_id: str | None = None) -> HistoryRead | None:
    """The read `history` (or, with `component_id`, `step_history`) makes, for a run's start to make
    in its own statement (RunStore.start_run, start_child); None when that window holds nothing."""
    if num_runs is not None:
        if num_runs <= 0:
            return None
    elif not num_messages or num_messages <= 0:
        return None
    return HistoryRead(session_pk, num_runs, num_messages, component_id)


def replayed(rows: list[HistoryRow], read: HistoryRead) -> list[ChatMessage]:
    """The messages of `read`'s rows, oldest first; with a window of messages, leading tool results
    are dropped (their call is outside it)."""
    messages = _messages(rows, from_history=True)
    while read.num_runs is None and messages and messages[0].role == Role.TOOL:
        messages.pop(0)
    return messages


def chat_history(session_pk: int, alias: str, last_n_runs: int | None = None) -> list[ChatMessage]:
    """User and assistant messages of the session's runs of every status on its current branch, oldest first."""
    messages = Message.objects.using(alias).filter(
        session_id=session_pk, role__in=(Role.USER, Role.ASSISTANT), run__parent_run__isnull=True,
        run__abandoned=False,
    )
    if last_n_runs is not None:
        run_ids = (
            Run.objects.using(alias).filter(session_id=session_pk, parent_run__isnull=True, abandoned=False)
            .order_by("-id").values("id")[: max(last_n_runs, 0)]
        )
        messages = messages.filter(run_id__in=run_ids)
    rows = messages.select_related("run").only(*_HISTORY_FIELDS, "run__run_id").order_by("seq")
    return [_with_run_id(ChatMessage.from_row(row), row.run.run_id) for row in rows]


def _with_run_id(message: ChatMessage, run_id: str) -> ChatMessage:
    message.run_id = run_id
    return message


def completed_messages(session_pk: int, alias: str, last_n_runs: int | None = None) -> list[ChatMessage]:
    """Messages of the completed top-level runs on the session's branch (the last `last_n_runs`), oldest first."""
    runs = Run.objects.using(alias).filter(session_id=session_pk, status=RunStatus.COMPLETED, parent_run__isnull=True,
                                           abandoned=False)
    if last_n_runs is not None:
        runs = runs.order_by("-id")[:last_n_runs]
    rows = Message.objects.using(alias).filter(run_id__in=runs.values("id")).exclude(role=Role.SYSTEM)
    return _messages(rows.order_by("seq").values_list(*_HISTORY_FIELDS))


def step_history(store: RunStore, session_pk: int, component_id: str, num_runs: int | None,
                 num_messages: int | None) -> list[ChatMessage]:
    """A step agent's (or team member's) own earlier completed runs in this session, bounded as `history`:
    one query, as plain SQL (run_sql.py)."""
    read = history_read(session_pk, num_runs, num_messages, component_id)
    return replayed(store.history(*read), read) if read else []
