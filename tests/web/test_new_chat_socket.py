"""A new chat started over its landing's socket (/ws/new/) through the real ASGI stack: the first message
makes the chat, runs at once on that socket, and the page is sent the chat's parts; what is refused makes
nothing."""

from __future__ import annotations

import json
import re

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import TransactionTestCase

from chatapp.asgi import application
from sessions_core.models import ChatSession, Run, RunStatus
from tests.support.factories import make_user
from tests.support.live_support import HOST, ORIGIN, LiveTestMixin, frames_until, run_done, settle, started_run_id
from tests.support.llm_server import Text, ToolCalls

HEADER = re.compile(r'<header class="chat-header" id="chat-header" data-session-id="([^"]+)" data-url="([^"]+)" '
                    r'hx-swap-oob="true">')


def first_message(text: str, assistant: str = "shopping", **extra) -> str:
    return json.dumps({"type": "send", "text": text, "assistant": assistant, "csrfmiddlewaretoken": "x",
                       "HEADERS": {"HX-Request": "true"}, **extra})


def is_error(frame: str) -> bool:
    return "innerHTML:#run-status" in frame and "status-error" in frame


class TestNewChatSocket(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")

    async def landing(self, user, connect: bool = True) -> WebsocketCommunicator:
        headers = [ORIGIN, HOST] + ([(b"cookie", await self.cookie_for(user))] if user is not None else [])
        communicator = WebsocketCommunicator(application, "/ws/new/", headers=headers)
        if connect:
            connected, code = await communicator.connect(timeout=5)
            assert connected, f"socket refused with {code}"
        return communicator

    async def test_anonymous_users_are_refused(self):
        connected, code = await (await self.landing(None, connect=False)).connect()
        assert (connected, code) == (False, 4401)

    async def test_the_first_message_makes_the_chat_streams_its_reply_here_and_turns_the_page_into_the_chat(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added **milk**."), Text("Milk"))
        socket = await self.landing(self.alice)
        assert await socket.receive_nothing(timeout=0.1)  # nothing is sent before the first message
        await socket.send_to(text_data=first_message("add milk"))
        frames = await frames_until(socket, run_done())
        session = await ChatSession.objects.aget()
        assert (session.owner_id, session.component_id, session.name) == (self.alice.pk, "shopping", "add milk")
        # The chat's parts, out of band: its header (its id and URL for the page), the composer of a
        # chat, the state pane with the assistant's starting state; and the run, streamed here.
        parts = next(frame for frame in frames if HEADER.search(frame))
        assert HEADER.search(parts).groups() == (session.session_id, f"/s/{session.session_id}/")
        assert '<form id="composer" class="composer" ws-send aria-label="Send a message" hx-swap-oob="true">' in parts
        assert 'hx-swap-oob="beforeend:#session-area"><aside id="state-pane"' in parts
        assert 'id="state-panel"' in parts and '<div id="landing-intro" hx-swap-oob="delete">' in parts
        assert f'id="session-item-{session.pk}"' in "".join(frames)  # the sidebar's new row, to the user's tabs
        run_id = started_run_id(frames)
        assert "<strong>milk</strong>" in frames[-1]
        await settle()
        run = await Run.objects.aget(run_id=run_id)
        assert (run.session_id, run.status, run.input) == (session.pk, RunStatus.COMPLETED, "add milk")
        assert (await ChatSession.objects.aget()).session_state == {"shopping_list": ["milk"]}

        # From then on the socket is the chat's: the next message runs in the same chat.
        self.llm.add(Text("Anything else?"))
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "thanks"}))
        await frames_until(socket, run_done())
        await settle()
        assert await ChatSession.objects.acount() == 1
        assert [r.input async for r in Run.objects.filter(session=session).order_by("pk")] == ["add milk", "thanks"]
        await socket.disconnect()

    async def test_what_is_refused_makes_nothing_and_the_text_comes_back(self):
        socket = await self.landing(self.alice)
        cases = {
            first_message("hi", assistant="nobody"): "Choose one of the assistants.",
            json.dumps({"type": "send", "text": "hi"}): "Choose one of the assistants.",
            json.dumps({"type": "stop"}): "Send a message first",
            json.dumps({"type": "retry", "run_id": "r1"}): "Send a message first",
            first_message("   "): "Type a message first",
            "not json {": "not JSON",
        }
        for frame, message in cases.items():
            await socket.send_to(text_data=frame)
            answer = await socket.receive_from(timeout=5)
            assert is_error(answer) and message in answer, (frame, answer)
        await socket.send_to(text_data=first_message("hi <b>there</b>", assistant="nobody"))
        assert re.search(r'<textarea id="composer-text" [^>]*hx-swap-oob="true">hi &lt;b&gt;there&lt;/b&gt;</textarea>',
                         await socket.receive_from(timeout=5))
        assert await ChatSession.objects.acount() == 0 and await Run.objects.acount() == 0
        await socket.disconnect()

    async def test_it_counts_against_the_new_chats_limit_as_the_form_does(self):
        self.llm.responder = lambda body: Text("ok")
        with self.settings(CHAT_NEW_CHATS_PER_MINUTE=1):
            socket = await self.landing(self.alice)
            await socket.send_to(text_data=first_message("one"))
            await frames_until(socket, run_done())
            other = await self.landing(self.alice)
            await other.send_to(text_data=first_message("two"))
            answer = await frames_until(other, is_error)
            assert "Too many new chats" in answer[-1] and ">two</textarea>" in answer[-1]
            await settle()
            await socket.disconnect()
            await other.disconnect()
        assert await ChatSession.objects.acount() == 1
        assert [run.input async for run in Run.objects.all()] == ["one"]

    async def test_a_chat_page_socket_path_still_refuses_another_users_chat(self):
        bob = await sync_to_async(make_user)("bob", "pw-bob-123")
        self.llm.responder = lambda body: Text("ok")
        socket = await self.landing(self.alice)
        await socket.send_to(text_data=first_message("mine"))
        await frames_until(socket, run_done())
        await settle()
        session = await ChatSession.objects.aget()
        connected, code = await (await self.socket(session.session_id, bob, connect=False)).connect()
        assert (connected, code) == (False, 4403)
        await socket.disconnect()
