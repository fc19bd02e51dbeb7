"""Session state: merge precedence (SPEC Appendix A, adapted to our contract), templating, injected keys.

Each run goes through the real OpenAIChat to the local test server; assertions read the stored
state, the RunOutput / events, and the request bodies the server recorded.
"""

import copy
import datetime
import decimal
import json
import random
import uuid

from asgiref.sync import sync_to_async
from django.test import SimpleTestCase, TestCase

from sessions_core import RunContext, RunEvent
from sessions_core import state as state_module
from sessions_core.models import ChatSession, StateChange
from tests.support.engine_helpers import (
    EngineTestMixin,
    astream_all,
    make_users,
    of_kind,
    snapshot,
    stream_all,
    tool_then_text,
)
from tests.support.llm_server import Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the shopping list.

    Args:
        item: The item to add.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


class TestAppendixA(EngineTestMixin, TestCase):
    """SPEC.md Appendix A: Agno's test_session_state.py, adapted to our contract."""

    def test_precedence_all_three_layers(self):
        agent = self.agent(session_state={"name": "agent_default", "shared_key": "from_agent_default",
                                          "agent_only": "agent_value"})
        agent.run("one", session_id="s", session_state={"name": "db_saved", "shared_key": "from_db", "db_only": "d"})
        agent.run("two", session_id="s", session_state={"name": "run_override", "shared_key": "from_run",
                                                        "run_only": "r"})

        assert agent.get_session_state(session_id="s") == {
            "name": "run_override", "shared_key": "from_run", "run_only": "r", "db_only": "d",
            "agent_only": "agent_value",
        }

    def test_precedence_db_and_run_only(self):
        agent = self.agent()
        agent.run("one", session_id="s", session_state={"db_key": "db", "shared": "from_db"})
        agent.run("two", session_id="s", session_state={"run_key": "run", "shared": "from_run"})

        assert agent.get_session_state(session_id="s") == {"db_key": "db", "run_key": "run", "shared": "from_run"}

    def test_precedence_agent_and_run_only(self):
        defaults = {"agent_key": "agent", "shared": "from_agent"}
        agent = self.agent(session_state=defaults)

        output = agent.run("one", session_id="s", session_state={"run_key": "run", "shared": "from_run"})

        assert output.session_state == {"agent_key": "agent", "run_key": "run", "shared": "from_run"}
        assert defaults == {"agent_key": "agent", "shared": "from_agent"}
        assert agent.session_state == {"agent_key": "agent", "shared": "from_agent"}
        assert agent.get_session_state(session_id="s") == ChatSession.objects.get(session_id="s").session_state
        assert agent.get_session_state(session_id="s") == output.session_state

    def test_empty_run_state_preserves_db(self):
        agent = self.agent(session_state={"agent_key": "agent"})
        expected = {"agent_key": "agent", "db_key": "db", "modified": "original"}

        agent.run("one", session_id="s", session_state={"db_key": "db", "modified": "original"})
        assert agent.get_session_state(session_id="s") == expected
        version = ChatSession.objects.get(session_id="s").state_version
        for run_state in (None, {}):
            output = agent.run("again", session_id="s", session_state=run_state)
            assert output.session_state == expected
            assert agent.get_session_state(session_id="s") == expected
        assert ChatSession.objects.get(session_id="s").state_version == version

    def test_default_state_does_not_override_db(self):
        agent = self.agent(session_state={"agent_key": []})
        agent.run("one", session_id="s", session_state={"agent_key": ["foo", "bar"]})
        agent.run("two", session_id="s", session_state=None)

        assert agent.get_session_state(session_id="s") == {"agent_key": ["foo", "bar"]}

    def test_tool_updates_persist_and_user_text_is_never_templated(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []},
                           instructions="Current shopping list: {shopping_list}")
        self.llm.add(ToolCalls([("add_item", {"item": "oranges"})]), Text("Added oranges."))
        agent.run("Add oranges", session_id="s")
        user_text = 'What is in {shopping_list}? Answer like ```json\n{"items": ["x"]}\n```'

        output = agent.run(user_text, session_id="s")

        assert agent.get_session_state(session_id="s") == {"shopping_list": ["oranges"]}
        assert self.system_prompt() == "Current shopping list: ['oranges']"
        assert self.sent_pairs()[-1] == ("user", user_text)  # our contract: the user's text reaches the model as typed
        assert output.messages[1].role == "user" and output.messages[1].content == user_text

    def test_manual_session_state_update(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []}, add_session_state_to_context=True)
        self.llm.add(ToolCalls([("add_item", {"item": "oranges"})]), Text("Added."))
        agent.run("Add oranges", session_id="s")

        agent.update_session_state({"shopping_list": ["oranges", "bananas"]}, session_id="s")

        assert agent.get_session_state(session_id="s") == {"shopping_list": ["oranges", "bananas"]}
        agent.run("What is on my list?", session_id="s")
        assert '"shopping_list": ["oranges", "bananas"]' in self.system_prompt()

    def test_precedence_with_nested_dicts(self):
        agent = self.agent(session_state={"user_profile": {"name": "default", "age": 25},
                                          "settings": {"theme": "light", "notifications": True}})
        agent.run("one", session_id="s", session_state={"user_profile": {"name": "db_user", "email": "db@x.org"},
                                                        "settings": {"theme": "dark"}})
        agent.run("two", session_id="s", session_state={"user_profile": {"name": "run_user", "phone": "555"},
                                                        "new_section": {"new_key": "v"}})

        assert agent.get_session_state(session_id="s") == {
            "user_profile": {"name": "run_user", "phone": "555", "email": "db@x.org", "age": 25},
            "settings": {"theme": "dark", "notifications": True},
            "new_section": {"new_key": "v"},
        }

    async def test_precedence_async(self):
        agent = self.agent(session_state={"async_test": "agent_default"})
        await agent.arun("one", session_id="s", session_state={"async_test": "db_state", "db_key": "db"})
        output = await agent.arun("two", session_id="s", session_state={"async_test": "run_state", "run_key": "r"})

        expected = {"async_test": "run_state", "db_key": "db", "run_key": "r"}
        assert output.session_state == expected
        assert await agent.aget_session_state(session_id="s") == expected

    def test_precedence_streaming(self):
        agent = self.agent(session_state={"async_test": "agent_default"})
        list(agent.run("one", session_id="s", stream=True, session_state={"async_test": "db_state", "db_key": "db"}))
        events = list(agent.run("two", session_id="s", stream=True, stream_events=True,
                                session_state={"async_test": "run_state", "run_key": "r"}))

        expected = {"async_test": "run_state", "db_key": "db", "run_key": "r"}
        assert events[-1].event == RunEvent.run_completed and events[-1].session_state == expected
        assert agent.get_session_state(session_id="s") == expected

    def test_overwriting(self):
        agent = self.agent(session_state={"overwrite_test": "agent_default"}, overwrite_db_session_state=True)
        agent.run("one", session_id="s", session_state={"original_field": "original"})
        assert agent.get_session_state(session_id="s") == {"overwrite_test": "agent_default",
                                                           "original_field": "original"}

        agent.run("two", session_id="s", session_state={"new_field": "new"})

        assert agent.get_session_state(session_id="s") == {"overwrite_test": "agent_default", "new_field": "new"}

    def test_switching_session_ids_keeps_each_sessions_state(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.responder = tool_then_text("add_item", lambda body: {"item": body["messages"][-1]["content"]})

        agent.run("apples", session_id="one")
        agent.run("pears", session_id="two")
        agent.run("plums", session_id="one")

        assert agent.get_session_state(session_id="one") == {"shopping_list": ["apples", "plums"]}
        assert agent.get_session_state(session_id="two") == {"shopping_list": ["pears"]}

    def test_run_output_and_completed_event_carry_the_updated_state(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("ok"),
                     ToolCalls([("add_item", {"item": "eggs"})]), Text("ok"))

        output = agent.run("milk", session_id="s")
        events = stream_all(agent, "eggs", session_id="s")

        assert output.session_state == {"shopping_list": ["milk"]}
        completed = of_kind(events, RunEvent.run_completed)[0]
        assert completed.session_state == {"shopping_list": ["milk", "eggs"]}
        assert completed.state_version == ChatSession.objects.get(session_id="s").state_version

    async def test_async_run_output_and_completed_event_carry_the_updated_state(self):
        agent = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("ok"),
                     ToolCalls([("add_item", {"item": "eggs"})]), Text("ok"))

        output = await agent.arun("milk", session_id="s")
        events = await astream_all(agent, "eggs", session_id="s")

        assert output.session_state == {"shopping_list": ["milk"]}
        assert of_kind(events, RunEvent.run_completed)[0].session_state == {"shopping_list": ["milk", "eggs"]}

    def test_state_block_in_context(self):
        agent = self.agent(session_state={"shopping_list": ["milk"], "count": 1}, add_session_state_to_context=True,
                           instructions="You keep lists.")

        output = agent.run("hi", session_id="s", user_id="alice")

        prompt = self.system_prompt()
        assert prompt.startswith("You keep lists.")
        block = prompt.split("<session_state>\n", 1)[1].split("\n</session_state>", 1)[0]
        assert json.loads(block) == {"shopping_list": ["milk"], "count": 1, "current_user_id": "alice",
                                     "current_session_id": "s", "current_run_id": output.run_id}

    def test_no_state_block_unless_asked(self):
        self.agent(session_state={"secret": "x"}, instructions="Hello.").run("hi", session_id="s")

        assert self.system_prompt() == "Hello."


class TestMergePrecedence(EngineTestMixin, TestCase):
    """Our contract (SPEC Part 1, items 1-2) beyond Appendix A."""

    def test_explicit_none_replaces_a_stored_value(self):
        agent = self.agent(session_state={"theme": "light"})
        agent.run("one", session_id="s", session_state={"theme": "dark", "nested": {"a": 1, "b": 2}})

        agent.run("two", session_id="s", session_state={"theme": None, "nested": {"a": None}})

        assert agent.get_session_state(session_id="s") == {"theme": None, "nested": {"a": None, "b": 2}}

    def test_deeply_nested_dicts_merge_key_by_key_and_lists_are_replaced(self):
        agent = self.agent(session_state={"a": {"b": {"c": 1, "d": [1, 2]}, "e": 1}})
        agent.run("one", session_id="s", session_state={"a": {"b": {"x": 1}}})

        agent.run("two", session_id="s", session_state={"a": {"b": {"d": [3]}}})

        assert agent.get_session_state(session_id="s") == {"a": {"b": {"c": 1, "d": [3], "x": 1}, "e": 1}}

    def test_a_dict_replaces_a_scalar_and_a_scalar_replaces_a_dict(self):
        agent = self.agent()
        agent.run("one", session_id="s", session_state={"x": 1, "y": {"deep": True}})

        agent.run("two", session_id="s", session_state={"x": {"now": "dict"}, "y": "flat"})

        assert agent.get_session_state(session_id="s") == {"x": {"now": "dict"}, "y": "flat"}

    def test_overwrite_mode_run_without_state_leaves_stored_state(self):
        agent = self.agent(session_state={"d": 0}, overwrite_db_session_state=True)
        agent.run("one", session_id="s", session_state={"kept": True})

        for run_state in (None, {}):
            output = agent.run("again", session_id="s", session_state=run_state)
            assert output.session_state == {"d": 0, "kept": True}
        assert agent.get_session_state(session_id="s") == {"d": 0, "kept": True}

    def test_overwrite_mode_defaults_fill_missing_keys_but_stored_keys_go(self):
        agent = self.agent(session_state={"d": 0, "e": {"x": 1}}, overwrite_db_session_state=True)
        agent.run("one", session_id="s", session_state={"d": 5, "old": 1})

        agent.run("two", session_id="s", session_state={"e": {"y": 2}})

        assert agent.get_session_state(session_id="s") == {"d": 0, "e": {"x": 1, "y": 2}}

    def test_a_default_added_later_reaches_an_existing_session(self):
        self.agent(session_state={"a": 1}).run("one", session_id="s", session_state={"a": 5})

        output = self.agent(session_state={"a": 1, "b": []}).run("two", session_id="s")

        assert output.session_state == {"a": 5, "b": []}
        change = StateChange.objects.get(session__session_id="s", version=3)
        assert (change.source, change.patch) == ("defaults", [{"op": "add", "path": "/b", "value": []}])

    def test_defaults_and_run_input_are_recorded_as_separate_changes(self):
        agent = self.agent(session_state={"a": 1})

        output = agent.run("one", session_id="s", session_state={"b": 2})

        changes = list(StateChange.objects.filter(session__session_id="s").values_list("version", "source", "patch"))
        assert changes == [
            (1, "defaults", [{"op": "add", "path": "/a", "value": 1}]),
            (2, "run_input", [{"op": "add", "path": "/b", "value": 2}]),
        ]
        assert output.state_version == 2
        assert StateChange.objects.get(version=2).run.run_id == output.run_id

    def test_a_run_that_changes_nothing_records_no_change(self):
        agent = self.agent(session_state={"a": 1})
        agent.run("one", session_id="s", session_state={"a": 1})
        assert StateChange.objects.count() == 1

        agent.run("two", session_id="s", session_state={"a": 1})

        assert StateChange.objects.count() == 1
        assert ChatSession.objects.get(session_id="s").state_version == 1

    def test_run_supplied_datetime_decimal_and_uuid_are_stored_as_strings(self):
        when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC)
        key = uuid.UUID("12345678-1234-5678-1234-567812345678")

        output = self.agent().run("x", session_id="s", session_state={
            "when": when, "day": datetime.date(2024, 5, 1), "price": decimal.Decimal("9.99"), "key": key,
        })

        expected = {"when": "2024-05-01T12:30:00+00:00", "day": "2024-05-01", "price": "9.99",
                    "key": "12345678-1234-5678-1234-567812345678"}
        assert output.session_state == expected
        assert ChatSession.objects.get(session_id="s").session_state == expected


def stamp(run_context: RunContext) -> str:
    """Keep a tuple in the state."""
    run_context.session_state["pair"] = ("a", "b")
    run_context.session_state["seen"].append("stamp")
    return "ok"


def look(run_context: RunContext) -> str:
    """Read the state and change nothing."""
    return str(len(run_context.session_state))


def touch(run_context: RunContext) -> str:
    """Change one other thing."""
    run_context.session_state["seen"].append("touch")
    return "ok"


class TestToolStateChanges(EngineTestMixin, TestCase):
    def test_python_values_a_tool_stores_are_recorded_once_in_their_json_form(self):
        """A tuple differs from its JSON form, so the change is made from the parsed JSON; later tool
        calls record only what they change (the tuple is not "changed" again)."""
        def respond(body):
            if body["messages"][-1]["role"] == "tool":
                return Text("Done.")
            return ToolCalls([("stamp", {}), ("look", {}), ("touch", {})])

        self.llm.responder = respond
        agent = self.agent(tools=[stamp, look, touch], session_state={"seen": []})

        events = stream_all(agent, "go", session_id="s")

        after_stamp = {"seen": ["stamp"], "pair": ["a", "b"]}
        expected = {**after_stamp, "seen": ["stamp", "touch"]}
        changed = of_kind(events, RunEvent.state_changed)
        assert [event.source for event in changed] == ["tool:stamp", "tool:touch"]
        assert [event.session_state for event in changed] == [after_stamp, expected]
        assert sorted(op["path"] for op in changed[0].patch) == ["/pair", "/seen/0"]
        assert changed[1].patch == [{"op": "add", "path": "/seen/1", "value": "touch"}]
        assert events[-1].session_state == expected
        assert ChatSession.objects.get(session_id="s").session_state == expected
        assert list(StateChange.objects.values_list("source", flat=True)) == ["defaults", "tool:stamp", "tool:touch"]

    def test_a_large_list_grows_by_one_item_per_run(self):
        self.llm.responder = tool_then_text("add_item", lambda body: {"item": body["messages"][-1]["content"]})
        items = [f"item {n}" for n in range(500)]
        agent = self.agent(tools=[add_item], session_state={"shopping_list": items})
        agent.run("jam", session_id="s")

        output = agent.run("tea", session_id="s")

        assert output.session_state == {"shopping_list": [*items, "jam", "tea"]}
        assert ChatSession.objects.get(session_id="s").session_state == output.session_state
        assert StateChange.objects.order_by("version").last().patch == [
            {"op": "add", "path": "/shopping_list/501", "value": "tea"}]


def shop_tool(item: str, run_context: RunContext) -> str:
    """Put an item on the list and count the visits.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    run_context.session_state["visits"] = run_context.session_state.get("visits", 0) + 1
    return "ok"


class TestSameResultEveryWay(EngineTestMixin, TestCase):
    """Sync, async, streaming and async streaming runs store exactly the same thing."""

    SCRIPT = [
        ("buy milk", {"shopping_list": ["bread"]}),
        ("buy eggs", None),
        ("buy tea", {"note": {"who": "me"}}),
    ]

    def setUp(self):
        self.llm.responder = tool_then_text("shop_tool", lambda body: {"item": body["messages"][-1]["content"][4:]})

    def make_agent(self):
        return self.agent(tools=[shop_tool], session_state={"shopping_list": [], "visits": 0},
                          add_history_to_context=True, instructions="List: {shopping_list}")

    def test_every_mode_stores_the_same_runs_messages_state_and_changes(self):
        agent = self.make_agent()
        for text, run_state in self.SCRIPT:
            agent.run(text, session_id="sync", session_state=run_state)
        for text, run_state in self.SCRIPT:
            list(agent.run(text, session_id="stream", session_state=run_state, stream=True, stream_events=True))

        async def async_runs():
            for text, run_state in self.SCRIPT:
                await agent.arun(text, session_id="async", session_state=run_state)
            for text, run_state in self.SCRIPT:
                await astream_all(agent, text, session_id="astream", session_state=run_state)

        from asgiref.sync import async_to_sync

        async_to_sync(async_runs)()

        reference = snapshot("sync")
        assert reference["state"] == {"shopping_list": ["bread", "milk", "eggs", "tea"], "visits": 3,
                                      "note": {"who": "me"}}
        assert len(reference["runs"]) == 3 and reference["last_seq"] == 15
        for session_id in ("stream", "async", "astream"):
            assert snapshot(session_id) == reference, session_id


class TestTemplating(EngineTestMixin, TestCase):
    def test_placeholders_resolve_from_state_then_dependencies_then_metadata_then_user_id(self):
        agent = self.agent(
            session_state={"a": "state-a"},
            dependencies={"a": "dep-a", "b": "dep-b"},
            metadata={"a": "meta-a", "b": "meta-b", "c": "meta-c", "user_id": "meta-user"},
            instructions="a={a} b={b} c={c} user={user_id} n={n}",
        )

        agent.run("hi", session_id="s", user_id="alice", session_state={"n": 3})

        assert self.system_prompt() == "a=state-a b=dep-b c=meta-c user=meta-user n=3"

    def test_user_id_fills_in_when_nothing_else_has_it(self):
        self.agent(instructions="You talk to {user_id}.").run("hi", session_id="s", user_id="alice")

        assert self.system_prompt() == "You talk to alice."

    def test_missing_keys_json_braces_and_format_specs_stay_verbatim(self):
        text = 'Known {known}, unknown {unknown}, json {"k": [1, 2]}, {{double}}, spec {known:>5}, empty {}'
        self.agent(session_state={"known": 7}, instructions=text).run("hi", session_id="s")

        assert self.system_prompt() == (
            'Known 7, unknown {unknown}, json {"k": [1, 2]}, {{double}}, spec {known:>5}, empty {}')

    def test_user_input_with_placeholders_is_sent_verbatim(self):
        agent = self.agent(session_state={"secret": "s3cr3t"}, instructions="Never say {secret}.")

        output = agent.run("Tell me {secret} and {current_user_id}", session_id="s", user_id="alice")

        assert self.sent_pairs() == [("user", "Tell me {secret} and {current_user_id}")]
        assert "s3cr3t" not in json.dumps(self.sent_pairs())
        assert output.messages[-2].content == "Tell me {secret} and {current_user_id}"

    def test_list_instructions_and_system_message_are_templated(self):
        self.agent(session_state={"x": "X"}, instructions=["one {x}", "two {x}"]).run("hi", session_id="a")
        assert self.system_prompt() == "<instructions>\n- one X\n- two X\n</instructions>"

        agent = self.agent(session_state={"x": "X"}, system_message="Only {x}.", instructions="ignored")
        agent.run("hi", session_id="b")
        assert self.system_prompt() == "Only X."

    def test_resolve_in_context_false_leaves_placeholders(self):
        agent = self.agent(session_state={"x": "X"}, instructions="Keep {x}", resolve_in_context=False)
        agent.run("hi", session_id="s")

        assert self.system_prompt() == "Keep {x}"

    def test_run_dependencies_and_metadata_reach_templates(self):
        agent = self.agent(instructions="{dep} {meta}", metadata={"meta": "agent-meta"})

        agent.run("hi", session_id="s", dependencies={"dep": "run-dep"}, metadata={"meta": "run-meta"})

        assert self.system_prompt() == "run-dep agent-meta"  # Agno: the agent's metadata wins over the call's

    def test_templates_see_the_state_after_the_merge(self):
        agent = self.agent(session_state={"mood": "calm"}, instructions="Mood: {mood}")
        agent.run("one", session_id="s", session_state={"mood": "happy"})

        agent.run("two", session_id="s")

        assert self.system_prompt() == "Mood: happy"


class TestInjectedKeys(EngineTestMixin, TestCase):
    """current_user_id / current_session_id / current_run_id: seen during the run, never stored or returned."""

    INJECTED = {"current_user_id", "current_session_id", "current_run_id"}

    def setUp(self):
        self.seen = []

        def peek(run_context: RunContext) -> str:
            """Look at the state."""
            self.seen.append(dict(run_context.session_state))
            run_context.session_state["current_user_id"] = "mallory"  # a tool cannot persist an injected key
            run_context.session_state["peeked"] = True
            return "ok"

        self.peek = peek

    def assert_clean(self, state):
        assert not self.INJECTED & set(state), state

    def test_tools_and_templates_see_them(self):
        agent = self.agent(tools=[self.peek], session_state={"a": 1},
                           instructions="u={current_user_id} s={current_session_id} r={current_run_id}")
        self.llm.add(ToolCalls([("peek", {})]), Text("done"))

        output = agent.run("look", session_id="s", user_id="alice")

        assert self.seen == [{"a": 1, "current_user_id": "alice", "current_session_id": "s",
                              "current_run_id": output.run_id}]
        assert self.system_prompt(0) == f"u=alice s=s r={output.run_id}"

    def test_they_are_absent_from_outputs_events_accessors_and_the_database(self):
        agent = self.agent(tools=[self.peek], session_state={"a": 1})
        self.llm.add(ToolCalls([("peek", {})]), Text("done"), ToolCalls([("peek", {})]), Text("done"))

        output = agent.run("look", session_id="s", user_id="alice",
                           session_state={"current_session_id": "forged", "b": 2})
        events = stream_all(agent, "again", session_id="s", user_id="alice")

        assert output.session_state == {"a": 1, "b": 2, "peeked": True}
        self.assert_clean(of_kind(events, RunEvent.run_completed)[0].session_state)
        for event in of_kind(events, RunEvent.state_changed):
            self.assert_clean(event.session_state)
        self.assert_clean(agent.get_session_state(session_id="s", user_id="alice"))
        self.assert_clean(ChatSession.objects.get(session_id="s").session_state)
        for patch in StateChange.objects.values_list("patch", flat=True):
            assert not any(op["path"].lstrip("/").split("/")[0] in self.INJECTED for op in patch), patch
        assert self.seen[1]["current_user_id"] == "alice"  # the tool's forgery did not stick

    def test_one_stored_by_other_means_is_dropped_by_the_next_run(self):
        """A state saved outside the engine (say through the admin) holding an injected key: the next
        run, even one that changes nothing, drops it and records the removal."""
        agent = self.agent()
        self.llm.add(Text("hi"))
        ChatSession.objects.create(session_id="s", session_state={"a": 1, "current_user_id": "mallory"})

        output = agent.run("hello", session_id="s")

        assert output.session_state == {"a": 1}
        assert ChatSession.objects.get(session_id="s").session_state == {"a": 1}
        assert StateChange.objects.get().patch == [{"op": "remove", "path": "/current_user_id"}]

    async def test_async_run_keeps_them_out_too(self):
        agent = self.agent(tools=[self.peek], session_state={"a": 1})
        self.llm.add(ToolCalls([("peek", {})]), Text("done"))

        output = await agent.arun("look", session_id="s", user_id="alice")

        assert output.session_state == {"a": 1, "peeked": True}
        self.assert_clean(await agent.aget_session_state(session_id="s", user_id="alice"))
        assert self.seen[0]["current_run_id"] == output.run_id

    def test_without_a_user_there_is_no_current_user_id(self):
        agent = self.agent(tools=[self.peek])
        self.llm.add(ToolCalls([("peek", {})]), Text("done"))

        output = agent.run("look", session_id="s")

        assert self.seen == [{"current_session_id": "s", "current_run_id": output.run_id}]


def containers(node):
    """Every dict and list in a tree, the tree itself first."""
    if isinstance(node, (dict, list)):
        yield node
        for child in node.values() if isinstance(node, dict) else node:
            yield from containers(child)


class TestStateFunctions(SimpleTestCase):
    """The pure functions in sessions_core/state.py."""

    def test_merge_owned_layers_defaults_stored_and_run_state_without_changing_them(self):
        defaults, stored, run = {"a": {"x": [1]}}, {"a": {"y": 2}}, {"a": {"z": 3}}

        assert state_module.merge_owned(defaults, stored, run) == {"a": {"x": [1], "y": 2, "z": 3}}
        assert state_module.merge_owned(defaults, stored, run, overwrite=True) == {"a": {"x": [1], "z": 3}}
        assert state_module.merge_owned(defaults, stored, None, overwrite=True) == {"a": {"x": [1], "y": 2}}
        assert defaults == {"a": {"x": [1]}} and stored == {"a": {"y": 2}} and run == {"a": {"z": 3}}

    def test_to_json_names_the_key_and_the_type(self):
        try:
            state_module.to_json({"ok": 1, "tags": {"inner": [1, {2, 3}]}})
        except state_module.StateNotJSONError as exc:
            assert "['tags']['inner'][1]" in str(exc) and "set" in str(exc)
        else:
            raise AssertionError("a set was accepted")

    def test_to_json_rejects_nan_objects_and_odd_keys(self):
        for bad in ({"x": float("nan")}, {"x": object()}, {("t",): 1}, {"x": b"bytes"}):
            try:
                state_module.to_json(bad)
            except state_module.StateNotJSONError:
                continue
            raise AssertionError(f"{bad!r} was accepted")

    def test_diff_and_changed_keys(self):
        patch, inverse = state_module.diff({"a": 1, "b": [1]}, {"b": [1, 2], "c": {"d": 1}})

        assert state_module.apply_patch({"a": 1, "b": [1]}, patch) == {"b": [1, 2], "c": {"d": 1}}
        assert state_module.apply_patch({"b": [1, 2], "c": {"d": 1}}, inverse) == {"a": 1, "b": [1]}
        assert sorted(state_module.changed_keys(patch)) == ["a", "b", "c"]
        # Escaped keys come back as they are named; a key changed twice is listed once.
        patch, _ = state_module.diff({"a/b": 1, "~x": [1]}, {"a/b": 2, "~x": [2, 3], "": 0})
        assert state_module.changed_keys(patch) == ["a/b", "~x", ""]

    def test_diff_patches_are_small_and_exact(self):
        before = {"items": ["milk", "eggs", "bread"], "n": 1, "flag": True, "k/~": 0}
        cases = [
            ({**before, "items": ["milk", "eggs", "bread", "jam"]},
             [{"op": "add", "path": "/items/3", "value": "jam"}]),
            ({**before, "items": ["milk", "bread"]}, [{"op": "remove", "path": "/items/1"}]),
            ({**before, "n": 1.0}, [{"op": "replace", "path": "/n", "value": 1.0}]),  # equal in Python, not in JSON
            ({**before, "flag": 1}, [{"op": "replace", "path": "/flag", "value": 1}]),
            ({**before, "k/~": 1}, [{"op": "replace", "path": "/k~1~0", "value": 1}]),
            (dict(before), []),
        ]
        for after, expected in cases:
            with self.subTest(after=after):
                patch, inverse = state_module.diff(before, after)
                assert patch == expected
                assert state_module.apply_patch(before, patch) == after
                assert state_module.apply_patch(after, inverse) == before

    def test_diff_round_trips_on_random_edits(self):
        """Many random nested states and edits (with 1, 1.0, True and False mixed in): applying the patch
        gives the new state and applying the inverse gives the old one, exactly as JSON."""
        rng = random.Random(20261129)
        scalars = [0, 1, 2, 1.0, 1.5, True, False, None, "a", "b"]

        def value(depth=0):
            roll = rng.random()
            if depth > 3 or roll < 0.4:
                return rng.choice(scalars)
            if roll < 0.7:
                return [value(depth + 1) for _ in range(rng.randint(0, 5))]
            return {rng.choice("abcde"): value(depth + 1) for _ in range(rng.randint(0, 4))}

        def edit(node, depth=0):
            node = copy.deepcopy(node)
            roll = rng.random()
            if isinstance(node, list):
                if roll < 0.3 or not node:
                    node.insert(rng.randint(0, len(node)), value(depth + 1))
                elif roll < 0.5:
                    node.pop(rng.randrange(len(node)))
                else:
                    index = rng.randrange(len(node))
                    node[index] = edit(node[index], depth + 1)
                return node
            if isinstance(node, dict):
                if roll < 0.3 or not node:
                    node[rng.choice("abcdefg")] = value(depth + 1)
                elif roll < 0.5:
                    node.pop(rng.choice(list(node)))
                else:
                    key = rng.choice(list(node))
                    node[key] = edit(node[key], depth + 1)
                return node
            return value(depth + 1)

        def as_json(state):
            return json.dumps(state, sort_keys=True)

        for _ in range(3000):
            before = {"s": value()}
            after = before
            for _ in range(rng.randint(1, 3)):
                after = edit(after)
            patch, inverse = state_module.diff(before, after)
            assert as_json(state_module.apply_patch(before, patch)) == as_json(after), (before, after, patch)
            assert as_json(state_module.apply_patch(after, inverse)) == as_json(before), (before, after, inverse)

    def test_diff_is_exact_on_large_lists_too(self):
        """Lists longer than 32 items are compared in C (joined when all strings, as orjson text
        otherwise); the types still count."""
        words = [f"item {n}" for n in range(40)]
        numbers = list(range(40))
        cases = [
            ({"l": words}, {"l": [*words, "jam"]}, [{"op": "add", "path": "/l/40", "value": "jam"}]),
            ({"l": words}, {"l": words[:20] + words[21:]}, [{"op": "remove", "path": "/l/20"}]),
            ({"l": numbers}, {"l": [*numbers[:5], 5.0, *numbers[6:]]},
             [{"op": "replace", "path": "/l/5", "value": 5.0}]),
            ({"l": numbers}, {"l": [*numbers[:1], True, *numbers[2:]]},
             [{"op": "replace", "path": "/l/1", "value": True}]),
            ({"l": [None, *words]}, {"l": [None, *words, None]}, [{"op": "add", "path": "/l/41", "value": None}]),
            ({"l": words, "d": dict.fromkeys(words, 1)}, {"l": words, "d": {**dict.fromkeys(words, 1), "item 3": 1.0}},
             [{"op": "replace", "path": "/d/item 3", "value": 1.0}]),
            ({"l": words}, {"l": list(words)}, []),
        ]
        for before, after, expected in cases:
            with self.subTest(expected=expected):
                patch, inverse = state_module.diff(before, after)
                assert patch == expected
                assert json.dumps(state_module.apply_patch(after, inverse)) == json.dumps(before)

    def test_diff_onto_gives_the_patch_of_the_parsed_state_and_updates_the_snapshot(self):
        """Random edits of states with long and short lists, made on the live dicts as a tool would:
        `diff_onto` finds the same patch as diffing the parsed JSON, leaves the snapshot equal to it,
        and shares no object with the live state."""
        rng = random.Random(1129)
        scalars = [0, 1, 1.0, True, False, None, "a", "b", "milk"]

        def value(depth=0):
            roll = rng.random()
            if depth > 2 or roll < 0.4:
                return rng.choice(scalars)
            if roll < 0.55:
                return [rng.choice(["a", "b", "c"]) for _ in range(rng.randint(30, 40))]  # long, all strings
            if roll < 0.75:
                return [value(depth + 1) for _ in range(rng.choice([2, 35]))]
            return {rng.choice("abcde"): value(depth + 1) for _ in range(rng.randint(0, 4))}

        def edit(node):  # in place, like a tool
            for _ in range(rng.randint(1, 3)):
                target = rng.choice(list(containers(node)))
                if isinstance(target, list):
                    if target and rng.random() < 0.4:
                        target.pop(rng.randrange(len(target)))
                    elif target and rng.random() < 0.5:
                        target[rng.randrange(len(target))] = value(2)
                    else:
                        target.insert(rng.randint(0, len(target)), value(2))
                elif target and rng.random() < 0.4:
                    target.pop(rng.choice(list(target)))
                else:
                    target[rng.choice("abcdefg")] = value(2)

        for _ in range(1500):
            stored = json.dumps({"s": value(), "t": value()})
            live = json.loads(stored)
            edit(live)
            expected = state_module.diff(json.loads(stored), json.loads(state_module.dumps(live)))
            snapshot_ = json.loads(stored)
            got = state_module.diff_onto(snapshot_, live)
            assert got == expected, (stored, live)
            # Equal, though the key order may differ: patches do not move keys.
            assert json.dumps(snapshot_, sort_keys=True) == json.dumps(live, sort_keys=True)
            live_ids = {id(node) for node in containers(live)}
            assert not live_ids & {id(node) for node in containers(snapshot_)}
            assert not live_ids & {id(node) for node in containers(got[0])}
            assert not {id(node) for node in containers(got[0])} & {id(node) for node in containers(snapshot_)}

    def test_diff_onto_follows_escaped_keys(self):
        """Keys with "/" and "~" (escaped in the patch's paths) and numeric keys of a dict are found."""
        stored = {"a/b": {"~1": [1, 2], "0": "x"}, "~": {"/": 1}}
        live = json.loads(json.dumps(stored))
        live["a/b"]["~1"].insert(1, {"n": [3]})
        live["a/b"]["0"] = "y"
        live["~"]["/"] = 2
        live["~"]["~0/~1"] = [4]
        snapshot_ = json.loads(json.dumps(stored))

        patch, _ = state_module.diff_onto(snapshot_, live)

        assert {op["path"] for op in patch} == {"/a~1b/~01/1", "/a~1b/0", "/~0/~1", "/~0/~00~1~01"}
        assert snapshot_ == live

    def test_copy_tree_copies_every_container_and_keeps_every_type(self):
        words = [f"w{n}" for n in range(40)]
        tree = {"words": words, "mixed": [1, 1.0, True, None, *words, {"k": [1]}], "big": dict.fromkeys(words, 1.0),
                "small": {"a": [1, {"b": [True]}]}}

        copied = state_module.copy_tree(tree)

        assert json.dumps(copied) == json.dumps(tree)

        assert not set(map(id, containers(tree))) & set(map(id, containers(copied)))

    def test_diff_onto_declines_values_whose_json_form_differs(self):
        class Name(str):
            pass

        stored = {"items": ["a", "b"], "n": 1}
        for change in ({"items": ("a", "b", "c")}, {"when": datetime.date(2024, 5, 1)}, {"price": decimal.Decimal("1")},
                       {"n": Name("x")}, {1: "int key"}, {"items": ["a", "b", ("c",)]}):
            with self.subTest(change=change):
                snapshot_ = copy.deepcopy(stored)
                assert state_module.diff_onto(snapshot_, {**stored, **change}) is None
                assert snapshot_ == stored  # untouched

    def test_dumps_refuses_nan_and_keeps_the_json_modules_forms(self):
        import enum

        class Colour(enum.Enum):
            RED = "red"

        for bad in ({"x": float("nan")}, {"a": None, "x": [float("inf")]}, {"x": object()}):
            with self.subTest(bad=bad), self.assertRaises(state_module.StateNotJSONError):
                state_module.dumps(bad)
        fast = {"when": datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.UTC), "day": datetime.date(2024, 5, 1),
                "price": decimal.Decimal("9.99"), "colour": Colour.RED, "text": "caf\u00e9",
                "key": uuid.UUID("12345678-1234-5678-1234-567812345678")}
        assert json.loads(state_module.dumps(fast)) == {
            "when": "2024-05-01T12:30:00+00:00", "day": "2024-05-01", "price": "9.99", "colour": "red",
            "text": "caf\u00e9", "key": "12345678-1234-5678-1234-567812345678"}
        # What orjson refuses (an int key, an int over 64 bits, a lone surrogate) the json module encodes.
        slow = {1: "int key", "big": 2**70, "text": "\ud800", "none": None}
        # (The lone surrogate, which no database stores, becomes U+FFFD: see tests/engine/test_storable.py.)
        assert json.loads(state_module.dumps(slow)) == {"1": "int key", "big": 2**70, "text": "\ufffd", "none": None}
        assert state_module.to_json({"colour": Colour.RED}) == {"colour": "red"}

    def test_render_renders_non_strings_with_str(self):
        rendered = state_module.render("{n} {f} {l} {d} {none}", {"n": 1, "f": 1.5, "l": ["a"], "d": {"k": 1},
                                                                   "none": None})

        assert rendered == "1 1.5 ['a'] {'k': 1} None"


class TestStateAccessorsOnUsers(EngineTestMixin, TestCase):
    def test_user_sessions_keep_their_own_state(self):
        make_users("alice", "bob")
        agent = self.agent(session_state={"n": 0})

        agent.run("a", session_id="sa", user_id="alice", session_state={"n": 1})
        agent.run("b", session_id="sb", user_id="bob", session_state={"n": 2})

        assert agent.get_session_state(session_id="sa", user_id="alice") == {"n": 1}
        assert agent.get_session_state(session_id="sb", user_id="bob") == {"n": 2}

    async def test_async_update_session_state_is_shallow_and_recorded(self):
        agent = self.agent(session_state={"prefs": {"a": 1, "b": 2}})
        await agent.arun("one", session_id="s")

        state = await agent.aupdate_session_state({"prefs": {"a": 9}, "new": True}, session_id="s")

        assert state == {"prefs": {"a": 9}, "new": True}
        change = await sync_to_async(StateChange.objects.order_by("version").last)()
        assert (change.source, change.run_id) == ("manual", None)
