"""Concurrency (SPEC Part 1, item 6): runs on one session are serialized and lose nothing; runs on
different sessions run side by side. Thread tests commit for real (transaction=True), so they run
the same on SQLite and PostgreSQL."""

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import TestCase, TransactionTestCase

from sessions_core import RunContext
from sessions_core.models import ChatSession, Message, Run, StateChange
from tests.support.engine_helpers import EngineTestMixin, Gate, last_user_text, tool_then_text
from tests.support.llm_server import Text

TURNS = 50


def append_item(item: str, run_context: RunContext) -> str:
    """Append an item to the list.

    Args:
        item: The item.
    """
    run_context.session_state["items"].append(item)
    return f"Appended {item}"


class ConcurrencyTest(EngineTestMixin):
    def setUp(self):
        # The scripted model: call the tool with the user's text, then answer once the result is in.
        self.llm.responder = tool_then_text("append_item", lambda body: {"item": last_user_text(body)})
        self.agent_ = self.agent(tools=[append_item], session_state={"items": []})

    def assert_nothing_lost(self, session_id: str, workers: list[str]):
        session = ChatSession.objects.get(session_id=session_id)
        items = session.session_state["items"]
        assert sorted(items) == sorted(f"{w}-{n}" for w in workers for n in range(TURNS))
        for worker in workers:  # each worker's turns landed in the order it made them
            assert [i for i in items if i.startswith(f"{worker}-")] == [f"{worker}-{n}" for n in range(TURNS)]
        runs = list(session.runs.order_by("id"))
        assert len(runs) == TURNS * len(workers) and {run.status for run in runs} == {"completed"}
        seqs = list(Message.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, 4 * len(runs) + 1)) and session.last_seq == seqs[-1]
        for run in runs:  # serialized: each run's four messages are consecutive
            run_seqs = list(run.messages.values_list("seq", flat=True))
            assert run_seqs == list(range(run_seqs[0], run_seqs[0] + 4)), run_seqs
        versions = list(StateChange.objects.filter(session=session).values_list("version", flat=True))
        assert versions == list(range(1, len(runs) + 2)) == list(range(1, session.state_version + 1))
        assert session.state_at(1) == {"items": []}
        assert not session.is_running


@pytest.mark.django_db(transaction=True)
class TestThreads(ConcurrencyTest, TransactionTestCase):
    def test_two_threads_running_fifty_turns_each_on_one_session_lose_nothing(self):
        errors = []

        def worker(name: str):
            try:
                for n in range(TURNS):
                    output = self.agent_.run(f"{name}-{n}", session_id="shared", user_id="alice")
                    assert output.status == "completed", output.error
            except Exception as exc:  # surfaced in the main thread below
                errors.append(exc)
            finally:
                connection.close()

        started = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started

        assert errors == []
        self.assert_nothing_lost("shared", ["a", "b"])
        print(f"\n2 threads x {TURNS} turns on one session ({connection.vendor}): {elapsed:.2f} s")

    def test_runs_on_two_sessions_overlap(self):
        gate = threading.Event()
        self.llm.responder = lambda body: Text("slow reply", wait_event=gate) if last_user_text(body) == "slow" \
            else Text("fast reply")
        outputs = {}

        def slow():
            try:
                outputs["slow"] = self.agent().run("slow", session_id="one")
            finally:
                connection.close()

        thread = threading.Thread(target=slow)
        try:
            thread.start()
            assert self.llm.wait_for_requests(1)
            outputs["fast"] = self.agent().run("fast", session_id="two")  # finishes while "slow" is mid-reply
        finally:
            gate.set()
            thread.join()

        slow_run, fast_run = Run.objects.get(session__session_id="one"), Run.objects.get(session__session_id="two")
        assert (outputs["slow"].content, outputs["fast"].content) == ("slow reply", "fast reply")
        assert slow_run.created_at < fast_run.created_at < fast_run.finished_at < slow_run.finished_at


@pytest.mark.django_db(transaction=True)
class TestTasks(ConcurrencyTest, TransactionTestCase):
    async def test_two_asyncio_tasks_running_fifty_turns_each_on_one_session_lose_nothing(self):
        async def worker(name: str):
            for n in range(TURNS):
                output = await self.agent_.arun(f"{name}-{n}", session_id="shared", user_id="alice")
                assert output.status == "completed", output.error

        started = time.perf_counter()
        await asyncio.gather(worker("a"), worker("b"))
        elapsed = time.perf_counter() - started

        await sync_to_async(self.assert_nothing_lost)("shared", ["a", "b"])
        print(f"\n2 asyncio tasks x {TURNS} turns on one session ({connection.vendor}): {elapsed:.2f} s")

    async def test_streamed_runs_on_one_session_take_turns(self):
        async def worker(name: str):
            for n in range(TURNS):
                events = [e async for e in self.agent_.arun(f"{name}-{n}", session_id="shared", stream=True,
                                                            stream_events=True)]
                assert events[-1].status == "completed"

        await asyncio.gather(worker("a"), worker("b"))

        await sync_to_async(self.assert_nothing_lost)("shared", ["a", "b"])


class TestManualUpdateDuringARun(EngineTestMixin, TestCase):
    async def test_a_manual_update_during_a_run_is_kept_and_every_version_rebuilds(self):
        def tick(run_context: RunContext) -> str:
            """Add milk and count."""
            run_context.session_state["items"].append("milk")
            run_context.session_state["count"] += 1
            return "ok"

        agent = self.agent(tools=[tick], session_state={"items": [], "count": 0})
        await agent.arun("start", session_id="s", session_state={"count": 0})
        call_tick = tool_then_text("tick")
        with Gate() as gate:
            def respond(body):  # the reply after the tool result is held until the manual edit is in
                return Text("All done.", wait_event=gate) if body["messages"][-1]["role"] == "tool" else call_tick(body)

            self.llm.responder = respond
            run = asyncio.ensure_future(agent.arun("tick", session_id="s"))
            # The tool has run and the reply is held: the run is in flight. Now someone edits the state.
            assert await asyncio.to_thread(self.llm.wait_for_requests, 3)
            manual = await agent.aupdate_session_state({"items": ["oranges"], "count": 10, "note": "manual"},
                                                       session_id="s")
            gate.set()
            output = await run

        assert manual == {"items": ["oranges"], "count": 10, "note": "manual"}
        # The run's changes are replayed on top of the manual edit: nothing of either is lost.
        expected = {"items": ["milk", "oranges"], "count": 1, "note": "manual"}
        assert output.session_state == expected
        assert await agent.aget_session_state(session_id="s") == expected

        def versions():
            session = ChatSession.objects.get(session_id="s")
            changes = list(session.state_changes.values_list("version", "source"))
            return changes, {v: session.state_at(v) for v, _ in changes}

        changes, states = await sync_to_async(versions)()
        assert changes == [(1, "defaults"), (2, "manual"), (3, "tool:tick")]
        assert states == {1: {"items": [], "count": 0}, 2: manual, 3: expected}
