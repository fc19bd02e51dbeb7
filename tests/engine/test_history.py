"""History: exactly which earlier messages reach the model, what is stored, and what it costs."""

import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sessions_core import RunContext
from sessions_core.history import HISTORY_FIELDS, HistoryRead, read_history
from sessions_core.models import ChatSession, Message, Role, Run, RunStatus
from tests.support.engine_helpers import EngineTestMixin, Gate, bulk_runs, make_users, tool_then_text
from tests.support.factories import make_run, make_session
from tests.support.llm_server import Error, Text, ToolCalls


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

    def test_max_tool_calls_from_history_keeps_the_most_recent_calls(self):
        """SPEC Part 2, 4.2 step 8: of four earlier tool calls the last two are sent, each assistant message
        with only its kept calls; one left without calls is sent for its text, or not at all."""
        agent = self.agent(add_history_to_context=True, tools=[add_item], max_tool_calls_from_history=2)
        self.llm.add(ToolCalls([("add_item", {"item": "a"})], text="Adding a."), Text("Added a."),
                     ToolCalls([("add_item", {"item": "b"}), ("add_item", {"item": "c"})]), Text("Added b, c."),
                     ToolCalls([("add_item", {"item": "d"})]), Text("Added d."))
        self.talk(agent, "add a", "add b and c", "add d")

        output = agent.run("what is on it?", session_id="s")

        def call(call_id, item):
            return {"id": call_id, "type": "function",
                    "function": {"name": "add_item", "arguments": f'{{"item": "{item}"}}'}}

        assert self.sent() == [
            {"role": "user", "content": "add a"},
            {"role": "assistant", "content": "Adding a."},
            {"role": "assistant", "content": "Added a."},
            {"role": "user", "content": "add b and c"},
            {"role": "assistant", "content": None, "tool_calls": [call("call_3", "c")]},
            {"role": "tool", "tool_call_id": "call_3", "content": "Added c"},
            {"role": "assistant", "content": "Added b, c."},
            {"role": "user", "content": "add d"},
            {"role": "assistant", "content": None, "tool_calls": [call("call_4", "d")]},
            {"role": "tool", "tool_call_id": "call_4", "content": "Added d"},
            {"role": "assistant", "content": "Added d."},
            {"role": "user", "content": "what is on it?"},
        ]
        assert [m.tool_call_id for m in output.messages if m.role == "tool"] == ["call_3", "call_4"]
        stored = Message.objects.filter(run__input="add b and c", role="assistant").exclude(tool_calls=None).get()
        assert [c["id"] for c in stored.tool_calls] == ["call_2", "call_3"]  # the stored run is untouched

    def test_max_tool_calls_from_history_zero_sends_text_only(self):
        agent = self.agent(add_history_to_context=True, tools=[add_item], max_tool_calls_from_history=0)
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        self.talk(agent, "add milk")

        agent.run("what now?", session_id="s")

        assert self.sent() == [{"role": "user", "content": "add milk"}, {"role": "assistant", "content": "Added milk."},
                               {"role": "user", "content": "what now?"}]

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


INTRO = "Hi, I keep your shopping list."


class TestIntroduction(HistoryTest):
    """Agno's `introduction`: the first reply of a session, stored by the run that creates the session as a
    completed run of its own, and history like any other run."""

    def test_it_is_the_sessions_first_reply_and_is_sent_as_history(self):
        agent = self.agent(introduction=INTRO, add_history_to_context=True, instructions="Shop.")

        agent.run("one", session_id="s")
        first = self.sent_pairs(system=True)
        agent.run("two", session_id="s")

        assert first == [("system", "Shop."), ("assistant", INTRO), ("user", "one")]
        assert self.sent_pairs(system=True) == [("system", "Shop."), ("assistant", INTRO), *self.turns("one"),
                                                ("user", "two")]
        assert [(m.role, m.content) for m in agent.get_chat_history(session_id="s")] == [
            ("assistant", INTRO), *self.turns("one", "two")]
        intro, one, two = Run.objects.order_by("id")
        assert (intro.status, intro.input, intro.content, intro.parent_run, intro.follows) == (
            RunStatus.COMPLETED, "", INTRO, None, None)
        assert (one.follows, two.follows) == (intro, one)
        assert list(intro.messages.values_list("seq", "role", "content")) == [(1, "assistant", INTRO)]

    def test_it_is_a_run_of_the_history_window_and_not_sent_without_history(self):
        self.agent(introduction=INTRO).run("one", session_id="s")
        assert self.sent_pairs() == [("user", "one")]

        self.agent(introduction=INTRO, add_history_to_context=True, num_history_runs=1).run("two", session_id="s")
        assert self.sent_pairs() == [*self.turns("one"), ("user", "two")]

    def test_it_is_stored_once_per_session_by_the_run_that_creates_it(self):
        agent = self.agent(introduction=INTRO)
        self.talk(agent, "one", "two")
        self.talk(agent, "elsewhere", session_id="other")
        self.talk(self.agent(), "plain", session_id="plain")
        self.talk(agent, "later", session_id="plain")  # the session was made without one: none now

        introductions = Message.objects.filter(content=INTRO).values_list("session__session_id", "seq")
        assert sorted(introductions) == [("other", 1), ("s", 1)]
        assert [m.content for m in agent.get_chat_history(session_id="plain")] == [
            "plain", "re: plain", "later", "re: later"]


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
    # (the session, the messages, the state change, the run): 10 statements, each step in a transaction
    # (a savepoint inside the test's), at 5 and 500 earlier runs.
    BOUND = 14

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


    def test_get_session_messages_with_a_limit_costs_the_same_at_any_length(self):
        """Agno's get_session_messages(limit=N) reads the latest N in one statement, after the owner check."""
        agent = self.agent()

        def read(earlier: int) -> int:
            session = make_session(owner=self.alice, session_id=f"m{earlier}", component_id="tester")
            bulk_runs(session, earlier)
            with CaptureQueriesContext(connection) as captured:
                messages = agent.get_session_messages(session_id=session.session_id, user_id="alice", limit=3)
            assert [m.content for m in messages] == [f"answer {earlier - 2}", f"question {earlier - 1}",
                                                     f"answer {earlier - 1}"]
            return len(captured)

        assert read(5) == read(500)


def add_tool_turn(session, run_status=RunStatus.COMPLETED, parent_run=None):
    """A run with a system prompt, a tool call and its result, as the engine stores one."""
    run = Run.objects.create(session=session, status=run_status, input="add milk", parent_run=parent_run)
    seq = session.last_seq
    call = {"id": f"call_{run.pk}", "name": "add_item", "arguments": '{"item": "milk"}'}
    rows = [
        Message(session=session, run=run, seq=seq + 1, role=Role.SYSTEM, content="You keep a list."),
        Message(session=session, run=run, seq=seq + 2, role=Role.USER, content="add milk"),
        Message(session=session, run=run, seq=seq + 3, role=Role.ASSISTANT, content="", tool_calls=[call]),
        Message(session=session, run=run, seq=seq + 4, role=Role.TOOL, content="Added milk", tool_call_id=call["id"],
                tool_name="add_item", tool_error=run_status == RunStatus.ERROR),
        Message(session=session, run=run, seq=seq + 5, role=Role.ASSISTANT, content="Done: milk."),
    ]
    Message.objects.bulk_create(rows)
    session.last_seq = seq + len(rows)
    session.save(update_fields=["last_seq"])
    return run


class TestHistoryStatement(TestCase):
    """read_history's one statement reads what the ORM reads, typed as the ORM types it."""

    @classmethod
    def setUpTestData(cls):
        cls.session = make_session()
        for number in range(6):
            add_tool_turn(cls.session)
            make_run(cls.session, user_text=f"question {number}", reply=f"answer {number}")
        add_tool_turn(cls.session, run_status=RunStatus.ERROR)
        make_run(cls.session, user_text="stopped", reply="half", status=RunStatus.CANCELLED)
        abandoned = make_run(cls.session, user_text="left behind", reply="on another branch")
        Run.objects.filter(pk=abandoned.pk).update(abandoned=True)
        parent = Run.objects.filter(session=cls.session, status=RunStatus.COMPLETED).last()
        add_tool_turn(cls.session, parent_run=parent)  # a member run: never history of the session
        make_session()  # another session's messages must never appear

    def rows(self, read):
        return [(m.seq, m.role, m.content, m.tool_calls, m.tool_call_id, m.tool_name, m.tool_error, m.created_at)
                for m in read_history(read, "default")]

    def top_level(self):
        return Run.objects.filter(session=self.session, status=RunStatus.COMPLETED, parent_run__isnull=True,
                                  abandoned=False).order_by("-id")

    def orm(self, runs, num_runs=None, num_messages=None):
        messages = Message.objects.exclude(role=Role.SYSTEM)
        if num_runs is not None:
            return list(messages.filter(run_id__in=runs.values("id")[:num_runs]).order_by("run_id", "seq")
                        .values_list(*HISTORY_FIELDS))
        rows = messages.filter(run_id__in=runs.values("id")).order_by("-run_id", "-seq").values_list(*HISTORY_FIELDS)
        return list(rows[:num_messages])[::-1]

    def test_by_runs_and_by_messages_read_what_the_orm_reads(self):
        for num_runs in (1, 2, 3, 7, 50):
            with self.subTest(num_runs=num_runs):
                rows = self.rows(HistoryRead(self.session.pk, num_runs, None))
                assert rows == self.orm(self.top_level(), num_runs=num_runs) and rows
        for num_messages in (1, 2, 3, 4, 9, 200):
            with self.subTest(num_messages=num_messages):
                rows = self.rows(HistoryRead(self.session.pk, None, num_messages))
                expected = self.orm(self.top_level(), num_messages=num_messages)
                while expected and expected[0][1] == Role.TOOL:  # a window of messages starts after a tool result
                    expected.pop(0)
                assert rows == expected and rows

    def test_a_step_agents_own_runs_read_what_the_orm_reads(self):
        parent = Run.objects.filter(session=self.session, parent_run__isnull=True).last()
        for number in range(4):  # step runs of "shopper", one of another step, one failed
            step = add_tool_turn(self.session, parent_run=parent)
            Run.objects.filter(pk=step.pk).update(component_id="shopper", content=f"step {number}")
        other = add_tool_turn(self.session, parent_run=parent)
        Run.objects.filter(pk=other.pk).update(component_id="other")
        failed = add_tool_turn(self.session, run_status=RunStatus.ERROR, parent_run=parent)
        Run.objects.filter(pk=failed.pk).update(component_id="shopper")
        runs = Run.objects.filter(session=self.session, status=RunStatus.COMPLETED, parent_run__isnull=False,
                                  component_id="shopper").order_by("-id")
        for num_runs in (1, 3, 10):
            with self.subTest(num_runs=num_runs):
                rows = self.rows(HistoryRead(self.session.pk, num_runs, None, "shopper"))
                assert rows == self.orm(runs, num_runs=num_runs) and rows
        for num_messages in (1, 3, 9):
            with self.subTest(num_messages=num_messages):
                rows = self.rows(HistoryRead(self.session.pk, None, num_messages, "shopper"))
                expected = self.orm(runs, num_messages=num_messages)
                while expected and expected[0][1] == Role.TOOL:
                    expected.pop(0)
                assert rows == expected and rows

    def test_values_come_back_typed(self):
        rows = read_history(HistoryRead(self.session.pk, 2, None), "default")
        tool_call = next(row for row in rows if row.tool_calls)
        assert tool_call.tool_calls[0]["name"] == "add_item"
        assert all(isinstance(row.tool_error, bool) for row in rows)
        assert all(timezone.is_aware(row.created_at) for row in rows)
        assert {row.created_at for row in rows} <= set(Message.objects.values_list("created_at", flat=True))
