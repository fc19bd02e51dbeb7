"""Tools: schemas, sync and async tools, the hook chain, the agentic state tool, StateChanged events
and StateChange rows."""

import asyncio
import json
from typing import Literal

from django.test import TestCase

from sessions_core import RunContext, RunEvent, ToolError
from sessions_core.models import ChatSession, Message, Run, StateChange
from sessions_core.tools import Function
from tests.support.engine_helpers import EngineTestMixin, astream_all, kinds, of_kind, stream_all
from tests.support.llm_server import Text, ToolCalls


def plan_trip(city: str, days: int = 3, tags: list[str] | None = None, budget: float | None = None,
              mode: Literal["train", "car"] = "train", urgent: bool = False, run_context: RunContext = None,
              agent=None) -> str:
    """Plan a trip to a city.

    Books nothing, only plans.

    Args:
        city: Where to go.
        days (int): How long to stay,
            in whole days.
        tags: Things to do.

    Returns:
        The plan.
    """
    return f"{city} for {days} days"


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the shopping list.

    Args:
        item: The item to add.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


def list_items(run_context: RunContext) -> str:
    """List the shopping list."""
    return ", ".join(run_context.session_state["shopping_list"])


async def async_add_item(item: str, run_context: RunContext) -> str:
    """Add an item, asynchronously.

    Args:
        item: The item to add.
    """
    await asyncio.sleep(0)
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item} (async)"


def tool_messages(body: dict) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]


class TestSchemas(EngineTestMixin, TestCase):
    def test_schema_comes_from_signature_type_hints_and_docstring(self):
        self.agent(tools=[plan_trip]).run("plan", session_id="s")

        assert self.llm.requests[0]["tools"] == [{
            "type": "function",
            "function": {
                "name": "plan_trip",
                "description": "Plan a trip to a city.\n\nBooks nothing, only plans.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "Where to go."},
                        "days": {"type": "integer", "default": 3, "description": "How long to stay, in whole days."},
                        "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                                 "default": None, "description": "Things to do."},
                        "budget": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
                        "mode": {"type": "string", "enum": ["train", "car"], "default": "train"},
                        "urgent": {"type": "boolean", "default": False},
                    },
                    "required": ["city"],
                },
            },
        }]

    def test_run_context_and_agent_are_hidden_and_injected(self):
        function = Function.from_callable(plan_trip)

        assert function.injected == ("run_context", "agent")
        assert "run_context" not in function.parameters["properties"]

    def test_no_tools_sends_no_tools_key(self):
        self.agent().run("hi", session_id="s")

        assert "tools" not in self.llm.requests[0]

    def test_the_agentic_tool_is_offered_with_its_one_argument(self):
        self.agent(enable_agentic_state=True).run("hi", session_id="s")

        (offered,) = self.llm.requests[0]["tools"]
        assert offered["function"]["name"] == "update_session_state"
        assert offered["function"]["parameters"]["required"] == ["session_state_updates"]
        assert offered["function"]["parameters"]["properties"]["session_state_updates"]["type"] == "object"

    def test_two_tools_with_one_name_are_refused(self):
        def add_item(x: str) -> str:  # noqa: F811 - the clash is the point
            return x

        agent = self.agent(tools=[add_item, globals()["add_item"]])
        with self.assertRaisesMessage(ValueError, "Two tools are named 'add_item'."):
            agent.run("hi", session_id="s")
        assert (Run.objects.count(), len(self.llm.requests)) == (0, 0)


class TestCalls(EngineTestMixin, TestCase):
    def test_sync_and_async_tools_run_and_their_results_reach_the_model(self):
        agent = self.agent(tools=[add_item, async_add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("async_add_item", {"item": "eggs"})]), Text("Both."))

        output = agent.run("add milk and eggs", session_id="s")

        assert output.status == "completed" and output.content == "Both."
        assert tool_messages(self.llm.requests[1]) == [("call_1", "Added milk"), ("call_2", "Added eggs (async)")]
        assert output.session_state == {"shopping_list": ["milk", "eggs"]}
        assert [(t.tool_name, t.tool_args, t.result) for t in output.tools] == [
            ("add_item", {"item": "milk"}, "Added milk"), ("async_add_item", {"item": "eggs"}, "Added eggs (async)"),
        ]

    async def test_async_run_with_sync_and_async_tools(self):
        agent = self.agent(tools=[add_item, async_add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("async_add_item", {"item": "a"}), ("add_item", {"item": "b"})]), Text("ok"))

        output = await agent.arun("add", session_id="s")

        assert output.session_state == {"shopping_list": ["a", "b"]}

    def test_tool_results_of_other_types_are_sent_as_json(self):
        def lookup(key: str) -> dict:
            """Look a key up."""
            return {"key": key, "found": True}

        self.llm.add(ToolCalls([("lookup", {"key": "k"})]), Text("ok"))
        self.agent(tools=[lookup]).run("look", session_id="s")

        assert tool_messages(self.llm.requests[1]) == [("call_1", '{"key": "k", "found": true}')]

    def test_a_failing_tool_reports_the_error_to_the_model_and_the_run_completes(self):
        def fragile(n: int) -> str:
            """Fail."""
            raise ToolError(f"cannot handle {n}")

        self.llm.add(ToolCalls([("fragile", {"n": 4})]), Text("Sorry."))
        output = self.agent(tools=[fragile]).run("try", session_id="s")

        assert output.status == "completed"
        assert tool_messages(self.llm.requests[1]) == [("call_1", "Error: ToolError: cannot handle 4")]
        stored = Message.objects.get(role="tool")
        assert stored.tool_error and stored.tool_name == "fragile"

    def test_unknown_tools_and_bad_arguments_become_error_results(self):
        self.llm.add(ToolCalls([("no_such_tool", {}), ("add_item", {"wrong": 1})]), Text("ok"))
        output = self.agent(tools=[add_item], session_state={"shopping_list": []}).run("x", session_id="s")

        assert output.status == "completed"
        results = tool_messages(self.llm.requests[1])
        assert results[0] == ("call_1", "Error: there is no tool named 'no_such_tool'.")
        assert results[1][1].startswith("Error: TypeError") and "item" in results[1][1]
        assert [t.tool_call_error for t in output.tools] == [True, True]

    def test_tool_call_messages_are_stored_in_order(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})], text="Let me add it."), Text("Added."))

        output = agent.run("add milk", session_id="s")

        rows = list(Message.objects.filter(run__run_id=output.run_id).values_list(
            "seq", "role", "content", "tool_calls", "tool_call_id", "tool_name"))
        assert rows == [
            (1, "user", "add milk", None, "", ""),
            (2, "assistant", "Let me add it.", [{"id": "call_1", "name": "add_item", "arguments": '{"item": "milk"}'}],
             "", ""),
            (3, "tool", "Added milk", None, "call_1", "add_item"),
            (4, "assistant", "Added.", None, "", ""),
        ]
        assert output.content == "Let me add it.Added."


REFUSED = "Tool call limit reached. Tool call add_item not executed. Don't try to execute it again."


class TestToolCallLimit(EngineTestMixin, TestCase):
    """Agno's tool_call_limit: the run's calls past it are not run, the model is told so, and the run ends
    normally with the calls it made, their state changes stored."""

    def setUp(self):
        self.agent_ = self.agent(tools=[add_item], session_state={"shopping_list": []}, tool_call_limit=2)

    def test_calls_past_the_limit_are_not_run_and_the_run_ends_with_the_calls_made(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"}),
                                ("add_item", {"item": "bread"})]),
                     ToolCalls([("no_such_tool", {}), ("add_item", {"item": "bread"})]),
                     Text("I added milk and eggs; I could not add bread."))

        events = stream_all(self.agent_, "add milk, eggs and bread", session_id="s")

        assert tool_messages(self.llm.requests[1]) == [("call_1", "Added milk"), ("call_2", "Added eggs"),
                                                       ("call_3", REFUSED)]
        assert tool_messages(self.llm.requests[2])[3:] == [
            ("call_4", "Error: there is no tool named 'no_such_tool'."), ("call_5", REFUSED)]
        completed = events[-1]
        assert completed.event == RunEvent.run_completed and completed.status == "completed"
        assert completed.content == "I added milk and eggs; I could not add bread."
        assert completed.session_state == {"shopping_list": ["milk", "eggs"]}
        assert [(event.tool.tool_name, event.tool.tool_args) for event in of_kind(events, RunEvent.tool_call_completed)
                ] == [("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"}), ("no_such_tool", {})]
        assert self.agent_.get_session_state(session_id="s") == {"shopping_list": ["milk", "eggs"]}
        assert StateChange.objects.filter(source="tool:add_item").count() == 2
        refused = Message.objects.filter(role="tool", content=REFUSED)
        assert [(m.tool_call_id, m.tool_name, m.tool_error) for m in refused] == [
            ("call_3", "add_item", True), ("call_5", "add_item", True)]

    def test_the_limit_counts_the_calls_of_one_run(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})]), Text("Added."),
                     ToolCalls([("add_item", {"item": "tea"})]), Text("Added tea."))

        first = self.agent_.run("milk and eggs", session_id="s")
        second = self.agent_.run("tea", session_id="s")

        assert [tool.result for tool in first.tools + second.tools] == ["Added milk", "Added eggs", "Added tea"]
        assert second.session_state == {"shopping_list": ["milk", "eggs", "tea"]}

    def test_without_a_limit_every_call_runs(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": str(n)}) for n in range(5)]), Text("Added five."))

        output = agent.run("add five", session_id="s")

        assert agent.tool_call_limit is None and output.session_state == {"shopping_list": ["0", "1", "2", "3", "4"]}


class TestHooks(EngineTestMixin, TestCase):
    def setUp(self):
        self.calls = []

    def make_agent(self, hooks, tools=None):
        return self.agent(tools=tools or [add_item], tool_hooks=hooks, session_state={"shopping_list": []})

    def test_hooks_wrap_the_call_outermost_first(self):
        def outer(function_name, function_call, arguments):
            self.calls.append(f"outer before {function_name} {arguments}")
            result = function_call(**arguments)
            self.calls.append(f"outer after {result}")
            return result

        def inner(name, func, args, run_context: RunContext):
            self.calls.append(f"inner before {name} {run_context.session_id}")
            result = func(**args)
            self.calls.append("inner after")
            return result + "!"

        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("ok"))
        output = self.make_agent([outer, inner]).run("add", session_id="s")

        assert self.calls == ["outer before add_item {'item': 'milk'}", "inner before add_item s", "inner after",
                              "outer after Added milk!"]
        assert tool_messages(self.llm.requests[1]) == [("call_1", "Added milk!")]
        assert output.session_state == {"shopping_list": ["milk"]}

    def test_a_hook_can_short_circuit_the_tool(self):
        def cache(function_name, function_call, arguments):
            self.calls.append(function_name)
            return "from the cache"

        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("ok"))
        output = self.make_agent([cache]).run("add", session_id="s")

        assert self.calls == ["add_item"]
        assert tool_messages(self.llm.requests[1]) == [("call_1", "from the cache")]
        assert output.session_state == {"shopping_list": []}  # the tool never ran

    def test_a_hook_can_change_the_arguments(self):
        def shout(function_call, arguments):
            return function_call(item=arguments["item"].upper())

        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("ok"))
        output = self.make_agent([shout]).run("add", session_id="s")

        assert output.session_state == {"shopping_list": ["MILK"]}

    def test_a_raising_hook_becomes_a_tool_error_and_the_run_completes(self):
        def guard(function_name, function_call, arguments):
            raise PermissionError(f"{function_name} is not allowed")

        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Not allowed."))
        events = stream_all(self.make_agent([guard]), "add", session_id="s")

        completed_tool = of_kind(events, RunEvent.tool_call_completed)[0].tool
        assert completed_tool.tool_call_error is True
        assert completed_tool.result == "Error: PermissionError: add_item is not allowed"
        assert events[-1].event == RunEvent.run_completed and events[-1].status == "completed"
        assert events[-1].session_state == {"shopping_list": []}
        assert Run.objects.get().status == "completed"

    def test_async_hooks_around_sync_and_async_tools(self):
        async def outer(function_name, function_call, arguments):
            self.calls.append(f"async outer {function_name}")
            result = await function_call(**arguments)
            return f"[{result}]"

        def middle(function_name, function_call, arguments):
            self.calls.append(f"sync middle {function_name}")
            return function_call(**arguments)

        async def inner(function_name, function_call, arguments):
            self.calls.append(f"async inner {function_name}")
            return await function_call(**arguments)

        self.llm.add(ToolCalls([("add_item", {"item": "a"}), ("async_add_item", {"item": "b"})]), Text("ok"))
        output = self.make_agent([outer, middle, inner], tools=[add_item, async_add_item]).run("x", session_id="s")

        assert self.calls == ["async outer add_item", "sync middle add_item", "async inner add_item",
                              "async outer async_add_item", "sync middle async_add_item", "async inner async_add_item"]
        assert tool_messages(self.llm.requests[1]) == [("call_1", "[Added a]"), ("call_2", "[Added b (async)]")]
        assert output.session_state == {"shopping_list": ["a", "b"]}

    async def test_hooks_in_an_async_run(self):
        async def outer(function_name, function_call, arguments):
            return "<" + await function_call(**arguments) + ">"

        def inner(function_call, arguments):
            return function_call(**arguments) + "."

        self.llm.add(ToolCalls([("async_add_item", {"item": "b"}), ("add_item", {"item": "c"})]), Text("ok"))
        output = await self.make_agent([outer, inner], tools=[add_item, async_add_item]).arun("x", session_id="s")

        assert tool_messages(self.llm.requests[1]) == [("call_1", "<Added b (async).>"), ("call_2", "<Added c.>")]
        assert output.session_state == {"shopping_list": ["b", "c"]}


class TestAgenticState(EngineTestMixin, TestCase):
    def test_the_agentic_tool_replaces_top_level_keys(self):
        agent = self.agent(enable_agentic_state=True, session_state={"prefs": {"theme": "light", "font": "big"},
                                                                     "name": "Ann"})
        self.llm.add(ToolCalls([("update_session_state", {"session_state_updates": {"prefs": {"theme": "dark"},
                                                                                      "city": "Oslo"}})]),
                     Text("Updated."))

        output = agent.run("I like dark themes and live in Oslo", session_id="s", user_id="alice")

        assert output.session_state == {"prefs": {"theme": "dark"}, "name": "Ann", "city": "Oslo"}
        reply = tool_messages(self.llm.requests[1])[0][1]
        assert reply.startswith("Updated session state: ") and "'city': 'Oslo'" in reply
        change = StateChange.objects.order_by("version").last()
        assert change.source == "agentic" and change.run.run_id == output.run_id

    def test_a_user_tool_named_update_session_state_is_recorded_under_its_own_name(self):
        def update_session_state(key: str, run_context: RunContext) -> str:
            """Mine."""
            run_context.session_state[key] = 1
            return "ok"

        self.llm.add(ToolCalls([("update_session_state", {"key": "k"})]), Text("ok"))
        self.agent(tools=[update_session_state]).run("x", session_id="s")

        assert StateChange.objects.get().source == "tool:update_session_state"


class TestStateChanges(EngineTestMixin, TestCase):
    def setUp(self):
        self.agent_ = self.agent(tools=[add_item, list_items], session_state={"shopping_list": []})

    def test_a_state_changed_event_follows_each_changing_tool_call(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("list_items", {}), ("add_item", {"item": "eggs"})]),
                     Text("ok"))

        events = stream_all(self.agent_, "add", session_id="s")

        assert kinds(events) == [
            "RunStarted",
            "ToolCallStarted", "ToolCallCompleted", "StateChanged",
            "ToolCallStarted", "ToolCallCompleted",
            "ToolCallStarted", "ToolCallCompleted", "StateChanged",
            "RunContent", "RunCompleted",
        ]
        first, second = of_kind(events, RunEvent.state_changed)
        assert first.patch == [{"op": "add", "path": "/shopping_list/0", "value": "milk"}]
        assert first.changed_keys == ["shopping_list"] and first.source == "tool:add_item"
        assert first.session_state == {"shopping_list": ["milk"]}
        assert second.patch == [{"op": "add", "path": "/shopping_list/1", "value": "eggs"}]
        assert second.session_state == {"shopping_list": ["milk", "eggs"]}
        assert [event.seq for event in events] == list(range(1, len(events) + 1))

    async def test_async_stream_emits_the_same_state_events(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("list_items", {})]), Text("ok"))

        events = await astream_all(self.agent_, "add", session_id="s")

        (changed,) = of_kind(events, RunEvent.state_changed)
        assert changed.patch == [{"op": "add", "path": "/shopping_list/0", "value": "milk"}]

    def test_changes_are_recorded_with_source_run_and_versions(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})]), Text("ok"))
        first = self.agent_.run("add", session_id="s", session_state={"owner": "ann"})
        self.agent_.update_session_state({"owner": "bob"}, session_id="s")

        rows = list(StateChange.objects.order_by("version").values_list("version", "source", "run__run_id", "patch"))

        assert rows == [
            (1, "defaults", first.run_id, [{"op": "add", "path": "/shopping_list", "value": []}]),
            (2, "run_input", first.run_id, [{"op": "add", "path": "/owner", "value": "ann"}]),
            (3, "tool:add_item", first.run_id, [{"op": "add", "path": "/shopping_list/0", "value": "milk"}]),
            (4, "tool:add_item", first.run_id, [{"op": "add", "path": "/shopping_list/1", "value": "eggs"}]),
            (5, "manual", None, [{"op": "replace", "path": "/owner", "value": "bob"}]),
        ]
        assert first.state_version == 4 and Run.objects.get().state_version == 4
        assert ChatSession.objects.get().state_version == 5

    def test_state_at_rebuilds_every_earlier_version(self):
        agent = self.agent(tools=[add_item], enable_agentic_state=True, session_state={"shopping_list": []})
        seen = {0: {}}

        def remember(events):
            for event in events:
                if event.event == RunEvent.state_changed:
                    seen[max(seen) + 1] = event.session_state

        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})]), Text("ok"),
                     ToolCalls([("update_session_state", {"session_state_updates": {"shopping_list": ["tea"],
                                                                                     "meta": {"n": 1}}})]),
                     Text("ok"))
        seen[1] = {"shopping_list": []}  # the defaults, applied at the start of the first run
        remember(stream_all(agent, "one", session_id="s"))
        seen[max(seen) + 1] = agent.update_session_state({"meta": {"n": 2, "deep": [1, {"x": None}]}}, session_id="s")
        remember(stream_all(agent, "two", session_id="s"))
        seen[max(seen) + 1] = agent.update_session_state({"shopping_list": [], "meta": None}, session_id="s")

        session = ChatSession.objects.get()
        assert session.state_version == max(seen) == 6
        for version, state in seen.items():
            assert session.state_at(version) == state, version
        try:
            session.state_at(7)
        except ValueError as exc:
            assert "latest is 6" in str(exc)
        else:
            raise AssertionError("a future version was rebuilt")

    def test_a_tool_that_changes_nothing_emits_no_event_and_records_nothing(self):
        self.llm.add(ToolCalls([("list_items", {})]), Text("empty"))
        self.agent_.run("first", session_id="s")
        count = StateChange.objects.count()

        self.llm.add(ToolCalls([("list_items", {})]), Text("empty"))
        events = stream_all(self.agent_, "list", session_id="s")

        assert of_kind(events, RunEvent.state_changed) == []
        assert StateChange.objects.count() == count

    def test_a_tool_that_rebinds_the_state_dict_still_counts(self):
        def reset(run_context: RunContext) -> str:
            """Start over."""
            run_context.session_state = {"shopping_list": ["fresh"]}
            return "reset"

        self.llm.add(ToolCalls([("reset", {}), ("add_item", {"item": "more"})]), Text("ok"))
        output = self.agent(tools=[reset, add_item], session_state={"shopping_list": ["old"]}).run("x", session_id="s")

        assert output.session_state == {"shopping_list": ["fresh", "more"]}
        assert json.loads(json.dumps(ChatSession.objects.get().session_state)) == {"shopping_list": ["fresh", "more"]}
