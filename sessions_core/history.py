"""Reading earlier messages of a session: bounded queries whose cost does not grow with its length."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import NamedTuple

from .models import Message, Role, Run, RunStatus


class HistoryRead(NamedTuple):
    """A history read: the last `num_runs` runs, else the last `num_messages` messages, of the session's
    completed top-level runs on its branch or, with `component_id`, of one step agent's (or team
    member's) own completed runs."""

    session_pk: int
    num_runs: int | None
    num_messages: int | None
    component_id: str | None = None


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


def history_read(session_pk: int, num_runs: int | None, num_messages: int | None,
                 component_id: str | None = None) -> HistoryRead | None:
    """The read a run's start makes (`read_history`); None when that window holds nothing."""
    if num_runs is not None:
        if num_runs <= 0:
            return None
    elif not num_messages or num_messages <= 0:
        return None
    return HistoryRead(session_pk, num_runs, num_messages, component_id)


def read_history(read: HistoryRead | None, alias: str) -> list[ChatMessage]:
    """What an earlier part of the session contributes to a run's request, oldest first: one query whose
    cost does not grow with the session's length. System messages are never replayed."""
    if read is None:
        return []
    if read.component_id is None:
        runs = Run.objects.using(alias).filter(session_id=read.session_pk, status=RunStatus.COMPLETED,
                                               parent_run__isnull=True, abandoned=False)
    else:
        runs = Run.objects.using(alias).filter(session_id=read.session_pk, status=RunStatus.COMPLETED,
                                               parent_run__isnull=False, component_id=read.component_id)
    messages = Message.objects.using(alias).exclude(role=Role.SYSTEM)
    if read.num_runs is not None:
        last_runs = runs.order_by("-id").values("id")[: read.num_runs]
        rows = list(messages.filter(run_id__in=last_runs).order_by("seq").values_list(*_HISTORY_FIELDS))
    else:
        if read.component_id is None:
            messages = messages.filter(session_id=read.session_pk, run__in=runs)
        else:  # among its last as many runs: each has one message at least
            messages = messages.filter(run_id__in=runs.order_by("-id").values("id")[: read.num_messages])
        rows = list(messages.order_by("-seq").values_list(*_HISTORY_FIELDS)[: read.num_messages])[::-1]
    return replayed(rows, read)


def replayed(rows: list[tuple], read: HistoryRead) -> list[ChatMessage]:
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
