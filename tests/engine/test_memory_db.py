"""InMemoryDb(): a process-local database per instance, with the engine's whole behaviour on it."""

import asyncio
import subprocess
import sys
import textwrap

from django.db import connections
from django.test import TestCase, TransactionTestCase

from sessions_core import InMemoryDb, RunContext, SessionNotFoundError, SessionOwnershipError
from sessions_core.models import ChatSession, Run, StateChange
from tests.support.engine_helpers import EngineTestMixin
from tests.support.example_support import ROOT, offline_env
from tests.support.llm_server import Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state["items"].append(item)
    return f"Added {item}"


class MemoryDbTestMixin:
    """Django's test cases refuse queries to databases they were not told about, so the in-memory
    databases are made before the class is set up and named in `databases`."""

    @classmethod
    def setUpClass(cls):
        cls.db, cls.other_db = InMemoryDb(), InMemoryDb()
        cls.databases = {"default", cls.db.alias, cls.other_db.alias}
        super().setUpClass()


class TestInMemoryDb(MemoryDbTestMixin, EngineTestMixin, TestCase):
    def setUp(self):
        self.shop = self.agent(db=self.db, tools=[add_item], session_state={"items": []},
                               add_history_to_context=True)

    def test_runs_state_and_history_are_kept_in_it_and_nowhere_else(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Milk added."))
        self.shop.run("add milk", session_id="s", user_id="ann")
        self.llm.add(ToolCalls([("add_item", {"item": "eggs"})]), Text("Eggs added."))

        output = self.shop.run("add eggs", session_id="s", user_id="ann")

        assert output.session_state == {"items": ["milk", "eggs"]}
        assert ("assistant", "Milk added.") in self.sent_pairs()  # the first run is the second's history
        assert self.shop.get_session_state(session_id="s", user_id="ann") == {"items": ["milk", "eggs"]}
        assert ChatSession.objects.using(self.db.alias).get().owner.username == "ann"
        assert Run.objects.using(self.db.alias).count() == 2
        assert StateChange.objects.using(self.db.alias).count() == 3  # the default list, milk, eggs
        assert not ChatSession.objects.exists() and not Run.objects.exists()  # the Django database: untouched

    def test_each_instance_is_a_database_of_its_own(self):
        self.llm.add(Text("Hello."))
        self.shop.run("hi", session_id="s", user_id="ann")
        other = self.agent(db=self.other_db, session_state={"items": []})

        with self.assertRaises(SessionNotFoundError):
            other.get_session_state(session_id="s", user_id="ann")
        assert ChatSession.objects.using(other.db_alias).count() == 0

    def test_sessions_in_it_keep_their_owner(self):
        self.llm.add(Text("Hello."))
        self.shop.run("hi", session_id="s", user_id="ann")

        with self.assertRaises(SessionOwnershipError):
            self.shop.get_session_state(session_id="s", user_id="bob")
        with self.assertRaises(SessionOwnershipError):
            self.shop.run("mine now", session_id="s", user_id="bob")
        assert Run.objects.using(self.db.alias).count() == 1


class TestInMemoryDbAsync(MemoryDbTestMixin, EngineTestMixin, TransactionTestCase):
    def test_async_runs_share_it_across_threads(self):
        agent = self.agent(db=self.db, tools=[add_item], session_state={"items": []})
        self.llm.add(ToolCalls([("add_item", {"item": "jam"})]), Text("Jam added."))

        output = asyncio.run(agent.arun("add jam", session_id="s"))  # the ORM work runs on another thread

        assert output.session_state == {"items": ["jam"]}
        connections.close_all()  # Django keeps an in-memory database's connections; the keeper holds it anyway
        assert agent.get_session_state(session_id="s") == {"items": ["jam"]}


SCRIPT = """
    import asyncio

    from sessions_core import Agent, InMemoryDb
    from sessions_core.llm import OfflineModel

    async def main():
        db = InMemoryDb()  # made inside async code: its migration runs on another thread
        agent = Agent(model=OfflineModel(), db=db, session_state={"n": 1})
        output = await agent.arun("hello", session_id="s")
        print("result:", output.status, await agent.aget_session_state(session_id="s"))

    asyncio.run(main())
"""


def test_a_plain_async_script_can_make_one(tmp_path):
    """In its own process, as a script would: Django's test cases refuse databases made mid-test."""
    script = tmp_path / "memory_script.py"
    script.write_text(textwrap.dedent(SCRIPT))

    env = {**offline_env(tmp_path, "default"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert "result: completed {'n': 1}" in done.stdout
