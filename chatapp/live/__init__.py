"""Live runs for the web chat: runs as tasks that outlive the socket which asked for them, streamed to every
tab of their session through the channel layer, stopped, queued, and caught up with by a page that
(re)connects.

    queue.py      messages handed to their runs; the runs the engine holds queued, and orphans taken over
    runner.py     a run: the message handed to the engine, its events pumped to the session's group
    streaming.py  a run this process is streaming: its text, its numbered token batches, its tool rows
    fragments.py  HTML for a run's events, from view objects made from them; runs drawn from the database
    follower.py   one per socket: the catch-up when it connects, token batches applied in order, gaps filled
    actions.py    what a socket asks besides a message: retry, regenerate or edit, another version, stop
    answers.py    a reply that waits for the user, answered from its cards and continued
    leases.py     whether a run holds a session; runs left running by a process that stopped

The consumer (chatapp/consumers.py) and the views use the names below.
"""

from __future__ import annotations

import asyncio
import time

from .. import titles
from . import runner
from .actions import find_run, regenerate, retry, stop, switch_branch
from .answers import answer
from .follower import ID_MAX, Follower
from .queue import queued, run_queued, submit, take_over_unclaimed

__all__ = ["ID_MAX", "Follower", "answer", "find_run", "queued", "regenerate", "retry", "run_queued", "stop", "submit",
           "switch_branch", "take_over_unclaimed", "wait_idle"]


async def wait_idle(timeout: float = 30) -> None:
    """Wait until no run task or title job of this process is left (tests, shutdown)."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = [*runner.tasks(), *titles.jobs]
        if not tasks:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(tasks)} live task(s) still running")
        await asyncio.wait(tasks, timeout=remaining)
