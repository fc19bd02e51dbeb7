"""daphne with counters: SQL statements, template renders, channel-layer sends and thread hops
(sync_to_async calls), written as JSON to $BENCH_COUNT_FILE ten times a second. bench/load.py --count
serves the app through this instead of scripts/serve (after the same migrate and collectstatic) and
divides the counts of a wave by its messages.

    python bench/counting.py -b 127.0.0.1 -p 8000 chatapp.asgi:application
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from functools import wraps

counts: Counter = Counter()


def counted(owner, name: str, key: str) -> None:
    original = getattr(owner, name)

    if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # a coroutine function
        @wraps(original)
        async def wrapper(*args, **kwargs):
            counts[key] += 1
            return await original(*args, **kwargs)
    else:
        @wraps(original)
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def install() -> None:
    import channels.layers
    import channels_redis.core
    from asgiref.sync import SyncToAsync
    from django.db.backends import utils
    from django.template.backends import django as django_backend

    counted(utils.CursorWrapper, "execute", "sql")
    counted(utils.CursorWrapper, "executemany", "sql")
    counted(django_backend.Template, "render", "renders")
    for layer in (channels_redis.core.RedisChannelLayer, channels.layers.InMemoryChannelLayer):
        counted(layer, "group_send", "group_sends")
        counted(layer, "send", "sends")
    counted(SyncToAsync, "__call__", "sync_to_async")


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
