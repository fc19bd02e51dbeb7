"""History: exactly which earlier messages reach the model, what is stored, and what it costs."""

import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from sessions_core import RunContext
from sessions_core.models import ChatSession, Message, Run, RunStatus
from tests.engine_helpers import EngineTestMixin, Gate, bulk_runs, make_users, tool_then_text
from tests.factories import make_run, make_session
from tests.llm_server import Error, Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state.setdefault("items", []).append(item)
    return f"Added {item}"


class HistoryTest(EngineTestMixin, TestCase):
    def setUp(self):
        # Each answer repeats the question, so a history message says which run it came from.
        self.llm.responder = lambda body: Text("re: " + body["messages"][-1]["content"])

    def talk(self, agent, *texts, session_id="s"):
        for text in texts:
            output = agent.run(text, session_id=session_id)
            assert output.status == "completed", output.error

    def turns(self, *texts):
        pairs = []
        for text in texts:
            pairs += [("user", text), ("assistant", "re: " + text)]
        return pairs


class TestWhichMessages(HistoryTest):
    def test_the_last_three_runs_by_default(self):
        agent = self.agent(add_history_to_context=True, instructions="Be brief.")
        self.talk(agent, "one", "two", "three", "four", "five")

        agent.run("six", session_id="s")

        assert agent.num_history_runs == 3
        assert self.sent_pairs(system=True) == [("system", "Be brief."), *self.turns("three", "four", "five"),
                                                ("user", "six")]

    def test_num_history_runs(self):
        agent = self.agent(add_history_to_context=True, num_history_runs=1)
        self.talk(agent, "one", "two")

        agent.run("three", session_id="s")

        assert self.sent_pairs() == [*self.turns("two"), ("user", "three")]

    def test_no_history_unless_asked(self):
        agent = self.agent()
        self.talk(agent, "one")

        agent.run("two", session_id="s")

        assert self.sent_pairs() == [("user", "two")]

    def test_num_history_runs_zero_sends_none(self):
        agent = self.agent(add_history_to_context=True, num_history_runs=0)
        self.talk(agent, "one")

        agent.run("two", session_id="s")

        assert self.sent_pairs() == [("user", "two")]

    def test_num_history_messages_drops_leading_tool_results(self):
        agent = self.agent(add_history_to_context=True, num_history_messages=4, tools=[add_item])
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        self.talk(agent, "add milk")  # user, assistant (tool call), tool, assistant
        self.talk(agent, "two")  # user, assistant

        agent.run("three", session_id="s")

        # The last four are: tool result, "Added milk.", "two", "re: two"; the orphaned tool result goes.
        assert self.sent_pairs() == [("assistant", "Added milk."), *self.turns("two"), ("user", "three")]

    def test_num_history_messages_counts_messages_not_runs(self):
        agent = self.agent(add_history_to_context=True, num_history_messages=3)
        self.talk(agent, "one", "two")

        agent.run("three", session_id="s")

        assert self.sent_pairs() == [("assistant", "re: one"), *self.turns("two"), ("user", "three")]

    def test_both_limits_set_warns_and_uses_runs(self):
        with self.assertLogs("sessions_core", "WARNING") as logs:
            agent = self.agent(add_history_to_context=True, num_history_runs=1, num_history_messages=1)
        self.talk(agent, "one", "two")

        agent.run("three", session_id="s")

        assert "Using num_history_runs" in logs.output[0]
        assert (agent.num_history_runs, agent.num_history_messages) == (1, None)
        assert self.sent_pairs() == [*self.turns("two"), ("user", "three")]

    def test_errored_and_cancelled_runs_are_left_out(self):
        agent = self.agent(add_history_to_context=True, num_history_runs=5)
        self.talk(agent, "one")
        self.llm.add(Error(400, "bad request"))
        assert agent.run("broken", session_id="s").status == "error"
        with Gate() as gate:
            self.llm.add(Text("half way there", wait_event=gate))
            for _ in agent.run("stopped", session_id="s", stream=True):  # leaving mid-stream cancels the run
                break
        assert Run.objects.get(input="stopped").status == "cancelled"
        make_run(ChatSession.objects.get(), user_text="lost", reply="half", status=RunStatus.INTERRUPTED)
        self.talk(agent, "two")

        agent.run("three", session_id="s")

        assert self.sent_pairs() == [*self.turns("one", "two"), ("user", "three")]

    def test_tool_calls_and_results_are_replayed(self):
        agent = self.agent(add_history_to_context=True, tools=[add_item])
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        self.talk(agent, "add milk")

        agent.run("what now?", session_id="s")

        assert self.sent()[:-1] == [
            {"role": "user", "content": "add milk"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "add_item", "arguments": '{"item": "milk"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Added milk"},
            {"role": "assistant", "content": "Added milk."},
        ]

    def test_earlier_system_messages_are_never_replayed(self):
        self.talk(self.agent(instructions="Old rules."), "one")

        self.agent(add_history_to_context=True, instructions="New rules.").run("two", session_id="s")

        assert self.sent_pairs(system=True) == [("system", "New rules."), *self.turns("one"), ("user", "two")]

    def test_the_run_output_lists_history_messages_flagged(self):
        agent = self.agent(add_history_to_context=True, instructions="Hi.")
        self.talk(agent, "one")

        output = agent.run("two", session_id="s")

        assert [(m.role, m.content, m.from_history) for m in output.messages] == [
            ("system", "Hi.", False), ("user", "one", True), ("assistant", "re: one", True),
            ("user", "two", False), ("assistant", "re: two", False),
        ]


class TestWhatIsStored(HistoryTest):
    def test_history_is_never_copied_and_seqs_are_recorded_only_when_asked(self):
        plain = self.agent(add_history_to_context=True)
        self.talk(plain, "one", "two")
        assert Run.objects.get(input="two").history_seqs is None

        self.talk(self.agent(add_history_to_context=True, store_history_messages=True), "three")

        three = Run.objects.get(input="three")
        assert three.history_seqs == [1, 2, 3, 4]
        assert list(three.messages.values_list("role", "content")) == [("user", "three"), ("assistant", "re: three")]
        assert Message.objects.count() == 6

    def test_store_tool_messages_false_keeps_tool_traffic_out_of_storage(self):
        agent = self.agent(add_history_to_context=True, tools=[add_item], store_tool_messages=False)
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})], text="Adding."), Text("Added milk."))

        output = agent.run("add milk", session_id="s")

        assert [m.role for m in output.messages] == ["user", "assistant", "tool", "assistant"]  # returned untouched
        assert list(Message.objects.values_list("seq", "role", "content")) == [
            (1, "user", "add milk"), (2, "assistant", "Added milk.")]
        assert output.session_state == {"items": ["milk"]}
        agent.run("next", session_id="s")
        assert self.sent_pairs() == [("user", "add milk"), ("assistant", "Added milk."), ("user", "next")]

    def test_get_chat_history_includes_errored_runs(self):
        agent = self.agent()
        self.talk(agent, "one")
        self.llm.add(Error(400, "bad request"))
        agent.run("broken", session_id="s")
        self.talk(agent, "two")

        history = agent.get_chat_history(session_id="s")

        assert [(m.role, m.content) for m in history] == [*self.turns("one"), ("user", "broken"), *self.turns("two")]
        assert [(m.role, m.content) for m in agent.get_chat_history(session_id="s", last_n_runs=2)] == [
            ("user", "broken"), *self.turns("two")]
        assert {m.run_id for m in history} == set(Run.objects.values_list("run_id", flat=True))


class TestQueryCost(EngineTestMixin, TestCase):
    """The SQL a run costs does not depend on how many runs came before it."""

    # The start (the session, the queue, the history, the run, its first message, the lease) and the finish
    # (the session, the messages, the state change, the session again, the run): 11 statements, each
    # step in a transaction (a savepoint inside the test's), at 5 and 500 earlier runs.
    BOUND = 15

    @pytest.fixture(autouse=True)
    def _query_fixture(self, django_assert_max_num_queries):
        self.max_queries = django_assert_max_num_queries

    def setUp(self):
        (self.alice,) = make_users("alice")
        self.llm.responder = tool_then_text("add_item", lambda body: {"item": "x"})

    def one_run(self, earlier: int) -> int:
        session = make_session(owner=self.alice, session_id=f"s{earlier}", component_id="tester",
                               session_state={"items": []})
        bulk_runs(session, earlier)
        agent = self.agent(add_history_to_context=True, tools=[add_item], session_state={"items": []},
                           instructions="Items: {items}")
        with self.max_queries(self.BOUND) as captured:
            output = agent.run("add x", session_id=session.session_id, user_id="alice")
        assert output.status == "completed" and output.session_state == {"items": ["x"]}
        assert len(self.llm.requests[-2]["messages"]) == 1 + 6 + 1  # system, three earlier runs, the question
        return len(captured)

    def test_queries_per_run_do_not_grow_with_earlier_runs(self):
        few = self.one_run(5)
        many = self.one_run(500)

        assert Run.objects.filter(session__session_id="s500").count() == 501
        assert few == many

    def test_a_streamed_run_costs_the_same(self):
        session = make_session(owner=self.alice, session_id="s", component_id="tester")
        bulk_runs(session, 50)
        agent = self.agent(add_history_to_context=True, tools=[add_item])
        with CaptureQueriesContext(connection) as captured:
            events = list(agent.run("add x", session_id="s", user_id="alice", stream=True, stream_events=True))
        assert events[-1].status == "completed"
        assert len(captured) <= self.BOUND
