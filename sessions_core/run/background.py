"""Work that follows a reply and calls the model (the user-memory update, the session summary, and the
web's chat titles) waits its turn, so that it never comes ahead of anyone's first words:

    async with background.turn():
        ...  # the model call

At most AT_ONCE such jobs run at a time in an event loop, and each starts only once no run of this
process is waiting for its model's first chunk, or after FIRST_WORDS_WAIT seconds (a model that never
answers does not hold the work up for good). A run counts as waiting from its start until its model's
first chunk (`awaiting_first_words` / `heard`) or its end.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

AT_ONCE = 2
FIRST_WORDS_WAIT = 10.0

_lock = threading.Lock()
_awaiting: set[str] = set()  # runs of this process started and not yet answered by their model
_idle_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
_waiting = 0  # jobs waiting for a run's first words


def awaiting_first_words(run_id: str) -> None:
    with _lock:
        _awaiting.add(run_id)


def heard(run_id: str) -> None:
    """The run's model answered (or the run ended): work waiting only for it may start."""
    with _lock:
        if run_id not in _awaiting:
            return
        _awaiting.discard(run_id)
        waiters = [] if _awaiting else _idle_waiters[:]
        if waiters:
            _idle_waiters.clear()
    for loop, event in waiters:
        with suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(event.set)


def waiting() -> int:
    """How many jobs of this process wait for a run's first words."""
    return _waiting


@asynccontextmanager
async def turn() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(AT_ONCE)
    async with slots:
        await _first_words_heard(loop)
        yield


async def _first_words_heard(loop: asyncio.AbstractEventLoop) -> None:
    global _waiting
    event = asyncio.Event()
    with _lock:
        if not _awaiting:
            return
        _idle_waiters.append((loop, event))
        _waiting += 1
    try:
        with suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), FIRST_WORDS_WAIT)
    finally:
        with _lock:
            _waiting -= 1
            with suppress(ValueError):
                _idle_waiters.remove((loop, event))
