"""Restart: a session written by one process is continued by another (a plain script that imports
sessions_core), which sees the history and the state. Runs on SQLite and PostgreSQL."""

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection
from django.test import TransactionTestCase

from sessions_core import RunContext
from sessions_core.models import ChatSession, Run
from tests.support.engine_helpers import EngineTestMixin, last_user_text, tool_then_text

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys

from sessions_core import Agent, RunContext


def add_item(item: str, run_context: RunContext) -> str:
    '''Add an item to the shopping list.

    Args:
        item: The item.
    '''
    run_context.session_state["shopping_list"].append(item)
    return "Added " + item


# No model given: the engine's default model reads OPENAI_BASE_URL (the test server).
agent = Agent(name="Shopper", tools=[add_item], session_state={"shopping_list": []}, add_history_to_context=True)
output = agent.run(sys.argv[1], session_id=sys.argv[2], user_id="alice")
print(json.dumps({
    "status": output.status,
    "error": output.error,
    "state": agent.get_session_state(session_id=sys.argv[2], user_id="alice"),
    "history": [[m.role, m.content] for m in agent.get_chat_history(session_id=sys.argv[2], user_id="alice")],
}))
"""


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the shopping list.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return "Added " + item


def database_url() -> str:
    """The URL of the database this test runs on (the test database, not the configured one)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(settings['NAME']).resolve()}"
    user, password = quote(settings["USER"] or "", safe=""), quote(settings["PASSWORD"] or "", safe="")
    return f"postgres://{user}:{password}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"


@pytest.mark.django_db(transaction=True)
class TestRestart(EngineTestMixin, TransactionTestCase):
    def run_script(self, text: str, session_id: str) -> dict:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatapp.settings",
            "DATABASE_URL": database_url(),
            "OPENAI_BASE_URL": self.llm.base_url,
            "OPENAI_API_KEY": "test",
            "OPENAI_MODEL": "test-model",
        }
        env.pop("PYTHONPATH", None)
        done = subprocess.run([sys.executable, "-c", SCRIPT, text, session_id], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def test_a_second_process_sees_the_history_and_the_state(self):
        self.llm.responder = tool_then_text("add_item", lambda body: {"item": last_user_text(body).split()[-1]},
                                            reply="Added.")
        agent = self.agent(name="Shopper", tools=[add_item], session_state={"shopping_list": []},
                           add_history_to_context=True)
        first = agent.run("add milk", session_id="kept", user_id="alice")
        assert first.session_state == {"shopping_list": ["milk"]}

        result = self.run_script("add eggs", "kept")

        assert (result["status"], result["error"]) == ("completed", "")
        assert result["state"] == {"shopping_list": ["milk", "eggs"]}
        # What the second process sent the model: the first process's turn, tool traffic included.
        sent = [(m["role"], m.get("content")) for m in self.llm.requests[2]["messages"]]
        assert sent == [("user", "add milk"), ("assistant", None), ("tool", "Added milk"), ("assistant", "Added."),
                        ("user", "add eggs")]
        assert result["history"] == [["user", "add milk"], ["assistant", ""], ["assistant", "Added."],
                                     ["user", "add eggs"], ["assistant", ""], ["assistant", "Added."]]
        # And this process sees what the other one did.
        assert agent.get_session_state(session_id="kept", user_id="alice") == {"shopping_list": ["milk", "eggs"]}
        assert list(Run.objects.order_by("id").values_list("input", "status")) == [
            ("add milk", "completed"), ("add eggs", "completed")]
        assert ChatSession.objects.get(session_id="kept").owner.username == "alice"

    def test_a_second_process_cannot_use_another_users_session(self):
        self.agent().run("mine", session_id="bobs", user_id="bob")

        refusal = "SessionOwnershipError: Session 'bobs' does not belong to user 'alice'"
        with self.assertRaisesMessage(AssertionError, refusal):
            self.run_script("add eggs", "bobs")

        assert Run.objects.count() == 1 and len(self.llm.requests) == 1
