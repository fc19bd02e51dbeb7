"""The assistants registry, the shopping-list tools, and each assistant end to end."""

from __future__ import annotations

import json

import pytest
from django.test import TestCase, override_settings

from chatapp import assistants
from chatapp.assistants import (
    ASSISTANTS,
    SUMMARY_RUNS,
    add_item,
    clear_list,
    get_assistant,
    list_items,
    remove_item,
    reset_assistants,
)
from sessions_core.llm import OfflineModel, OpenAIChat
from sessions_core.models import ChatSession, Run, StateChange
from sessions_core.tools import RunContext
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text, ToolCalls


@pytest.fixture(autouse=True)
def _fresh_registry():
    reset_assistants()
    yield
    reset_assistants()


def test_the_registry_offers_general_shopping_and_agentic_notes():
    assert list(ASSISTANTS) == ["general", "shopping", "notes", "shopping-workflow", "task-router", "project-team",
                                "approvals", "reviewed-order"]
    general, shopping, notes = (get_assistant(name) for name in ("general", "shopping", "notes"))
    assert general.add_history_to_context and general.markdown
    assert set(shopping.functions()) == {"add_item", "remove_item", "list_items", "clear_list"}
    assert shopping.session_state == {"shopping_list": []} and shopping.add_session_state_to_context
    assert notes.enable_agentic_state and notes.add_session_state_to_context
    assert notes.session_state == {"shopping_list": [], "notes": []}
    assert "update_session_state" in notes.functions()


def test_the_workflows_and_the_team_are_assistants_like_any_agent():
    from sessions_core.steps import Router
    from sessions_core.team import Team
    from sessions_core.workflow import Workflow

    shopping, router, team = (get_assistant(name) for name in ("shopping-workflow", "task-router", "project-team"))
    assert isinstance(shopping, Workflow) and [step.name for step in shopping.steps] == ["Shopping assistant", "Tally"]
    assert isinstance(router, Workflow) and isinstance(router.steps[0], Router)
    assert [choice.name for choice in router.steps[0].choices] == ["Task manager", "Task viewer", "Task organizer"]
    assert isinstance(team, Team) and [member.name for member in team.members] == ["Planner", "Status tracker"]
    assert (shopping.kind, router.kind, team.kind) == ("workflow", "workflow", "team")


@pytest.mark.parametrize(("text", "route"), [
    ("clean up completed tasks and add a new one", "Task organizer"),  # organize words win
    ("add a task and show my tasks", "Task manager"),  # then manage words
    ("show my tasks", "Task viewer"),
])
def test_the_task_router_prefers_organize_then_manage_then_view(text, route):
    from chatapp.assistants import route_task_request
    from sessions_core.steps import StepInput

    assert route_task_request(StepInput(input=text)) == route


def test_each_assistant_is_built_once_until_reset():
    first = get_assistant("general")
    assert get_assistant("general") is first
    reset_assistants()
    assert get_assistant("general") is not first


def test_an_unknown_assistant_is_a_key_error():
    with pytest.raises(KeyError):
        get_assistant("nope")


@override_settings(OPENAI_API_KEY="", OPENAI_BASE_URL="")
def test_without_model_settings_the_offline_model_answers():
    assert isinstance(get_assistant("general").model, OfflineModel)


def test_model_settings_point_the_assistants_at_that_server(llm_server):
    with override_settings(OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="k", OPENAI_MODEL="m-1"):
        model = get_assistant("shopping").model
    assert isinstance(model, OpenAIChat) and model.id == "m-1"


def context(items=None) -> RunContext:
    return RunContext(run_id="r", session_id="s", session_state={"shopping_list": list(items or [])})


def test_add_item_ignores_case_duplicates():
    ctx = context(["Milk"])
    assert "already on the list" in add_item(ctx, "milk")
    add_item(ctx, " eggs ")
    assert ctx.session_state["shopping_list"] == ["Milk", "eggs"]
    assert add_item(ctx, "  ").startswith("Error")


def test_remove_list_and_clear():
    ctx = context(["Milk", "eggs"])
    assert remove_item(ctx, "MILK") == "Removed Milk."
    assert remove_item(ctx, "bread").startswith("Error")
    assert list_items(ctx) == "Shopping list: eggs"
    clear_list(ctx)
    assert ctx.session_state["shopping_list"] == [] and list_items(ctx) == "The list is empty."


def test_a_broken_stored_list_is_replaced_rather_than_crashing():
    ctx = RunContext(run_id="r", session_id="s", session_state={"shopping_list": "oops"})
    add_item(ctx, "milk")
    assert ctx.session_state["shopping_list"] == ["milk"]


class TestEndToEnd(TestCase):
    @pytest.fixture(autouse=True)
    def _server(self, llm_server):
        self.llm = llm_server

    def setUp(self):
        self.alice = make_user("alice")

    def test_the_general_assistants_summary_request_stays_the_same_size_as_the_chat_grows(self):
        session = make_session(owner=self.alice, component_id="general")
        summaries = iter(range(1, 100))

        def respond(body):
            if body.get("stream") is not True and "response_format" in body:
                return Text(json.dumps({"summary": f"Summary {next(summaries)}."}))
            return Text("ok")

        self.llm.responder = respond
        turns = SUMMARY_RUNS + 3
        with override_settings(OPENAI_BASE_URL=self.llm.base_url, OPENAI_API_KEY="k", OPENAI_MAX_RETRIES=0):
            for turn in range(1, turns + 1):
                get_assistant("general").run(f"message number {turn}.", session_id=session.session_id,
                                             user_id=self.alice)

        summary_requests = [body for body in self.llm.requests if "response_format" in body]
        assert len(summary_requests) == turns
        last = summary_requests[-1]["messages"][0]["content"]
        asked = [turn for turn in range(1, turns + 1) if f"User: message number {turn}." in last]
        assert asked == list(range(turns - SUMMARY_RUNS + 1, turns + 1))  # the window only...
        assert f"<previous_summary>\nSummary {turns - 1}.\n</previous_summary>" in last  # ...and what came before
        assert len(summary_requests[-1]["messages"][0]["content"]) - len(summary_requests[-2]["messages"][0]["content"]) < 5

    def test_the_shopping_assistant_keeps_the_list_through_its_tools(self):
        session = make_session(owner=self.alice, component_id="shopping")
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "Milk"}),
                                ("add_item", {"item": "eggs"})]), Text("Added milk and eggs."))
        with override_settings(OPENAI_BASE_URL=self.llm.base_url, OPENAI_API_KEY="k", OPENAI_MAX_RETRIES=0):
            output = get_assistant("shopping").run("add milk and eggs", session_id=session.session_id,
                                                   user_id=self.alice)
        assert output.content == "Added milk and eggs."
        session.refresh_from_db()
        assert session.session_state == {"shopping_list": ["milk", "eggs"]}
        assert {c.source for c in StateChange.objects.filter(session=session)} >= {"tool:add_item"}
        system = self.llm.requests[0]["messages"][0]["content"]
        assert "shopping_list" in system  # the state is in the context

    def served(self):
        return override_settings(OPENAI_BASE_URL=self.llm.base_url, OPENAI_API_KEY="k", OPENAI_MAX_RETRIES=0)

    def test_the_notes_assistant_edits_its_own_state(self):
        session = make_session(owner=self.alice, component_id="notes")
        updates = {"shopping_list": ["milk", "eggs"]}
        self.llm.add(ToolCalls([("update_session_state", {"session_state_updates": updates})]),
                     Text("Your list: milk and eggs."))
        with self.served():
            output = get_assistant("notes").run("add milk and eggs", session_id=session.session_id, user_id=self.alice)
        session.refresh_from_db()
        assert session.session_state == {"shopping_list": ["milk", "eggs"], "notes": []}
        assert StateChange.objects.filter(session=session, source="agentic").exists()
        assert output.content == "Your list: milk and eggs."
        assert "shopping_list" in self.llm.requests[0]["messages"][0]["content"]  # the state is in the context
        assert assistants.assistant_name("notes") == "Notes and list"
        assert ChatSession.objects.get(pk=session.pk).component_id == "notes"

    def test_the_task_router_sends_each_request_to_the_agent_for_it(self):
        session = make_session(owner=self.alice, component_id="task-router", kind="workflow")
        self.llm.add(ToolCalls([("add_task", {"name": "Write the report", "priority": "high"}),
                                ("add_task", {"name": "Buy milk", "priority": "low"})]), Text("Added two tasks."),
                     ToolCalls([("complete_task", {"name": "Write the report"})]), Text("Done."),
                     ToolCalls([("clear_completed_tasks", {}), ("list_tasks", {})]), Text("One task left."),
                     ToolCalls([("list_tasks", {})]), Text("Buy milk (low, pending)."))
        with self.served():
            router = get_assistant("task-router")
            for text in ("add write the report (high) and buy milk (low)", "complete write the report",
                         "organize my tasks", "what are my tasks?"):
                output = router.run(text, session_id=session.session_id, user_id=self.alice)

        assert output.content == "Buy milk (low, pending)."
        tools = [[tool["function"]["name"] for tool in body["tools"]] for body in self.llm.requests[::2]]
        assert tools == [["add_task", "complete_task"], ["add_task", "complete_task"],
                         ["clear_completed_tasks", "list_tasks"], ["list_tasks"]]
        session.refresh_from_db()
        assert session.session_state["task_list"] == [{"name": "Buy milk", "priority": "low", "status": "pending"}]

    def test_the_project_team_reports_the_status_through_the_tracker(self):
        session = make_session(owner=self.alice, component_id="project-team", kind="team")
        self.llm.add(ToolCalls([("delegate_task_to_member", {"member_id": "planner", "task": "add a Deploy step"})]),
                     ToolCalls([("add_step", {"name": "Deploy", "priority": "high"})]), Text("Added Deploy."),
                     Text("The Planner added Deploy."),
                     ToolCalls([("delegate_task_to_member", {"member_id": "status-tracker", "task": "the status"})]),
                     ToolCalls([("list_steps", {})]), Text("Deploy (high, pending)."),
                     Text("Status tracker: Deploy (high, pending)."))
        with self.served():
            team = get_assistant("project-team")
            team.run("add a Deploy step with high priority", session_id=session.session_id, user_id=self.alice)
            output = team.run("what is the status of the project?", session_id=session.session_id,
                              user_id=self.alice)

        assert output.content == "Status tracker: Deploy (high, pending)."
        assert self.llm.requests[-2]["messages"][-1]["content"] == "Steps: Deploy (high, pending)"
        assert list(Run.objects.filter(parent_run__run_id=output.run_id).values_list("component_id", flat=True)) == [
            "status-tracker"]
