"""The demo assistants that wait for a person, driven by the offline model (no network): approvals for
removing and clearing, a delivery whose date the user gives, a workflow whose last step waits for a review."""

import pytest
from django.test import TestCase

from chatapp.assistants import get_assistant, reset_assistants
from sessions_core.llm import OfflineModel
from sessions_core.models import RunStatus


@pytest.fixture(autouse=True)
def _offline(settings):
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    reset_assistants()
    yield
    reset_assistants()


class TestDemo(TestCase):
    def run_on(self, assistant_id: str, text: str, session_id: str = "demo"):
        return get_assistant(assistant_id).run(text, session_id=session_id, user_id="ann")

    def test_removing_waits_for_approval_and_a_rejection_changes_nothing(self):
        assert isinstance(get_assistant("approvals").model, OfflineModel)
        self.run_on("approvals", "add milk, eggs and bread")
        paused = self.run_on("approvals", "remove eggs")
        assert paused.status == RunStatus.PAUSED and paused.content == "I have tools to execute, but I need confirmation."
        (requirement,) = paused.active_requirements
        assert (requirement.tool_execution.tool_name, requirement.tool_execution.tool_args) == (
            "remove_item", {"item": "eggs"})
        requirement.reject("we still need them")
        output = get_assistant("approvals").continue_run(run_response=paused, user_id="ann")
        assert output.session_state["shopping_list"] == ["milk", "eggs", "bread"]
        assert output.content == "Function call was rejected by the user. Note: we still need them."

        paused = self.run_on("approvals", "clear the list")
        paused.active_requirements[0].confirm()
        output = get_assistant("approvals").continue_run(run_response=paused, user_id="ann")
        assert (output.content, output.session_state["shopping_list"]) == ("The list is now empty.", [])

    def test_the_delivery_asks_the_user_for_its_date(self):
        self.run_on("approvals", "add milk")
        paused = self.run_on("approvals", "schedule the delivery")
        (requirement,) = paused.active_requirements
        assert requirement.needs_user_input and [field.name for field in requirement.user_input_schema] == ["date"]
        requirement.provide_user_input({"date": "2026-12-24"})
        output = get_assistant("approvals").continue_run(run_response=paused, user_id="ann")
        assert output.session_state["delivery"] == {"date": "2026-12-24", "items": 1}
        assert "2026-12-24" in output.content

    def test_the_reviewed_order_waits_before_its_last_step(self):
        paused = self.run_on("reviewed-order", "add milk and eggs")
        assert paused.status == RunStatus.PAUSED and paused.paused_step_name == "Place order"
        assert paused.session_state["item_count"] == 2
        paused.active_requirements[0].confirm()
        output = get_assistant("reviewed-order").continue_run(run_response=paused, user_id="ann")
        assert output.content == "Order 1 placed: milk, eggs."
        assert output.session_state["orders"] == [["milk", "eggs"]]
