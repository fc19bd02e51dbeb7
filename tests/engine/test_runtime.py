"""One run, step by step: events and their order, what is stored when, the RunOutput, metrics,
structured output and the run lease."""

import json

import pydantic
from django.test import TestCase

from sessions_core import RunContext, RunEvent, RunOutput
from sessions_core.models import ChatSession, Run
from tests.support.engine_helpers import EngineTestMixin, Gate, astream_all, kinds, make_users, of_kind, stream_all
from tests.support.llm_server import Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


class Recipe(pydantic.BaseModel):
    title: str
    minutes: int


class TestEvents(EngineTestMixin, TestCase):
    def setUp(self):
        self.agent_ = self.agent(name="Shop Helper", tools=[add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})], text="On it."), Text("Milk is on the list."))

    def test_a_tool_using_run_emits_events_in_agnos_order(self):
        events = stream_all(self.agent_, "add milk", session_id="s", user_id="alice")

        assert kinds(events) == [
            "RunStarted", "RunContent", "RunContent", "ToolCallStarted", "ToolCallCompleted", "StateChanged",
            "RunContent", "RunContent", "RunContent", "RunContent", "RunContent", "RunCompleted",
        ]
        assert {(e.run_id, e.session_id, e.agent_id, e.agent_name) for e in events} == {
            (events[0].run_id, "s", "shop-helper", "Shop Helper")}
        assert [e.seq for e in events] == list(range(1, 13))
        assert (events[0].model, events[0].model_provider) == ("test-model", "openai")
        (started,) = of_kind(events, RunEvent.tool_call_started)
        (completed,) = of_kind(events, RunEvent.tool_call_completed)
        assert (started.tool.tool_call_id, started.tool.tool_name, started.tool.tool_args, started.tool.result) == (
            "call_1", "add_item", {"item": "milk"}, None)
        assert completed.tool.result == "Added milk" and completed.tool.tool_call_error is False
        assert completed.content.startswith("add_item() completed in ")
        assert "".join(e.content for e in of_kind(events, RunEvent.run_content)) == "On it.Milk is on the list."
        final = events[-1]
        assert (final.content, final.status, final.session_state) == ("On it.Milk is on the list.", "completed",
                                                                      {"shopping_list": ["milk"]})

    def test_stream_without_stream_events_yields_content_only(self):
        # As in Agno: content events only (a failure or a stop would still be reported, see test_errors).
        events = list(self.agent_.run("add milk", session_id="s", stream=True))

        assert set(kinds(events)) == {"RunContent"}
        assert "".join(e.content for e in events) == "On it.Milk is on the list."

    def test_yield_run_output_ends_the_stream_with_the_output(self):
        events = list(self.agent_.run("add milk", session_id="s", stream=True, stream_events=True,
                                      yield_run_output=True))

        output = events[-1]
        assert isinstance(output, RunOutput) and kinds(events[:-1])[-1] == "RunCompleted"
        assert (output.status, output.input, output.session_state) == ("completed", "add milk",
                                                                       {"shopping_list": ["milk"]})
        assert output.run_id == events[0].run_id and events[0].input == "add milk"

    async def test_async_streams_emit_the_same_events(self):
        events = await astream_all(self.agent_, "add milk", session_id="s")

        assert kinds(events)[:1] + kinds(events)[3:6] + kinds(events)[-1:] == [
            "RunStarted", "ToolCallStarted", "ToolCallCompleted", "StateChanged", "RunCompleted"]

    def test_state_changed_carries_the_version_its_change_is_stored_as(self):
        from sessions_core.models import StateChange

        self.agent_.run("add milk", session_id="s")  # v1 fills in the default list, v2 adds milk
        self.llm.add(ToolCalls([("add_item", {"item": "eggs"}), ("add_item", {"item": "jam"})]), Text("Done."))
        agent = self.agent(tools=[add_item], session_state={"shopping_list": [], "store": "corner"})  # +1 default

        events = stream_all(agent, "add eggs and jam", session_id="s")

        versions = [event.state_version for event in of_kind(events, RunEvent.state_changed)]
        stored = list(StateChange.objects.filter(source="tool:add_item").values_list("version", flat=True))
        assert versions == [4, 5] and stored == [2, 4, 5]  # v3 is the new default key, stored first
        assert of_kind(events, RunEvent.run_completed)[0].state_version == 5

    def test_events_serialise_to_plain_dicts(self):
        events = stream_all(self.agent_, "add milk", session_id="s")

        for event in events:
            data = json.loads(json.dumps(event.to_dict()))
            assert data["event"] == str(event.event) and data["run_id"] == event.run_id
        assert of_kind(events, RunEvent.tool_call_completed)[0].to_dict()["tool"]["result"] == "Added milk"

    def test_a_tool_event_holds_the_call_as_it_was_then(self):
        self.llm.reset()
        self.llm.add(ToolCalls([("add_item", {"item": {"name": "milk", "tags": ["cold"]}})]), Text("Done."))
        events = stream_all(self.agent_, "add milk", session_id="s")

        started = of_kind(events, RunEvent.tool_call_started)[0].tool
        completed = of_kind(events, RunEvent.tool_call_completed)[0].tool
        assert (started.result, started.metrics) == (None, {})  # the result came later, on another copy
        assert completed.result.startswith("Added") and "duration" in completed.metrics
        assert started.tool_args == completed.tool_args == {"item": {"name": "milk", "tags": ["cold"]}}
        started.tool_args["item"]["tags"].append("mine")  # a consumer's edit reaches no other copy
        assert completed.tool_args["item"]["tags"] == ["cold"]


class TestWhatIsStoredWhen(EngineTestMixin, TestCase):
    def test_the_run_and_the_user_message_are_stored_before_the_model_answers(self):
        (alice,) = make_users("alice")
        agent = self.agent(instructions="Be kind.", metadata={"team": "red"})
        with Gate() as gate:
            self.llm.add(Text("Slowly but surely", wait_event=gate))
            for event in agent.run("hello", session_id="s", user_id="alice", stream=True, stream_events=True):
                if event.event == RunEvent.run_started:
                    run = Run.objects.get(run_id=event.run_id)
                    session = ChatSession.objects.get(session_id="s")
                    assert (run.status, run.input, run.content, run.model_id, run.component_id) == (
                        "running", "hello", "", "test-model", "tester")
                    assert list(run.messages.values_list("seq", "role", "content")) == [
                        (1, "system", "Be kind."), (2, "user", "hello")]
                    assert session.is_running and session.lease_token
                    assert (session.owner, session.kind, session.component_id, session.metadata) == (
                        alice, "agent", "tester", {"team": "red"})
                    gate.set()

        run = Run.objects.get()
        assert (run.status, run.content, run.state_version) == ("completed", "Slowly but surely", 0)
        assert run.finished_at >= run.created_at
        session = ChatSession.objects.get()
        assert not session.is_running and session.last_seq == 3 and session.last_activity_at == run.finished_at

    def test_partial_text_is_checkpointed_while_streaming(self):
        words = " ".join(f"w{n}" for n in range(60))
        self.llm.add(Text(words, chunk_delay=0.02))
        checkpoint = ""

        for event in self.agent().run("long", session_id="s", stream=True):
            if event.event == RunEvent.run_content and not checkpoint:
                checkpoint = Run.objects.get(run_id=event.run_id).content  # saved about once a second

        assert checkpoint and words.startswith(checkpoint) and len(checkpoint) < len(words)
        assert Run.objects.get().content == words

    def test_run_output_fields(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Done now."))
        agent = self.agent(name="Shop Helper", tools=[add_item], session_state={"shopping_list": []},
                           instructions="Shop.")

        output = agent.run("add milk", session_id="s", user_id="alice")

        assert isinstance(output, RunOutput)
        assert (output.session_id, output.user_id, output.agent_id, output.agent_name) == (
            "s", "alice", "shop-helper", "Shop Helper")
        assert (output.status, output.error, output.content, output.content_type) == ("completed", "", "Done now.",
                                                                                      "str")
        assert (output.model, output.model_provider, output.state_version) == ("test-model", "openai", 2)
        assert [(m.role, m.content) for m in output.messages] == [
            ("system", "Shop."), ("user", "add milk"), ("assistant", ""), ("tool", "Added milk"),
            ("assistant", "Done now.")]
        assert [m.seq for m in output.messages] == [1, 2, 3, 4, 5]
        assert output.run_id == Run.objects.get().run_id

    def test_metrics_add_up_over_model_calls(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("one two three"))

        output = self.agent(tools=[add_item], session_state={"shopping_list": []}).run("add milk please",
                                                                                       session_id="s")

        metrics = output.metrics
        # The test server counts prompt words and reply words (a tool call counts as one).
        assert (metrics["input_tokens"], metrics["output_tokens"]) == (3 + 5, 1 + 3)
        assert metrics["total_tokens"] == 12 and metrics["model_calls"] == 2
        assert 0 < metrics["time_to_first_token"] <= metrics["duration"]
        assert Run.objects.get().metrics == metrics

    def test_markdown_adds_its_instruction(self):
        self.agent(instructions="Help.", markdown=True).run("hi", session_id="s")

        assert self.system_prompt() == "Help.\n\nUse markdown to format your answers."


class TestStructuredOutput(EngineTestMixin, TestCase):
    def test_output_schema_gives_a_model_instance(self):
        self.llm.add(Text('{"title": "Soup", "minutes": 20}'))

        output = self.agent(output_schema=Recipe).run("a recipe", session_id="s")

        assert output.content == Recipe(title="Soup", minutes=20) and output.content_type == "Recipe"
        sent_format = self.llm.requests[0]["response_format"]
        assert sent_format["type"] == "json_schema" and sent_format["json_schema"]["name"] == "Recipe"
        assert sent_format["json_schema"]["schema"]["required"] == ["title", "minutes"]
        run = Run.objects.get()
        assert (json.loads(run.content), run.content_type) == ({"title": "Soup", "minutes": 20}, "Recipe")

    def test_a_reply_that_does_not_match_the_schema_fails_the_run(self):
        self.llm.add(Text('{"title": "Soup"}'))

        output = self.agent(output_schema=Recipe).run("a recipe", session_id="s")

        assert output.status == "error" and output.error.startswith("The model's reply does not match Recipe:")
        assert Run.objects.get().status == "error"


class TestPrintResponse(EngineTestMixin, TestCase):
    def test_print_response_prints_the_reply(self):
        self.llm.add(Text("Hello there."), Text("Streamed hello."))
        agent = self.agent()

        with self.captureOutput() as out:
            agent.print_response("hi", session_id="s")
            agent.print_response("hi", session_id="s", stream=True)

        assert out.getvalue() == "Hello there.\nStreamed hello.\n"

    def captureOutput(self):
        import contextlib
        import io

        buffer = io.StringIO()

        @contextlib.contextmanager
        def capture():
            with contextlib.redirect_stdout(buffer):
                yield buffer

        return capture()
