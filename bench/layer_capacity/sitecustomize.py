"""For bench/load.py --layer-capacity N only: every server process built from this interpreter gets
channels-redis's capacity N instead of the configured one. channels-redis keeps all of a process's socket
channels in one Redis key, so its capacity (100 by default) bounds the messages in flight to every socket
of the process together; past it, messages are dropped (issue 15). This lets the bench measure a server
past that limit; the app's own setting is the fix."""

import os

import channels_redis.core

_init = channels_redis.core.RedisChannelLayer.__init__


def _with_capacity(self, *args, **kwargs):
    kwargs["capacity"] = int(os.environ["BENCH_LAYER_CAPACITY"])
    _init(self, *args, **kwargs)


channels_redis.core.RedisChannelLayer.__init__ = _with_capacity
