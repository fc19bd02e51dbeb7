"""The web's own database work on threads of its own, beside the thread the engine's queries use.

Django runs every `sync_to_async` call of a process (thread-sensitive, the default) on one thread, one
call at a time: a socket's session read before a message, or the rendering of a finished reply, waits
behind every other chat's engine work, and the engine's behind it. The calls sent here need no one
else's connection or transaction (a read, a render, an update of their own), so they run on a few
threads of their own (CHAT_DB_THREADS; 0 puts them back on the shared thread), each closing its
connections when it is done (back to the PostgreSQL pool; a SQLite file is simply opened again).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections

T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None


def _closing(fn: Callable[..., T], args, kwargs) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:  # made on first use: after a server forks its workers
        _executor = ThreadPoolExecutor(settings.CHAT_DB_THREADS, thread_name_prefix="chat-db")
    return _executor


async def run(fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` on one of the web's database threads."""
    if not settings.CHAT_DB_THREADS:
        return await sync_to_async(fn)(*args, **kwargs)
    return await sync_to_async(_closing, thread_sensitive=False, executor=_pool())(fn, args, kwargs)
