"""The app's channel layer over a real Redis (chatapp/channel_layer.py): groups across processes, and a
socket's bounded queue that drops its oldest messages.

Two layer objects stand for two server processes: each has its own subscriptions and queues, and only
Redis joins them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time

import pytest
from redis import exceptions as redis_errors

from chatapp.channel_layer import ChatChannelLayer, DroppingQueue
from tests.e2e.conftest import _free_port, redis_url  # noqa: F401  (fixture)


@pytest.fixture
def layers(redis_url):  # noqa: F811  (the suite's Redis)
    def make(**config):
        return ChatChannelLayer(hosts=[redis_url], prefix=f"layer{os.getpid()}", **config)
    return make


async def _receive(layer, channel, timeout=5.0):
    return await asyncio.wait_for(layer.receive(channel), timeout)


def test_a_full_queue_drops_its_oldest_message():
    queue = DroppingQueue(3)
    for n in range(5):
        queue.put_nowait(n)
    assert [queue.get_nowait() for _ in range(3)] == [2, 3, 4]
    assert queue.dropped == 2


def test_a_group_message_reaches_its_members_in_every_process_once(layers):
    asyncio.run(_groups(layers))


async def _groups(layers):
    here, there = layers(), layers()
    try:
        mine, theirs, other = await here.new_channel(), await there.new_channel(), await there.new_channel()
        await here.group_add("chat-1", mine)
        await there.group_add("chat-1", theirs)
        await there.group_add("chat-2", other)
        await here.group_send("chat-1", {"type": "chat.html", "html": "<p>hi</p>"})
        assert await _receive(here, mine) == {"type": "chat.html", "html": "<p>hi</p>"}
        assert await _receive(there, theirs) == {"type": "chat.html", "html": "<p>hi</p>"}
        await there.group_send("chat-2", {"type": "chat.html", "html": "after"})
        assert (await _receive(there, other))["html"] == "after"  # chat-1's message never came here
        await there.group_discard("chat-1", theirs)
        await here.group_send("chat-1", {"type": "chat.html", "html": "again"})
        assert (await _receive(here, mine))["html"] == "again"
        await there.send(other, {"type": "chat.html", "html": "direct"})  # to one socket, by name
        assert (await _receive(there, other))["html"] == "direct"
        assert there._get_layer().channels[theirs].empty()  # left the group: nothing more came to it
    finally:
        await here.flush()
        await there.flush()


def test_a_socket_that_stops_reading_keeps_the_newest_messages_up_to_its_capacity(layers):
    asyncio.run(_stalled(layers))


async def _stalled(layers):
    sender, reader = layers(), layers(capacity=5, channel_capacity={"*watch*": 1000})
    try:
        slow, watch = await reader.new_channel(), await reader.new_channel(prefix="watch.")
        for channel in (slow, watch):
            await reader.group_add("chat-3", channel)
        for seq in range(1, 13):
            await sender.group_send("chat-3", {"type": "chat.tokens", "seq": seq})
        # Everything has arrived once the channel that holds everything has it all.
        assert [(await _receive(reader, watch))["seq"] for _ in range(12)] == list(range(1, 13))
        assert [(await _receive(reader, slow))["seq"] for _ in range(5)] == [8, 9, 10, 11, 12]
        assert reader._get_layer().channels[slow].dropped == 7
    finally:
        await sender.flush()
        await reader.flush()


def test_many_sends_at_once_go_out_in_order_on_few_connections(redis_url):  # noqa: F811
    asyncio.run(_burst(redis_url))


async def _burst(redis_url):  # noqa: F811
    # Sends made together go out as pipelines, in the order they were made, on one connection at a time:
    # redis-py's pool (here 3 connections, the subscriptions' one included) refuses a command past its size.
    host = {"address": redis_url, "max_connections": 3}
    sender, reader = ChatChannelLayer(hosts=[host]), ChatChannelLayer(hosts=[redis_url], capacity=1000)
    try:
        channel = await reader.new_channel()
        await reader.group_add("chat-5", channel)
        await asyncio.gather(*(sender.group_send("chat-5", {"type": "chat.tokens", "seq": n}) for n in range(300)))
        assert [(await _receive(reader, channel))["seq"] for _ in range(300)] == list(range(300))
    finally:
        await sender.flush()
        await reader.flush()


class _OwnRedis:
    """A redis-server of this test's own, which it may restart (the suite's shared one is never touched)."""

    def __init__(self, tmp_path):
        self.port, self.folder = _free_port(), tmp_path

    def start(self) -> None:
        subprocess.run(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(self.folder / "redis.pid"),
                        "--dir", str(self.folder)], check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self._answers():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)  # polling a port: there is no event to wait on

    def stop(self) -> None:
        pidfile = self.folder / "redis.pid"
        if not pidfile.exists():  # not running (it removes the file as it stops)
            return
        os.kill(int(pidfile.read_text()), signal.SIGTERM)  # as scripts/test stops its own
        deadline = time.monotonic() + 10
        while self._answers():
            assert time.monotonic() < deadline, "redis-server did not stop"
            time.sleep(0.02)  # polling a port: there is no event to wait on

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False


def test_a_restarted_redis_delivers_again_to_the_sockets_that_were_subscribed(tmp_path):
    redis = _OwnRedis(tmp_path)
    redis.start()
    try:
        asyncio.run(_through_a_restart(redis))
    finally:
        redis.stop()


async def _through_a_restart(redis):
    url = f"redis://127.0.0.1:{redis.port}/0"
    sender, reader = ChatChannelLayer(hosts=[url]), ChatChannelLayer(hosts=[url])
    try:
        channel = await reader.new_channel()
        await reader.group_add("chat-4", channel)
        await sender.group_send("chat-4", {"type": "chat.html", "html": "before"})
        assert (await _receive(reader, channel))["html"] == "before"
        redis.stop()
        redis.start()
        # The reader's subscriptions come back with its connection; what was sent meanwhile is gone
        # (the live view resynchronises from the run), so the sender keeps sending until one arrives.
        # The receive is never cancelled: a pub/sub layer unsubscribes a channel whose receive is.
        receiving = asyncio.ensure_future(reader.receive(channel))
        deadline = time.monotonic() + 15
        while not receiving.done():
            assert time.monotonic() < deadline, "nothing arrived after the restart"
            with contextlib.suppress(ConnectionError, OSError, redis_errors.ConnectionError):
                await sender.group_send("chat-4", {"type": "chat.html", "html": "after"})
            await asyncio.wait([receiving], timeout=0.2)
        assert receiving.result()["html"] == "after"
    finally:
        await sender.flush()
        await reader.flush()


def test_the_channels_redis_internals_the_layer_overrides_are_still_there():
    """chatapp/channel_layer.py overrides a few non-public parts of channels-redis (its pub/sub layer has no
    channel capacity and sends each message in a round trip of its own). An upgrade that renames or
    reshapes them fails here, before it fails in production."""
    import inspect

    from channels_redis import pubsub, utils

    def parameters(function) -> list[str]:
        return list(inspect.signature(function).parameters)

    assert parameters(pubsub.RedisSingleShardConnection.__init__) == ["self", "host", "channel_layer"]
    assert parameters(pubsub.RedisSingleShardConnection.publish) == ["self", "channel", "message"]
    assert parameters(pubsub.RedisSingleShardConnection.flush) == ["self"]
    assert parameters(pubsub.RedisSingleShardConnection._ensure_redis) == ["self"]
    assert parameters(pubsub.RedisPubSubLoopLayer._subscribe_to_channel) == ["self", "channel"]
    assert parameters(pubsub.RedisPubSubLoopLayer._get_shard) == ["self", "channel_or_group_name"]
    assert parameters(pubsub.RedisPubSubChannelLayer._get_layer) == ["self"]
    assert parameters(utils._wrap_close) == ["proxy", "loop"]
    assert "channel_layer" in parameters(pubsub.RedisPubSubLoopLayer.__init__)
    # The attributes the overrides read: the loop layer's queues and shards, the shard's client.
    source = inspect.getsource(pubsub)
    for attribute in ("self.channels", "self._shards", "self._redis", "self._layers"):
        assert attribute in source, attribute
