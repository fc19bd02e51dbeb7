"""One async core, thin sync adapters.

The engine is written once, as async code. Blocking work (the ORM, sync tools) goes through
`call_sync`, which normally means `sync_to_async(thread_sensitive=True)`.

The sync adapters (`iterate_sync`, `run_sync`) drive the async core on an event loop of the calling
thread (one per thread, kept between calls so the model's HTTP connections are reused). The loop
runs only while the core waits for I/O; whenever the core asks for blocking work, the loop stops and
the work runs right there, on the caller's thread, with no loop running. So a sync run is as if the
code were synchronous: the caller's database connection (and its open transaction, in a test) is
the one the run uses, sync tools run in the caller's thread as Agno runs them, and no thread is
woken for each step. A streamed run is consumed as a plain generator.

Called from a thread whose own event loop is running (a notebook, an async test), the core runs on
a loop in a helper thread instead, and the calling thread still serves every blocking job itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections

T = TypeVar("T")
logger = logging.getLogger(__name__)

_runner: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("sessions_core_sync_runner", default=None)


def _apply(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except DatabaseError:
        drop_lost_connections()
        raise


def drop_lost_connections() -> None:
    """After a database error on this thread: close the connections the server has dropped (a restart, a
    failover), so the next call connects again instead of failing on a dead connection for the rest of
    a long-lived process. A connection inside a transaction is left to its owner, who must roll back."""
    for connection in connections.all(initialized_only=True):
        if (connection.connection is not None and connection.errors_occurred and not connection.in_atomic_block
                and not connection.is_usable()):
            connection.close()


# One wrapper made once: sync_to_async() inspects and wraps its function on every call, which costs
# more than the hop itself on a run's hot path.
_to_thread = sync_to_async(_apply, thread_sensitive=True)


async def call_sync(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run blocking `fn` off the event loop, on the thread that owns the database connection."""
    runner = _runner.get()
    if runner is not None:
        return await runner(_apply, (fn, args, kwargs), {})
    return await _to_thread(fn, args, kwargs)


_shared: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_shared_lock = threading.Lock()


def _shared_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The engine loop for sync calls made where a loop is already running, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid() or not _shared[2].is_alive():  # new, or forked
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sessions-core-loop", daemon=True)
            thread.start()
            _shared = (os.getpid(), loop, thread)
        return _shared[1], _shared[2]


def iterate_sync(make_iterator: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """Consume an async iterator from sync code, serving its `call_sync` jobs on this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _InThread(make_iterator).items()
    return _on_helper_thread(make_iterator)


class _LoopOwner:
    """Owns one thread's engine loop. When the thread ends, this object goes with the thread's local
    data and hands the loop over to be closed by the next sync call, on a thread that can run it
    (a thread being torn down cannot)."""

    def __init__(self):
        self.loop, self.pid = asyncio.new_event_loop(), os.getpid()
        self.closers: list[Callable[[], Awaitable]] = []

    def __del__(self):
        if self.pid == os.getpid():  # a forked child never touches its parent's loop or connections
            _retired.append((self.pid, self.loop, self.closers))


class _ThreadLoop(threading.local):
    """This thread's engine loop, made on first use; a forked child makes its own."""

    owner: _LoopOwner | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        while _retired:
            pid, loop, closers = _retired.popleft()
            if pid == os.getpid():  # left by a thread of this process, not inherited from a parent's
                _close_retired(loop, closers)
        owner = self.owner
        if owner is None or owner.loop.is_closed() or owner.pid != os.getpid():
            owner = self.owner = _LoopOwner()
            _owners[owner.loop] = owner
        return owner.loop


_thread_loop = _ThreadLoop()
_owners: weakref.WeakValueDictionary[asyncio.AbstractEventLoop, _LoopOwner] = weakref.WeakValueDictionary()
_retired: deque[tuple[int, asyncio.AbstractEventLoop, list]] = deque()


def at_loop_close(closer: Callable[[], Awaitable]) -> None:
    """Have `closer()` awaited on the running loop before the engine closes it. Only loops the engine
    made for sync callers are ever closed by it; on any other loop this does nothing."""
    owner = _owners.get(asyncio.get_running_loop())
    if owner is not None:
        owner.closers.append(closer)


def _close_retired(loop: asyncio.AbstractEventLoop, closers: list) -> None:
    """Close the loop of a thread that has ended, and what was opened on it (HTTP connections)."""
    if loop.is_closed() or loop.is_running():
        return
    for closer in closers:
        try:
            loop.run_until_complete(closer())
        except Exception:  # noqa: BLE001 - best effort: the connections die with the loop anyway
            logger.debug("Closing a resource of a finished thread's loop failed", exc_info=True)
    _close_loop(loop)


class _InThread:
    """Drives one async iterator on this thread's loop. The loop runs until the core has something
    for the caller (an item, a job to run, its end); jobs then run here with no loop running, which
    is what Django's ORM asks of a sync caller. Items and jobs are taken in the order they came, so
    the caller sees every event before the core's next blocking step (storing the run's end, say)."""

    def __init__(self, make_iterator: Callable[[], AsyncIterator]):
        self.make_iterator = make_iterator
        self.loop = _thread_loop.get()
        self.inbox: deque = deque()  # ("item", value) and ("job", (fn, args, kwargs, future)), in order
        self.wake: asyncio.Future | None = None

    def _poke(self, *_) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def _runner(self, fn, args, kwargs):
        future = self.loop.create_future()
        self.inbox.append(("job", (fn, args, kwargs, future)))
        self._poke()
        return await future

    async def _pump(self) -> None:
        _runner.set(self._runner)
        async for item in self.make_iterator():
            self.inbox.append(("item", item))
            self._poke()

    def _wait(self, task: asyncio.Task) -> None:
        """Run the loop until the core has something for this thread (or has ended)."""
        if not (self.inbox or task.done()):
            self.wake = self.loop.create_future()
            self.loop.run_until_complete(self.wake)

    @staticmethod
    def _serve(fn, args, kwargs, future: asyncio.Future) -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed back to the coroutine that asked
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(result)

    def _next(self, task: asyncio.Task) -> tuple | None:
        self._wait(task)
        return self.inbox.popleft() if self.inbox else None  # None: the core has ended

    def items(self) -> Iterator:
        task = self.loop.create_task(self._pump())
        task.add_done_callback(self._poke)
        return _deliver(task, lambda: self._next(task), self._serve, task.cancel)


def _deliver(task: asyncio.Task, next_message: Callable[[], tuple | None], serve: Callable,
             cancel: Callable[[], None]) -> Iterator:
    """Hand the core's items to the caller and serve its jobs, in the order they came, until the core
    ends (`next_message()` gives None); then raise what it raised. If the caller stops early (or is
    interrupted), cancel the core and keep serving its clean-up jobs."""
    finished = False
    try:
        while (message := next_message()) is not None:
            kind, payload = message
            if kind == "job":
                serve(*payload)
            else:
                yield payload
        finished = True
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    finally:
        if not finished:
            cancel()
            while (message := next_message()) is not None:
                if message[0] == "job":
                    serve(*message[1])


def _on_helper_thread(make_iterator: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """`iterate_sync` for a thread whose own loop is running: the core runs on another thread's loop."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    loop, thread = _shared_loop()
    private = threading.current_thread() is thread  # a sync call made from inside the engine's own loop
    if private:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="sessions-core-private-loop", daemon=True)

    async def runner(fn, args, kwargs):
        future = loop.create_future()
        inbox.put(("job", (fn, args, kwargs, future)))
        return await future

    async def pump():
        _runner.set(runner)
        async for item in make_iterator():
            inbox.put(("item", item))

    def settle(future: asyncio.Future, result: Any, error: BaseException | None):
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def serve(fn, args, kwargs, future):
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # handed back to the coroutine that asked
            result, error = None, exc
        loop.call_soon_threadsafe(settle, future, result, error)

    def start() -> asyncio.Task:
        task = loop.create_task(pump())
        task.add_done_callback(lambda done: inbox.put(None))
        return task

    if private:
        thread.start()
    task = asyncio.run_coroutine_threadsafe(_call(start), loop).result()
    try:
        yield from _deliver(task, inbox.get, serve, lambda: loop.call_soon_threadsafe(task.cancel))
    finally:
        if private:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            _close_loop(loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close the loop as asyncio.run does: leftover tasks (an HTTP client's closer) are cancelled
    and allowed to clean up first, so no task is destroyed while pending."""
    leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def _call(fn):
    return fn()


def run_sync(make_awaitable: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine to completion from sync code (see `iterate_sync`)."""

    async def single():
        yield await make_awaitable()

    for result in iterate_sync(single):
        return result
    raise RuntimeError("unreachable")
