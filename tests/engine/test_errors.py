"""Errors (SPEC Part 1, items 5 and 13): model failures, non-JSON state, accessor errors, cancellation and
stale leases. A failed run is kept, with its user message, and the stored state stays as it was."""

import asyncio
import datetime
import decimal
import threading
import uuid
from datetime import timedelta

from django.db import connection
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from sessions_core import Agent, RunContext, RunEvent, SessionIdNotSetError, SessionNotFoundError
from sessions_core.llm import OpenAIChat
from sessions_core.models import ChatSession, Message, Run, RunStatus, StateChange
from sessions_core.run import lifecycle
from tests.support.engine_helpers import EngineTestMixin, Gate, RefuseFinishOnce, astream_all, kinds, of_kind, stream_all
from tests.support.factories import make_session
from tests.support.llm_server import Cut, Error, Hang, Malformed, Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


# Each failure mode of the test server: what to queue, and words the readable message must contain.
FAILURES = {
    "500": ([Error(500, "The engine room is on fire.")] * 3,
            "answered 500 Internal Server Error: The engine room is on fire."),
    "429 exhausted": ([Error(429, "Slow down.", "rate_limit")] * 3, "rate limited the request (429 Too Many Requests)"),
    "stream cut": ([Cut("This reply stops")], "cut off mid-stream"),
    "malformed": ([Malformed("Half a")], "malformed data"),
}


class ErrorTest(EngineTestMixin, TestCase):
    def setUp(self):
        self.agent_ = self.agent(tools=[add_item], session_state={"shopping_list": ["bread"]})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        assert self.agent_.run("add milk", session_id="s").status == "completed"
        self.stored = ChatSession.objects.get(session_id="s")
        self.changes = StateChange.objects.count()

    def assert_failed_run_kept(self, run_id, message, user_text):
        """The Run row and its user message are kept; the stored state and its history are untouched."""
        run = Run.objects.get(run_id=run_id)
        assert run.status == RunStatus.ERROR and message in run.error, run.error
        assert run.finished_at is not None
        assert Message.objects.filter(run=run, role="user").get().content == user_text
        session = ChatSession.objects.get(session_id="s")
        assert (session.session_state, session.state_version) == (self.stored.session_state,
                                                                  self.stored.state_version)
        assert StateChange.objects.count() == self.changes
        assert not session.is_running and session.lease_token == ""


class TestModelFailures(ErrorTest):
    def test_each_failure_mode_ends_the_run_with_a_readable_error(self):
        for name, (responses, message) in FAILURES.items():
            with self.subTest(name):
                # The tool changes the state first; the failing model call that follows must undo nothing stored.
                self.llm.add(ToolCalls([("add_item", {"item": name})]), *responses)

                output = self.agent_.run(f"add {name}", session_id="s", session_state={"flag": name})

                assert output.status == "error" and message in output.error, output.error
                assert output.content == output.error
                self.assert_failed_run_kept(output.run_id, message, f"add {name}")

    def test_each_failure_mode_streams_a_run_error_event(self):
        for name, (responses, message) in FAILURES.items():
            with self.subTest(name):
                self.llm.add(ToolCalls([("add_item", {"item": name})]), *responses)

                events = stream_all(self.agent_, f"add {name}", session_id="s")

                assert kinds(events)[-1] == "RunError" and "RunCompleted" not in kinds(events)
                assert message in events[-1].content and events[-1].error_type == "model_provider_error"
                self.assert_failed_run_kept(events[-1].run_id, message, f"add {name}")

    async def test_an_async_run_reports_the_error_too(self):
        self.llm.add(*FAILURES["500"][0])

        output = await self.agent_.arun("hello", session_id="s")
        self.llm.add(Cut("This reply"))
        events = await astream_all(self.agent_, "hello", session_id="s")

        assert output.status == "error" and "answered 500" in output.error
        assert events[-1].event == RunEvent.run_error and "cut off mid-stream" in events[-1].content

    def test_retries_are_spent_before_giving_up(self):
        self.llm.add(Error(500), Error(429), Text("Third time lucky."))

        output = self.agent_.run("hello", session_id="s")

        assert output.status == "completed" and output.content == "Third time lucky."
        assert len(self.llm.requests) == 2 + 3

    def test_a_timeout_ends_the_run_with_a_readable_error(self):
        model = OpenAIChat(id="test-model", base_url=self.llm.base_url, api_key="test", timeout=0.5, max_retries=0)
        agent = Agent(name="Tester", model=model, tools=[add_item])
        self.llm.add(Hang(5), Hang(5))

        output = agent.run("hello", session_id="s")
        events = stream_all(agent, "hello again", session_id="s")

        assert output.status == "error"
        assert output.error == "The model server did not answer within 0.5 s."
        self.assert_failed_run_kept(output.run_id, "did not answer within 0.5 s", "hello")
        assert events[-1].event == RunEvent.run_error
        assert events[-1].content == "The model server did not answer within 0.5 s."
        self.assert_failed_run_kept(events[-1].run_id, "did not answer within 0.5 s", "hello again")

    def test_a_client_error_is_not_retried(self):
        self.llm.add(Error(400, "Unknown parameter: foo.", "invalid_request_error"))

        output = self.agent_.run("hello", session_id="s")

        assert output.error == "The model server answered 400 Bad Request: Unknown parameter: foo."
        assert len(self.llm.requests) == 2 + 1

    def test_a_model_that_never_stops_calling_tools_is_stopped(self):
        self.llm.responder = lambda body: ToolCalls([("add_item", {"item": "more"})])

        output = self.agent_.run("loop", session_id="s")

        assert output.status == "error" and "kept calling tools after 25 requests" in output.error
        assert "Raise CHAT_MAX_MODEL_CALLS to allow more, or give the agent a tool_call_limit" in output.error
        assert len(self.llm.requests) == 2 + 25
        self.assert_failed_run_kept(output.run_id, "kept calling tools", "loop")

    def test_the_bound_on_model_requests_is_the_chat_max_model_calls_setting(self):
        self.llm.responder = lambda body: ToolCalls([("add_item", {"item": "more"})])

        with self.settings(CHAT_MAX_MODEL_CALLS=3):
            events = stream_all(self.agent_, "loop", session_id="s")

        assert len(self.llm.requests) == 2 + 3
        assert events[-1].event == RunEvent.run_error and events[-1].error_type == "limit_exceeded"
        assert events[-1].content.startswith("The model kept calling tools after 3 requests; the run was stopped.")
        assert "CHAT_MAX_MODEL_CALLS" in events[-1].content
        self.assert_failed_run_kept(events[-1].run_id, "CHAT_MAX_MODEL_CALLS", "loop")

    def test_a_tool_name_longer_than_its_column_is_cut_and_the_run_goes_on(self):
        """A made-up tool name of 200 characters: PostgreSQL would refuse it whole (the column holds 128)."""
        self.llm.add(ToolCalls([("x" * 200, {})]), Text("Sorry."))

        output = self.agent_.run("call it", session_id="s")

        assert output.status == "completed" and output.content == "Sorry."
        messages = Message.objects.filter(run__run_id=output.run_id)
        tool = messages.get(role="tool")
        assert (tool.tool_name, tool.tool_error) == ("x" * 128, True)
        assert "no tool named" in tool.content
        assert messages.get(role="assistant", content="").tool_calls[0]["name"] == "x" * 128

    def test_a_database_refusing_the_outcome_fails_the_run_and_frees_the_session(self):
        refuse_once = RefuseFinishOnce()
        self.llm.add(Text("A reply that is lost."))
        with connection.execute_wrapper(refuse_once):
            events = stream_all(self.agent_, "second", session_id="s")

        assert refuse_once.refused
        [error] = of_kind(events, RunEvent.run_error)
        assert error.error_type == "storage_error" and "could not be stored" in error.content
        assert "simulated" in error.content
        self.assert_failed_run_kept(error.run_id, "could not be stored", "second")
        self.llm.add(Text("Fine."))
        assert self.agent_.run("third", session_id="s").status == "completed"  # no lease left to wait for

    def test_a_partial_reply_before_a_cut_is_kept_as_a_message(self):
        self.llm.add(Cut("The answer is"))

        output = self.agent_.run("question", session_id="s")

        assert output.status == "error"
        assert list(Message.objects.filter(run__run_id=output.run_id).values_list("role", "content")) == [
            ("user", "question"), ("assistant", "The answer is")]
        assert [m.content for m in self.agent_.get_chat_history(session_id="s")][-2:] == ["question", "The answer is"]


class TestNonJSONState(ErrorTest):
    def test_a_set_in_the_state_fails_the_run_naming_the_key_and_type(self):
        def tag(run_context: RunContext) -> str:
            """Tag it."""
            run_context.session_state["tags"] = {"a", "b"}
            return "tagged"

        agent = self.agent(tools=[tag, add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "x"}), ("tag", {})]), Text("never sent"))

        events = stream_all(agent, "tag it", session_id="s")

        error = events[-1]
        assert error.event == RunEvent.run_error and error.error_type == "state_error"
        assert "session_state['tags']" in error.content and "type set" in error.content
        self.assert_failed_run_kept(error.run_id, "session_state['tags'] holds a value of type set", "tag it")
        roles = list(Message.objects.filter(run__run_id=error.run_id).values_list("role", flat=True))
        assert roles == ["user", "assistant", "tool", "tool"]  # the tool traffic is kept too
        assert len(self.llm.requests) == 2 + 1  # the model was not asked again

    def test_a_non_json_object_nested_deep_is_named_by_its_path(self):
        def nest(run_context: RunContext) -> str:
            """Nest."""
            run_context.session_state["shopping_list"].append({"when": object()})
            return "ok"

        self.llm.add(ToolCalls([("nest", {})]), Text("never sent"))
        output = self.agent(tools=[nest], session_state={"shopping_list": []}).run("x", session_id="s")

        assert output.status == "error"
        assert "session_state['shopping_list'][2]['when'] holds a value of type object" in output.error
        self.assert_failed_run_kept(output.run_id, "type object", "x")

    def test_non_json_run_state_fails_the_run_before_the_model_is_called(self):
        output = self.agent_.run("x", session_id="s", session_state={"ids": {1, 2}})

        assert output.status == "error" and "session_state['ids'] holds a value of type set" in output.error
        assert len(self.llm.requests) == 2
        self.assert_failed_run_kept(output.run_id, "type set", "x")

    def test_datetime_decimal_and_uuid_from_a_tool_become_strings(self):
        def stamp(run_context: RunContext) -> str:
            """Stamp."""
            run_context.session_state.update(
                at=datetime.datetime(2024, 1, 2, 3, 4, 5), day=datetime.date(2024, 1, 2),
                price=decimal.Decimal("1.50"), id=uuid.UUID(int=1),
            )
            return "ok"

        self.llm.add(ToolCalls([("stamp", {})]), Text("ok"))
        events = stream_all(self.agent(tools=[stamp]), "x", session_id="t")

        expected = {"at": "2024-01-02T03:04:05", "day": "2024-01-02", "price": "1.50",
                    "id": "00000000-0000-0000-0000-000000000001"}
        assert of_kind(events, RunEvent.state_changed)[0].session_state == expected
        assert events[-1].session_state == expected
        assert ChatSession.objects.get(session_id="t").session_state == expected

    def test_manual_update_with_a_set_is_refused_and_stores_nothing(self):
        with self.assertRaisesMessage(ValueError, "session_state['tags'] holds a value of type set"):
            self.agent_.update_session_state({"tags": {"x"}}, session_id="s")

        assert ChatSession.objects.get(session_id="s").session_state == self.stored.session_state


class TestAccessorErrors(EngineTestMixin, TestCase):
    def test_without_a_session_id_accessors_say_so(self):
        agent = self.agent()
        for call in (agent.get_session_state, agent.get_chat_history, agent.get_session, agent.get_session_name,
                     lambda: agent.update_session_state({"a": 1}), agent.delete_session):
            with self.assertRaisesMessage(SessionIdNotSetError, "Session ID is not set"):
                call()

    def test_an_unknown_session_is_not_found(self):
        agent = self.agent()
        for call in (lambda: agent.get_session_state(session_id="nope"),
                     lambda: agent.get_chat_history(session_id="nope"),
                     lambda: agent.update_session_state({"a": 1}, session_id="nope")):
            with self.assertRaisesMessage(SessionNotFoundError, "Session not found: nope"):
                call()
        assert not ChatSession.objects.exists()

    async def test_async_accessors_raise_the_same(self):
        agent = self.agent()
        with self.assertRaisesMessage(SessionIdNotSetError, "Session ID is not set"):
            await agent.aget_session_state()
        with self.assertRaisesMessage(SessionNotFoundError, "Session not found: nope"):
            await agent.aget_chat_history(session_id="nope")

    def test_a_run_without_a_session_id_starts_one_and_sticks_to_it(self):
        agent = self.agent()

        first = agent.run("one")
        second = agent.run("two")

        assert first.session_id == second.session_id == agent.session_id
        assert [m.content for m in agent.get_chat_history() if m.role == "user"] == ["one", "two"]

    def test_a_bad_session_id_is_refused(self):
        for bad in ("x" * 129, "tab\there"):
            with self.assertRaises(ValueError):
                self.agent().run("hi", session_id=bad)
        assert not ChatSession.objects.exists()


class TestCancellation(EngineTestMixin, TestCase):
    def test_cancel_run_mid_stream_keeps_the_partial_text_and_history_skips_it(self):
        agent = self.agent(add_history_to_context=True)
        self.llm.add(Text("Before."))
        agent.run("earlier", session_id="s")
        events = []
        with Gate() as gate:
            self.llm.add(Text("Partial answer that never ends", wait_event=gate))
            for event in agent.run("stop me", session_id="s", stream=True, stream_events=True):
                events.append(event)
                if event.event == RunEvent.run_content:
                    assert Agent.cancel_run(event.run_id) is True
                    # Nothing more comes from the model: the stop must land while the reply is held.
                    assert self.llm.wait_for_disconnects(1, timeout=5)

        assert kinds(events) == ["RunStarted", "RunContent", "RunCancelled", "RunCompleted"]
        assert events[-2].content == "Partial "
        assert events[-1].status == "cancelled" and events[-1].content == "Partial "
        run = Run.objects.get(run_id=events[0].run_id)
        assert (run.status, run.content, run.cancel_requested) == ("cancelled", "Partial ", True)
        assert list(run.messages.values_list("role", "content")) == [("user", "stop me"), ("assistant", "Partial ")]
        agent.run("after", session_id="s")
        assert self.sent_pairs() == [("user", "earlier"), ("assistant", "Before."), ("user", "after")]
        assert not ChatSession.objects.get(session_id="s").is_running

    async def test_acancel_run_stops_an_async_stream(self):
        agent = self.agent(session_state={"n": 1})
        events = []
        with Gate() as gate:
            self.llm.add(Text("Half of it", wait_event=gate))
            async for event in agent.arun("stop me", session_id="s", stream=True, stream_events=True,
                                          session_state={"n": 2}):
                events.append(event)
                if event.event == RunEvent.run_content:
                    assert await Agent.acancel_run(event.run_id) is True

        assert kinds(events)[-2:] == ["RunCancelled", "RunCompleted"]
        assert events[-1].content == "Half " and events[-1].status == "cancelled"
        assert events[-1].session_state == {"n": 2}  # a cancelled run keeps the state it reached
        assert await agent.aget_session_state(session_id="s") == {"n": 2}

    def test_a_stop_asked_by_another_process_lands_at_the_next_checkpoint(self):
        agent = self.agent()
        words = " ".join(f"w{n}" for n in range(60))
        self.llm.add(Text(words, chunk_delay=0.05))
        events = []

        for event in agent.run("long", session_id="s", stream=True, stream_events=True):
            events.append(event)
            if len(events) == 1:
                # What Agent.acancel_run does from another process: only the database flag.
                Run.objects.filter(run_id=event.run_id).update(cancel_requested=True)

        assert events[-1].status == "cancelled"
        assert 1 < len(events) - 2 < 60  # stopped about a second in, well before the end
        assert Run.objects.get().content == events[-1].content

    def test_stopping_to_listen_cancels_the_run(self):
        agent = self.agent()
        with Gate() as gate:
            self.llm.add(Text("You will not read this", wait_event=gate))
            stream = agent.run("hi", session_id="s", stream=True)
            first = next(stream)
            stream.close()

        run = Run.objects.get(run_id=first.run_id)
        assert (run.status, run.content) == ("cancelled", "You ")
        assert not ChatSession.objects.get().is_running


class TestCancellationAcrossThreads(EngineTestMixin, TransactionTestCase):
    async def cancel_while_blocked(self, run, entered: threading.Event, release: threading.Event) -> None:
        """Start `run` as a task, cancel it once a blocking step has `entered`, then `release` the step."""
        task = asyncio.ensure_future(run)
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        release.set()
        with self.assertRaises(asyncio.CancelledError):
            await task

    def test_a_non_streamed_run_is_cancelled_from_another_thread(self):
        agent = self.agent()

        def cancel_once_streaming():
            try:
                assert self.llm.wait_for_requests(1)
                assert Agent.cancel_run(Run.objects.get(status="running").run_id) is True
            finally:
                connection.close()

        with Gate() as gate:
            self.llm.add(Text("Slow answer here", wait_event=gate))
            canceller = threading.Thread(target=cancel_once_streaming)
            canceller.start()
            output = agent.run("slow", session_id="s")
            canceller.join()

        # The stop can land before or after the engine has read the first word (the server cannot tell
        # when the client read it); keeping a partial reply is asserted by the streamed test above.
        assert output.status == "cancelled"
        assert output.content in ("Slow ", f"Run {output.run_id} was cancelled")
        assert Run.objects.get().status == "cancelled"


    def test_a_stop_flagged_by_another_process_lands_while_waiting_for_the_first_token(self):
        """Another process can only set Run.cancel_requested; the run hears it within a second or so."""
        agent = self.agent()

        def flag_once_waiting():
            try:
                assert self.llm.wait_for_requests(1)
                assert Run.objects.filter(status="running").update(cancel_requested=True) == 1
            finally:
                connection.close()

        self.llm.add(Hang(10))
        flagger = threading.Thread(target=flag_once_waiting)
        flagger.start()
        output = agent.run("slow", session_id="s")
        flagger.join()
        assert (output.status, output.content) == ("cancelled", f"Run {output.run_id} was cancelled")
        assert ChatSession.objects.get(session_id="s").lease_token == ""

    async def test_a_task_cancelled_during_the_start_step_ends_the_run_it_began(self):
        from asgiref.sync import sync_to_async

        from sessions_core.run.root import RootRun

        agent = self.agent()
        entered, release = threading.Event(), threading.Event()
        original = RootRun._start_sync

        def slow_start(loop):
            entered.set()
            release.wait(10)
            return original(loop)

        RootRun._start_sync = slow_start
        try:
            await self.cancel_while_blocked(agent.arun("hello", session_id="s"), entered, release)
        finally:
            RootRun._start_sync = original
        run = await Run.objects.aget()
        session = await ChatSession.objects.aget(session_id="s")
        assert run.status == "cancelled" and session.lease_token == ""
        assert await sync_to_async(lambda: list(Message.objects.values_list("role", flat=True)))() == ["user"]
        assert self.llm.requests == []  # the model was never called


    async def test_a_run_cancelled_inside_a_tool_stores_the_state_of_its_last_recorded_change(self):
        """The tool goes on in its thread after the task is cancelled, and edits the state there: that
        edit has no StateChange (the run never saw the tool return), so it is not stored either, and
        the stored state stays what its recorded changes say."""
        from asgiref.sync import sync_to_async

        entered, release = threading.Event(), threading.Event()

        def add_slowly(item: str, run_context: RunContext) -> str:
            """Add an item, slowly.

            Args:
                item: The item.
            """
            entered.set()
            release.wait(10)
            run_context.session_state["items"].append(item)
            return "added"

        await sync_to_async(make_session)(session_id="s", component_id="tester", session_state={"items": ["a"]},
                                          state_version=1)
        agent = self.agent(tools=[add_slowly])
        self.llm.add(ToolCalls([("add_slowly", {"item": "b"})]), Text("Done."))
        await self.cancel_while_blocked(agent.arun("add b", session_id="s"), entered, release)

        run = await Run.objects.aget()
        session = await ChatSession.objects.aget(session_id="s")
        assert run.status == "cancelled" and session.lease_token == ""
        assert (session.session_state, session.state_version) == ({"items": ["a"]}, 1)
        assert not await StateChange.objects.filter(run=run).aexists()


class TestStaleLease(EngineTestMixin, TestCase):
    def test_a_stale_lease_marks_the_dead_run_interrupted_and_the_next_run_proceeds(self):
        session = make_session(session_id="s", component_id="tester", lease_token="dead-process",
                               lease_expires_at=timezone.now() - timedelta(seconds=1))
        dead = Run.objects.create(session=session, status=RunStatus.RUNNING, input="lost", content="half a rep")

        output = self.agent().run("hello", session_id="s")

        dead.refresh_from_db()
        assert dead.status == RunStatus.INTERRUPTED and dead.finished_at is not None
        assert dead.error == "The process running this run stopped before it finished."
        assert dead.content == "half a rep"
        assert output.status == "completed"
        session.refresh_from_db()
        assert (session.lease_token, session.lease_expires_at) == ("", None)

    def test_the_last_run_output_of_a_stopped_process_says_interrupted(self):
        session = make_session(session_id="s", component_id="tester", lease_token="dead-process",
                               lease_expires_at=timezone.now() - timedelta(seconds=1))
        Run.objects.create(session=session, component_id="tester", status=RunStatus.RUNNING, input="lost",
                           content="half a rep")

        output = self.agent().get_last_run_output(session_id="s")

        assert (output.status, output.content) == (RunStatus.INTERRUPTED, "half a rep")
        assert output.error == "The process running this run stopped before it finished."
        assert Run.objects.get().status == RunStatus.INTERRUPTED

    def test_the_last_run_output_of_a_run_in_progress_says_running(self):
        session = make_session(session_id="s", component_id="tester", lease_token="live",
                               lease_expires_at=timezone.now() + timedelta(seconds=30))
        Run.objects.create(session=session, component_id="tester", status=RunStatus.RUNNING, input="going")

        assert self.agent().get_last_run_output(session_id="s").status == RunStatus.RUNNING

    def test_abandoned_runs_are_the_running_ones_without_a_live_lease(self):
        now = timezone.now()
        sessions = {
            "leased": make_session(session_id="leased", lease_token="t", lease_expires_at=now + timedelta(seconds=30)),
            "expired": make_session(session_id="expired", lease_token="t", lease_expires_at=now - timedelta(seconds=1)),
            "released": make_session(session_id="released"),
        }
        runs = {name: Run.objects.create(session=session, status=RunStatus.RUNNING, input=name)
                for name, session in sessions.items()}
        Run.objects.create(session=sessions["released"], status=RunStatus.COMPLETED, input="done")

        assert set(Run.objects.abandoned().values_list("input", flat=True)) == {"expired", "released"}
        assert lifecycle.settle_abandoned(Run.objects.filter(session=sessions["expired"])) == [runs["expired"].pk]
        assert lifecycle.settle_abandoned(Run.objects.all()) == [runs["released"].pk]  # the other one is done already
        statuses = dict(Run.objects.values_list("input", "status"))
        assert statuses == {"leased": RunStatus.RUNNING, "expired": RunStatus.INTERRUPTED,
                            "released": RunStatus.INTERRUPTED, "done": RunStatus.COMPLETED}
        assert runs["leased"].session.is_running

    def test_a_live_lease_is_waited_for(self):
        expires = timezone.now() + timedelta(seconds=0.4)
        make_session(session_id="s", component_id="tester", lease_token="other-process", lease_expires_at=expires)

        output = self.agent().run("hello", session_id="s")

        assert output.status == "completed"
        assert Run.objects.get().created_at >= expires
