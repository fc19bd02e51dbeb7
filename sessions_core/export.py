"""A session as a document to keep: JSON (everything the user may take away) or Markdown (to read).

    for part in export_json(session): ...
    for part in export_markdown(session): ...

Both stream: the runs are read in batches with their messages, so a session of 10,000 runs costs the
memory and the queries of a batch at a time, never of the whole session. The caller has checked that
the session is the user's (`ChatSession.objects.for_user`). System prompts are left out: they are the
assistant's instructions, not the conversation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime

from django.db.models import Prefetch

from .models import ChatSession, Message, Role, Run, RunStatus

BATCH_RUNS = 200
FORMAT_VERSION = 1


def _runs(session: ChatSession) -> Iterator[Run]:
    """Top-level runs, oldest first, each with `shown` (its messages but the system prompt, by seq)."""
    shown = Prefetch("messages", queryset=Message.objects.exclude(role=Role.SYSTEM).order_by("seq"), to_attr="shown")
    runs = Run.objects.filter(session=session, parent_run__isnull=True).order_by("pk")
    return runs.prefetch_related(shown).iterator(chunk_size=BATCH_RUNS)


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
    return {
        "run_id": run.run_id, "status": run.status, "error": run.error, "model": run.model_id,
        "created_at": _time(run.created_at), "finished_at": _time(run.finished_at), "metrics": run.metrics,
        "state_version": run.state_version, "messages": [_message(message) for message in run.shown],
    }


def session_header(session: ChatSession) -> dict:
    """What a session is, without its runs."""
    return {
        "session_id": session.session_id, "name": session.name, "assistant": session.component_id,
        "created_at": _time(session.created_at), "last_activity_at": _time(session.last_activity_at),
        "session_state": session.session_state, "state_version": session.state_version,
        "summary": session.summary, "metadata": session.metadata,
    }


def export_json(session: ChatSession) -> Iterator[str]:
    """The session as one JSON object: its header, then `runs` (each with its messages), oldest first."""
    header = json.dumps({"format": "sessions_core.session", "version": FORMAT_VERSION, **session_header(session)},
                        ensure_ascii=False)
    yield header[:-1] + ', "runs": ['
    for number, run in enumerate(_runs(session)):
        yield ("," if number else "") + json.dumps(_run(run), ensure_ascii=False)
    yield "]}"


def export_all_json(sessions: Iterable[ChatSession], username: str, now: datetime) -> Iterator[str]:
    """Several sessions (a user's) as one JSON object: `{"user", "exported_at", "sessions": [...]}`."""
    yield json.dumps({"format": "sessions_core.export", "version": FORMAT_VERSION, "user": username,
                      "exported_at": now.isoformat()}, ensure_ascii=False)[:-1] + ', "sessions": ['
    for number, session in enumerate(sessions):
        if number:
            yield ","
        yield from export_json(session)
    yield "]}"


def export_markdown(session: ChatSession, assistant_name: str = "") -> Iterator[str]:
    """The conversation to read: who said what, tool calls as quoted lines, the state at the end."""
    yield f"# {_line(session.name) or 'Untitled chat'}\n\n"
    assistant = assistant_name or session.component_id
    facts = [f"Assistant: {assistant}"] if assistant else []
    facts += [f"started {session.created_at:%Y-%m-%d %H:%M} UTC",
              f"last active {session.last_activity_at:%Y-%m-%d %H:%M} UTC"]
    yield " · ".join(facts) + "\n"
    for run in _runs(session):
        for message in run.shown:
            yield from _markdown_message(message)
        if run.status in _ENDINGS:
            yield f"\n*{_ENDINGS[run.status]}{': ' + _line(run.error) if run.error else '.'}*\n"
    if session.session_state:
        state = json.dumps(session.session_state, indent=2, ensure_ascii=False)
        yield f"\n---\n\n## Session state (version {session.state_version})\n\n```json\n{state}\n```\n"


_ENDINGS = {RunStatus.ERROR: "The reply failed", RunStatus.CANCELLED: "The reply was stopped",
            RunStatus.INTERRUPTED: "The reply was interrupted"}
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
