"""Helpers for the websocket and live-run tests: sockets through the real ASGI stack, logged in with a
real session cookie, and readers for the HTML frames the server sends."""

from __future__ import annotations

import asyncio
import re
import time
from html.parser import HTMLParser

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from chatapp import live
from chatapp.asgi import application
from chatapp.assistants import reset_assistants
from chatapp.broadcast import asend_to_session
from chatapp.live import fragments, streaming
from sessions_core.models import Run
from tests.support.llm_server import summary_responder

ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")  # a browser sends both: the socket's Origin must be the site's own
RUN_ID = re.compile(r'id="run-([0-9a-f-]{36})"')
STREAM_FRAME = re.compile(r'<template data-stream-run="([^"]+)" data-keep="(\d+)">(.*)</template>', re.DOTALL)


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
        headers = [ORIGIN, HOST]
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


class TopLevel(HTMLParser):
    """A fragment cut into its top-level elements, each with the text that follows it (as the DOM holds it)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=False)
        self.depth, self.starts, self.html = 0, [], html
        self.feed(html)
        self.close()
        bounds = [*self.starts, len(html)]
        self.lead = html[: bounds[0]]  # text before the first element
        self.parts = [html[a:b] for a, b in zip(bounds, bounds[1:])]

    def _cut(self) -> None:
        line, column = self.getpos()
        self.starts.append(sum(len(row) for row in self.html.splitlines(keepends=True)[: line - 1]) + column)

    def handle_starttag(self, tag, attrs):
        if self.depth == 0:
            self._cut()
        if tag not in ("br", "hr"):
            self.depth += 1

    def handle_startendtag(self, tag, attrs):
        if self.depth == 0:
            self._cut()

    def handle_endtag(self, tag):
        self.depth -= 1


def apply_frame(reply: list[str], keep: int, html: str) -> list[str]:
    """What static/chatapp/live.js does with a stream frame: keep the reply's first `keep` elements, then
    the frame's elements."""
    fragment = TopLevel(html)
    assert not fragment.lead.strip(), fragment.lead
    return reply[:keep] + fragment.parts


def is_stream_frame(frame: str) -> bool:
    return frame.startswith("<template data-stream-run=")


def streamed_html(frames: list[str], run_id: str, reply: str = "") -> str:
    """The reply `run_id` as a page holding `reply` has it after these frames: a run fragment replaces it,
    a stream frame is applied as live.js applies it."""
    parts = TopLevel(reply).parts if reply else []
    for frame in frames:
        match = STREAM_FRAME.fullmatch(frame.strip())
        if match and match.group(1) == run_id:
            parts = apply_frame(parts, int(match.group(2)), match.group(3))
        elif not match and f'id="reply-{run_id}"' in frame:
            parts = TopLevel(reply_in(frame, run_id)).parts
    return "".join(parts)


def reply_in(html: str, run_id: str) -> str:
    """The content of #reply-<run_id> in a run fragment."""
    match = re.search(rf'id="reply-{re.escape(run_id)}">(.*?)</div>\s*(?:<p class="run-note|<div class="run-|<footer|</div>\s*</article>)',
                      html, re.DOTALL)
    assert match, html
    return match.group(1)


async def layer_listener(group: str) -> str:
    """A channel of our own in `group`, to read what the run tasks send there."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    return channel


class AnotherProcess:
    """A run streaming in another server process, as this process's sockets see it: its token batches on
    the session's group, made as that process's runner makes them, and its text in the database, stored
    when the test says (as the engine checkpoints it)."""

    def __init__(self, session_pk: int, run_id: str):
        self.session_pk, self.run_id = session_pk, run_id
        self.live = streaming.LiveRun(fragments.StreamedRun(run_id))

    def write(self, text: str) -> dict:
        """The model writes `text`: the batch that process sends for it."""
        self.live.add(text)
        return {**self.live.next_batch(), "origin": "another-process"}

    async def send(self, batch: dict) -> None:
        await asend_to_session(self.session_pk, "chat.tokens", **batch)

    async def checkpoint(self) -> None:
        await Run.objects.filter(run_id=self.run_id).aupdate(content=self.live.text)


def stored_text(run_id: str, timeout: float = 10) -> str:
    """The run's text once the engine has stored some of it (it checkpoints a streaming run's text about
    once a second)."""
    deadline = time.monotonic() + timeout
    while not (text := Run.objects.filter(run_id=run_id).values_list("content", flat=True).first()):
        assert time.monotonic() < deadline, "the engine stored none of the run's text"
        time.sleep(0.05)  # polling the database: there is no event to wait on
    return text


async def settle():
    """Wait for every run task and title job of this process to finish."""
    await live.wait_idle(timeout=20)
