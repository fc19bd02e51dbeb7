"""A user's memories in the database: one row per memory, one history row per change.

Every function here is blocking (call it in a database thread) and takes the owner as `memory_owner`
resolved it: a saved User, or None, who has no memories and can make none. Every read and write goes
through `UserMemoryRecord.objects.for_user(owner)`, so another user's memory id is simply not found.
A change is one transaction of row writes (the memory's row and its history row), never a rewrite of
a list, so concurrent runs of one user lose nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import MemoryAction, UserMemoryChange, UserMemoryOptOut, UserMemoryRecord, new_id
from .record import UserMemory, clean_text, clean_topics


class Source:
    RUN = "run"  # the manager, after a run
    AGENTIC = "agentic"  # the model's update_user_memory tool, during a run
    USER = "user"  # the user's own edit (an accessor, the Memories page)
    UNDO = "undo"  # a run's changes undone
    IMPORT = "import"


@dataclass
class MemoryChange:
    """One entry of a memory's history."""

    memory_id: str
    action: str
    memory: str
    previous: str
    topics: list[str]
    source: str
    run_id: str | None
    session_id: str | None
    created_at: datetime
    undone: bool = False


def _label(owner) -> str | None:
    return owner.get_username() if owner is not None else None


def _rows(owner, alias: str):
    return UserMemoryRecord.objects.using(alias).for_user(owner).select_related("run__session")


def _scope(owner):
    if owner is None:
        raise ValueError("Memories belong to a user: give a user_id.")


def list_memories(owner, alias: str, search: str | None = None, limit: int | None = None) -> list[UserMemory]:
    """The user's memories, oldest first; `search` keeps those whose text or topics contain it."""
    rows = _rows(owner, alias)
    if search:
        rows = rows.filter(Q(memory__icontains=search) | Q(topics__icontains=search))
    if limit is not None:
        rows = rows[:limit]
    return [UserMemory.from_row(row, _label(owner)) for row in rows]


def memory_ids_and_texts(owner, alias: str) -> list[tuple[str, str]]:
    """(id, text) of each of the user's memories, oldest first: what the manager's prompt lists."""
    if owner is None:
        return []
    return list(UserMemoryRecord.objects.using(alias).for_user(owner).values_list("memory_id", "memory"))


def memory_texts(owner, alias: str) -> list[str]:
    """Only the texts, oldest first (what a model's context shows)."""
    if owner is None:
        return []
    return list(UserMemoryRecord.objects.using(alias).for_user(owner).values_list("memory", flat=True))


def get_memory(owner, memory_id: str, alias: str) -> UserMemory | None:
    row = _rows(owner, alias).filter(memory_id=str(memory_id)).first()
    return UserMemory.from_row(row, _label(owner)) if row is not None else None


def _record(owner, row_or_id, action, text, previous, topics, previous_topics, run_pk, source, now, alias):
    UserMemoryChange.objects.using(alias).create(
        user=owner, memory_id=row_or_id, action=action, memory=text, previous=previous, topics=topics,
        previous_topics=previous_topics, run_id=run_pk, source=source, created_at=now)


def add_memory(owner, text, topics, alias: str, *, source: str, run_pk: int | None = None, input: str = "",
               agent_id: str = "", team_id: str = "", memory_id: str | None = None,
               created_at: datetime | None = None) -> UserMemory:
    """A new memory of the user (a fresh id unless `memory_id` names one this user had and deleted)."""
    _scope(owner)
    text, topics, now = clean_text(text), clean_topics(topics), timezone.now()
    with transaction.atomic(using=alias):
        try:
            with transaction.atomic(using=alias):
                row = UserMemoryRecord.objects.using(alias).create(
                    memory_id=str(memory_id or new_id()), user=owner, memory=text, topics=topics,
                    input=(input or "")[:4000], agent_id=agent_id or "", team_id=team_id or "", run_id=run_pk,
                    created_at=created_at or now, updated_at=now)
        except IntegrityError:  # that id is taken (another user's, or the user's own): a fresh one
            row = UserMemoryRecord.objects.using(alias).create(
                user=owner, memory=text, topics=topics, input=(input or "")[:4000], agent_id=agent_id or "",
                team_id=team_id or "", run_id=run_pk, created_at=created_at or now, updated_at=now)
        _record(owner, row.memory_id, MemoryAction.ADDED, text, "", topics, [], run_pk, source, now, alias)
    return get_memory(owner, row.memory_id, alias)


def update_memory(owner, memory_id: str, text, topics, alias: str, *, source: str,
                  run_pk: int | None = None) -> UserMemory | None:
    """Change the text (and topics, None: kept) of the user's memory; None if the user has no such memory."""
    _scope(owner)
    text, now = clean_text(text), timezone.now()
    with transaction.atomic(using=alias):
        row = (UserMemoryRecord.objects.using(alias).for_user(owner).select_for_update()
               .filter(memory_id=str(memory_id)).first())
        if row is None:
            return None
        new_topics = clean_topics(topics) if topics is not None else list(row.topics or [])
        if text == row.memory and new_topics == list(row.topics or []):
            return get_memory(owner, row.memory_id, alias)
        _record(owner, row.memory_id, MemoryAction.UPDATED, text, row.memory, new_topics, row.topics or [],
                run_pk, source, now, alias)
        UserMemoryRecord.objects.using(alias).filter(pk=row.pk).update(
            memory=text, topics=new_topics, run_id=run_pk, updated_at=now)
    return get_memory(owner, row.memory_id, alias)


def delete_memory(owner, memory_id: str, alias: str, *, source: str, run_pk: int | None = None) -> bool:
    """Delete the user's memory (its history stays); False if the user has no such memory."""
    if owner is None:
        return False
    with transaction.atomic(using=alias):
        row = (UserMemoryRecord.objects.using(alias).for_user(owner).select_for_update()
               .filter(memory_id=str(memory_id)).first())
        if row is None:
            return False
        _record(owner, row.memory_id, MemoryAction.DELETED, row.memory, "", row.topics or [], [], run_pk, source,
                timezone.now(), alias)
        row.delete(using=alias)
    return True


def clear_memories(owner, alias: str, *, source: str, run_pk: int | None = None) -> int:
    """Delete every memory of this one user (never anyone else's); how many were deleted."""
    if owner is None:
        return 0
    with transaction.atomic(using=alias):
        rows = list(UserMemoryRecord.objects.using(alias).for_user(owner).select_for_update()
                    .only("memory_id", "memory", "topics"))
        now = timezone.now()
        UserMemoryChange.objects.using(alias).bulk_create([
            UserMemoryChange(user=owner, memory_id=row.memory_id, action=MemoryAction.DELETED, memory=row.memory,
                             topics=row.topics or [], run_id=run_pk, source=source, created_at=now)
            for row in rows])
        UserMemoryRecord.objects.using(alias).filter(pk__in=[row.pk for row in rows]).delete()
    return len(rows)


def _change(row) -> MemoryChange:
    run = row.run if row.run_id else None
    return MemoryChange(memory_id=row.memory_id, action=row.action, memory=row.memory, previous=row.previous,
                        topics=list(row.topics or []), source=row.source, run_id=run.run_id if run else None,
                        session_id=run.session.session_id if run else None, created_at=row.created_at,
                        undone=row.undone_at is not None)


def _changes(owner, alias: str):
    return UserMemoryChange.objects.using(alias).for_user(owner).select_related("run__session")


def memory_history(owner, memory_id: str, alias: str) -> list[MemoryChange]:
    """Every change of the user's memory, oldest first (a deleted memory's too)."""
    return [_change(row) for row in _changes(owner, alias).filter(memory_id=str(memory_id))]


def run_changes(owner, run_id: str, alias: str) -> list[MemoryChange]:
    """The changes a run of the user made, oldest first."""
    return [_change(row) for row in _changes(owner, alias).filter(run__run_id=str(run_id), source__in=(
        Source.RUN, Source.AGENTIC))]


def undo_run(owner, run_id: str, alias: str) -> int:
    """Undo what a run did to the user's memories, newest change first: an added memory is deleted, an
    updated one gets its text back, a deleted one comes back. Each undo is a change of its own. How many
    changes were undone (one already undone, or changed since by someone else, is left as it is)."""
    if owner is None:
        return 0
    undone = 0
    with transaction.atomic(using=alias):
        changes = list(UserMemoryChange.objects.using(alias).for_user(owner).select_for_update()
                       .filter(run__run_id=str(run_id), source__in=(Source.RUN, Source.AGENTIC), undone_at__isnull=True)
                       .order_by("-id"))
        for change in changes:
            current = UserMemoryRecord.objects.using(alias).for_user(owner).filter(memory_id=change.memory_id).first()
            if change.action == MemoryAction.ADDED and current is not None and current.memory == change.memory:
                undone += delete_memory(owner, change.memory_id, alias, source=Source.UNDO)
            elif change.action == MemoryAction.UPDATED and current is not None and current.memory == change.memory:
                update_memory(owner, change.memory_id, change.previous, change.previous_topics, alias,
                              source=Source.UNDO)
                undone += 1
            elif change.action == MemoryAction.DELETED and current is None:
                add_memory(owner, change.memory, change.topics, alias, source=Source.UNDO, memory_id=change.memory_id)
                undone += 1
        UserMemoryChange.objects.using(alias).filter(pk__in=[c.pk for c in changes]).update(
            undone_at=timezone.now())
    return undone


def memories_enabled(owner, alias: str) -> bool:
    """Whether the user (a User or a user's pk; None: no user) has memories on."""
    owner_pk = getattr(owner, "pk", owner)
    return owner_pk is not None and not UserMemoryOptOut.objects.using(alias).filter(user_id=owner_pk).exists()


def set_memories_enabled(owner, enabled: bool, alias: str) -> None:
    """Turn memories on or off for the user (off: nothing is learnt, none is shown to a model; the stored
    memories are kept until the user deletes them)."""
    _scope(owner)
    if enabled:
        UserMemoryOptOut.objects.using(alias).filter(user_id=owner.pk).delete()
    else:
        UserMemoryOptOut.objects.using(alias).get_or_create(user=owner)


def histories(owner, memory_ids: list[str], alias: str) -> dict[str, list[MemoryChange]]:
    """The history of each of the user's memories named, in one query: {memory id: changes, oldest first}."""
    found: dict[str, list[MemoryChange]] = {}
    for row in _changes(owner, alias).filter(memory_id__in=[str(memory_id) for memory_id in memory_ids]):
        found.setdefault(row.memory_id, []).append(_change(row))
    return found
