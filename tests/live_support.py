"""Helpers for the websocket and live-run tests: sockets through the real ASGI stack, logged in with a
real session cookie, and readers for the HTML frames the server sends."""

from __future__ import annotations

import asyncio
import html
import re

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from chatapp import live
from chatapp.asgi import application
from chatapp.assistants import reset_assistants
from tests.llm_server import summary_responder

ORIGIN = (b"origin", b"http://localhost")
RUN_ID = re.compile(r'id="run-([0-9a-f-]{36})"')
TOKENS = re.compile(r'<div hx-swap-oob="beforeend:#reply-([0-9a-f-]{36})">(.*?)</div>', re.DOTALL)


class LiveTestMixin:
    """Points the assistants at the local test server (`self.llm`) for each test."""

    @pytest.fixture(autouse=True)
    def _live_fixtures(self, llm_server, settings):
        self.llm = llm_server
        llm_server.side_responder = summary_responder  # the general assistant's summaries: not these tests' subject
        settings.OPENAI_BASE_URL = llm_server.base_url
        settings.OPENAI_API_KEY = "test"
        settings.OPENAI_TIMEOUT = 10
        settings.CHAT_TITLE_RETRY_SECONDS = 0.01
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test users only
        reset_assistants()
        yield
        reset_assistants()

    async def cookie_for(self, user) -> bytes:
        client = Client()
        await sync_to_async(client.force_login)(user)
        return f"sessionid={client.cookies['sessionid'].value}".encode()

    async def socket(self, session_id: str, user=None, query: str = "", connect: bool = True):
        """A connected socket for `user` (anonymous when None)."""
        headers = [ORIGIN]
        if user is not None:
            headers.append((b"cookie", await self.cookie_for(user)))
        path = f"/ws/sessions/{session_id}/" + (f"?{query}" if query else "")
        communicator = WebsocketCommunicator(application, path, headers=headers)
        if connect:
            connected, code = await communicator.connect(timeout=5)
            assert connected, f"socket refused with {code}"
        return communicator


async def frames_until(communicator, predicate, timeout: float = 10) -> list[str]:
    """Frames received up to and including the first one `predicate` accepts."""
    frames: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"no matching frame within {timeout} s; got {frames!r}")
        try:
            frame = await communicator.receive_from(timeout=remaining)
        except TimeoutError:
            raise AssertionError(f"no matching frame within {timeout} s; got {frames!r}") from None
        frames.append(frame)
        if predicate(frame):
            return frames


def run_done(status: str = "completed", run_id: str = ""):
    """A predicate: the frame replacing a run's fragment in its final form."""
    marker = f'data-status="{status}"'

    def check(frame: str) -> bool:
        return marker in frame and 'hx-swap-oob="true"' in frame and (not run_id or f'id="run-{run_id}"' in frame)

    return check


def started_run_id(frames: list[str]) -> str:
    for frame in frames:
        if "beforeend:#transcript" in frame and 'data-status="running"' in frame:
            return RUN_ID.search(frame).group(1)
    raise AssertionError("no run started")


def streamed_text(frames: list[str], run_id: str) -> str:
    """The text of the token frames for one run, unescaped and joined."""
    return "".join(html.unescape(text) for frame in frames for rid, text in TOKENS.findall(frame) if rid == run_id)


def token_frames(frames: list[str]) -> list[str]:
    return [frame for frame in frames if TOKENS.search(frame)]


async def layer_listener(group: str) -> str:
    """A channel of our own in `group`, to read what the run tasks send there."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


async def settle():
    """Wait for every run task and title job of this process to finish."""
    await live.wait_idle(timeout=20)
