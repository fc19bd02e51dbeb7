"""Branches: a session's top-level runs form a tree, and the session state branches with it.

Each top-level run records the run it follows (`Run.follows`); the session's `current_leaf` is the last
run of the branch it is on, and runs off that branch are `abandoned` (kept, never deleted). History,
summaries and the chat history read the current branch only, so their queries stay what they were.

- A regenerate or an edit-and-rerun is a run that follows the same run as its target did, after the
  state is set back to what it was when the target started (`start_branch`, inside the run's start
  step, under the session's row lock): so regenerating a reply that added an item does not add it twice.
- Switching branches (`switch_to`) makes the latest leaf under a run current, marks the runs off the new
  path abandoned and the ones on it not, and sets the state to the state at the end of that leaf.
- `fork` copies the path up to a run into a new session of the same owner, with the state as of that run.

Every state move is a recorded StateChange whose source says why (`branch:regenerate`, `branch:edit`,
`branch:switch`, `fork`), so the timeline stays a truthful log. A move back to an earlier version's state
(a regenerate, an edit, a switch) is recorded as a change that names that version (`restores`), not as a
diff: switching back and forth between two branches writes a small row each time, however large the state.
"""

from __future__ import annotations

from django.db import connections, transaction
from django.utils import timezone

from .errors import SessionError
from .models import ChatSession, Message, Run, StateChange
from .state import dumps


class RunNotFoundError(SessionError):
    def __init__(self, run_id: str, session_id: str):
        self.run_id, self.session_id = run_id, session_id
        super().__init__(f"Run not found in session {session_id!r}: {run_id}")


class SessionBusyError(SessionError):
    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(f"Session {session_id!r} has a run in progress; try again when it has finished.")


def top_level_run(session: ChatSession, run_id: str | None, alias: str) -> Run:
    """A top-level run of the session (None: its current leaf); RunNotFoundError if it has none such."""
    runs = Run.objects.using(alias).begun().filter(session=session, parent_run__isnull=True)
    run = runs.filter(run_id=run_id).first() if run_id else runs.filter(pk=session.current_leaf_id).first()
    if run is None:
        raise RunNotFoundError(run_id or "(the latest)", session.session_id)
    return run


def state_before(run: Run, alias: str) -> int:
    """The state version the session was at when `run` started: the last change made before it."""
    earlier = StateChange.objects.using(alias).filter(session_id=run.session_id, created_at__lte=run.created_at)
    return earlier.order_by("-version").values_list("version", flat=True).first() or 0


def path_to(run: Run, alias: str) -> list[int]:
    """The pks of the runs from the first up to `run` along `follows`, in one recursive query."""
    table = connections[alias].ops.quote_name(Run._meta.db_table)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE path(id, follows_id) AS (SELECT id, follows_id FROM {table} WHERE id = %s"
            f" UNION ALL SELECT r.id, r.follows_id FROM {table} r JOIN path p ON r.id = p.follows_id)"
            f" SELECT id FROM path", [run.pk])
        return [row[0] for row in cursor.fetchall()][::-1]


def latest_leaf(run: Run, alias: str) -> Run:
    """The newest leaf under `run`: following its newest follower down, in one recursive query."""
    table = connections[alias].ops.quote_name(Run._meta.db_table)
    newest = f"(SELECT MAX(f.id) FROM {table} f WHERE f.follows_id = down.id AND f.parent_run_id IS NULL)"
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE down(id) AS (SELECT id FROM {table} WHERE id = %s"
            f" UNION ALL SELECT {newest} FROM down WHERE {newest} IS NOT NULL)"
            f" SELECT MAX(id) FROM down", [run.pk])
        leaf_pk = cursor.fetchone()[0]
    return run if leaf_pk == run.pk else Run.objects.using(alias).get(pk=leaf_pk)


def _set_state(session: ChatSession, version: int, source: str, now=None) -> None:
    """The session's state becomes the state it had at `version`, recorded as one change naming it."""
    session.restore_state(version, source, now=now)


def _follow_path(session: ChatSession, path: list[int], alias: str) -> None:
    """Mark the runs on `path` current and every other top-level run of the session abandoned."""
    runs = Run.objects.using(alias).begun().filter(session=session, parent_run__isnull=True)
    runs.filter(abandoned=False).exclude(pk__in=path).update(abandoned=True)
    runs.filter(pk__in=path, abandoned=True).update(abandoned=False)


def start_branch(session_pk: int, run_id: str, source: str, alias: str, now) -> tuple[Run, str, int]:
    """In a run's start step (the session row locked, `now` its time): a new branch beside `run_id`. The state goes back to
    what it was when that run started; that run and what came after it on the branch are abandoned.
    Returns (the target run, the state as JSON text, its version); the new run follows the target's `follows`."""
    session = ChatSession.objects.using(alias).get(pk=session_pk)
    target = top_level_run(session, run_id, alias)
    # Stamped with the new run's start, so the state "when it started" includes this change.
    _set_state(session, state_before(target, alias), f"branch:{source}", now=now)
    runs = Run.objects.using(alias).begun().filter(session=session, parent_run__isnull=True, abandoned=False)
    runs.filter(pk__gte=target.pk).update(abandoned=True)
    ChatSession.objects.using(alias).filter(pk=session_pk).update(current_leaf=target.follows_id)
    return target, dumps(session.session_state), session.state_version


def switch_to(session: ChatSession, run_id: str, alias: str) -> Run:
    """Make the newest leaf under `run_id` the session's current one (the session row locked); the state
    becomes the state at the end of that leaf. Returns the leaf."""
    if session.is_running:
        raise SessionBusyError(session.session_id)
    leaf = latest_leaf(top_level_run(session, run_id, alias), alias)
    _follow_path(session, path_to(leaf, alias), alias)
    if leaf.state_version is not None:
        _set_state(session, leaf.state_version, "branch:switch")
    ChatSession.objects.using(alias).filter(pk=session.pk).update(current_leaf=leaf)
    session.current_leaf = leaf
    return leaf


def fork(session: ChatSession, run_id: str | None, alias: str, new_session_id: str | None = None) -> ChatSession:
    """A new session of the same owner with the runs from the first up to `run_id` (default: the current
    leaf) and their messages, and the state as of that run; its metadata names where it came from."""
    run = top_level_run(session, run_id, alias)
    path = path_to(run, alias)
    now = timezone.now()
    with transaction.atomic(using=alias):
        copy = ChatSession.objects.using(alias).new(
            owner=session.owner, component_id=session.component_id, kind=session.kind, session_id=new_session_id,
            metadata={**session.metadata, "forked_from_session_id": session.session_id,
                      "forked_from_run_id": run.run_id},
            name=session.name, name_source=session.name_source, now=now)
        if run.state_version is not None:
            copy.apply_state_change(session.state_at(run.state_version), "fork")
        originals = {r.pk: r for r in Run.objects.using(alias).filter(pk__in=path)}
        previous, seq, leaf = None, 0, None
        for pk in path:
            original = originals[pk]
            leaf = Run.objects.using(alias).create(
                session=copy, follows=previous, kind=original.kind, component_id=original.component_id,
                status=original.status, input=original.input, content=original.content,
                content_type=original.content_type, error=original.error, model_id=original.model_id,
                metrics=original.metrics, state_version=copy.state_version if pk == path[-1] else None,
                created_at=original.created_at, finished_at=original.finished_at)
            messages = []
            for message in Message.objects.using(alias).filter(run_id=pk).order_by("seq"):
                seq += 1
                messages.append(Message(
                    session=copy, run=leaf, seq=seq, role=message.role, content=message.content,
                    tool_calls=message.tool_calls, tool_call_id=message.tool_call_id, tool_name=message.tool_name,
                    tool_error=message.tool_error, created_at=message.created_at))
            Message.objects.using(alias).bulk_create(messages)
            previous = leaf
        ChatSession.objects.using(alias).filter(pk=copy.pk).update(last_seq=seq, current_leaf=leaf)
    copy.refresh_from_db(using=alias)
    return copy
