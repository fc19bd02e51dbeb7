"""The sync adapters (sessions_core.bridge): a sync run drives the async core on its own thread."""

import asyncio
import os
import threading
from unittest import mock

from django.db import connections
from django.test import TestCase, TransactionTestCase

from sessions_core import RunContext, bridge
from sessions_core.models import ChatSession
from tests.support.engine_helpers import EngineTestMixin
from tests.support.llm_server import Text, ToolCalls


class TestSyncRunsStayOnTheCallersThread(EngineTestMixin, TestCase):
    def test_database_work_and_sync_tools_run_on_the_calling_thread(self):
        seen = []

        def where(run_context: RunContext) -> str:
            """Say which thread this is."""
            seen.append(threading.get_ident())
            return "here"

        self.llm.add(ToolCalls([("where", {})]), Text("Done."))
        output = self.agent(tools=[where]).run("where are you?", session_id="s")

        assert output.status == "completed"
        assert seen == [threading.get_ident()]  # as Agno runs a sync tool in a sync run
        # The run's rows went through this thread's connection: this test's open transaction sees them.
        assert ChatSession.objects.get(session_id="s").last_seq == 4  # user, tool call, tool result, reply

    def test_a_sync_tool_can_call_the_sync_api_of_an_agent(self):
        reader = self.agent(session_state={"notes": ["from elsewhere"]})
        self.llm.add(Text("ok"))
        reader.run("set up", session_id="other")

        def read_other(run_context: RunContext) -> str:
            """Read the other session's notes."""
            return ", ".join(reader.get_session_state(session_id="other")["notes"])

        self.llm.add(ToolCalls([("read_other", {})]), Text("Done."))
        output = self.agent(tools=[read_other]).run("read it", session_id="s")

        assert output.status == "completed"
        assert output.tools[0].result == "from elsewhere"

    def test_streaming_gives_each_event_before_the_run_goes_on(self):
        self.llm.add(Text("one two three"))
        agent = self.agent()
        running_at_first_event = None
        for _event in agent.run("hi", session_id="s", stream=True):
            if running_at_first_event is None:
                running_at_first_event = ChatSession.objects.get(session_id="s").is_running
        assert running_at_first_event is True
        assert not ChatSession.objects.get(session_id="s").is_running


class TestThreadLoops(EngineTestMixin, TransactionTestCase):
    def test_the_loop_of_a_thread_that_ended_is_closed_with_its_model_connections(self):
        agent = self.agent()
        self.llm.add(Text("from a thread"), Text("from the main thread"))
        loops = []

        def work():
            agent.run("hi", session_id="t")
            loops.append(bridge._thread_loop.owner.loop)
            connections.close_all()

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        del thread
        assert self.model._clients.get(loops[0]) is not None  # its HTTP client is still open

        agent.run("hi", session_id="main")  # the next sync call closes what the ended thread left

        assert loops[0].is_closed()
        assert loops[0] not in self.model._clients
        assert not bridge._retired


class TestSyncCallsWhereALoopIsRunning(EngineTestMixin, TransactionTestCase):
    """A notebook cell: sync code on a thread whose event loop is running. The core runs on a helper
    thread's loop; the blocking work still runs here (Django allows it with DJANGO_ALLOW_ASYNC_UNSAFE,
    as it asks of notebooks)."""

    async def test_a_sync_run_and_a_stream_complete_and_are_stored(self):
        self.llm.add(Text("from a cell"), Text("streamed from a cell"))
        agent = self.agent(session_state={"n": 1})
        with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
            try:
                output = agent.run("hi", session_id="nb")
                events = list(agent.run("again", session_id="nb", stream=True, stream_events=True))
                state = agent.get_session_state(session_id="nb")
            finally:
                connections.close_all()  # this thread's own connection, which nothing else would close

        assert (output.status, output.content) == ("completed", "from a cell")
        assert events[-1].content == "streamed from a cell"
        assert state == {"n": 1}
        history = await agent.aget_chat_history(session_id="nb")
        assert [m.content for m in history] == ["hi", "from a cell", "again", "streamed from a cell"]


def test_a_loop_inherited_from_a_parent_process_is_never_closed_by_the_child():
    """After a fork, what the parent's ended threads left is the parent's to close: closing it in
    the child would close the parent's connections (a TLS close_notify on a shared socket, say)."""
    parents_loop, closed = asyncio.new_event_loop(), []

    async def closer():
        closed.append(True)

    bridge._retired.append((os.getpid() + 1, parents_loop, [closer]))  # as a forked child sees it
    try:
        bridge._thread_loop.get()
        assert not bridge._retired
        assert closed == [] and not parents_loop.is_closed()
    finally:
        parents_loop.close()
