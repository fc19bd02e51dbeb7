"""The chat websocket through the real ASGI stack (origin check, session auth, URL routing), with
runs against the local OpenAI-compatible test server."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from datetime import timedelta

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client, TransactionTestCase, override_settings
from django.urls import reverse
from django.utils import timezone

from chatapp import live, rendering
from chatapp.asgi import application
from chatapp.broadcast import asend_to_session, session_group, user_group
from sessions_core.models import ChatSession, Message, NameSource, Run, RunStatus
from sessions_core.run import lifecycle
from chatapp.rendering import render_markdown
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import (
    HOST,
    ORIGIN,
    AnotherProcess,
    LiveTestMixin,
    frames_until,
    layer_listener,
    run_done,
    settle,
    is_stream_frame,
    reply_in,
    started_run_id,
    streamed_html,
)
from tests.support.llm_server import Error, Text, ToolCalls, is_memory_request, is_summary_request


def is_error(frame: str) -> bool:
    return "innerHTML:#run-status" in frame and "status-error" in frame


class TestConnect(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.bob = make_user("bob", "pw-bob-123")
        self.session = make_session(self.alice, component_id="general")

    async def test_it_refuses_anonymous_users(self):
        socket = await self.socket(self.session.session_id, None, connect=False)
        connected, code = await socket.connect()
        assert (connected, code) == (False, 4401)

    async def test_it_refuses_another_users_session(self):
        socket = await self.socket(self.session.session_id, self.bob, connect=False)
        connected, code = await socket.connect()
        assert (connected, code) == (False, 4403)

    async def test_it_refuses_an_unknown_session_id(self):
        socket = await self.socket("no-such-session", self.alice, connect=False)
        connected, code = await socket.connect()
        assert (connected, code) == (False, 4403)

    async def test_a_socket_to_an_unknown_path_is_refused_not_a_server_error(self):
        for path in ("/ws/nowhere/", "/ws/sessions/", "/not-a-socket"):
            socket = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST])
            connected, code = await socket.connect()
            assert (connected, code) == (False, 4404), path

    async def test_a_message_to_a_chat_trashed_meanwhile_comes_back_into_the_composer(self):
        socket = await self.socket(self.session.session_id, self.alice)
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(deleted_at=self.session.created_at)
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "my <long> message"}))
        frame = await socket.receive_from(timeout=5)
        assert is_error(frame) and "in the trash" in frame
        assert '<textarea id="composer-text"' in frame and 'hx-swap-oob="true">my &lt;long&gt; message</textarea>' in frame
        assert not await Run.objects.aexists()
        await socket.disconnect()

    async def test_it_refuses_a_session_in_the_trash(self):
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(deleted_at=self.session.created_at)
        socket = await self.socket(self.session.session_id, self.alice, connect=False)
        connected, code = await socket.connect()
        assert (connected, code) == (False, 4403)

    async def test_it_accepts_the_owner_and_sends_nothing_when_nothing_is_live(self):
        socket = await self.socket(self.session.session_id, self.alice)
        assert await socket.receive_nothing(timeout=0.2)
        await socket.disconnect()


class TestBadFrames(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")

    async def test_each_bad_frame_gets_an_error_and_writes_nothing(self):
        socket = await self.socket(self.session.session_id, self.alice)
        too_long = "x" * 20_001
        bad = {
            "not json {": "not JSON",
            "[1, 2]": "not a JSON object",
            '"send"': "not a JSON object",
            json.dumps({"type": "shout", "text": "hi"}): "Unknown request type",
            json.dumps({"text": "hi"}): "Unknown request type",
            json.dumps({"type": "send"}): "Type a message first",
            json.dumps({"type": "send", "text": "   \n "}): "Type a message first",
            json.dumps({"type": "send", "text": 42}): "Type a message first",
            json.dumps({"type": "send", "text": too_long}): "20,001 characters long; the limit is 20,000",
            json.dumps({"type": "retry"}): "The run_id is missing",
            json.dumps({"type": "retry", "run_id": "r" * 65}): "The run_id is too long",
            json.dumps({"type": "stop", "run_id": ["x"]}): "The run_id is missing",
        }
        for frame, message in bad.items():
            await socket.send_to(text_data=frame)
            answer = await socket.receive_from(timeout=5)
            assert is_error(answer), frame
            assert message in answer, (frame, answer)
        await socket.send_to(bytes_data=b"\x00\x01")
        assert "Binary frames are not accepted" in await socket.receive_from(timeout=5)

        assert await Run.objects.acount() == 0
        assert await Message.objects.acount() == 0
        assert (await ChatSession.objects.aget(pk=self.session.pk)).name == ""
        # The socket still works: a stop with nothing running is answered, not refused.
        await socket.send_to(text_data=json.dumps({"type": "stop", "HEADERS": {"HX-Request": "true"}}))
        assert "Nothing to stop." in await socket.receive_from(timeout=5)
        await socket.disconnect()

    async def test_the_limit_is_a_setting(self):
        with self.settings(CHAT_MAX_MESSAGE_CHARS=5):
            socket = await self.socket(self.session.session_id, self.alice)
            await socket.send_to(text_data=json.dumps({"type": "send", "text": "123456"}))
            assert "6 characters long; the limit is 5" in await socket.receive_from(timeout=5)
            await socket.disconnect()
        assert await Run.objects.acount() == 0

    async def test_a_message_refused_for_its_length_comes_back_into_the_composer(self):
        with self.settings(CHAT_MAX_MESSAGE_CHARS=5):
            socket = await self.socket(self.session.session_id, self.alice)
            await socket.send_to(text_data=json.dumps({"type": "send", "text": "1 <b>3456"}))
            answer = await socket.receive_from(timeout=5)
            assert "9 characters long; the limit is 5" in answer
            # The page cleared its box as it sent the message: the box comes back holding it (escaped).
            assert re.search(r'<textarea id="composer-text" [^>]*hx-swap-oob="true">1 &lt;b&gt;3456</textarea>', answer)
            await socket.send_to(text_data=json.dumps({"type": "edit", "run_id": "r1", "text": "123456"}))
            assert "composer-text" not in await socket.receive_from(timeout=5)  # an edit's text is in its own form
            await socket.send_to(text_data=json.dumps({"type": "send", "text": "  "}))
            assert "composer-text" not in await socket.receive_from(timeout=5)  # nothing to hand back
            await socket.disconnect()
        assert await Run.objects.acount() == 0

    async def test_a_retry_of_another_sessions_run_is_refused(self):
        other = await sync_to_async(make_session)(self.alice, component_id="general")
        foreign = await sync_to_async(make_run)(other, "secret question", None, status=RunStatus.ERROR)
        socket = await self.socket(self.session.session_id, self.alice)
        await socket.send_to(text_data=json.dumps({"type": "retry", "run_id": foreign.run_id}))
        assert "That reply cannot be retried." in await socket.receive_from(timeout=5)
        assert await Run.objects.acount() == 1
        await socket.disconnect()

    async def test_a_stop_of_another_sessions_run_is_refused(self):
        bob = await sync_to_async(make_user)("bob", "pw-bob-123")
        theirs = await sync_to_async(make_session)(bob, component_id="general")
        running = await sync_to_async(make_run)(theirs, "hi", None, status=RunStatus.RUNNING)
        socket = await self.socket(self.session.session_id, self.alice)
        await socket.send_to(text_data=json.dumps({"type": "stop", "run_id": running.run_id}))
        assert "Nothing to stop." in await socket.receive_from(timeout=5)
        assert not (await Run.objects.aget(pk=running.pk)).cancel_requested
        await socket.disconnect()


class TestResume(LiveTestMixin, TransactionTestCase):
    """What a page that reconnects missed, from the runs it says it shows."""

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")
        self.first = make_run(self.session, "first question", "first answer")
        self.second = make_run(self.session, "second question", "**second** answer")

    async def test_runs_newer_than_the_pages_last_run_are_appended(self):
        socket = await self.socket(self.session.session_id, self.alice, query=f"last_run={self.first.run_id}")
        frame = await socket.receive_from(timeout=5)
        assert frame.startswith('<div hx-swap-oob="beforeend:#transcript">')
        assert f'id="run-{self.second.run_id}"' in frame
        assert f'id="run-{self.first.run_id}"' not in frame
        assert "<strong>second</strong>" in frame
        # Then the state panel as stored: those runs may have changed it.
        assert 'id="state-panel"' in await socket.receive_from(timeout=5)
        assert await socket.receive_nothing(timeout=0.2)
        await socket.disconnect()

    async def test_an_empty_page_gets_every_run_and_an_up_to_date_page_nothing(self):
        socket = await self.socket(self.session.session_id, self.alice, query="last_run=")
        frame = await socket.receive_from(timeout=5)
        assert frame.index(self.first.run_id) < frame.index(self.second.run_id)
        await socket.disconnect()
        socket = await self.socket(self.session.session_id, self.alice, query=f"last_run={self.second.run_id}")
        assert await socket.receive_nothing(timeout=0.2)
        await socket.disconnect()

    async def test_a_run_the_page_shows_running_comes_back_finished(self):
        query = f"last_run={self.second.run_id}&running={self.second.run_id}&reconnect=1"
        socket = await self.socket(self.session.session_id, self.alice, query=query)
        frames = [await socket.receive_from(timeout=5) for _ in range(3)]
        final = next(f for f in frames if f'id="run-{self.second.run_id}"' in f)
        assert 'hx-swap-oob="true"' in final and 'data-status="completed"' in final
        assert any('id="queue"' in f for f in frames)  # a reconnect refreshes the queue...
        assert any('id="state-panel"' in f for f in frames)  # ...and the state panel
        await socket.disconnect()


class TestRuns(LiveTestMixin, TransactionTestCase):
    """Runs started from the socket: tasks that commit from the test's database thread."""

    def setUp(self):
        self.alice = make_user("alice")
        self.shopping = make_session(self.alice, component_id="shopping")

    async def send(self, socket, text: str):
        await socket.send_to(text_data=json.dumps({"type": "send", "text": text, "HEADERS": {"HX-Request": "true"}}))

    async def test_a_streamed_batch_costs_the_socket_no_trip_to_the_thread_the_engine_uses(self):
        # Channels' dispatch hops onto the thread for sync code before every handler (to close stale
        # connections); a reply's batches and fragments skip it, the socket's own frames do not.
        import channels.consumer

        hops, real = [], channels.consumer.aclose_old_connections

        async def counted():
            hops.append(1)
            await real()

        channels.consumer.aclose_old_connections = counted
        try:
            with self.settings(CHAT_STREAM_BATCH_SECONDS=0):
                self.llm.add(Text(" ".join(f"word{n}" for n in range(60)), chunk_delay=0.002), Text("Words"))
                socket = await self.socket(self.shopping.session_id, self.alice)
                before = len(hops)
                await self.send(socket, "count to sixty")
                frames = await frames_until(socket, run_done())
                await settle()
        finally:
            channels.consumer.aclose_old_connections = real
        assert sum(map(is_stream_frame, frames)) > 10  # many batches reached the socket...
        assert len(hops) - before <= 3  # ...and only its own message and the run's end hopped
        await socket.disconnect()

    async def test_a_send_streams_the_reply_then_the_final_fragment_and_the_state(self):
        self.llm.add(
            ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})]),
            Text("I added **milk** and *eggs* to your list, so you are all set for the week.", chunk_delay=0.004),
            Text("Milk and eggs"),
        )
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "add milk and eggs")
        frames = await frames_until(socket, run_done())
        run_id = started_run_id(frames)

        started = next(i for i, f in enumerate(frames) if f'id="run-{run_id}"' in f)
        assert "add milk and eggs" in frames[started]
        rows = [f for f in frames if 'class="tool-call' in f and "data-status" not in f]
        assert len(rows) == 4  # two calls, each shown running and then done
        assert 'beforeend:#tools-' in rows[0] and "running…" in rows[0] and "add_item" in rows[0]
        assert "done" in rows[1] and "Added milk" in rows[1]
        panels = [i for i, f in enumerate(frames) if 'id="state-panel"' in f]
        done = len(frames) - 1
        assert panels and panels[0] < done  # the panel changed mid-run, before the final fragment
        assert "milk" in frames[panels[0]]
        # Mid-run the panel shows the version the change will be stored as, and no editor: an edit
        # of a state the run has not stored yet would get the run's changes a second time.
        # (v1 filled in the assistant's default list; milk and eggs are v2 and v3.)
        version = re.compile(r'id="state-version" class="state-version" data-version="(\d+)"')
        shown = [version.findall(frames[i]) for i in panels]
        assert shown == [["2"], ["3"], ["3"]]
        assert 'id="state-edit"' not in frames[panels[0]] and "state-note" in frames[panels[0]]
        # ...and its changes head the timeline, marked as not stored yet (no link to a stored version).
        pending = re.compile(r'class="state-change pending" data-version="(\d+)"')
        assert pending.findall(frames[panels[0]]) == ["2"] and pending.findall(frames[panels[1]]) == ["3", "2"]
        assert "saving with the reply" in frames[panels[1]] and "state/v3/" not in frames[panels[1]]
        assert not pending.findall(frames[done]) and "state/v3/" in frames[done]  # stored: links again
        # Markdown while streaming, batched (fewer frames than words), complete: the final render's HTML.
        text = "I added **milk** and *eggs* to your list, so you are all set for the week."
        tokens = [frame for frame in frames if is_stream_frame(frame)]
        assert 1 <= len(tokens) < len(text.split())
        assert reply_in(frames[done], run_id) == render_markdown(text)
        # Each frame shows the text so far (the last batches may have come after the end: the final form has them).
        streamed = streamed_html(frames, run_id)
        assert any(streamed == render_markdown(text[:n]) for n in range(len(text) // 2, len(text) + 1))
        # The final fragment is the sanitized markdown, plus the state panel as stored.
        assert "<strong>milk</strong>" in frames[done] and "<em>eggs</em>" in frames[done]
        assert 'id="state-panel"' in frames[done] and "eggs" in frames[done]
        assert 'id="state-edit"' in frames[done]  # the editor is back
        assert "Reply complete." in frames[done]
        await settle()
        session = await ChatSession.objects.aget(pk=self.shopping.pk)
        assert session.session_state["shopping_list"] == ["milk", "eggs"]
        run = await Run.objects.aget(run_id=run_id)
        assert run.status == RunStatus.COMPLETED
        await socket.disconnect()

    async def test_a_page_loaded_mid_run_gets_the_runs_state_changes_and_the_status_line(self):
        hold = threading.Event()
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk, and more to say", wait_event=hold))
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "add milk")
        await frames_until(socket, is_stream_frame)  # the tool has changed the state; the reply is streaming
        reload = await self.socket(self.shopping.session_id, self.alice)  # a page loaded now (no reconnect)
        frames = await frames_until(reload, lambda f: "Generating a reply" in f)
        panels = [f for f in frames if 'id="state-panel"' in f]
        assert panels and "milk" in panels[-1] and "saving with the reply" in panels[-1]
        assert 'data-version="2"' in panels[-1] and 'id="state-edit"' not in panels[-1]  # in flight: no editor
        hold.set()
        await frames_until(reload, run_done())
        await settle()
        await socket.disconnect()
        await reload.disconnect()

    async def test_a_message_sent_during_a_run_is_queued_and_runs_next(self):
        hold = threading.Event()
        self.llm.add(Text("first reply here", wait_event=hold), Text("second reply"))
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Chat",
                                                    name_source=NameSource.USER)
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "one")
        await frames_until(socket, is_stream_frame)
        await self.send(socket, "two")
        frames = await frames_until(socket, lambda f: "beforeend:#queue" in f)
        assert "Queued: will run after the current reply" in frames[-1]
        assert "two" in frames[-1]
        assert await Run.objects.begun().filter(session=session).acount() == 1  # not started yet
        assert await Run.objects.filter(session=session, status=RunStatus.QUEUED, input="two").aexists()
        hold.set()
        frames = await frames_until(socket, run_done())
        frames += await frames_until(socket, run_done())
        assert any('hx-swap-oob="delete"' in f and "queued-" in f for f in frames)
        await settle()
        runs = [run async for run in Run.objects.filter(session=session).order_by("pk")]
        assert [(r.input, r.content, r.status) for r in runs] == [
            ("one", "first reply here", "completed"), ("two", "second reply", "completed")
        ]
        await socket.disconnect()

    async def test_a_starting_key_the_user_deleted_comes_back_on_the_next_message_as_the_panel_says(self):
        from chatapp.state_edits import replace_state

        await sync_to_async(replace_state)(self.alice, self.shopping.session_id, {"budget": 20}, 0)
        session = await ChatSession.objects.aget(pk=self.shopping.pk)
        panel = await sync_to_async(rendering.render_state_panel)(session)
        assert ("starts with <code>shopping_list</code>: delete it and it comes back with its starting value "
                "on your next message") in panel
        self.llm.add(Text("Noted."))
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "hello")
        await frames_until(socket, run_done())
        await settle()
        session = await ChatSession.objects.aget(pk=self.shopping.pk)
        assert session.session_state == {"budget": 20, "shopping_list": []}
        await socket.disconnect()

    async def test_stop_cancels_the_run_keeps_the_partial_reply_and_closes_the_model_stream(self):
        hold = threading.Event()  # never set: the reply stops after its first word
        self.llm.add(Text("partial words that never arrive", wait_event=hold))
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "write a long story")
        frames = await frames_until(socket, is_stream_frame)
        run_id = started_run_id(frames)
        await socket.send_to(text_data=json.dumps({"type": "stop", "run_id": run_id}))
        frames = await frames_until(socket, run_done("cancelled"))
        assert "Stopped" in frames[-1] and "partial" in frames[-1]
        await settle()
        run = await Run.objects.aget(run_id=run_id)
        assert (run.status, run.content) == (RunStatus.CANCELLED, "partial ")
        # A stopped stream reports no usage: the figure is unknown, never a false "0 in / 0 out".
        assert not {"input_tokens", "output_tokens", "total_tokens"} & run.metrics.keys()
        assert "tokens unknown" in frames[-1] and "0 in" not in frames[-1]
        assert await sync_to_async(self.llm.wait_for_disconnects)(1, 5)  # the provider stream was closed
        await socket.disconnect()

    async def test_stop_without_a_run_id_stops_the_current_run(self):
        hold = threading.Event()
        self.llm.add(Text("hello there friend", wait_event=hold))
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "hi")
        await frames_until(socket, is_stream_frame)
        await socket.send_to(text_data=json.dumps({"type": "stop"}))
        await frames_until(socket, run_done("cancelled"))
        await settle()
        assert await Run.objects.filter(status=RunStatus.CANCELLED).acount() == 1
        await socket.disconnect()

    async def test_a_socket_joining_mid_reply_gets_the_whole_text_once(self):
        hold = threading.Event()
        self.llm.add(Text("alpha beta gamma delta", wait_event=hold))
        first = await self.socket(self.shopping.session_id, self.alice)
        await self.send(first, "greek letters please")
        frames = await frames_until(first, is_stream_frame)
        run_id = started_run_id(frames)
        assert streamed_html(frames, run_id) == "<p>alpha</p>\n"

        second = await self.socket(self.shopping.session_id, self.alice)
        catch_up = await second.receive_from(timeout=5)
        assert f'id="run-{run_id}"' in catch_up and 'hx-swap-oob="true"' in catch_up
        assert reply_in(catch_up, run_id) == "<p>alpha</p>\n"
        # A batch the socket already has (as a slower process might still deliver it) is dropped.
        await asend_to_session(self.shopping.pk, "chat.tokens", run_id=run_id, seq=1, origin="elsewhere",
                               keep=0, html="<p>alpha</p>", elements=0)
        await asend_to_session(self.shopping.pk, "chat.html", html="<i>after the stale batch</i>")
        assert await second.receive_from(timeout=5) == "<i>after the stale batch</i>"
        hold.set()
        frames = await frames_until(second, run_done())
        assert reply_in(frames[-1], run_id) == "<p>alpha beta gamma delta</p>\n"
        assert all(streamed_html(frames[:n], run_id, reply_in(catch_up, run_id)).startswith("<p>alpha")
                   for n in range(len(frames)))
        await settle()
        for socket in (first, second):
            await socket.disconnect()

    async def test_a_reload_after_a_tool_call_shows_the_tool_rows_in_the_catch_up(self):
        hold = threading.Event()
        self.llm.add(ToolCalls([("add_item", {"item": "bread"})]), Text("Added bread for you.", wait_event=hold))
        first = await self.socket(self.shopping.session_id, self.alice)
        await self.send(first, "add bread")
        frames = await frames_until(first, is_stream_frame)
        run_id = started_run_id(frames)
        second = await self.socket(self.shopping.session_id, self.alice)
        catch_up = await second.receive_from(timeout=5)
        assert "add_item" in catch_up and "bread" in catch_up and "Added " in catch_up
        hold.set()
        await frames_until(second, run_done(run_id=run_id))
        await settle()
        for socket in (first, second):
            await socket.disconnect()

    async def test_a_model_error_shows_inline_with_retry_and_retry_runs_the_input_again(self):
        self.llm.add(Error(400, "The test server refuses this."))
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Kept",
                                                    name_source=NameSource.USER)
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "please answer")
        frames = await frames_until(socket, run_done("error"))
        failed = started_run_id(frames)
        assert "The test server refuses this." in frames[-1]
        assert f'class="retry button small" data-run-id="{failed}"' in frames[-1]
        self.llm.add(Text("Here is the answer."))
        await socket.send_to(text_data=json.dumps({"type": "retry", "run_id": failed}))
        frames = await frames_until(socket, run_done())
        retried = started_run_id(frames)
        assert retried != failed
        await settle()
        run = await Run.objects.aget(run_id=retried)
        assert (run.input, run.content) == ("please answer", "Here is the answer.")
        await socket.disconnect()

    async def test_a_nul_or_a_lone_surrogate_in_a_message_is_stored_as_a_replacement_character(self):
        """PostgreSQL stores neither: the message, its title and the model's copy get U+FFFD."""
        self.llm.add(Text("Noted."), Text("Oat milk"))
        session = await sync_to_async(make_session)(self.alice, component_id="general")
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "buy oat\x00milk \ud800")
        frames = await frames_until(socket, run_done())
        run = await Run.objects.aget(run_id=started_run_id(frames))
        assert (run.status, run.input, run.content) == (RunStatus.COMPLETED, "buy oat\ufffdmilk \ufffd", "Noted.")
        await settle()
        assert (await ChatSession.objects.aget(pk=session.pk)).name == "Oat milk"  # the fallback title, then this
        await socket.disconnect()

    async def test_a_fallback_title_at_once_then_a_generated_one_in_every_tab(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general")
        elsewhere = await sync_to_async(make_session)(self.alice, component_id="general")
        self.llm.add(Text("Sure, here is a plan."), Text("Weekend trip plan"))
        socket = await self.socket(session.session_id, self.alice)
        other_tab = await self.socket(elsewhere.session_id, self.alice)  # another session: user group only
        long_text = "Please help me plan a weekend trip to the mountains with my family"
        await self.send(socket, long_text)
        row = f'id="session-item-{session.pk}"'
        frames = await frames_until(other_tab, lambda f: row in f)
        assert "Please help me plan a weekend trip to…" in frames[-1]
        await frames_until(socket, run_done())  # the fallback is stored with the run's end (tests/web/test_live.py)
        activity = (await ChatSession.objects.aget(pk=session.pk)).last_activity_at
        frames = await frames_until(other_tab, lambda f: row in f and "Weekend trip plan" in f)
        assert 'data-status' not in "".join(frames)  # the other session's tab gets no transcript
        await settle()
        titled = await ChatSession.objects.aget(pk=session.pk)
        assert (titled.name, titled.name_source) == ("Weekend trip plan", NameSource.AUTO)
        assert titled.last_activity_at == activity  # titling does not move the session up
        for s in (socket, other_tab):
            await s.disconnect()

    async def test_the_summary_reaches_the_state_panel_after_the_reply(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Trip",
                                                    name_source=NameSource.USER)
        summary_may_answer = threading.Event()

        def summaries(body):
            if not is_summary_request(body):
                return None
            summary_may_answer.wait(10)  # the model takes its time with the summary
            return Text(json.dumps({"summary": "Alice plans a <b>trip</b>.", "topics": ["travel"]}))

        self.llm.side_responder = summaries
        self.llm.add(Text("Happy to help."))
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "help me plan a trip")
        # The reply is complete while the summary is still being written...
        frames = await frames_until(socket, run_done())
        assert not any('id="session-summary"' in f for f in frames)
        summary_may_answer.set()
        # ...and the summary reaches the panel when it is done.
        frames = await frames_until(socket, lambda f: 'id="session-summary"' in f)
        assert "Alice plans a &lt;b&gt;trip&lt;/b&gt;." in frames[-1]
        await settle()
        await socket.disconnect()

    async def test_a_newer_summary_replaces_the_one_shown_without_redrawing_the_panel(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Trip",
                                                    name_source=NameSource.USER)
        summaries = iter(["Alice plans a trip.", "Alice plans a <i>trip</i> to Oslo."])
        self.llm.side_responder = lambda body: (
            Text(json.dumps({"summary": next(summaries), "topics": ["travel"]})) if is_summary_request(body) else None)
        self.llm.add(Text("Happy to help."), Text("Oslo it is."))
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "help me plan a trip")
        first = await frames_until(socket, lambda f: 'id="session-summary"' in f)
        assert 'id="state-panel"' in first[-1]  # the first summary brings the panel (this assistant has no state)
        await self.send(socket, "to Oslo")
        newer = (await frames_until(socket, lambda f: 'id="session-summary"' in f))[-1]
        assert 'id="state-panel"' not in newer and 'hx-swap-oob="true"' in newer
        assert "Alice plans a &lt;i&gt;trip&lt;/i&gt; to Oslo." in newer and "Topics: travel" in newer
        stored = await ChatSession.objects.aget(pk=session.pk)
        panel = await sync_to_async(rendering.render_state_panel)(stored)
        shown = newer[newer.index("<details"):]
        assert shown.replace(' hx-swap-oob="true"', "") in panel  # the same as the panel draws it
        await settle()
        await socket.disconnect()

    async def test_a_title_the_user_set_is_never_replaced_by_a_run(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="My own title",
                                                    name_source=NameSource.USER)
        self.llm.add(Text("An answer."), Text("Generated title"))
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "a question")
        await frames_until(socket, run_done())
        await settle()
        asked = [body for body in self.llm.requests if not is_summary_request(body) and not is_memory_request(body)]
        assert len(asked) == 1  # the reply only: no title was even asked for
        assert (await ChatSession.objects.aget(pk=session.pk)).name == "My own title"
        await socket.disconnect()

    async def test_regenerate_title_asks_the_model_even_over_a_user_title(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Old",
                                                    name_source=NameSource.USER)
        await sync_to_async(make_run)(session, "tell me about owls", "Owls are birds.")
        self.llm.add(Text("All about owls"))
        socket = await self.socket(session.session_id, self.alice)
        await socket.send_to(text_data=json.dumps({"type": "regenerate_title"}))
        frames = await frames_until(socket, lambda f: f'id="session-item-{session.pk}"' in f)
        assert "All about owls" in frames[-1]
        await settle()
        assert (await ChatSession.objects.aget(pk=session.pk)).name_source == NameSource.AUTO
        await socket.disconnect()

    async def test_a_rename_in_one_tab_reaches_the_users_other_tabs(self):
        session = await sync_to_async(make_session)(self.alice, component_id="general", name="Before")
        tab = await self.socket(session.session_id, self.alice)
        client = Client()
        await sync_to_async(client.force_login)(self.alice)
        response = await sync_to_async(client.post)(
            reverse("chat:session_rename_hx", args=[session.session_id]), {"name": "After the rename"},
            headers={"HX-Request": "true"},
        )
        assert response.status_code == 200
        frames = await frames_until(tab, lambda f: f'id="session-item-{session.pk}"' in f)
        assert "After the rename" in frames[-1] and 'hx-swap-oob="true"' in frames[-1]
        await tab.disconnect()

    async def test_a_stop_asked_in_another_process_reaches_the_run_through_the_database(self):
        hold = threading.Event()  # never set: the model's stream stalls after its first word
        self.llm.add(Text("one two three", wait_event=hold))
        socket = await self.socket(self.shopping.session_id, self.alice)
        await self.send(socket, "count")
        run_id = started_run_id(await frames_until(socket, is_stream_frame))
        # What Stop in a tab of another process does here: the engine's flag on the run's row, which the
        # run hears at its next heartbeat and stops the stalled stream for.
        await Run.objects.filter(run_id=run_id).aupdate(cancel_requested=True)
        await frames_until(socket, run_done("cancelled", run_id))
        await settle()
        assert (await Run.objects.aget(run_id=run_id)).content == "one "
        assert await sync_to_async(self.llm.wait_for_disconnects)(1, 5)  # the provider stream was closed
        await socket.disconnect()

    async def run_elsewhere(self, checkpoint: str) -> Run:
        """A run that another process is streaming: running in the database with the text it has stored,
        its session leased, not in this process."""
        running = await sync_to_async(make_run)(self.shopping, "remote question", None, status=RunStatus.RUNNING)
        await Run.objects.filter(pk=running.pk).aupdate(content=checkpoint, finished_at=None)
        await ChatSession.objects.filter(pk=self.shopping.pk).aupdate(
            lease_token="other", lease_expires_at=timezone.now() + timedelta(seconds=30))
        return running

    async def test_a_reconnect_after_lost_frames_catches_up_from_the_stored_text_without_asking_anyone(self):
        await get_channel_layer().flush()  # no group left from an earlier test
        running = await self.run_elsewhere("")
        other = AnotherProcess(self.shopping.pk, running.run_id)
        # Before the page reconnects: the reply so far, its batches sent while the page was away (lost
        # to it) and its text stored by the engine.
        other.write("## Title\n\n")
        other.write("alpha")
        await other.checkpoint()
        query = f"last_run={running.run_id}&running={running.run_id}&reconnect=1"
        socket = await self.socket(self.shopping.session_id, self.alice, query=query)
        frames = await frames_until(socket, lambda f: f'id="run-{running.run_id}"' in f)
        caught_up = reply_in(frames[-1], running.run_id)
        assert 'data-status="running"' in frames[-1] and caught_up == render_markdown("## Title\n\nalpha")

        async def shown(batch: dict) -> str:
            await other.send(batch)
            return await socket.receive_from(timeout=5)

        frames = [await shown(other.write(" beta")), await shown(other.write("\n\ngamma"))]  # in order
        assert all(map(is_stream_frame, frames))
        other.write(" delta\n\nepsilon")  # a block completed in a batch the layer dropped...
        await other.checkpoint()  # ...whose text the engine has stored since
        await other.send(other.write(" zeta"))  # this batch keeps that block: the page is drawn from the database
        frames += await frames_until(socket, is_stream_frame)
        assert not is_stream_frame(frames[2]) and 'data-status="running"' in frames[2]
        frames.append(await shown(other.write("\n\neta")))  # and the batches after it apply in order
        text = other.live.text
        assert streamed_html(frames, running.run_id, caught_up) == render_markdown(text)
        assert len(frames) == 5 and await socket.receive_nothing(timeout=0.2)
        # No process was asked for anything: the only groups are the session's and the user's.
        groups = {name for name, members in get_channel_layer().groups.items() if members}
        assert groups == {session_group(self.shopping.pk), user_group(self.alice.pk)}
        await socket.disconnect()

    async def test_stored_text_older_than_the_page_is_not_shown(self):
        running = await self.run_elsewhere("")
        other = AnotherProcess(self.shopping.pk, running.run_id)
        socket = await self.socket(self.shopping.session_id, self.alice)
        assert reply_in(await socket.receive_from(timeout=5), running.run_id) == ""  # nothing stored yet
        frames = []
        for words in ("one", "\n\ntwo", "\n\nthree"):
            await other.send(other.write(words))
            frames.append(await socket.receive_from(timeout=5))
        other.write("\n\nfour")  # dropped on the way, and not stored yet
        await other.send(other.write(" and more"))
        assert await socket.receive_nothing(timeout=0.2)  # the stored text (none) is not drawn over the page's
        assert streamed_html(frames, running.run_id) == render_markdown("one\n\ntwo\n\nthree")
        await socket.disconnect()

    async def test_a_run_of_another_process_that_ended_meanwhile_is_shown_as_stored(self):
        running = await self.run_elsewhere("Half")
        other = AnotherProcess(self.shopping.pk, running.run_id)
        socket = await self.socket(self.shopping.session_id, self.alice)
        assert reply_in(await socket.receive_from(timeout=5), running.run_id) == "<p>Half</p>\n"
        other.write("Half\n\nway")
        await Run.objects.filter(pk=running.pk).aupdate(status=RunStatus.COMPLETED, content="Half\n\nway there.")
        await other.send(other.write(" there."))  # its final form was dropped: this batch finds the run ended
        frame = await socket.receive_from(timeout=5)
        assert run_done("completed", running.run_id)(frame) and "way there." in frame
        await other.send(other.write(" Late."))  # stale now
        assert await socket.receive_nothing(timeout=0.2)
        await socket.disconnect()


class TestAbandonedRuns(LiveTestMixin, TransactionTestCase):
    """A run whose process stopped mid-reply (a restart): still "running" in the database, its lease
    no longer renewed. Pages show it interrupted as soon as that is known, instead of forever running."""

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")
        self.run = make_run(self.session, "a question", None, status=RunStatus.RUNNING)
        Run.objects.filter(pk=self.run.pk).update(content="Half a rep", finished_at=None)

    def lease_ends_in(self, seconds: float):
        expires = timezone.now() + timedelta(seconds=seconds)
        ChatSession.objects.filter(pk=self.session.pk).update(lease_expires_at=expires)

    async def interrupted(self) -> Run:
        run = await Run.objects.aget(pk=self.run.pk)
        assert run.status == RunStatus.INTERRUPTED and run.finished_at is not None
        assert run.error == "The process running this run stopped before it finished."
        return run

    async def test_a_page_that_shows_it_running_gets_it_interrupted_when_it_connects(self):
        await sync_to_async(self.lease_ends_in)(-1)
        query = f"last_run={self.run.run_id}&running={self.run.run_id}&reconnect=1"
        socket = await self.socket(self.session.session_id, self.alice, query=query)
        frames = await frames_until(socket, run_done("interrupted", self.run.run_id))
        assert "Half a rep" in frames[-1] and "Interrupted: the server stopped during this reply." in frames[-1]
        frames = await frames_until(socket, lambda f: "The reply was interrupted." in f)
        await self.interrupted()
        await socket.disconnect()

    async def watch(self):
        """A page showing the run, connected while another process holds its lease for 0.3 s more: it is
        sent the run as stored."""
        await sync_to_async(self.lease_ends_in)(0.3)
        socket = await self.socket(self.session.session_id, self.alice,
                                   query=f"last_run={self.run.run_id}&running={self.run.run_id}")
        caught_up = await socket.receive_from(timeout=5)
        assert 'data-status="running"' in caught_up and "Half a rep" in caught_up
        return socket

    @override_settings(CHAT_LEASE_GRACE_SECONDS=0.05)
    async def test_a_page_watching_it_sees_it_interrupted_when_its_lease_runs_out(self):
        socket = await self.watch()  # that process is gone
        frames = await frames_until(socket, run_done("interrupted", self.run.run_id))
        assert "The reply was interrupted." in frames[-1]
        await self.interrupted()
        await socket.disconnect()

    @override_settings(CHAT_LEASE_GRACE_SECONDS=0.05)
    async def test_a_run_whose_process_renews_its_lease_stays_running(self):
        socket = await self.watch()
        await sync_to_async(self.lease_ends_in)(30)  # the owning process's heartbeat
        assert await socket.receive_nothing(timeout=1.0)  # past the first expiry: the watch looked again
        assert (await Run.objects.aget(pk=self.run.pk)).status == RunStatus.RUNNING
        await socket.disconnect()

    async def test_stop_ends_it_at_once(self):
        # Called as the socket calls it, with no socket: one that watched the run would settle it itself
        # the moment its lease ran out, racing the Stop.
        channel = await layer_listener(session_group(self.session.pk))
        await sync_to_async(self.lease_ends_in)(-1)  # the process stops while the page is open
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert await live.stop(session, run_id=self.run.run_id)  # not "Nothing to stop."
        frame = await asyncio.wait_for(get_channel_layer().receive(channel), 10)
        assert run_done("interrupted", self.run.run_id)(frame["html"])
        await self.interrupted()

    async def test_a_new_message_shows_it_interrupted_before_its_own_reply(self):
        self.llm.add(Text("A new reply."))
        socket = await self.socket(self.session.session_id, self.alice, query=f"last_run={self.run.run_id}")
        await sync_to_async(self.lease_ends_in)(-1)  # the process stops while the page is open
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "are you there?"}))
        frames = await frames_until(socket, run_done())
        old = next(i for i, f in enumerate(frames) if run_done("interrupted", self.run.run_id)(f))
        new = next(i for i, f in enumerate(frames) if "beforeend:#transcript" in f and "are you there?" in f)
        assert old < new
        await settle()
        await self.interrupted()
        await socket.disconnect()

    async def test_a_message_queued_behind_it_runs_when_the_page_comes_back(self):
        await sync_to_async(self.lease_ends_in)(-1)
        queued = await sync_to_async(lifecycle.enqueue)(self.session, "next one")  # its process stopped too
        self.llm.add(Text("The next answer."))
        query = f"last_run={self.run.run_id}&running={self.run.run_id}&reconnect=1"
        socket = await self.socket(self.session.session_id, self.alice, query=query)
        frames = await frames_until(socket, run_done("completed"))
        interrupted = next(i for i, f in enumerate(frames) if run_done("interrupted", self.run.run_id)(f))
        shown = next(i for i, f in enumerate(frames) if 'id="queue"' in f and "next one" in f)
        started = next(i for i, f in enumerate(frames) if "beforeend:#transcript" in f and "next one" in f)
        assert interrupted < started and shown < started
        assert any(f'<li id="queued-{queued.run_id}" hx-swap-oob="delete">' in f for f in frames)
        await settle()
        assert [r.input async for r in Run.objects.filter(session=self.session).order_by("pk")] == [
            "a question", "next one"]
        assert not await Run.objects.filter(status=RunStatus.QUEUED).aexists()
        await socket.disconnect()

    def test_the_page_shows_it_interrupted_and_not_busy(self):
        self.lease_ends_in(-1)
        client = Client()
        client.force_login(self.alice)
        html = client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert 'aria-busy="false"' in html and 'data-status="interrupted"' in html and "Half a rep" in html
        # A page writes nothing: the run is stored interrupted when the page's socket connects.
        assert Run.objects.get(pk=self.run.pk).status == RunStatus.RUNNING

    def test_a_page_of_a_run_in_progress_is_left_alone(self):
        client = Client()
        client.force_login(self.alice)
        html = client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert 'aria-busy="true"' in html
        assert Run.objects.get(pk=self.run.pk).status == RunStatus.RUNNING
