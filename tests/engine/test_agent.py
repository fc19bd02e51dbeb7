"""The Agent's public API beyond runs: Agno's names and defaults, accessors and their async twins."""

import contextlib
import io

from django.test import TestCase, override_settings

import sessions_core
from sessions_core import Agent, RunContext
from sessions_core.models import ChatSession, Message, NameSource, Run, StateChange
from tests.support.engine_helpers import EngineTestMixin, make_users
from tests.support.llm_server import Error, Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


class TestConstruction(EngineTestMixin, TestCase):
    def test_public_names_are_importable(self):
        for name in ("Agent", "RunContext", "RunOutput", "SessionSummaryManager", "RunEvent", "RunStartedEvent",
                     "RunContentEvent", "ToolCallStartedEvent", "ToolCallCompletedEvent", "StateChangedEvent",
                     "RunCompletedEvent", "RunErrorEvent", "RunCancelledEvent", "SessionOwnershipError",
                     "SessionNotFoundError"):
            assert getattr(sessions_core, name).__name__ == name

    def test_agnos_defaults(self):
        agent = Agent(name="My Shopping Agent", model=self.model)

        assert agent.id == "my-shopping-agent"
        assert (agent.add_history_to_context, agent.num_history_runs, agent.num_history_messages) == (False, 3, None)
        assert (agent.store_history_messages, agent.store_tool_messages) == (False, True)
        assert (agent.add_session_state_to_context, agent.enable_agentic_state) == (False, False)
        assert (agent.overwrite_db_session_state, agent.resolve_in_context, agent.markdown) == (False, True, False)
        assert (agent.max_tool_calls_from_history, agent.introduction, agent.tool_call_limit) == (None, None, None)
        assert agent.session_state == {} and Agent(model=self.model, id="explicit").id == "explicit"

    def test_the_agents_session_and_user_are_the_defaults(self):
        agent = self.agent(session_id="fixed", user_id="alice", session_state={"n": 0})

        agent.run("one")
        agent.run("two", session_state={"n": 2})

        session = ChatSession.objects.get()
        assert (session.session_id, session.owner.username) == ("fixed", "alice")
        assert agent.get_session_state() == {"n": 2}
        assert [m.content for m in agent.get_chat_history() if m.role == "user"] == ["one", "two"]

    @override_settings(OPENAI_API_KEY="", OPENAI_BASE_URL="")
    def test_the_model_is_the_default_model_when_none_is_given(self):
        agent = Agent(name="Offline")

        assert agent.resolved_model().provider == "offline"


class TestAccessors(EngineTestMixin, TestCase):
    def setUp(self):
        (self.alice,) = make_users("alice")
        self.agent_ = self.agent(tools=[add_item], session_state={"shopping_list": []}, instructions="Shop.")
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."), Text("Anything else?"))
        self.first = self.agent_.run("add milk", session_id="s", user_id="alice")
        self.second = self.agent_.run("thanks", session_id="s", user_id="alice")

    def test_get_session_and_its_messages(self):
        view = self.agent_.get_session(session_id="s", user_id="alice")

        assert (view.session_id, view.user_id, view.agent_id, view.session_name) == ("s", "alice", "tester", "")
        assert (view.session_state, view.state_version) == ({"shopping_list": ["milk"]}, 2)
        assert view.created_at <= view.updated_at
        assert [(m.role, m.content) for m in view.get_messages()] == [
            ("system", "Shop."), ("user", "add milk"), ("assistant", ""), ("tool", "Added milk"),
            ("assistant", "Added milk."), ("user", "thanks"), ("assistant", "Anything else?")]
        assert [m.content for m in view.get_messages(last_n_runs=1)] == ["Shop.", "thanks", "Anything else?"]
        assert [m.content for m in view.get_chat_history(last_n_runs=1)] == ["thanks", "Anything else?"]

    def messages(self, **selection) -> list[tuple[str, str]]:
        return [(m.role, m.content) for m in self.agent_.get_session_messages(session_id="s", user_id="alice",
                                                                              **selection)]

    def test_get_session_messages_with_a_limit_is_the_system_message_and_the_latest(self):
        """SPEC Part 2, 4.4: the first system message leads and counts toward the limit; a window that would
        start with a tool result (its call outside it) starts after it."""
        assert self.messages(limit=3) == [("system", "Shop."), ("user", "thanks"), ("assistant", "Anything else?")]
        assert self.messages(limit=5) == [("system", "Shop."), ("assistant", "Added milk."), ("user", "thanks"),
                                          ("assistant", "Anything else?")]
        assert self.messages(limit=1) == self.messages(limit=0) == [("system", "Shop.")]
        assert self.messages(limit=2, skip_roles=["system"]) == [("user", "thanks"), ("assistant", "Anything else?")]
        assert self.messages(limit=0, skip_roles=["system"]) == []
        assert self.messages(limit=2, last_n_runs=2) == [("system", "Shop."), ("assistant", "Anything else?")]
        assert self.messages(skip_roles=["system", "tool"], last_n_runs=1) == [("user", "thanks"),
                                                                              ("assistant", "Anything else?")]
        view = self.agent_.get_session(session_id="s", user_id="alice")
        assert [(m.role, m.content) for m in view.get_messages(limit=3)] == self.messages(limit=3)
        assert [m.run_id for m in view.get_messages(limit=3)] == [self.first.run_id] + [self.second.run_id] * 2

    def test_get_session_messages_reads_the_current_branch_and_skips_failed_runs_unless_asked(self):
        self.llm.add(Text("Bread it is."))
        self.agent_.edit_and_rerun(self.second.run_id, "add bread", session_id="s", user_id="alice")
        self.llm.add(Error(400, "bad request"))
        assert self.agent_.run("broken", session_id="s", user_id="alice").status == "error"
        talk = ["system", "tool"]

        assert self.messages(skip_roles=talk) == [
            ("user", "add milk"), ("assistant", ""), ("assistant", "Added milk."), ("user", "add bread"),
            ("assistant", "Bread it is.")]
        assert self.messages(skip_roles=talk, skip_statuses=[]) == [*self.messages(skip_roles=talk), ("user", "broken")]
        assert self.messages(skip_roles=talk, skip_statuses=["ERROR"]) == self.messages(skip_roles=talk)
        assert self.messages(skip_statuses=["completed"]) == [("system", "Shop."), ("user", "broken")]
        with self.assertRaisesMessage(ValueError, "Unknown run status regenrated"):
            self.messages(skip_statuses=["regenrated"])

    async def test_aget_session_messages(self):
        messages = await self.agent_.aget_session_messages(session_id="s", user_id="alice", limit=2)
        view = await self.agent_.aget_session(session_id="s", user_id="alice")

        assert [m.content for m in messages] == ["Shop.", "Anything else?"]
        assert [m.content for m in await view.aget_messages(limit=2)] == ["Shop.", "Anything else?"]

    def test_get_chat_history_is_user_and_assistant_messages_with_run_ids(self):
        history = self.agent_.get_chat_history(session_id="s", user_id="alice")

        assert [(m.role, m.content, m.run_id) for m in history] == [
            ("user", "add milk", self.first.run_id), ("assistant", "", self.first.run_id),
            ("assistant", "Added milk.", self.first.run_id), ("user", "thanks", self.second.run_id),
            ("assistant", "Anything else?", self.second.run_id)]
        assert [m.seq for m in history] == [2, 3, 5, 7, 8]

    def test_get_last_run_output(self):
        last = self.agent_.get_last_run_output(session_id="s", user_id="alice")

        assert (last.run_id, last.content, last.status) == (self.second.run_id, "Anything else?", "completed")
        assert last.session_state == {"shopping_list": ["milk"]} and last.state_version == 2
        assert [m.role for m in last.messages] == ["system", "user", "assistant"]
        assert last.metrics == self.second.metrics

    def test_get_last_run_output_shows_the_state_as_of_that_run(self):
        self.agent_.update_session_state({"shopping_list": []}, session_id="s", user_id="alice")

        assert self.agent_.get_last_run_output(session_id="s", user_id="alice").session_state == {
            "shopping_list": ["milk"]}

    def test_update_session_state_is_shallow_ignores_injected_keys_and_is_recorded(self):
        state = self.agent_.update_session_state({"shopping_list": ["tea"], "budget": {"max": 10},
                                                  "current_user_id": "mallory"}, session_id="s", user_id="alice")

        assert state == {"shopping_list": ["tea"], "budget": {"max": 10}}
        change = StateChange.objects.order_by("version").last()
        assert (change.version, change.source, change.run) == (3, "manual", None)
        assert self.agent_.update_session_state({"budget": {"min": 1}}, session_id="s", user_id="alice") == {
            "shopping_list": ["tea"], "budget": {"min": 1}}

    def test_an_update_that_changes_nothing_records_nothing(self):
        self.agent_.update_session_state({"shopping_list": ["milk"]}, session_id="s", user_id="alice")

        assert StateChange.objects.count() == 2

    def test_session_names(self):
        assert self.agent_.get_session_name(session_id="s", user_id="alice") == ""
        self.llm.add(Text('"Buying Milk Today."'))

        view = self.agent_.set_session_name(session_id="s", user_id="alice", autogenerate=True)

        assert view.session_name == "Buying Milk Today"
        assert ChatSession.objects.get().name_source == NameSource.AUTO
        self.agent_.set_session_name(session_id="s", user_id="alice", session_name="Milk run")
        self.llm.add(Text("Another Title"))
        self.agent_.set_session_name(session_id="s", user_id="alice", autogenerate=True)
        assert self.agent_.get_session_name(session_id="s", user_id="alice") == "Milk run"
        with self.assertRaisesMessage(ValueError, "No session name provided"):
            self.agent_.set_session_name(session_id="s", user_id="alice", session_name="  ")

    def test_delete_session_removes_everything_in_it(self):
        self.agent_.run("other", session_id="other", user_id="alice")

        self.agent_.delete_session(session_id="s", user_id="alice")

        assert list(ChatSession.objects.values_list("session_id", flat=True)) == ["other"]
        assert Run.objects.count() == 1 and Message.objects.filter(session__session_id="s").count() == 0
        assert StateChange.objects.filter(session__session_id="s").count() == 0

    def test_get_sessions_lists_this_agents_sessions_newest_first(self):
        self.agent_.run("later", session_id="t", user_id="alice")
        self.agent(id="someone-else").run("not mine", session_id="u", user_id="alice")

        sessions = self.agent_.get_sessions(user_id="alice")

        assert [s.session_id for s in sessions] == ["t", "s"]
        assert [s.session_id for s in self.agent_.get_sessions(user_id="alice", limit=1)] == ["t"]

    async def test_async_twins(self):
        agent = self.agent_
        assert (await agent.aget_session(session_id="s", user_id="alice")).state_version == 2
        assert await agent.aget_session_state(session_id="s", user_id="alice") == {"shopping_list": ["milk"]}
        assert len(await agent.aget_chat_history(session_id="s", user_id="alice", last_n_runs=1)) == 2
        assert (await agent.aget_last_run_output(session_id="s", user_id="alice")).run_id == self.second.run_id
        await agent.aset_session_name(session_id="s", user_id="alice", session_name="Async name")
        assert await agent.aget_session_name(session_id="s", user_id="alice") == "Async name"
        assert [s.session_id for s in await agent.aget_sessions(user_id="alice")] == ["s"]
        state = await agent.aupdate_session_state({"x": 1}, session_id="s", user_id="alice", source="admin")
        assert state == {"shopping_list": ["milk"], "x": 1}
        await agent.adelete_session(session_id="s", user_id="alice")
        assert await agent.aget_sessions(user_id="alice") == []

    async def test_aprint_response(self):
        self.llm.add(Text("Async hello."))
        buffer = io.StringIO()

        with contextlib.redirect_stdout(buffer):
            await self.agent_.aprint_response("hi", session_id="s", user_id="alice", stream=True)

        assert buffer.getvalue() == "Async hello.\n"


class TestRunArguments(EngineTestMixin, TestCase):
    """Agno's run signature: a misspelt keyword is an error, a given run id is used, a stop may come first."""

    def test_an_unknown_keyword_is_a_type_error_naming_it_and_runs_nothing(self):
        agent = self.agent()
        for call in (lambda: agent.run("hi", sesion_id="s"), lambda: agent.arun("hi", sesion_id="s"),
                     lambda: agent.print_response("hi", sesion_id="s", strem=True)):
            with self.subTest(call=call):
                try:
                    call()
                except TypeError as exc:
                    assert "'sesion_id'" in str(exc)
                else:
                    raise AssertionError("no TypeError")
        assert not Run.objects.exists() and self.llm.requests == []

    def test_a_given_run_id_is_the_runs_id(self):
        self.llm.add(Text("hello"))
        output = self.agent().run("hi", session_id="s", run_id="my-run-1")

        assert output.run_id == "my-run-1" and Run.objects.get().run_id == "my-run-1"

    def test_a_stop_asked_before_the_run_starts_cancels_it_when_it_starts(self):
        self.llm.add(Text("never sent"))
        assert Agent.cancel_run("early-run") is False  # not running yet: the intent is kept

        output = self.agent().run("hi", session_id="s", run_id="early-run")

        assert output.status == "cancelled" and self.llm.requests == []
        assert Run.objects.get(run_id="early-run").status == "cancelled"

    def test_run_output_has_input_and_created_at_from_a_run_and_from_the_store(self):
        self.llm.add(Text("hello"))
        agent = self.agent()
        output = agent.run("hi there", session_id="s")
        stored = agent.get_last_run_output(session_id="s")
        run = Run.objects.get()

        assert output.input == stored.input == "hi there"
        assert output.created_at == stored.created_at == int(run.created_at.timestamp()) > 0
