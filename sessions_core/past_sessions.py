"""The past-session tools (`search_past_sessions=True`): list the caller's earlier sessions, then read one.

Scoped to the current user (no user: only ownerless sessions) and to the same agent, newest
activity first, with the current session left out before the limit is applied. Another user's
session reads as "not found", exactly like a session that does not exist. A session is read as its
history is: the runs of its current branch (an edited or regenerated turn's first version is not
part of the conversation any more), never a queued run that has not begun.
"""

from __future__ import annotations

import json

from .bridge import call_sync
from .models import Message, Role, Run
from .owners import sessions_of
from .tools import Function, RunContext

PREVIEW_CHARS = 200
NOT_FOUND = "Session not found."


def _scoped_sessions(agent, run_context: RunContext):
    """The run's user's other sessions with this agent: the owner check of `owners.sessions_of`."""
    return (sessions_of(run_context.user_id, agent.db_alias).filter(component_id=agent.id)
            .exclude(session_id=run_context.session_id))


def _clip(text: str) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "..."


def _conversation(agent, session):
    """The session's top-level runs that make its conversation: begun, on its current branch."""
    return Run.objects.using(agent.db_alias).begun().filter(session=session, parent_run__isnull=True, abandoned=False)


def _turns(messages) -> list[dict]:
    """[{user, assistant}] per run: its user text and its last assistant text."""
    turns: dict[int, dict] = {}
    for message in messages:
        turn = turns.setdefault(message.run_id, {})
        if message.role == Role.USER:
            turn.setdefault("user", message.content)
        elif message.role == Role.ASSISTANT and message.content:
            turn["assistant"] = message.content
    return [turn for turn in turns.values() if turn]


def _list_sessions(agent, run_context: RunContext) -> list[dict]:
    alias = agent.db_alias
    sessions = list(
        _scoped_sessions(agent, run_context).filter(last_seq__gt=0)
        .only("id", "session_id", "name", "created_at", "last_activity_at")
        .order_by("-last_activity_at", "-id")[: agent.num_past_sessions_to_search]
    )
    listed = []
    for session in sessions:
        run_ids = _conversation(agent, session).order_by("-id").values("id")[: agent.num_past_session_runs_in_search]
        messages = (Message.objects.using(alias).filter(run_id__in=run_ids, role__in=(Role.USER, Role.ASSISTANT))
                    .only("run_id", "role", "content").order_by("seq"))
        listed.append({
            "session_id": session.session_id,
            "name": session.name,
            "created_at": session.created_at.isoformat(),
            "last_activity_at": session.last_activity_at.isoformat(),
            "recent_runs": [{key: _clip(value) for key, value in turn.items()} for turn in _turns(messages)],
        })
    return listed


def _read_session(agent, run_context: RunContext, session_id: str, num_runs: int | None) -> str:
    session = _scoped_sessions(agent, run_context).filter(session_id=session_id).first()
    if session is None:
        return NOT_FOUND
    runs = _conversation(agent, session).order_by("id")
    if num_runs is not None:
        runs = runs[: max(num_runs, 0)]
    messages = (Message.objects.using(agent.db_alias).filter(run_id__in=runs.values("id"),
                                                             role__in=(Role.USER, Role.ASSISTANT))
                .only("run_id", "role", "content").order_by("seq"))
    lines = [f"Session: {session.session_id}", f"Name: {session.name}", f"Created: {session.created_at.isoformat()}", ""]
    for turn in _turns(messages):
        for role in ("user", "assistant"):
            if role in turn:
                lines += [f"{role.capitalize()}: {turn[role]}", ""]
    if len(lines) == 4:
        return "No messages found in session."
    return "\n".join(lines).rstrip() + "\n"


async def search_past_sessions(run_context: RunContext, agent) -> str:
    """List your earlier conversations with this user, newest first, each with its id, name, dates and a
    short preview of its most recent exchanges. Use read_past_session to read one in full."""
    return json.dumps(await call_sync(_list_sessions, agent, run_context), ensure_ascii=False)


async def read_past_session(session_id: str, run_context: RunContext, agent, num_runs: int | None = None) -> str:
    """Read the transcript of one earlier conversation.

    Args:
        session_id: The id of the session, as listed by search_past_sessions.
        num_runs: Read only this many exchanges from the start (all when omitted).
    """
    return await call_sync(_read_session, agent, run_context, session_id, num_runs)


PAST_SESSION_TOOLS = [Function.from_callable(search_past_sessions), Function.from_callable(read_past_session)]
