"""chatapp.live and chatapp.titles without a socket: run tasks, batching, queueing, stop, titles, what the
groups receive."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import SimpleTestCase, TransactionTestCase, override_settings
from django.utils import timezone
from django.utils.safestring import SafeString

from chatapp import live, rendering, titles
from chatapp.broadcast import session_group, user_group
from chatapp.live import fragments, queue, streaming
from sessions_core.events import RunStartedEvent
from sessions_core.models import ChatSession, NameSource, Run, RunStatus
from sessions_core.run import lifecycle
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import LiveTestMixin, TopLevel, apply_frame, frames_until, layer_listener, run_done, settle
from tests.support.llm_server import Error, Text, ToolCalls, is_memory_request


def echo_reply(body: dict) -> Text:
    """A title for title requests, else "reply <the last user message>" (order-independent)."""
    messages = body["messages"]
    if "at most five words" in (messages[0].get("content") or ""):
        return Text("Title")
    return Text("reply " + messages[-1]["content"])


class TestFragments(SimpleTestCase):
    def test_fallback_title_cuts_at_a_word_near_forty_characters(self):
        assert titles.fallback_title("  add   milk\nand eggs ") == "add milk and eggs"
        title = titles.fallback_title("Please help me plan a weekend trip to the mountains with my family")
        assert title == "Please help me plan a weekend trip to…"
        assert len(title) <= 41
        assert titles.fallback_title("x" * 100) == "x" * 40 + "…"

    def test_oob_marks_the_first_element_and_keeps_the_rest(self):
        run = Run(run_id="r1", input="hi", status=RunStatus.COMPLETED)
        run.shown_messages = []
        marked = rendering.render_run(run, oob="true")
        assert '<article id="run-r1" class="run" data-status="completed" data-run-id="r1" hx-swap-oob="true">' in marked
        assert marked.count("hx-swap-oob") == 1 and marked.replace(' hx-swap-oob="true"', "") == rendering.render_run(run)
        assert 'hx-swap-oob="afterend:#y"' in rendering.render_run(run, oob="afterend:#y")
        wrapped = rendering.render_oob(SafeString("<b>x</b>"), "beforeend:#t")
        assert wrapped == '<div hx-swap-oob="beforeend:#t"><b>x</b></div>'
        assert rendering.render_oob([SafeString("<b>x</b>"), SafeString("<i>y</i>")], "beforeend:#t") == (
            '<div hx-swap-oob="beforeend:#t"><b>x</b><i>y</i></div>')
        assert rendering.render_delete("li", "queued-q1") == '<li id="queued-q1" hx-swap-oob="delete"></li>'

    def test_a_batch_waits_for_the_batch_time_or_the_drawings_share_whichever_is_longer(self):
        run = streaming.LiveRun(fragments.StreamedRun("r1"))
        assert run.flush_wait(0.03, now=100.0) < 0  # the first text goes at once
        run.last_flush, run.pace = 100.0, 0.01  # a paragraph's drawing: the batch time rules
        assert run.flush_wait(0.03, now=100.0) == pytest.approx(0.03)
        run.pace = 0.2  # a long code block's: drawn less often
        assert run.flush_wait(0.03, now=100.1) == pytest.approx(0.1)

    def test_a_stream_frame_carries_sanitized_html_for_live_js(self):
        html = rendering.render_stream_frame("r1", 2, rendering.render_markdown('<script>alert("x")</script> **b**'))
        assert html == ('<template data-stream-run="r1" data-keep="2"><p>&lt;script&gt;alert("x")'
                        "&lt;/script&gt; <strong>b</strong></p>\n</template>")


class LiveTaskTests(LiveTestMixin, TransactionTestCase):
    """A session of alice's, and readers of what the run tasks send to the channel groups."""

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")

    async def listen(self, group: str) -> str:
        return await layer_listener(group)

    async def next_message(self, channel: str, predicate=lambda m: True, timeout: float = 10) -> dict:
        layer = get_channel_layer()
        while True:
            message = await asyncio.wait_for(layer.receive(channel), timeout)
            if predicate(message):
                return message

    async def empty(self, channel: str) -> bool:
        """Nothing waiting on `channel` (the in-memory layer's queue for it), once every task has settled."""
        queue = get_channel_layer().channels.get(channel)
        return queue is None or queue.empty()

    async def collect_until_done(self, channel: str, count: int = 1) -> list[dict]:
        layer, messages, done = get_channel_layer(), [], 0
        while done < count:
            message = await asyncio.wait_for(layer.receive(channel), 10)
            messages.append(message)
            done += message["type"] == "chat.run_done"
        return messages

    async def send_three_while_the_first_is_held(self):
        """"one", "two" and "three" submitted while the reply to "one" is held: (session, the session
        group's channel, the event that releases the reply, the three items)."""
        hold = threading.Event()
        self.llm.add(Text("reply one", wait_event=hold))
        self.llm.responder = echo_reply
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        items = [await live.submit(session, self.alice, text) for text in ("one", "two", "three")]
        return session, channel, hold, items

    async def batches(self, reply: Text) -> list[dict]:
        """The token batches the session's group receives while the model writes `reply`."""
        self.llm.add(reply)
        channel = await self.listen(session_group(self.session.pk))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        await live.submit(session, self.alice, "a message")
        batches = [m for m in await self.collect_until_done(channel) if m["type"] == "chat.tokens"]
        await settle()
        return batches


class TestRunTasks(LiveTaskTests):
    async def test_the_first_batch_goes_at_once_and_later_ones_are_batched(self):
        words = " ".join(f"word{n}" for n in range(30))
        batches = await self.batches(Text(words, chunk_delay=0.005))
        assert (batches[0]["keep"], batches[0]["html"]) == (0, "<p>word0</p>\n")  # no waiting
        assert [b["seq"] for b in batches] == list(range(1, len(batches) + 1))  # numbered, none missing
        assert batches[-1]["html"] == rendering.render_markdown(words)
        assert len(batches) < 30

    async def test_batches_applied_in_order_draw_the_whole_reply(self):
        text = "".join(f"## Part {n}\n\nSome *text* of part {n}.\n\n" for n in range(6))
        batches = await self.batches(Text(text, chunk_delay=0.002))
        reply, completed = [], 0
        for batch in batches:
            assert batch["keep"] <= completed  # each keeps no more than the completed blocks before it
            reply, completed = apply_frame(reply, batch["keep"], batch["html"]), batch["elements"]
            assert completed <= len(reply)
        assert "".join(reply) == rendering.render_markdown(text)
        assert completed == len(TopLevel(rendering.render_markdown(text)).parts) - 1  # all but the open block

    async def test_three_messages_run_in_the_order_sent(self):
        session, channel, hold, (first, second, third) = await self.send_three_while_the_first_is_held()
        assert [run.run_id for run in await live.queued(session.pk)] == [second.run_id, third.run_id]
        assert [run.input for run in await live.queued(session.pk)] == ["two", "three"]
        hold.set()
        await self.collect_until_done(channel, 3)
        await settle()
        runs = [(r.input, r.content) async for r in Run.objects.filter(session=session).order_by("pk")]
        assert runs == [("one", "reply one"), ("two", "reply two"), ("three", "reply three")]
        assert await live.queued(session.pk) == []

    async def test_a_queued_message_can_be_dropped_before_it_runs(self):
        session, channel, hold, (_, second, _) = await self.send_three_while_the_first_is_held()
        runs = [(r.input, r.status) async for r in Run.objects.order_by("pk")]
        assert runs == [("one", RunStatus.RUNNING), ("two", RunStatus.QUEUED), ("three", RunStatus.QUEUED)]
        assert await live.stop(session, queued_id=second.run_id)
        removed = await self.next_message(channel, lambda m: 'hx-swap-oob="delete"' in m.get("html", ""))
        assert f'<li id="queued-{second.run_id}" hx-swap-oob="delete">' in removed["html"]
        assert not await live.stop(session, queued_id=second.run_id)  # already gone
        hold.set()
        await self.collect_until_done(channel, 2)
        await settle()
        inputs = [r.input async for r in Run.objects.filter(session=session).order_by("pk")]
        assert inputs == ["one", "three"]

    async def test_a_message_waits_for_another_process_and_can_be_stopped_before_it_starts(self):
        # Another process holds the session's lease: the message is shown queued and waits.
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(
            lease_token="elsewhere", lease_expires_at=timezone.now() + timedelta(seconds=30))
        self.llm.add(Text("never shown"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        item = await live.submit(session, self.alice, "hello")
        queued = await self.next_message(channel, lambda m: "beforeend:#queue" in m.get("html", ""))
        assert rendering.QUEUED_NOTE in queued["html"] and f"queued-{item.run_id}" in queued["html"]
        assert await live.stop(session)  # no run shown: the oldest message waiting is stopped
        removed = await self.next_message(channel, lambda m: "Queued message removed." in m.get("html", ""))
        assert f'<li id="queued-{item.run_id}" hx-swap-oob="delete">' in removed["html"]
        await settle()
        assert not await Run.objects.filter(session=session).aexists()  # it never began
        assert self.llm.requests == []  # stopped before the model was asked anything

    async def test_the_sidebar_row_shows_the_run_while_it_runs(self):
        hold = threading.Event()
        self.llm.add(Text("a reply", wait_event=hold), Text("Title"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        rows = await self.listen(user_group(self.alice.pk))
        events = await self.listen(session_group(session.pk))
        await live.submit(session, self.alice, "hello")
        running = await self.next_message(rows)  # one row as the run starts, titled after the first message
        assert 'class="running"' in running["html"] and '<span class="session-title">hello</span>' in running["html"]
        assert re.search(r'<div hx-swap-oob="afterend:#group-today">\s*<li id="session-item-', running["html"])  # to the top of Today
        hold.set()
        await self.collect_until_done(events)
        finished = await self.next_message(rows)  # and one when its title arrives
        assert 'class="running"' not in finished["html"] and "Title" in finished["html"]
        await settle()
        assert await self.empty(rows)  # nothing more: the row is not pushed again
        stored = await ChatSession.objects.aget(pk=session.pk)
        assert (stored.name, stored.name_source) == ("Title", NameSource.AUTO)

    async def test_a_new_chat_is_named_after_its_first_message_when_the_title_fails(self):
        self.llm.add(Text("a reply"), *[Error(500)] * 9)
        session = await ChatSession.objects.aget(pk=self.session.pk)
        rows = await self.listen(user_group(self.alice.pk))
        with override_settings(CHAT_TITLE_ATTEMPTS=1):
            await live.submit(session, self.alice, "plan my weekend")
            await settle()
        stored = await ChatSession.objects.aget(pk=session.pk)
        assert (stored.name, stored.name_source) == ("plan my weekend", NameSource.FALLBACK)
        await self.next_message(rows)  # the running row
        finished = await self.next_message(rows)  # redrawn once the title job gave up
        assert 'class="running"' not in finished["html"] and "plan my weekend" in finished["html"]

    async def test_an_unknown_assistant_is_reported_and_nothing_runs(self):
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(component_id="retired")
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        await live.submit(session, self.alice, "hello")
        message = await self.next_message(channel, lambda m: "status-error" in m.get("html", ""))
        assert "assistant (retired) is not available" in message["html"]
        await settle()
        assert await Run.objects.acount() == 0

    async def test_a_title_is_retried_when_the_model_fails(self):
        await sync_to_async(make_run)(self.session, "plan my weekend", "Here is a plan.")
        # The SDK retries twice itself, then the engine asks again: the fourth request answers.
        self.llm.add(Error(500), Error(500), Error(500), Text("Weekend plans"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert await titles.generate_title(session, self.alice)
        titled = await ChatSession.objects.aget(pk=session.pk)
        assert (titled.name, titled.name_source) == ("Weekend plans", NameSource.AUTO)
        assert len(self.llm.requests) == 4

    @override_settings(CHAT_TITLE_RETRY_SECONDS=0.01)
    async def test_a_title_is_tried_again_later_when_every_engine_attempt_fails(self):
        await sync_to_async(make_run)(self.session, "plan my weekend", "Here is a plan.")
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(name="plan my weekend", name_source="fallback")
        # First round: the SDK's 3 tries x the engine's 3 attempts all fail; the fallback title stays.
        self.llm.add(*[Error(500)] * 9, Text("Weekend plans"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert await titles.generate_title(session, self.alice)
        titled = await ChatSession.objects.aget(pk=session.pk)
        assert (titled.name, titled.name_source) == ("Weekend plans", NameSource.AUTO)
        assert len(self.llm.requests) == 10

    async def test_a_title_for_a_session_deleted_meanwhile_gives_up_quietly(self):
        session = await ChatSession.objects.aget(pk=self.session.pk)
        await ChatSession.objects.filter(pk=session.pk).adelete()
        assert not await titles.generate_title(session, self.alice)
        assert self.llm.requests == []

    async def test_the_fallback_title_never_replaces_an_existing_name(self):
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(name="Mine", name_source=NameSource.USER)
        self.llm.add(Text("ok"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        await live.submit(session, self.alice, "a first message")
        await settle()
        assert (await ChatSession.objects.aget(pk=session.pk)).name == "Mine"


class TestStoredQueue(LiveTaskTests):
    """Messages waiting for their run are the engine's queued runs: a process that stops (a restart, a crash)
    does not take them with it, the next process to serve the session runs them, and none runs twice."""

    async def unclaimed(self, text: str) -> Run:
        """A message left queued by a process that has stopped: a queued run no process waits for."""
        return await sync_to_async(lifecycle.enqueue)(self.session, text)

    async def test_a_queued_message_is_stored_until_its_run_starts(self):
        hold = threading.Event()
        self.llm.add(Text("reply one", wait_event=hold))
        self.llm.responder = echo_reply
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        await live.submit(session, self.alice, "one")
        second = await live.submit(session, self.alice, "two")
        stored = await Run.objects.aget(run_id=second.run_id)
        assert (stored.status, stored.input, stored.session_id) == (RunStatus.QUEUED, "two", session.pk)
        hold.set()
        await self.collect_until_done(channel, 2)
        await settle()
        assert not await Run.objects.filter(status=RunStatus.QUEUED).aexists()

    async def test_a_page_drawn_while_a_run_ran_gets_the_state_and_row_it_left_when_its_socket_connects(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        session = await sync_to_async(make_session)(self.alice, component_id="shopping", name="add milk")
        await live.submit(session, self.alice, "add milk")
        await live.wait_idle()  # the run (and its title job) ended before the page's socket connects
        run = await Run.objects.aget(session=session)
        assert run.status == RunStatus.COMPLETED
        # The page was drawn with the run still running, the state and the chat's name as they were then.
        communicator = await self.socket(session.session_id, self.alice,
                                         f"last_run=&running={run.run_id}&shown_name=an+old+name")
        row = f'id="session-item-{session.pk}"'
        frames = await frames_until(communicator, lambda frame: row in frame)
        await communicator.disconnect()
        assert any(run_done(run_id=run.run_id)(frame) for frame in frames)
        assert "milk" in next(frame for frame in frames if 'id="state-panel"' in frame)
        session = await ChatSession.objects.aget(pk=session.pk)
        assert f'data-name="{session.name}"' in next(frame for frame in frames if row in frame)

    async def test_a_page_that_shows_a_run_ended_but_an_older_state_gets_the_panel_when_its_socket_connects(self):
        # The page read the session (state version 1) before the run's end was stored, and its runs after.
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        session = await sync_to_async(make_session)(self.alice, component_id="shopping")
        await sync_to_async(session.apply_state_change)({"shopping_list": []}, "defaults")
        drawn_from = await sync_to_async(rendering.panel_stamp)(session)
        await live.submit(session, self.alice, "add milk")
        await live.wait_idle()
        run = await Run.objects.aget(session=session)
        communicator = await self.socket(session.session_id, self.alice, f"last_run={run.run_id}&panel={drawn_from}")
        frames = await frames_until(communicator, lambda frame: 'id="state-panel"' in frame)
        await communicator.disconnect()
        assert "milk" in frames[-1] and 'data-stamp="2:' in frames[-1]
        assert not any(f'id="run-{run.run_id}"' in frame for frame in frames)  # the page has the run itself

    async def test_messages_left_by_a_stopped_process_run_here_in_order(self):
        self.llm.responder = echo_reply
        first, second = await self.unclaimed("left one"), await self.unclaimed("left two")
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        assert "left one" in rendering.render_queue(await live.queued(session.pk))  # the page shows them queued meanwhile
        assert await live.take_over_unclaimed(session)
        messages = await self.collect_until_done(channel, 2)
        await settle()
        runs = [(r.run_id, r.input, r.content) async for r in Run.objects.filter(session=session).order_by("pk")]
        assert runs == [(first.run_id, "left one", "reply left one"), (second.run_id, "left two", "reply left two")]
        removed = [m["html"] for m in messages if 'hx-swap-oob="delete"' in m.get("html", "")]
        assert any(f"queued-{first.run_id}" in html for html in removed)
        assert any(f"queued-{second.run_id}" in html for html in removed)

    async def test_an_orphan_taken_over_while_a_run_holds_the_session_waits_its_turn(self):
        unclaimed = await self.unclaimed("waiting")
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(
            lease_token="elsewhere", lease_expires_at=timezone.now() + timedelta(seconds=30))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert await live.take_over_unclaimed(session)
        await until_true(lambda: Run.objects.filter(pk=unclaimed.pk, claimed_until__isnull=False).aexists())
        assert await sync_to_async(lifecycle.unclaimed)(session.pk) == []  # this process waits for it now
        assert await live.stop(session, queued_id=unclaimed.run_id)
        await settle()
        assert not await Run.objects.aexists() and self.llm.requests == []

    @override_settings(CHAT_LEASE_GRACE_SECONDS=0.01)
    async def test_a_message_another_process_waits_for_is_taken_over_when_that_process_stops(self):
        self.llm.responder = echo_reply
        # Claimed by a process that stops now: its claim is not renewed and runs out in a moment.
        waiting = await Run.objects.acreate(session=self.session, status=RunStatus.QUEUED, input="left waiting",
                                            claimed_until=timezone.now() + timedelta(seconds=0.2))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert not await live.take_over_unclaimed(session)  # still claimed
        await queue.take_over_when_unclaimed(session)  # returns once nothing waits elsewhere
        await settle()
        run = await Run.objects.aget(pk=waiting.pk)
        assert (run.status, run.content) == (RunStatus.COMPLETED, "reply left waiting")

    async def test_two_adoptions_at_once_run_each_message_once(self):
        self.llm.responder = echo_reply
        await self.unclaimed("only once")
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        await asyncio.gather(live.take_over_unclaimed(session), live.take_over_unclaimed(session))
        await self.collect_until_done(channel, 1)
        await settle()
        assert [r.input async for r in Run.objects.filter(session=session)] == ["only once"]
        replies = [r for r in self.llm.requests if not is_memory_request(r)]  # the memory work reads it too
        assert [r["messages"][-1]["content"] for r in replies].count("only once") == 1

    async def test_a_message_queued_in_another_process_can_be_dropped_from_here(self):
        unclaimed = await self.unclaimed("never mind")
        session = await ChatSession.objects.aget(pk=self.session.pk)
        channel = await self.listen(session_group(session.pk))
        assert await live.stop(session, queued_id=unclaimed.run_id)
        removed = await self.next_message(channel, lambda m: 'hx-swap-oob="delete"' in m.get("html", ""))
        assert f'<li id="queued-{unclaimed.run_id}" hx-swap-oob="delete">' in removed["html"]
        assert not await Run.objects.aexists()

    async def test_another_sessions_queued_message_cannot_be_dropped(self):
        other = await sync_to_async(lambda: make_session(make_user("bob"), component_id="general"))()
        theirs = await sync_to_async(lifecycle.enqueue)(other, "not yours")
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert not await live.stop(session, queued_id=theirs.run_id)
        assert await Run.objects.filter(pk=theirs.pk, status=RunStatus.QUEUED).aexists()


async def until_true(condition, timeout: float = 5) -> None:
    """Wait until the async `condition` holds (polling the database: there is no event to wait on)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


@pytest.mark.django_db
def test_a_started_run_comes_from_its_event_when_the_event_carries_the_input(django_assert_num_queries):
    """The RunStarted fragment is the stored run's, made from the event (which carries the run's input)
    without reading the row back."""
    session = make_session(make_user("carol"))
    run = make_run(session, user_text="add <milk> & eggs", reply=None, status=RunStatus.RUNNING)
    stored = Run.objects.get(run_id=run.run_id)
    stored.shown_messages = list(stored.messages.order_by("seq"))
    from_db = rendering.render_run(stored)
    carrying = RunStartedEvent(run_id=run.run_id, session_id=session.session_id, input=run.input,
                               created_at=run.created_at.timestamp())  # what the engine sends
    with django_assert_num_queries(0):
        started = fragments.started_html(fragments.started_run(carrying))
    assert started == rendering.render_oob(from_db, "beforeend:#transcript")
    assert "add &lt;milk&gt; &amp; eggs" in from_db
