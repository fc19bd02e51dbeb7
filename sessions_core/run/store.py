"""The rows a run writes besides its status: its session, its messages and its state changes.

Called inside the caller's `transaction.atomic`; the inserts are writes.insert's single statements, the
reads the ORM's. A run's statements do not grow with its session's length.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Max, Q

from ..history import ChatMessage
from ..models import ChatSession, Message, Role, Run, StateChange
from ..owners import owned_session, resolve_user
from ..storable import replace_unstorable
from . import lifecycle, writes


def new_session(session_id: str, user_ref, config, alias: str, now) -> tuple[ChatSession, bool]:
    """A new session for a run, locked, with the component's introduction (`introduce`), and True; if
    another run created it a moment ago, that one (checked), and False."""
    user = resolve_user(user_ref, alias)
    try:
        with transaction.atomic(using=alias):  # a savepoint: a lost race rolls back only this
            session = ChatSession.objects.using(alias).build(
                session_id=session_id, owner=user, kind=config.kind, component_id=config.component_id,
                metadata=config.session_metadata, now=now)
            writes.insert([session], alias, returning_pk=True)
            if config.introduction is not None:
                introduce(session, config, alias, now)
            return session, True
    except IntegrityError:
        session = owned_session(session_id, user_ref, alias, lock=True, must_exist=False)
        if session is None:
            raise
        return session, False


def introduce(session: ChatSession, config, alias: str, now) -> None:
    """Agno's `introduction`: a new session's first run, completed, whose one message is the introduction
    as the assistant's; it is history and chat history like any other run. Once per session: only the
    run that creates the session stores it."""
    run = lifecycle.completed_new(alias, session=session, kind=config.kind, component_id=config.component_id,
                                  content=replace_unstorable(config.introduction), created_at=now, finished_at=now)
    message = ChatMessage(role=Role.ASSISTANT, content=run.content)
    rows, session.last_seq = message_rows(session.pk, run, [message], session.last_seq, now, run.run_id)
    insert_messages(rows, alias)
    session.current_leaf = run  # the session's first run follows it
    ChatSession.objects.using(alias).filter(pk=session.pk).update(last_seq=session.last_seq, current_leaf=run)


def next_seq_after_crash(session: ChatSession, alias: str) -> int:
    """The highest message seq of a session whose last run's process stopped: its steps may have stored
    messages beyond the session's `last_seq`, which only a finish brings up to date."""
    highest = Message.objects.using(alias).filter(session_id=session.pk).aggregate(seq=Max("seq"))["seq"]
    return max(session.last_seq, highest or 0)


def message_rows(session_pk: int, run: Run | int, messages: list[ChatMessage], last_seq: int, now,
                 run_id: str) -> tuple[list[Message], int]:
    """Unsaved Message rows of `messages`, numbered after `last_seq`, and the last number."""
    run_pk = run if isinstance(run, int) else run.pk
    rows = []
    for message in messages:
        last_seq += 1
        message.seq, message.created_at, message.run_id = last_seq, now, run_id
        rows.append(Message(session_id=session_pk, run_id=run_pk, seq=last_seq, role=message.role,
                            content=message.content or "", tool_calls=message.tool_calls,
                            tool_call_id=message.tool_call_id, tool_name=message.tool_name,
                            tool_error=message.tool_error, created_at=now))
    return rows, last_seq


def insert_messages(messages: list[Message], alias: str) -> None:
    writes.insert(messages, alias)


def run_messages(run_pk: int, alias: str) -> list[ChatMessage]:
    """A run's own stored messages but its system prompt, in order (a paused run's, to continue it)."""
    rows = Message.objects.using(alias).filter(run_id=run_pk).exclude(role=Role.SYSTEM).order_by("seq")
    return [ChatMessage.from_row(row) for row in rows]


def drop_tool_messages(run_pk: int, alias: str) -> None:
    """A continued run with store_tool_messages=False: the tool traffic it kept while it waited goes."""
    Message.objects.using(alias).filter(Q(role=Role.TOOL) | Q(tool_calls__isnull=False), run_id=run_pk).delete()


def insert_changes(session_pk: int, changes: list, first_version: int, default_run_pk: int, now,
                   alias: str) -> None:
    """StateChange rows of `changes` [(patch, inverse, source, run or None)], versioned after `first_version`;
    each names the run that made it (a step's or a member's), else the run with pk `default_run_pk`."""
    if not changes:
        return
    writes.insert([
        StateChange(session_id=session_pk, run_id=default_run_pk if run is None else run.run_pk,
                    version=first_version + number, patch=patch, inverse=inverse, source=source, created_at=now)
        for number, (patch, inverse, source, run) in enumerate(changes, start=1)
    ], alias)
