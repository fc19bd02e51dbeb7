"""What the chat shows of a user's memories: under a reply, what it remembered (with an undo) and which
memories were in its context; in the state panel, the memories in the context of the chat's latest reply.
Both read what a reply was shown back from its stored system message.

`attach` puts both on a page's runs in two queries, whatever the page holds; `render_run_memories` is the
fragment that replaces a reply's line once its memory work is done (live) or undone;
`render_context_memories` is the panel's section, sent again when a reply ends.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from sessions_core.models import OPEN_STATUSES, MemoryAction, Message, Role, Run, UserMemoryChange
from sessions_core.user_memories import store
from sessions_core.user_memories.context import memories_in

from .assistants import assistant_uses_memories

_MADE_BY_RUNS = (store.Source.RUN, store.Source.AGENTIC)


def attach(runs: list[Run], owner_id: int | None) -> None:
    """Set `memory_changes` (what each run remembered or forgot) and `memories_used` (what its model was
    shown) on the runs: two queries, none without an owner or runs."""
    pks = [run.pk for run in runs if run.pk]
    changes: dict[int, list] = {}
    used: dict[int, list[str]] = {}
    if pks and owner_id is not None:
        for change in UserMemoryChange.objects.for_user(owner_id).filter(run_id__in=pks, source__in=_MADE_BY_RUNS):
            changes.setdefault(change.run_id, []).append(change)
        system = Message.objects.filter(run_id__in=pks, role=Role.SYSTEM, content__contains="<memories_from")
        for run_id, content in system.values_list("run_id", "content"):
            used[run_id] = memories_in(content)
    for run in runs:
        run.memory_changes = changes.get(run.pk, [])
        run.memories_used = used.get(run.pk, [])


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
    run = Run.objects.filter(session_id=session_pk, run_id=run_id).first()
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
