"""Nothing dropped on the way: a socket that stops reading while a reply streams a frame per token
(CHAT_STREAM_BATCH_SECONDS=0) overflows its channel, whose layer drops what it cannot hold without a word.
The socket must still end with the stored reply, in the in-memory layer and in Redis alike.

The slow socket is the real consumer behind the real routing whose sends to the browser wait (as a send does
over a slow connection when the server applies backpressure): while they wait it reads nothing from its channel.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading

import pytest
from channels.auth import AuthMiddlewareStack
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import TransactionTestCase
from django.urls import path

from chatapp.broadcast import session_group
from chatapp.consumers import SessionConsumer
from chatapp.rendering import render_markdown
from sessions_core.models import Run
from tests.e2e.conftest import redis_url  # noqa: F401  (fixture)
from tests.support.factories import make_session, make_user
from tests.support.live_support import (
    ORIGIN,
    LiveTestMixin,
    apply_frame,
    frames_until,
    is_stream_frame,
    run_done,
    settle,
    streamed_html,
)
from tests.support.llm_server import Text

CAPACITY = 20  # per socket channel here; the test's own watcher holds everything
SECTION = """## Part {n}

Some **bold {n}** text, a [link](https://example.com/{n}) and `code {n}`.

- first point of {n}
- second point of {n}

```python
def part_{n}():
    return {n}
```
"""
REPLY = "\n".join(SECTION.format(n=n) for n in range(12))


class SlowSocket(SessionConsumer):
    """The chat's consumer, its sends to the browser held while `gate` is clear."""

    gate: asyncio.Event

    async def _send_html(self, html: str) -> None:
        await self.gate.wait()
        await super()._send_html(html)


SLOW_APP = AuthMiddlewareStack(URLRouter([path("ws/sessions/<str:session_id>/", SlowSocket.as_asgi())]))


class FloodChecks(LiveTestMixin):
    """The checks, run on each layer below (`layer_config`)."""

    @pytest.fixture(autouse=True)
    def _layer(self, settings, request):
        settings.CHANNEL_LAYERS = {"default": self.layer_config(request)}
        settings.CHAT_STREAM_BATCH_SECONDS, settings.CHAT_STREAM_DRAW_SHARE = 0, 1  # a batch per token

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general", name="Flood")

    async def slow_socket(self) -> WebsocketCommunicator:
        SlowSocket.gate = asyncio.Event()
        SlowSocket.gate.set()
        headers = [ORIGIN, (b"cookie", await self.cookie_for(self.alice))]
        socket = WebsocketCommunicator(SLOW_APP, f"/ws/sessions/{self.session.session_id}/", headers=headers)
        connected, code = await socket.connect(timeout=5)
        assert connected, code
        return socket

    async def watch(self) -> str:
        """A channel of the test's own in the session's group, large enough to see every batch."""
        layer = get_channel_layer()
        channel = await layer.new_channel(prefix="flood-watch")
        await layer.group_add(session_group(self.session.pk), channel)
        return channel

    async def done(self, socket: WebsocketCommunicator) -> None:
        """The socket closed and this test's layer emptied, its connections with it: nothing of it is left
        for a later test's event loop."""
        await socket.disconnect()
        await get_channel_layer().flush()

    async def batches_until(self, channel: str, predicate) -> list[dict]:
        layer, seen = get_channel_layer(), []
        while True:
            message = await asyncio.wait_for(layer.receive(channel), 20)
            seen.append(message)
            if predicate(message):
                return seen

    async def test_a_socket_that_stopped_reading_mid_reply_catches_up_in_one_frame(self):
        end = threading.Event()
        self.llm.add(Text(REPLY, chunk_delay=0.002, end_event=end))
        watcher, socket = await self.watch(), await self.slow_socket()
        SlowSocket.gate.clear()  # from now on the socket reads nothing
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "a long one"}))
        drawn: list[str] = []  # the reply as the watcher's batches draw it

        def whole(message: dict) -> bool:
            if message["type"] == "chat.tokens":
                drawn[:] = apply_frame(drawn, message["keep"], message["html"])
            return "".join(drawn) == render_markdown(REPLY)

        seen = await self.batches_until(watcher, whole)
        batches = [m for m in seen if m["type"] == "chat.tokens"]
        assert len(batches) > 2 * CAPACITY  # far more than the socket's channel holds: the layer dropped some
        run_id = batches[0]["run_id"]

        SlowSocket.gate.set()  # it reads again, the run still running
        frames: list[str] = []
        await frames_until(socket, lambda f: frames.append(f) or streamed_html(frames, run_id) == render_markdown(REPLY))
        # All it was behind on in one frame, not one per batch (it missed over 2 x CAPACITY of them). (The
        # in-memory layer drops the newest messages of a full channel: the run's fragment came, then one
        # frame. Redis's drops the oldest: the run's fragment went, so its first batch did too, and the
        # socket is sent the whole run so far instead.) At most one frame more: which of its messages the
        # socket holds when its sends stall (Channels takes the next one before its handler runs) is a
        # matter of timing, and on the Redis layer about one run in thirty catches up in two frames.
        assert sum(map(is_stream_frame, frames)) <= 2 and len(frames) <= 5

        end.set()
        frames += await frames_until(socket, run_done(run_id=run_id))
        await settle()
        stored = await Run.objects.aget(run_id=run_id)
        assert stored.content == REPLY
        assert streamed_html(frames, run_id) == render_markdown(stored.content)
        await self.done(socket)

    async def test_a_final_form_the_layer_dropped_comes_from_the_stored_run(self):
        self.llm.add(Text(REPLY, chunk_delay=0.002))
        watcher, socket = await self.watch(), await self.slow_socket()
        SlowSocket.gate.clear()
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "a long one"}))
        seen = await self.batches_until(watcher, lambda m: m["type"] == "chat.run_done")
        assert sum(m["type"] == "chat.tokens" for m in seen) > 2 * CAPACITY  # the final form was dropped too
        run_id = seen[-1]["run_id"]
        await settle()

        SlowSocket.gate.set()
        frames = await frames_until(socket, run_done(run_id=run_id))
        stored = await Run.objects.aget(run_id=run_id)
        assert stored.content == REPLY
        assert streamed_html(frames, run_id) == render_markdown(REPLY)
        await self.done(socket)


class TestInMemoryLayer(FloodChecks, TransactionTestCase):
    @staticmethod
    def layer_config(request):
        # (This layer takes its channel_capacity already compiled: it never compiles the patterns itself.)
        return {"BACKEND": "channels.layers.InMemoryChannelLayer",
                "CONFIG": {"capacity": CAPACITY, "channel_capacity": [(re.compile(r"flood-watch.*"), 100_000)]}}


@pytest.mark.usefixtures("redis_url")
class TestRedisLayer(FloodChecks, TransactionTestCase):
    """The app's layer over Redis (chatapp/channel_layer.py), which drops a full channel's oldest messages."""

    @staticmethod
    def layer_config(request):
        # Its channel names start with the layer's prefix.
        return {"BACKEND": "chatapp.channel_layer.ChatChannelLayer",
                "CONFIG": {"hosts": [request.getfixturevalue("redis_url")], "prefix": f"flood{os.getpid()}",
                           "capacity": CAPACITY, "channel_capacity": {"*flood-watch*": 100_000}}}
