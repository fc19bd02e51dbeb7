"""One async core, thin sync adapters.

The engine is written once, as async code. Blocking work (the ORM, sync tools) goes through
`call_sync`, which normally means `sync_to_async(thread_sensitive=True)`. The sync adapters
(`iterate_sync`, `run_sync`) run the async core on an event loop in a helper thread while the
calling thread serves every `call_sync` job itself: the caller's database connection (and its open
transaction, in a test) is the one the run uses, exactly as if the code were synchronous, and a
streamed run can still be consumed as a plain generator.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

T = TypeVar("T")

_runner: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("sessions_core_sync_runner", default=None)


def _apply(fn, args, kwargs):
    return fn(*args, **kwargs)


# One wrapper made once: sync_to_async() inspects and wraps its function on every call, which costs
# more than the hop itself on a run's hot path.
_to_thread = sync_to_async(_apply, thread_sensitive=True)


async def call_sync(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run blocking `fn` off the event loop, on the thread that owns the database connection."""
    runner = _runner.get()
    if runner is not None:
        return await runner(fn, args, kwargs)
    return await _to_thread(fn, args, kwargs)


_shared: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_shared_lock = threading.Lock()


def _shared_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The process's engine loop, started on first use: sync calls reuse it (and the model's HTTP
    connections on it) instead of paying for a new loop and thread each time."""
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
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    loop, thread = _shared_loop()
    private = threading.current_thread() is thread  # a sync call made from inside the engine's own loop
    if private:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="sessions-core-private-loop", daemon=True)

    async def runner(fn, args, kwargs):
        future = loop.create_future()
        inbox.put(("call", (fn, args, kwargs, future)))
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
        task.add_done_callback(lambda done: inbox.put(("finished", done)))
        return task

    if private:
        thread.start()
    task = asyncio.run_coroutine_threadsafe(_call(start), loop).result()
    finished = False
    try:
        while (message := inbox.get())[0] != "finished":
            kind, payload = message
            if kind == "call":
                serve(*payload)
            else:
                yield payload
        finished = True
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    finally:
        if not finished:
            # The caller stopped early: cancel the core and keep serving its clean-up calls.
            loop.call_soon_threadsafe(task.cancel)
            while (message := inbox.get())[0] != "finished":
                if message[0] == "call":
                    serve(*message[1])
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
