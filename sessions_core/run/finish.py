"""A root run's finish: its messages, the state and every change of it, the lease and its outcome, stored in
one transaction; tried again while the database connection is lost; a refused outcome still frees the
session at once.

A pause (a run that waits for a person) is stored the same way: its messages so far, its state changes
(committed and versioned as a finished run's), the lease released; the run moves to `paused` with its
requirements instead of ending.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.utils import timezone

from .. import state as state_module
from ..bridge import call_sync
from ..models import ChatSession, Run, RunStatus
from ..storable import replace_unstorable
from . import lifecycle, registry, store

logger = logging.getLogger("sessions_core")

FINISH_RETRY_SECONDS = 10.0  # how long storing a run's outcome is tried again while the database is unreachable


async def finish(run, status: str, error: str) -> None:
    """Store how `run` (a RootRun) ended and set its output's state; the lease is released either way."""
    out = run.output
    error = replace_unstorable(error)
    run._settle_output(status, error)
    keep_state = status in (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.PAUSED)
    try:
        out.session_state, out.state_version, stored = await _store_outcome(run, status, error, keep_state)
        if stored != status:  # a pause that a stop from another process turned into a cancellation
            run.outcome = (stored, error, "")
            run._settle_output(stored, error)
    except DatabaseError as exc:
        # The database refused the outcome: say so on the run and free the session now, rather than
        # leave the run "running" and the next one waiting for the lease to expire.
        logger.exception("Run %s in session %s: its outcome could not be stored", run.run_id, run.session_id)
        error = replace_unstorable(f"The run's outcome could not be stored ({type(exc).__name__}: {exc}).")
        out.status, out.error, out.content = RunStatus.ERROR, error, error
        try:
            await call_sync(_store_failure, run, error)
        except DatabaseError:  # unreachable still: the run is settled as interrupted when its lease expires
            logger.exception("Run %s: its failure could not be stored either", run.run_id)
        out.session_state, out.state_version = json.loads(run.start.base_text), run.start.base_version
    out.messages.extend(run.new_messages)
    registry.notify_lease_released(run.start.session_pk)


async def _store_outcome(run, status, error, keep_state) -> tuple[dict, int]:
    """`store_outcome`, tried again while what fails is the connection (the database server restarting
    or failing over), for up to FINISH_RETRY_SECONDS: each try is one transaction on a new connection
    (call_sync drops the lost one), and none is made once an earlier commit is found to have got
    through before its connection went."""
    deadline, pause, tried = time.monotonic() + FINISH_RETRY_SECONDS, 0.1, False
    while True:
        try:
            stored = await call_sync(_stored_outcome, run) if tried else None
            if stored is not None:  # an earlier try's commit got through before its connection went
                return stored
            tried = True
            return await call_sync(store_outcome, run, status, error, keep_state)
        except (OperationalError, InterfaceError) as exc:
            if time.monotonic() + pause > deadline:
                raise
            logger.warning("Run %s: storing its outcome is tried again (%s: %s)", run.run_id, type(exc).__name__, exc)
        await asyncio.sleep(pause)  # a back-off between tries, not a wait for a condition
        pause = min(pause * 2, 1.0)


def _stored_outcome(run) -> tuple[dict, int, str] | None:
    """The session's state and version and the run's status if its outcome is stored already, else None."""
    status = Run.objects.using(run.alias).filter(pk=run.start.run_pk).values_list("status", flat=True).get()
    if status == RunStatus.RUNNING:
        return None
    session = ChatSession.objects.using(run.alias).only("session_state", "state_version").get(pk=run.start.session_pk)
    return session.session_state, session.state_version, status


def _store_failure(run, error: str) -> None:
    """The run failed to store its outcome: mark it (and its steps) failed and release the lease."""
    now, alias, start = timezone.now(), run.alias, run.start
    with transaction.atomic(using=alias):
        lifecycle.end(start.run_pk, RunStatus.ERROR, alias, error=error, content=error, finished_at=now)
        lifecycle.end_children(start.run_pk, RunStatus.ERROR, alias, error=error, finished_at=now)
        lifecycle.release_lease(start.session_pk, run.lease_token, alias, now)


def store_outcome(run, status, error, keep_state) -> tuple[dict, int, str]:
    """Store the outcome in one transaction; the state and version stored, and the run's status. A failed
    run keeps the state as it was; otherwise the state as of the run's last recorded change is stored."""
    alias, start, tracker, now = run.alias, run.start, run.tracker, timezone.now()
    changes = [(*change, None) for change in start.changes] + tracker.changes if keep_state else []
    # A paused run keeps its tool traffic whatever store_tool_messages says: its continuation sends it.
    messages = run.new_messages if status == RunStatus.PAUSED else run.stored_messages()
    with transaction.atomic(using=alias):
        # The usual case: the run still holds the lease (so its seqs are the session's) and nobody edited
        # the state meanwhile (so its changes apply as they are).
        state = json.loads(tracker.state_text if changes else start.base_text)
        first_version, last_seq = start.base_version, run.last_seq + len(messages)
        fields = {"last_seq": last_seq}
        if changes:
            fields.update(session_state=state, state_version=first_version + len(changes))
        if not lifecycle.release_lease(start.session_pk, run.lease_token, alias, now, at_version=first_version,
                                       **fields):
            state, changes, first_version, last_seq = _merge_onto_session(run, keep_state, changes, messages, now)
        rows, _ = store.message_rows(start.session_pk, start.run_pk, messages, last_seq - len(messages), now,
                                     run.run_id)
        store.insert_messages(rows, alias)
        store.insert_changes(start.session_pk, changes, first_version, start.run_pk, now, alias)
        version = first_version + len(changes)
        fields = {"state_version": version, **run.outcome_fields(error)}
        if status == RunStatus.PAUSED:
            status = lifecycle.pause(start.run_pk, alias, **fields)
        else:
            if run.continued and not run.config.store_tool_messages:  # what it kept while it waited
                store.drop_tool_messages(start.run_pk, alias)
            lifecycle.end(start.run_pk, status, alias, finished_at=now, **fields)
    return state, version, status


def _merge_onto_session(run, keep_state, changes, messages, now):
    """The lease was lost or the state was edited during the run: merge onto the locked row. Returns the
    state, the changes as they apply to it, the version before them and the session's new last seq."""
    alias = run.alias
    session = ChatSession.objects.using(alias).select_for_update().only(
        "session_state", "state_version", "lease_token", "last_seq").get(pk=run.start.session_pk)
    state, first_version = session.session_state, session.state_version
    if keep_state:  # replay this run's changes on the state as it is now
        state, changes = rebase(state, changes)
    last_seq = max(session.last_seq, run.last_seq) + len(messages)
    fields = {"last_seq": last_seq, "session_state": state, "state_version": first_version + len(changes)}
    if not lifecycle.release_lease(session.pk, run.lease_token, alias, now, **fields):
        # The lease expired and another run took it: store this run's work without touching its lease.
        ChatSession.objects.using(alias).filter(pk=session.pk).update(last_activity_at=now, **fields)
    return state, changes, first_version, last_seq


def rebase(current: dict, changes: list) -> tuple[dict, list]:
    """Replay `changes` on `current`: the final state, and the changes as they apply to it (each diffed
    again, so its inverse patch undoes exactly that step and state_at() stays exact)."""
    state, rebased = current, []
    for patch, _inverse, source, made_by in changes:
        try:
            after = state_module.apply_patch(state, patch)
        except Exception:  # jsonpatch conflicts: the later writer's value for those keys stands
            logger.warning("State change from %s no longer applies after a concurrent edit", source)
            continue
        if after != state:
            rebased.append((*state_module.diff(state, after), source, made_by))
            state = after
    return state, rebased
