"""What the chat shows of a user's memories: under a reply, what it remembered (with an undo) and which
memories were in its context; in the state panel, the memories in the context of the chat's latest reply.
Both read what a reply was shown back from its stored system message.

The memories shown come with the runs' own read (annotated with `SHOWN`); `attach` adds what they
remembered in one query, whatever the page holds. `render_run_memories` is the fragment that replaces a
reply's line once its memory work is done (live) or undone; `render_context_memories` is the panel's
section, sent again when a reply ends.
"""

from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.template.loader import render_to_string

from sessions_core.models import OPEN_STATUSES, MemoryAction, Message, Role, Run, UserMemoryChange
from sessions_core.user_memories import store
from sessions_core.user_memories.context import memories_in

from .assistants import assistant_uses_memories

_MADE_BY_RUNS = (store.Source.RUN, store.Source.AGENTIC)

# A run query's annotation for `attach`: the run's system message when it listed memories to its model.
SHOWN = {"memories_context": Subquery(Message.objects.filter(
    run_id=OuterRef("pk"), role=Role.SYSTEM, content__contains="<memories_from").values("content")[:1])}


def attach(runs: list[Run], owner_id: int | None) -> None:
    """Set `memory_changes` (what each run remembered or forgot) and `memories_used` (what its model was
    shown) on the runs, read with `**SHOWN`: one query, none without an owner or runs."""
    pks = [run.pk for run in runs if run.pk]
    changes: dict[int, list] = {}
    if pks and owner_id is not None:
        for change in UserMemoryChange.objects.for_user(owner_id).filter(run_id__in=pks, source__in=_MADE_BY_RUNS):
            changes.setdefault(change.run_id, []).append(change)
    for run in runs:
        run.memory_changes = changes.get(run.pk, [])
        shown = run.memories_context if run.pk and owner_id is not None else None
        run.memories_used = memories_in(shown) if shown else []


def lines(changes: list) -> list[str]:
    """'Remembered: you are vegetarian' words for a run's changes, one per change."""
    words = {MemoryAction.ADDED: "Remembered", MemoryAction.UPDATED: "Updated", MemoryAction.DELETED: "Forgot"}
    return [f"{words.get(change.action, change.action)}: {change.memory}" for change in changes]


def run_memories_context(run: Run) -> dict:
    changes = getattr(run, "memory_changes", [])
    return {"run": run, "memory_lines": lines(changes), "undone": bool(changes) and all(c.undone_at for c in changes),
            "memories_used": getattr(run, "memories_used", []),
            "memory_error": (run.metrics or {}).get("memory_error", "")}


def render_run_memories(run: Run, oob: str = "") -> str:
    """The reply's memory line as stored now (`run` with `attach` done)."""
    return render_to_string("chatapp/_run_memories.html", {**run_memories_context(run), "oob": oob})


def stored_run_memories(run_id: str, session_pk: int, owner_id: int | None) -> str:
    """The memory line of a run of the session, read now, to replace the one shown (out of band)."""
    run = Run.objects.annotate(**SHOWN).filter(session_id=session_pk, run_id=run_id).first()
    if run is None:
        return ""
    attach([run], owner_id)
    return render_run_memories(run, oob="true")


def context_memories(session, runs: list[Run]) -> dict | None:
    """The memories section beside the state panel: None for an assistant that uses no memories; else
    whether the owner has memories on, and the memories shown to the latest ended run of `runs` (a page of
    the chat's current branch, `attach` done): one query."""
    if not assistant_uses_memories(session.component_id):
        return None
    ended = [run for run in runs if run.status not in OPEN_STATUSES]
    return _context(session, ended[-1].memories_used if ended else [], replied=bool(ended))


def context_memories_of_run(session, run: Run) -> dict | None:
    """The same section once `run` (a top-level run, `attach` done) has ended: one query."""
    if not assistant_uses_memories(session.component_id):
        return None
    return _context(session, run.memories_used, replied=True)

def _context(session, used: list[str], replied: bool) -> dict:
    return {"enabled": store.memories_enabled(session.owner_id, "default"), "memories": used, "replied": replied}


def render_context_memories(context: dict | None, oob: str = "") -> str:
    """The panel's memories section ("" for an assistant that uses no memories)."""
    if context is None:
        return ""
    return render_to_string("chatapp/_context_memories.html", {"context_memories": context, "oob": oob})
