"""A run's status, and the session lease that makes a session's runs take turns. Every change of a
run's status is made here:

    queued -> running -> (paused -> running) -> completed | error | cancelled | interrupted

A run that finds its session's lease held (or live runs queued before it) is stored `queued`, with its
input, and starts in order once the lease is free. The process waiting to start it renews the run's
`claimed_until`; a queued run whose process has stopped is an orphan, which any process that serves
the session may take over (`unclaimed`). A queued run that is cancelled never began: its row is deleted,
so the transcript, the branches and the history never see it. A running run holds the session's lease
and renews it with a heartbeat; a lease that expires means its process stopped, and the next start
marks that run `interrupted`. `paused` (a run waiting for a person) holds no lease; `resume` moves it
back to running for the one continuation that gets there first. `cancel` stops a run in any of the
open statuses, from any process.

Each transition is one conditional UPDATE (`status` must still be what the transition leaves), so two
processes never both move the same run.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connections
from django.utils import timezone

from ..models import INTERRUPTED_ERROR, ChatSession, Run, RunStatus
from . import registry, writes

LEASE_SECONDS = 30  # a lease (or a queued run's claim) not renewed for this long is taken as dead
HEARTBEAT_SECONDS = 10  # how often a running run renews its lease (and a queued run its claim)

# Which status each status may move to (None: a new run; a completed one is an introduction, over as it is made).
TRANSITIONS = {
    None: {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.COMPLETED},
    RunStatus.QUEUED: {RunStatus.RUNNING},  # cancelled, it is deleted (it never began)
    RunStatus.RUNNING: {RunStatus.PAUSED, RunStatus.COMPLETED, RunStatus.ERROR, RunStatus.CANCELLED,
                        RunStatus.INTERRUPTED},
    RunStatus.PAUSED: {RunStatus.RUNNING, RunStatus.CANCELLED},
    # A run marked interrupted whose process was only slow (its lease expired) still stores its outcome.
    RunStatus.INTERRUPTED: {RunStatus.PAUSED, RunStatus.COMPLETED, RunStatus.ERROR, RunStatus.CANCELLED},
}


class TransitionError(ValueError):
    pass


def _move(alias: str, where: dict, current: str | tuple[str, ...], new: str, **fields) -> int:
    """Move the runs matching `where` (writes.update's form) still in `current` (a status or several) to
    `new`; how many moved."""
    current = (current,) if isinstance(current, str) else current
    for status in current:
        if new not in TRANSITIONS[status]:
            raise TransitionError(f"A {status} run cannot become {new}.")
    return writes.update(Run, alias, {**where, "status": current}, status=new, **fields)


def expiry(now):
    return now + timedelta(seconds=LEASE_SECONDS)


# -- the lease ---------------------------------------------------------------------------------------


def lease_live(session: ChatSession, now) -> bool:
    return bool(session.lease_token and session.lease_expires_at and session.lease_expires_at > now)


def take_lease(session: ChatSession, token: str, run: Run | None, last_seq: int, now, alias: str) -> None:
    """The run takes the session's lease (the session row locked) and becomes its current leaf (a
    continued run, `run` None, stays where it is in the session's tree)."""
    leaf = {} if run is None else {"current_leaf_id": run.pk}
    writes.update(ChatSession, alias, {"pk": session.pk}, lease_token=token, lease_expires_at=expiry(now),
                last_activity_at=now, last_seq=last_seq, **leaf)


def renew_lease(session_pk: int, token: str, alias: str) -> None:
    writes.update(ChatSession, alias, {"pk": session_pk, "lease_token": token}, lease_expires_at=expiry(timezone.now()))


def release_lease(session_pk: int, token: str, alias: str, now, at_version: int | None = None, **fields) -> int:
    """Release the lease if `token` still holds it (and the state is still at version `at_version`, when
    given), writing `fields` of the session; 1 if it did."""
    where = {"pk": session_pk, "lease_token": token}
    if at_version is not None:
        where["state_version"] = at_version
    return writes.update(ChatSession, alias, where, lease_token="", lease_expires_at=None, last_activity_at=now,
                       **fields)


def interrupt_abandoned(session: ChatSession, alias: str, now) -> None:
    """The session's lease expired (the session row locked): the run that held it is over; its steps too."""
    _move(alias, {"session_id": session.pk}, RunStatus.RUNNING, RunStatus.INTERRUPTED, finished_at=now,
          error=INTERRUPTED_ERROR)


def settle_abandoned(runs, now=None) -> list[int]:
    """Mark the runs among `runs` still running whose session holds no live lease (their process stopped)
    interrupted, as the session's next run would; their pks (a read first: usually there are none)."""
    now = now or timezone.now()
    pks = list(runs.abandoned(now).values_list("pk", flat=True))
    if pks:
        _move(runs.db, {"pk": tuple(pks)}, RunStatus.RUNNING, RunStatus.INTERRUPTED, finished_at=now,
              error=INTERRUPTED_ERROR)
    return pks


# -- the queue ---------------------------------------------------------------------------------------


def queued_ahead(session_pk: int, run_pk: int | None, now, alias: str) -> bool:
    """Whether a queued run whose process is alive waits before run `run_pk` (None: any queued run).
    Written out, like writes.py's statements: every start on an existing session asks it."""
    connection = connections[alias]
    sql = (f"SELECT 1 FROM {Run._meta.db_table} WHERE session_id = %s AND status = %s AND claimed_until > %s"
           " AND id < %s LIMIT 1")
    with connection.cursor() as cursor:
        cursor.execute(sql, [session_pk, RunStatus.QUEUED, connection.ops.adapt_datetimefield_value(now),
                             run_pk if run_pk is not None else 2**63 - 1])
        return cursor.fetchone() is not None


def queue(alias: str, now, **fields) -> Run:
    """A new run, stored as waiting for its session's lease by the process that will start it."""
    return _new(alias, RunStatus.QUEUED, claimed_until=expiry(now), created_at=now, **fields)


def enqueue(session: ChatSession, text: str, alias: str = "default") -> Run:
    """A message to run on the session when a process next serves it (the web's new chat stores its first
    message so, for the chat page to run): a queued run no process waits for yet (`unclaimed`)."""
    return _new(alias, RunStatus.QUEUED, session=session, kind=session.kind, component_id=session.component_id,
                input=text)


def drop_queued(run_id: str, alias: str) -> bool:
    """A queued run is cancelled: it never began, so its row goes. True if it was queued."""
    deleted, _ = Run.objects.using(alias).filter(run_id=run_id, status=RunStatus.QUEUED).delete()
    return bool(deleted)


def still_queued(run_pk: int, alias: str) -> bool:
    """Whether the queued run is still waiting (a cancel from any process ends the wait); renews its claim."""
    return bool(Run.objects.using(alias).filter(pk=run_pk, status=RunStatus.QUEUED).update(
        claimed_until=expiry(timezone.now())))


def claim_unclaimed(run_id: str, session_pk: int, alias: str, now) -> Run | None:
    """Take over a queued run of the session whose waiting process has stopped; None if it is not one."""
    runs = Run.objects.using(alias).filter(run_id=run_id, session_id=session_pk, status=RunStatus.QUEUED)
    unclaimed = runs.filter(claimed_until__lte=now) | runs.filter(claimed_until__isnull=True)
    if not unclaimed.update(claimed_until=expiry(now)):
        return None
    return runs.get()


def claim_left(session_pk: int, alias: str = "default", exclude: tuple[str, ...] = ()) -> float | None:
    """Seconds until the earliest live claim of the session's queued runs (but those of `exclude`, run ids)
    runs out; None when no other queued run is claimed."""
    now = timezone.now()
    runs = Run.objects.using(alias).filter(session_id=session_pk, status=RunStatus.QUEUED, claimed_until__gt=now)
    earliest = runs.exclude(run_id__in=exclude).order_by("claimed_until").values_list("claimed_until", flat=True).first()
    return None if earliest is None else (earliest - now).total_seconds()


def unclaimed(session_pk: int, alias: str = "default", now=None) -> list[Run]:
    """The session's queued runs whose waiting process has stopped, oldest first: runs to take over
    (`Agent.arun(None, run_id=run.run_id, ...)` runs one with its stored input)."""
    runs = Run.objects.using(alias).filter(session_id=session_pk, status=RunStatus.QUEUED)
    now = now or timezone.now()
    return list((runs.filter(claimed_until__lte=now) | runs.filter(claimed_until__isnull=True)).order_by("pk"))


# -- a run's own transitions -------------------------------------------------------------------------


def start_queued(run_pk: int, alias: str, now, **fields) -> bool:
    """queued -> running; False if it was cancelled meanwhile."""
    return bool(_move(alias, {"pk": run_pk}, RunStatus.QUEUED, RunStatus.RUNNING, claimed_until=None, created_at=now,
                      **fields))


def _new(alias: str, status: str, **fields) -> Run:
    if status not in TRANSITIONS[None]:
        raise TransitionError(f"A new run cannot be {status}.")
    run = Run(status=status, **fields)
    writes.insert([run], alias, returning_pk=True)
    return run


def start_new(alias: str, **fields) -> Run:
    """A new run, running at once (a root run that found its session free, a step, a member)."""
    return _new(alias, RunStatus.RUNNING, **fields)


def completed_new(alias: str, **fields) -> Run:
    """A new run that is over as it is made: a component's introduction (store.introduce)."""
    return _new(alias, RunStatus.COMPLETED, **fields)


def end(run_pk: int, status: str, alias: str, **fields) -> int:
    """running (or interrupted meanwhile) -> completed, error or cancelled."""
    return _move(alias, {"pk": run_pk}, (RunStatus.RUNNING, RunStatus.INTERRUPTED), status, **fields)


def pause(run_pk: int, alias: str, **fields) -> str:
    """running (or interrupted meanwhile) -> paused, waiting for a person; a run asked to stop from another
    process meanwhile ends cancelled instead. The status it took."""
    if _move(alias, {"pk": run_pk, "cancel_requested": False}, (RunStatus.RUNNING, RunStatus.INTERRUPTED),
             RunStatus.PAUSED, **fields):
        return RunStatus.PAUSED
    end(run_pk, RunStatus.CANCELLED, alias, finished_at=timezone.now(), **fields)
    cancel_paused_children([run_pk], alias)
    return RunStatus.CANCELLED


def cancel_paused_children(run_pks: list[int], alias: str) -> None:
    """The paused runs under these runs (a team's member, a workflow's step, a member of a team step) end
    cancelled with them: a query per level of the tree."""
    now = timezone.now()
    while run_pks:
        children = Run.objects.using(alias).filter(parent_run_id__in=run_pks)
        run_pks = list(children.filter(status=RunStatus.PAUSED).values_list("pk", flat=True))
        if run_pks:
            _move(alias, {"pk": tuple(run_pks)}, RunStatus.PAUSED, RunStatus.CANCELLED, finished_at=now)


def resume(run_pk: int, alias: str, **fields) -> bool:
    """paused -> running, for a continuation; False if it is not paused (continued or cancelled already)."""
    return bool(_move(alias, {"pk": run_pk}, RunStatus.PAUSED, RunStatus.RUNNING, **fields))


def end_children(parent_pk: int, status: str, alias: str, **fields) -> int:
    """The steps of a run still running end with it (its outcome could not be stored)."""
    return _move(alias, {"parent_run_id": parent_pk}, RunStatus.RUNNING, status, **fields)


def checkpoint(run_pk: int, partial: str, alias: str) -> None:
    """The text so far of a running run."""
    Run.objects.using(alias).filter(pk=run_pk, status=RunStatus.RUNNING).update(content=partial)


def cancel_requested(run_pk: int, alias: str) -> bool:
    return Run.objects.using(alias).filter(pk=run_pk, cancel_requested=True).exists()


def cancel(run_id: str, alias: str = "default") -> bool:
    """Stop a run, from any process: a queued or paused one ends cancelled at once (its waiting process
    hears it at its next look), a running one is asked to stop (its process hears it at once if it is
    this one, else within about a second, through its heartbeat). True if the run was open."""
    local = registry.request_cancel(run_id)
    return cancel_stored(run_id, alias) or local


def cancel_stored(run_id: str, alias: str = "default") -> bool:
    """`cancel`'s part in the database: True if the stored run was open."""
    if drop_queued(run_id, alias):
        return True
    if _move(alias, {"run_id": run_id, "parent_run_id": None}, RunStatus.PAUSED, RunStatus.CANCELLED,
             finished_at=timezone.now()):
        cancel_paused_children(list(Run.objects.using(alias).filter(run_id=run_id, parent_run__isnull=True)
                                    .values_list("pk", flat=True)), alias)
        return True
    return bool(Run.objects.using(alias).filter(run_id=run_id, status=RunStatus.RUNNING).update(cancel_requested=True))
