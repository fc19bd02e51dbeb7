"""The web's queue of messages waiting for their run. The engine is to own this queue (queued runs); until
then this module is all of the web's, behind these functions, and the rest of the web calls only them:

    submit(session, user, text, branch=None) -> Pending   run the message now, or after those waiting
    drop(session, queued_id) -> bool                      Stop of a waiting message (from a tab of any process)
    stop_before_start(session_pk) -> bool                 Stop pressed before the next message's run started
    adopt_orphans(session) -> bool                        run the stored queue no process is working through
    waiting(session_pk) -> list[QueuedMessage]            the messages waiting, oldest first (sync)
    queued(session_pk) -> list[QueuedMessage]             the same, async
    store_first_message(session, user, text) -> None      a new chat's first message, run by its page (sync)
    waiting_count(user) -> int                            the user's messages waiting (sync; rate limits)
    tasks() -> tuple[asyncio.Task, ...]                   this process's queue tasks (wait_idle)

A message that can run at once goes to its run (chatapp/live/runner.py) with nothing written for it. One
that waits (behind a run of this process, or another's lease on the row the socket read) is a
`QueuedMessage` row until its run starts, so a process that stops loses none: the next socket to find the
session idle with rows left runs them (`adopt_orphans`). Each session with messages in this process has a
task that takes them in order: one whose turn comes while a run of another process holds the session stays
stored until that run lets go, so a tab served by any process can still drop it; its row is deleted as its
run starts, so no message runs twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from sessions_core.run import registry as run_registry
from sessions_core.models import ChatSession

from .. import rendering
from ..broadcast import abroadcast_to_session
from ..models import QueuedMessage, new_queued_id
from . import leases, runner
from .fragments import QUEUED_STATUS

logger = logging.getLogger("chatapp.live")


@dataclass
class Pending(runner.Prompt):
    """A message waiting for its run to start."""

    queued_id: str = field(default_factory=new_queued_id)
    shown_queued: bool = False  # a queued note was sent for it (and it has a row)
    row_pk: int | None = None  # its QueuedMessage, deleted when its run starts


@dataclass
class _SessionQueue:
    session_pk: int
    owner_pk: int | None
    pending: deque[Pending] = field(default_factory=deque)
    starting: Pending | None = None  # taken off the queue, its run not started yet
    task: asyncio.Task | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


_queues: dict[int, _SessionQueue] = {}


def _queue(session: ChatSession) -> _SessionQueue:
    queue = _queues.get(session.pk)
    if queue is None:
        queue = _queues[session.pk] = _SessionQueue(session.pk, session.owner_id)
    return queue


def _work(queue: _SessionQueue) -> None:
    if not queue.busy:
        queue.task = asyncio.create_task(_drain(queue), name=f"chat-queue-{queue.session_pk}")


def tasks() -> tuple[asyncio.Task, ...]:
    return tuple(queue.task for queue in _queues.values() if queue.busy)


async def submit(session: ChatSession, user, text: str, branch: tuple[str, str] | None = None) -> Pending:
    """Run `text` on the session now, or after the messages waiting and the run in flight; with `branch`,
    as a new version of that run (regenerated, or edited to `text`)."""
    queue = _queue(session)
    item = Pending(text=text, user=user, branch=branch)
    must_wait = queue.busy or bool(queue.pending) or session.is_running
    if must_wait:
        row = await QueuedMessage.objects.acreate(session_id=session.pk, user=user, text=text,
                                                  queued_id=item.queued_id)
        item.row_pk, item.shown_queued = row.pk, True
    else:
        item.session = session
    runner.name_new_chat(session, item)
    queue.pending.append(item)
    if must_wait:
        note = rendering.render_oob(rendering.render_queued(item), "beforeend:#queue")
        await abroadcast_to_session(session.pk, note + rendering.render_status(QUEUED_STATUS))
    _work(queue)
    return item


async def drop(session: ChatSession, queued_id: str) -> bool:
    """Drop a waiting message: its row is deleted, so whichever process holds it skips it."""
    deleted, _ = await QueuedMessage.objects.filter(session_id=session.pk, queued_id=queued_id).adelete()
    queue = _queues.get(session.pk)
    for item in queue.pending if queue else ():
        if item.queued_id == queued_id:
            item.cancelled = True
            queue.pending.remove(item)
            break
    if deleted:
        await abroadcast_to_session(session.pk, rendering.render_delete("li", f"queued-{queued_id}")
                                    + rendering.render_status("Queued message removed."))
    return bool(deleted)


def stop_before_start(session_pk: int) -> bool:
    """Stop the message taken off the queue whose run has not started yet: it is cancelled as it starts."""
    queue = _queues.get(session_pk)
    item = queue.starting if queue else None
    if item is None or item.run_id:
        return False
    item.cancelled = True
    return True


def _rows(session_pk: int):
    """The session's messages waiting for their run, oldest first (in this process or another)."""
    return QueuedMessage.objects.filter(session_id=session_pk).order_by("pk")


def waiting(session_pk: int) -> list[QueuedMessage]:
    return list(_rows(session_pk))


async def queued(session_pk: int) -> list[QueuedMessage]:
    return [row async for row in _rows(session_pk)]


def store_first_message(session: ChatSession, user, text: str) -> None:
    """A new chat's first message, waiting for the chat's page: its socket runs it (`adopt_orphans`)."""
    QueuedMessage.objects.create(session=session, user=user, text=text)


def waiting_count(user) -> int:
    return QueuedMessage.objects.filter(user=user).count()


async def adopt_orphans(session: ChatSession) -> bool:
    """Run here the session's stored queue that no process is working through (the process it was sent
    to has stopped), in order. True if there was something to run."""
    queue = _queues.get(session.pk)
    if (queue is not None and (queue.busy or queue.pending)) or await leases.running_elsewhere(session):
        return False
    rows = [row async for row in _rows(session.pk).select_related("user")]
    if not rows:
        return False
    queue = _queue(session)  # looked up again: this coroutine waited above
    held = {item.row_pk for item in queue.pending}
    queue.pending.extend(Pending(text=row.text, user=row.user, queued_id=row.queued_id, shown_queued=True,
                                 row_pk=row.pk) for row in rows if row.pk not in held)
    _work(queue)
    return True


async def _drain(queue: _SessionQueue) -> None:
    try:
        while queue.pending:
            item = queue.pending.popleft()
            if item.cancelled:
                continue
            queue.starting = item  # from here a Stop without a run id stops it (as its run starts)
            try:
                if item.shown_queued:
                    await _wait_for_other_processes(queue)
                    if not await _take(item):
                        continue
                    removed = rendering.render_delete("li", f"queued-{item.queued_id}")
                    await abroadcast_to_session(queue.session_pk, removed)
                await runner.start(queue.session_pk, queue.owner_pk, item)
            except Exception:
                logger.exception("A message of session %s could not be run", queue.session_pk)
                await runner.report_failure(queue.session_pk)
            finally:
                queue.starting = None
    finally:
        task = asyncio.current_task()
        if queue.pending and not (task and task.cancelling()):
            # A message arrived while this task was closing down: it must not be left waiting.
            queue.task = asyncio.create_task(_drain(queue), name=f"chat-queue-{queue.session_pk}")
        elif _queues.get(queue.session_pk) is queue:
            del _queues[queue.session_pk]


async def _wait_for_other_processes(queue: _SessionQueue) -> None:
    """While a run of another process holds the session, wait before taking the next message off the
    stored queue, where a tab served by any process can still drop it (the engine would wait for the
    lease all the same, with the message no longer stored). Polled with the engine's back-off."""
    delay = 0.005
    while await leases.lease_left(queue.session_pk, queue.owner_pk) is not None:
        await run_registry.wait_for_lease(queue.session_pk, delay)
        delay = min(delay * 2, 0.25)


async def _take(item: Pending) -> bool:
    """Take the message off the stored queue to run it now; False if it is gone (dropped, or taken by
    another process that adopted it)."""
    deleted, _ = await QueuedMessage.objects.filter(pk=item.row_pk).adelete()
    return bool(deleted)
