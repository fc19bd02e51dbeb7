"""The channel layer over Redis: channels-redis's pub/sub layer, with a bounded queue per socket.

channels-redis offers two layers. The default one keeps each process's messages in Redis lists: a group
send reads the group's members from a sorted set and pushes to every member's list (several commands), and
each process pops its sockets' messages back one blocking pop at a time, in one loop for all its sockets:
under many streaming chats that loop is where a process falls behind. The pub/sub layer sends a group
message with one PUBLISH; Redis hands it to the processes that have a member in the group, and each
process gives it to its own sockets. Its sends, one round trip each under a lock, go out here as
pipelines (`_Shard`). The figures behind this choice are in bench/README.md.

Its one gap: it keeps what a socket has not read yet in an unbounded queue, so a socket that stops
reading (a stalled browser) would hold every frame of every reply in memory. Here a socket's queue holds
`capacity` messages (`channel_capacity` patterns as in Channels' other layers) and a message past that
pushes out the oldest, as channels-redis's list layer drops a full channel's oldest messages. The live
view numbers its frames and resynchronises a socket that missed some (docs/web.md, "Nothing dropped on the
way"), so what is dropped here is never lost text.

Both changes override parts of channels-redis that are not its public API (a shard's `publish` and
`flush`, the loop layer's `_subscribe_to_channel`, the layer's `_get_layer`), because it offers no
setting for either; tests/web/test_channel_layer.py fails if an upgrade reshapes them.
"""

from __future__ import annotations

import asyncio

from channels.layers import BaseChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close, decode_hosts


class DroppingQueue(asyncio.Queue):
    """A queue of at most `maxsize` messages where a new message pushes out the oldest."""

    dropped = 0  # messages pushed out, in this queue

    def put_nowait(self, item) -> None:
        if self.full():
            self.get_nowait()
            self.dropped += 1
        super().put_nowait(item)


class _Shard(RedisSingleShardConnection):
    """channels-redis's connection to one Redis, whose sends go out together: upstream each send is one
    round trip under a lock, so a process's sends wait for each other one at a time, and each costs
    redis-py a command's Python. Here the sends made while one batch is on its way go out next as one
    pipeline: one round trip, in order, whatever the load.
    The lock still guards the subscriptions; the client's creation has no await."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._outbox: list[tuple[str, bytes, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None

    async def publish(self, channel, message) -> None:
        sent = asyncio.get_running_loop().create_future()
        self._outbox.append((channel, message, sent))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_all())
        await sent

    async def _send_all(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            try:
                self._ensure_redis()
                async with self._redis.pipeline(transaction=False) as pipe:
                    for channel, message, _ in batch:
                        pipe.publish(channel, message)
                    await pipe.execute()
            except Exception as exc:  # each sender hears of it (a Redis that is down: the send fails)
                outcome = exc
            else:
                outcome = None
            for *_, sent in batch:
                if sent.done():  # its sender was cancelled while waiting
                    continue
                if outcome is None:
                    sent.set_result(None)
                else:
                    sent.set_exception(outcome)

    async def flush(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        for *_, sent in self._outbox:
            sent.cancel()
        self._outbox = []
        await super().flush()


class _LoopLayer(RedisPubSubLoopLayer):
    """channels-redis's per-event-loop half, with the bounded queues."""

    def __init__(self, hosts=None, *args, capacity: int = 100, channel_capacity: dict | None = None, **kwargs):
        super().__init__(hosts, *args, **kwargs)
        self._shards = [_Shard(host, self) for host in decode_hosts(hosts)]
        capacities = BaseChannelLayer(capacity=capacity)
        capacities.channel_capacity = capacities.compile_capacities(channel_capacity or {})
        self.get_capacity = capacities.get_capacity

    async def _subscribe_to_channel(self, channel: str) -> None:
        # The queue is in place before the subscription, so nothing that arrives is missed.
        self.channels[channel] = DroppingQueue(self.get_capacity(channel))
        await self._get_shard(channel).subscribe(channel)


class ChatChannelLayer(RedisPubSubChannelLayer):
    """`channels_redis.pubsub.RedisPubSubChannelLayer` whose sockets hold at most `capacity` messages."""

    def _get_layer(self) -> _LoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _LoopLayer(*self._args, **self._kwargs, channel_layer=self)
            _wrap_close(self, loop)  # flushed (its connections closed) when the loop closes, as upstream does
        return layer
