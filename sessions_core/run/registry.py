"""This process's runs: who is running, which were asked to stop, and who waits for a session's lease.

A stop asked in this process is seen between streamed chunks, and a run waiting for the model's next
chunk is interrupted at once. A stop asked before the run started is kept and cancels it when it
starts (Agno keeps the intent too); a run of this process still waiting to start (queued, or about to
be) ends at its next look, dropping its queued row itself. Other processes see a stop through `Run.cancel_requested` at
the run's next checkpoint.

Runs waiting for a session's lease held in this process are woken as soon as it is released; runs
waiting on another process's lease poll with a short back-off.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Protocol

KEPT_STOP_REQUESTS = 1024  # stops asked for runs not (yet) running here, oldest forgotten first


class Interruptible(Protocol):
    def interrupt(self) -> None: ...


_lock = threading.Lock()
_running: dict[str, Interruptible] = {}
_stop_requested: OrderedDict[str, None] = OrderedDict()
_lease_waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}


def register(run_id: str, run: Interruptible) -> None:
    with _lock:
        _running[run_id] = run


def unregister(run_id: str) -> None:
    with _lock:
        _running.pop(run_id, None)
        _stop_requested.pop(run_id, None)


def stop_requested(run_id: str) -> bool:
    return run_id in _stop_requested


def request_cancel(run_id: str) -> bool:
    """Stop a run of this process (registered as it waits its turn, and while it runs): interrupted at once;
    one waiting ends where it waits. False if it is not here (the request is kept for its start)."""
    with _lock:
        run = _running.get(run_id)
        _stop_requested[run_id] = None
        _stop_requested.move_to_end(run_id)
        while len(_stop_requested) > KEPT_STOP_REQUESTS:
            _stop_requested.popitem(last=False)
    if run is not None:
        run.interrupt()
    return run is not None


def notify_lease_released(session_pk: int) -> None:
    with _lock:
        waiters = _lease_waiters.pop(session_pk, [])
    for loop, event in waiters:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # that loop has closed
            pass


async def wait_for_lease(session_pk: int, timeout: float) -> None:
    event = asyncio.Event()
    with _lock:
        _lease_waiters.setdefault(session_pk, []).append((asyncio.get_running_loop(), event))
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
