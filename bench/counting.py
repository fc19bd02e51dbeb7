"""daphne with counters: SQL statements, template renders, channel-layer sends and thread hops
(sync_to_async calls), each also by the innermost function of the app that made it, written as JSON to $BENCH_COUNT_FILE ten times a second. bench/load.py --count
serves the app through this instead of scripts/serve (after the same migrate and collectstatic) and
divides the counts of a wave by its messages.

    python bench/counting.py -b 127.0.0.1 -p 8000 chatapp.asgi:application
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from functools import wraps

counts: Counter = Counter()


def caller() -> str:
    """The innermost function of the app (chatapp/, sessions_core/) on this thread's stack."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/chatapp/" in path or "/sessions_core/" in path:
            return f"{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "elsewhere (channels, Django)"


def counted(owner, name: str, key: str, by_caller: bool = False) -> None:
    original = getattr(owner, name)

    def count() -> None:
        counts[key] += 1
        if by_caller:
            counts[f"{key} <- {caller()}"] += 1

    if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # a coroutine function
        @wraps(original)
        async def wrapper(*args, **kwargs):
            count()
            return await original(*args, **kwargs)
    else:
        @wraps(original)
        def wrapper(*args, **kwargs):
            count()
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def install() -> None:
    import channels.layers
    import channels_redis.core
    import channels_redis.pubsub
    from asgiref.sync import SyncToAsync
    from django.db.backends import utils
    from django.template.backends import django as django_backend

    counted(utils.CursorWrapper, "execute", "sql", by_caller=True)
    counted(utils.CursorWrapper, "executemany", "sql", by_caller=True)
    counted(django_backend.Template, "render", "renders", by_caller=True)
    for layer in (channels_redis.core.RedisChannelLayer, channels_redis.pubsub.RedisPubSubLoopLayer,
                  channels.layers.InMemoryChannelLayer):
        counted(layer, "group_send", "group_sends")
        counted(layer, "send", "sends")
    counted(SyncToAsync, "__call__", "sync_to_async", by_caller=True)


def dump(path: str) -> None:
    while True:
        with open(path + ".tmp", "w") as file:
            json.dump(dict(counts), file)
        os.replace(path + ".tmp", path)
        time.sleep(0.1)


if __name__ == "__main__":
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    django.setup()
    install()
    threading.Thread(target=dump, args=(os.environ["BENCH_COUNT_FILE"],), daemon=True).start()
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()
