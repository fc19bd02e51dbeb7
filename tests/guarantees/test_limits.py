"""Limits on every JSON that enters (sessions_core/limits.py): depth and size, checked before any
recursive work, with a readable refusal and nothing written; and the stored state's size, whatever
changes it; and the per-tool timeout."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import TestCase, TransactionTestCase
from django.urls import reverse

from sessions_core import RunContext, limits
from sessions_core.export import ImportRefused, export_json, import_json
from sessions_core.models import ChatSession, Message, Run, RunStatus, StateChange
from sessions_core.state import StateLimitError
from tests.support.engine_helpers import EngineTestMixin, make_users
from tests.support.factories import make_session, make_user
from tests.support.live_support import LiveTestMixin
from tests.support.llm_server import Text, ToolCalls, _fragments
from tests.support.web_helpers import WebTestCase, worked

DEEP = 5_000


def nested(depth: int, open_: str = "[", close: str = "]", inner: str = "") -> str:
    return open_ * depth + inner + close * depth


@dataclass
class RawToolCall:
    """A tool call whose arguments are the given text, as a model could send it (not made by json.dumps)."""

    name: str
    arguments: str

    def serve(self, handler, body: dict) -> None:
        handler.start_stream()
        first = {"index": 0, "id": handler.server.next_call_id(), "type": "function",
                 "function": {"name": self.name, "arguments": ""}}
        handler.send_delta({"tool_calls": [first]})
        for fragment in _fragments(self.arguments, 4096):
            handler.send_delta({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]})
        handler.finish_stream(body, "tool_calls", 1)


# -- the checks themselves ------------------------------------------------------------------------


class TestChecks:
    def test_text_depth_counts_brackets_outside_strings_without_recursing(self):
        assert limits.text_depth('{"a": [1, {"b": "[[[[{{{"}]}') == 3
        assert limits.text_depth(r'["a \"[[[ quoted", []]') == 2
        assert limits.text_depth(b'[[1], [2, [3]]]') == 3
        assert limits.text_depth("42") == 0
        assert limits.text_depth(nested(200_000)) == 200_000  # a loop: no RecursionError

    def test_tree_depth_walks_with_a_stack(self):
        value = []
        for _ in range(100_000):
            value = [value]
        assert limits.tree_depth(value) == 100_001
        assert limits.tree_depth(value, stop_after=64) == 65
        assert limits.tree_depth({"a": [1, {"b": (2,)}], "c": "x"}) == 4
        assert limits.tree_depth("text") == 0

    def test_each_refusal_names_its_setting(self, settings):
        settings.CHAT_MAX_JSON_DEPTH, settings.CHAT_MAX_JSON_BYTES = 3, 100
        with pytest.raises(limits.LimitExceeded, match=r"more than 3 levels deep.*\(CHAT_MAX_JSON_DEPTH\)"):
            limits.check_text("[[[[]]]]", "The message")
        with pytest.raises(limits.LimitExceeded, match=r"The message is 101 bytes; the limit is 100 \(CHAT_MAX_JSON_BYTES\)"):
            limits.check_text("x" * 101, "The message")
        # Bytes, not characters: 34 three-byte characters are 102 bytes.
        with pytest.raises(limits.LimitExceeded, match="102 bytes"):
            limits.check_text("€" * 34, "The message")
        limits.check_text("[[[]]]", "The message")
        limits.check_text("€" * 33, "The message")

    def test_zero_turns_a_limit_off(self, settings):
        settings.CHAT_MAX_JSON_DEPTH, settings.CHAT_MAX_JSON_BYTES = 0, 0
        limits.check_text(nested(DEEP) + " " * 2_000_000, "The message")
        limits.check_tree(json.loads(nested(500)), "The result")

    def test_the_engine_has_defaults_without_the_settings(self, settings):
        del settings.CHAT_MAX_JSON_DEPTH, settings.CHAT_MAX_JSON_BYTES, settings.CHAT_MAX_STATE_BYTES
        del settings.CHAT_MAX_MODEL_CALLS
        assert (limits.max_json_depth(), limits.max_json_bytes(), limits.max_state_bytes()) == (64, 1_000_000, 1_000_000)
        assert limits.max_model_calls() == 25
        with pytest.raises(limits.LimitExceeded, match="64"):
            limits.check_text(nested(65), "The message")

    def test_a_changed_setting_is_seen_at_the_next_check_and_the_old_one_again_after(self):
        from django.test import override_settings

        before = limits.max_json_depth()
        with override_settings(CHAT_MAX_JSON_DEPTH=before + 5):
            assert limits.max_json_depth() == before + 5
            with override_settings(CHAT_MAX_JSON_DEPTH=2):
                with pytest.raises(limits.LimitExceeded, match="more than 2 levels"):
                    limits.check_text("[[[]]]", "The message")
            assert limits.max_json_depth() == before + 5
        assert limits.max_json_depth() == before

    def test_a_change_is_measured_where_it_lands(self, settings):
        settings.CHAT_MAX_JSON_DEPTH = 4
        limits.check_patch([{"op": "add", "path": "/a/b", "value": [[1]]}])  # root, a, b's list, its list
        with pytest.raises(limits.LimitExceeded):
            limits.check_patch([{"op": "add", "path": "/a/b", "value": [[[1]]]}])
        with pytest.raises(limits.LimitExceeded):
            limits.check_patch([{"op": "replace", "path": "/a/b/c/d/e", "value": 1}])


# -- the socket -----------------------------------------------------------------------------------


class TestSocketFrames(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")

    async def test_a_deeply_nested_frame_is_an_error_frame_and_the_socket_stays_open(self):
        socket = await self.socket(self.session.session_id, self.alice)
        frames = [nested(DEEP), '{"type": "send", "text": "hi", "x": ' + nested(DEEP) + "}",
                  nested(DEEP, "{\"a\":", "}", "1")]
        for frame in frames:
            await socket.send_to(text_data=frame)
            answer = await socket.receive_from(timeout=5)
            assert "status-error" in answer and "CHAT_MAX_JSON_DEPTH" in answer, answer
        await socket.send_to(text_data=json.dumps({"type": "stop"}))
        assert "Nothing to stop." in await socket.receive_from(timeout=5)  # still open, still answering
        assert await Run.objects.acount() == 0
        await socket.disconnect()

    async def test_a_frame_over_the_size_limit_is_refused_before_it_is_read(self):
        with self.settings(CHAT_MAX_JSON_BYTES=1_000, CHAT_MAX_MESSAGE_CHARS=100_000):
            socket = await self.socket(self.session.session_id, self.alice)
            await socket.send_to(text_data=json.dumps({"type": "send", "text": "x" * 2_000}))
            answer = await socket.receive_from(timeout=5)
            assert "the limit is 1,000 (CHAT_MAX_JSON_BYTES)" in answer
            await socket.disconnect()
        assert await Run.objects.acount() == 0


# -- state edits and imports (HTTP) ------------------------------------------------------------------


class TestStateEdits(WebTestCase):
    def edit(self, text: str):
        url = reverse("chat:state_edit_hx", args=[self.session.session_id])
        return self.hx_post(url, {"state": text, "version": self.session.state_version})

    def assert_unchanged(self):
        self.session.refresh_from_db()
        assert self.session.session_state == {} and self.session.state_version == 0
        assert not StateChange.objects.exists()

    def test_a_deeply_nested_edit_is_a_422_with_a_message(self):
        for depth in (500, 2_000, DEEP):
            response = self.edit('{"a": ' + nested(depth) + "}")
            assert response.status_code == 422
            assert "more than 64 levels deep" in response.content.decode()
            assert "CHAT_MAX_JSON_DEPTH" in response.content.decode()
        self.assert_unchanged()

    def test_an_edit_over_the_size_limits_is_a_422(self):
        with self.settings(CHAT_MAX_JSON_BYTES=100):
            response = self.edit(json.dumps({"a": "x" * 200}))
        assert response.status_code == 422 and "CHAT_MAX_JSON_BYTES" in response.content.decode()
        with self.settings(CHAT_MAX_STATE_BYTES=100):
            response = self.edit(json.dumps({"a": "x" * 200}))
        assert response.status_code == 422
        assert "The session state is 208 bytes; the limit is 100 (CHAT_MAX_STATE_BYTES)" in response.content.decode()
        self.assert_unchanged()
        with self.settings(CHAT_MAX_STATE_BYTES=208):
            assert self.edit(json.dumps({"a": "x" * 200})).status_code == 200


class TestImports(WebTestCase):
    def upload(self, content: bytes):
        return self.client.post(reverse("chat:import"), {"file": SimpleUploadedFile("chats.json", content)})

    def test_a_deeply_nested_file_is_refused_and_nothing_is_imported(self):
        before = ChatSession.objects.count()
        transfer = worked(self.upload(nested(DEEP).encode()))
        assert transfer.status == "failed" and "The file is nested more than 64 levels deep" in transfer.error
        assert ChatSession.objects.count() == before

    def test_a_chat_whose_state_is_over_the_limit_is_refused_whole(self):
        self.session.apply_state_change({"notes": "x" * 500}, "manual")
        document = "".join(export_json(self.session)).encode()
        small = make_session(owner=self.alice, name="Small")
        both = {"format": "sessions_core.export", "version": 1,
                "sessions": [json.loads("".join(export_json(small))), json.loads(document)]}
        before = ChatSession.objects.count()
        with self.settings(CHAT_MAX_STATE_BYTES=300):
            with pytest.raises(ImportRefused, match="CHAT_MAX_STATE_BYTES"):
                import_json(json.dumps(both), self.alice)
            transfer = worked(self.upload(document))
        assert transfer.status == "failed" and "CHAT_MAX_STATE_BYTES" in transfer.error
        assert ChatSession.objects.count() == before


# -- the engine -----------------------------------------------------------------------------------


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the shopping list.

    Args:
        item: The item to add.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


def nest_state(levels: int, run_context: RunContext) -> str:
    """Nest the state.

    Args:
        levels: How deep.
    """
    value: list = []
    for _ in range(levels):
        value = [value]
    run_context.session_state["deep"] = value
    return "nested"


def grow_state(size: int, run_context: RunContext) -> str:
    """Grow the state.

    Args:
        size: How many characters.
    """
    run_context.session_state["blob"] = "x" * size
    return "grown"


def deep_result() -> list:
    """A deeply nested result."""
    value: list = []
    for _ in range(DEEP):
        value = [value]
    return value


def big_result() -> str:
    """A large result."""
    return "y" * 5_000


class TestEngineLimits(EngineTestMixin, TestCase):
    def setUp(self):
        (self.john,) = make_users("john")

    def shop(self, **options):
        return self.agent(tools=[add_item, nest_state, grow_state, deep_result, big_result],
                          session_state={"shopping_list": []}, **options)

    def stored(self, agent, session_id="s1"):
        return agent.get_session_state(session_id=session_id, user_id="john")

    def start_with_milk(self, agent):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added."))
        assert agent.run("milk", session_id="s1", user_id="john").status == RunStatus.COMPLETED
        assert self.stored(agent) == {"shopping_list": ["milk"]}

    def assert_failed_on(self, output, setting: str, agent):
        assert output.status == RunStatus.ERROR and setting in output.error, output.error
        run = Run.objects.get(run_id=output.run_id)
        assert run.status == RunStatus.ERROR and setting in run.error
        assert self.stored(agent) == {"shopping_list": ["milk"]}  # the stored state stays as it was
        assert ChatSession.objects.get(session_id="s1").state_version == 2  # defaults, then milk

    def test_tool_arguments_nested_too_deep_fail_the_run_naming_the_limit(self):
        agent = self.shop()
        self.start_with_milk(agent)
        self.llm.add(RawToolCall("add_item", '{"item": ' + nested(DEEP) + "}"), Text("never sent"))
        output = agent.run("deep", session_id="s1", user_id="john")
        self.assert_failed_on(output, "CHAT_MAX_JSON_DEPTH", agent)
        assert len(self.llm.requests) == 3  # two for milk, one here: the model was not asked again
        tool_message = Message.objects.get(run__run_id=output.run_id, role="tool")
        assert "The arguments for add_item is nested more than 64" in tool_message.content

    def test_tool_arguments_over_the_size_limit_fail_the_run(self):
        agent = self.shop()
        self.start_with_milk(agent)
        with self.settings(CHAT_MAX_JSON_BYTES=1_000):
            self.llm.add(ToolCalls([("add_item", {"item": "z" * 2_000})]))
            output = agent.run("big", session_id="s1", user_id="john")
        self.assert_failed_on(output, "CHAT_MAX_JSON_BYTES", agent)

    def test_a_tool_result_over_a_limit_fails_the_run(self):
        agent = self.shop()
        self.start_with_milk(agent)
        self.llm.add(ToolCalls([("deep_result", {})]))
        self.assert_failed_on(agent.run("deep", session_id="s1", user_id="john"), "CHAT_MAX_JSON_DEPTH", agent)
        with self.settings(CHAT_MAX_JSON_BYTES=1_000):
            self.llm.add(ToolCalls([("big_result", {})]))
            output = agent.run("big", session_id="s1", user_id="john")
        self.assert_failed_on(output, "CHAT_MAX_JSON_BYTES", agent)

    def test_a_tool_nesting_the_state_too_deep_fails_the_run_and_stores_nothing(self):
        agent = self.shop()
        self.start_with_milk(agent)
        for levels in (100, 1_000, DEEP):  # past orjson's own limit (254) too
            self.llm.add(ToolCalls([("nest_state", {"levels": levels})]))
            self.assert_failed_on(agent.run("deep", session_id="s1", user_id="john"), "CHAT_MAX_JSON_DEPTH", agent)

    def test_a_tool_growing_the_state_past_its_limit_fails_the_run_and_stores_nothing(self):
        agent = self.shop()
        self.start_with_milk(agent)
        with self.settings(CHAT_MAX_STATE_BYTES=10_000):
            self.llm.add(ToolCalls([("grow_state", {"size": 20_000})]))
            output = agent.run("grow", session_id="s1", user_id="john")
            self.assert_failed_on(output, "CHAT_MAX_STATE_BYTES", agent)
            self.llm.add(ToolCalls([("grow_state", {"size": 5_000})]), Text("Grown."))
            assert agent.run("grow less", session_id="s1", user_id="john").status == RunStatus.COMPLETED
        assert len(self.stored(agent)["blob"]) == 5_000

    def test_the_agentic_state_tool_is_held_to_the_state_limit(self):
        agent = self.agent(enable_agentic_state=True, session_state={"notes": []})
        with self.settings(CHAT_MAX_STATE_BYTES=1_000):
            self.llm.add(ToolCalls([("update_session_state", {"session_state_updates": {"notes": ["n" * 2_000]}})]))
            output = agent.run("note", session_id="s2", user_id="john")
        assert output.status == RunStatus.ERROR and "CHAT_MAX_STATE_BYTES" in output.error
        assert agent.get_session_state(session_id="s2", user_id="john") == {}  # the failed first run stored nothing

    def test_the_state_a_script_passes_to_run_is_held_to_the_limits(self):
        agent = self.shop()
        self.start_with_milk(agent)
        output = agent.run("deep", session_id="s1", user_id="john", session_state={"x": json.loads(nested(300))})
        self.assert_failed_on(output, "CHAT_MAX_JSON_DEPTH", agent)
        with self.settings(CHAT_MAX_STATE_BYTES=1_000):
            output = agent.run("big", session_id="s1", user_id="john", session_state={"x": "x" * 2_000})
            self.assert_failed_on(output, "CHAT_MAX_STATE_BYTES", agent)
        assert len(self.llm.requests) == 2  # neither run asked the model

    def test_a_manual_change_is_held_to_the_limits_too(self):
        session = make_session(owner=self.john)
        with self.settings(CHAT_MAX_STATE_BYTES=100):
            with pytest.raises(StateLimitError, match="CHAT_MAX_STATE_BYTES"):
                session.apply_state_change({"a": "x" * 200}, "manual")
        with pytest.raises(StateLimitError, match="CHAT_MAX_JSON_DEPTH"):
            session.apply_state_change({"a": json.loads(nested(100))}, "manual")
        session.refresh_from_db()
        assert session.session_state == {} and not StateChange.objects.filter(session=session).exists()


# -- tools that hang or raise -----------------------------------------------------------------------


async def hang_forever() -> str:
    """A tool that never answers."""
    await asyncio.Event().wait()
    return "never"


def explode() -> str:
    """A tool that raises."""
    raise RuntimeError("the warehouse is on fire")


class TestToolFaults(EngineTestMixin, TestCase):
    def setUp(self):
        make_users("john")

    def test_a_tool_that_hangs_is_timed_out_and_the_model_is_told(self):
        agent = self.agent(tools=[hang_forever, add_item], session_state={"shopping_list": []})
        self.llm.add(ToolCalls([("hang_forever", {})]), Text("The tool timed out."))
        with self.settings(CHAT_TOOL_TIMEOUT_SECONDS=0.2):
            output = agent.run("go", session_id="s1", user_id="john")
        assert output.status == RunStatus.COMPLETED and output.content == "The tool timed out."
        tool = self.llm.requests[1]["messages"][-1]
        assert tool["role"] == "tool"
        assert "hang_forever did not finish within 0.2 s (CHAT_TOOL_TIMEOUT_SECONDS)" in tool["content"]
        assert output.tools[0].tool_call_error
        # The session is free: the next run takes the lease at once.
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added."))
        assert agent.run("milk", session_id="s1", user_id="john").status == RunStatus.COMPLETED

    async def test_an_async_run_times_out_a_hanging_tool_too(self):
        agent = self.agent(tools=[hang_forever])
        self.llm.add(ToolCalls([("hang_forever", {})]), Text("Timed out."))
        with self.settings(CHAT_TOOL_TIMEOUT_SECONDS=0.2):
            output = await agent.arun("go", session_id="s1", user_id="john")
        assert output.status == RunStatus.COMPLETED and "CHAT_TOOL_TIMEOUT_SECONDS" in output.tools[0].result

    def test_a_tool_that_raises_is_reported_and_the_run_goes_on(self):
        agent = self.agent(tools=[explode])
        self.llm.add(ToolCalls([("explode", {})]), Text("Sorry, that failed."))
        output = agent.run("go", session_id="s1", user_id="john")
        assert output.status == RunStatus.COMPLETED and output.content == "Sorry, that failed."
        assert output.tools[0].result == "Error: RuntimeError: the warehouse is on fire"
        assert Run.objects.get(run_id=output.run_id).status == RunStatus.COMPLETED
