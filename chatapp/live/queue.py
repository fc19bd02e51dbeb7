"""The messages waiting for their run, as the web sees them. The engine owns the queue
(sessions_core/run/lifecycle.py): a message sent while its session's run is in flight is a queued `Run`
row, with its text, that starts in order whichever process sent it, and a queued run whose process
stopped (a restart) is taken over by the next process that serves the session (`take_over_unclaimed`).

    submit(session, user, text, branch=None) -> Prompt   hand a message to a run task of its own
    take_over_unclaimed(session) -> bool                       run the queued runs no process waits for
    run_queued(session, owner, run)                            run one queued run here (a new chat's first message)
    take_over_when_unclaimed(session)                         ...and those of other processes as their claims run out
    waiting(session_pk) / queued(session_pk)             the queued runs, oldest first (sync / async)
    store_first_message(session, text) -> Run            a new chat's first message, for its page to run

The run task (chatapp/live/runner.py) shows its message queued while the engine holds it, and drawn as a
run once it starts; Stop of a queued message is the engine's `cancel_run` (chatapp/live/actions.py).
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model

from sessions_core.models import ChatSession, Run, RunStatus
from sessions_core.run import lifecycle
from sessions_core.run.base import new_run_id

from . import runner
from .runner import Prompt


async def submit(session: ChatSession, user, text: str, branch: tuple[str, str] | None = None) -> Prompt:
    """Run `text` on the session (the engine queues it behind the run in flight); with `branch`, as a new
    version of that run (regenerated, or edited to `text`)."""
    # A message that may run at once keeps the row the socket just read; one that waits reads it as it starts.
    item = Prompt(text=text, user=user, branch=branch, session=None if session.is_running else session,
                  run_id="" if branch else new_run_id())
    runner.name_new_chat(session, item)
    runner.start(session.pk, session.owner_id, item)
    await item.stored.wait()  # stored when this returns: counted by the rate limits, kept through a restart
    return item


def _rows(session_pk: int):
    return Run.objects.filter(session_id=session_pk, status=RunStatus.QUEUED, parent_run__isnull=True).order_by("pk")


def waiting(session_pk: int) -> list[Run]:
    return list(_rows(session_pk).only("run_id", "input"))


async def queued(session_pk: int) -> list[Run]:
    return [run async for run in _rows(session_pk).only("run_id", "input")]


def store_first_message(session: ChatSession, text: str) -> Run:
    """A new chat's first message, queued for the chat's page: its socket runs it (`take_over_unclaimed`)."""
    return lifecycle.enqueue(session, text)


async def take_over_unclaimed(session: ChatSession) -> bool:
    """Run here, in order, the session's queued runs no process waits for (the process that queued them has
    stopped, or a new chat's first message). True if there were any. Another process taking one over at
    the same moment wins it or loses it whole (the engine claims it)."""
    mine = runner.waiting_run_ids(session.pk)  # (taken over here a moment ago, by another tab's socket)
    unclaimed = [run for run in await sync_to_async(lifecycle.unclaimed)(session.pk) if run.run_id not in mine]
    if not unclaimed:
        return False
    owner = await get_user_model().objects.filter(pk=session.owner_id).afirst()
    for run in unclaimed:
        run_queued(session, owner, run)
    return True


def run_queued(session: ChatSession, owner, run: Run) -> None:
    """Run the session's queued `run` here, as a task of its own (the engine claims it as it starts)."""
    item = Prompt(text=run.input, user=owner, run_id=run.run_id, take_over=True)
    runner.name_new_chat(session, item)
    runner.start(session.pk, session.owner_id, item)


async def take_over_when_unclaimed(session: ChatSession) -> None:
    """Take over the session's queued runs that another process waits for if that process stops (their
    claims run out), until none is left waiting elsewhere."""
    while True:
        mine = runner.waiting_run_ids(session.pk)
        left = await sync_to_async(lifecycle.claim_left)(session.pk, exclude=mine)
        if left is None:
            return
        await asyncio.sleep(left + settings.CHAT_LEASE_GRACE_SECONDS)  # a deadline, not a wait on a condition
        await take_over_unclaimed(session)
