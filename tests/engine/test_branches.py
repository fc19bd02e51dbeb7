"""Branches: regenerate, edit and rerun, switch, fork; the session state branches with the conversation."""

import threading

import pytest
from django.db import connection, connections
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext

from sessions_core import RunContext, RunNotFoundError, SessionBusyError, SessionOwnershipError
from sessions_core.models import ChatSession, Run, StateChange
from tests.support.engine_helpers import EngineTestMixin, Gate, bulk_runs, counts, make_users
from tests.support.llm_server import Text, ToolCalls


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


def adds(body):
    """The model adds the last word of the user's message, then says so."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Text(f"ok: {messages[-1]['content']}")
    return ToolCalls([("add_item", {"item": messages[-1]["content"].split()[-1]})])


class BranchTestCase(EngineTestMixin, TestCase):
    def setUp(self):
        self.llm.responder = adds
        self.shop = self.agent(tools=[add_item], session_state={"shopping_list": []}, add_history_to_context=True)

    def state(self):
        return self.shop.get_session_state(session_id="s")

    def path(self):
        return list(Run.objects.filter(parent_run__isnull=True, abandoned=False).order_by("pk")
                    .values_list("input", flat=True))


class TestTree(BranchTestCase):
    def test_runs_follow_each_other_and_the_session_knows_its_leaf(self):
        first = self.shop.run("add milk", session_id="s")
        second = self.shop.run("add eggs", session_id="s")
        runs = {run.run_id: run for run in Run.objects.all()}
        assert runs[first.run_id].follows is None and runs[second.run_id].follows_id == runs[first.run_id].pk
        assert ChatSession.objects.get().current_leaf_id == runs[second.run_id].pk

    def test_regenerate_is_a_sibling_from_the_state_at_its_targets_start(self):
        self.shop.run("add milk", session_id="s")
        second = self.shop.run("add eggs", session_id="s")
        assert self.state() == {"shopping_list": ["milk", "eggs"]}

        again = self.shop.regenerate(session_id="s")  # the last run by default

        assert again.status == "completed" and again.input == "add eggs"
        assert self.state() == {"shopping_list": ["milk", "eggs"]}  # eggs once, not twice
        old, new = Run.objects.get(run_id=second.run_id), Run.objects.get(run_id=again.run_id)
        assert old.abandoned and not new.abandoned and new.follows_id == old.follows_id
        assert self.path() == ["add milk", "add eggs"]
        sources = list(StateChange.objects.order_by("version").values_list("source", flat=True))
        assert sources == ["defaults", "tool:add_item", "tool:add_item", "branch:regenerate", "tool:add_item"]

    def test_the_current_branchs_changes_leave_out_abandoned_runs_and_the_resets(self):
        self.shop.run("add milk", session_id="s")
        eggs = self.shop.run("add eggs", session_id="s")
        self.shop.edit_and_rerun(eggs.run_id, "add bread", session_id="s")
        current = lambda: list(StateChange.objects.on_current_branch().order_by("version").values_list(  # noqa: E731
            "version", "source"))
        assert current() == [(1, "defaults"), (2, "tool:add_item"), (5, "tool:add_item")]
        self.shop.set_current_branch(eggs.run_id, session_id="s")  # back to the first version: one entry says so
        assert current() == [(1, "defaults"), (2, "tool:add_item"), (3, "tool:add_item"), (6, "branch:switch")]
        assert StateChange.objects.count() == 6  # the log itself keeps everything

    def test_history_and_chat_history_follow_the_current_branch(self):
        self.shop.run("add milk", session_id="s")
        self.shop.run("add eggs", session_id="s")
        self.shop.edit_and_rerun(Run.objects.get(input="add eggs").run_id, "add bread", session_id="s")
        self.shop.run("add jam", session_id="s")

        sent_users = [content for role, content in self.sent_pairs(-2) if role == "user"]
        assert sent_users == ["add milk", "add bread", "add jam"]  # no "add eggs" from the abandoned branch
        assert [m.content for m in self.shop.get_chat_history(session_id="s") if m.role == "user"] == [
            "add milk", "add bread", "add jam"]
        assert self.state() == {"shopping_list": ["milk", "bread", "jam"]}
        assert self.shop.get_last_run_output(session_id="s").input == "add jam"

    def test_switching_back_restores_that_branchs_state_as_a_recorded_change(self):
        self.shop.run("add milk", session_id="s")
        eggs = self.shop.run("add eggs", session_id="s")
        self.shop.edit_and_rerun(eggs.run_id, "add bread", session_id="s")
        assert self.state() == {"shopping_list": ["milk", "bread"]}

        leaf = self.shop.set_current_branch(eggs.run_id, session_id="s")

        assert leaf.run_id == eggs.run_id and self.state() == {"shopping_list": ["milk", "eggs"]}
        assert self.path() == ["add milk", "add eggs"]
        assert StateChange.objects.order_by("-version").first().source == "branch:switch"
        self.shop.run("add jam", session_id="s")  # the next run follows the switched-to leaf
        assert self.state() == {"shopping_list": ["milk", "eggs", "jam"]}
        assert Run.objects.get(input="add jam").follows_id == Run.objects.get(run_id=eggs.run_id).pk

    def test_a_switch_back_and_forth_names_the_version_it_returns_to_and_copies_no_state(self):
        big = [f"item {number} " + "x" * 50 for number in range(300)]  # a state of about 20 KB
        self.shop.run("add milk", session_id="s", session_state={"shopping_list": big})
        eggs = self.shop.run("add eggs", session_id="s")
        bread = self.shop.edit_and_rerun(eggs.run_id, "add bread", session_id="s")
        states = {}  # the state at each version, as the session had it
        for _ in range(5):
            for run in (eggs, bread):
                self.shop.set_current_branch(run.run_id, session_id="s")
                session = ChatSession.objects.get()
                states[session.state_version] = session.session_state
        switches = list(StateChange.objects.filter(source="branch:switch").order_by("version"))
        assert len(switches) == 10
        eggs_version, bread_version = (Run.objects.get(run_id=run.run_id).state_version for run in (eggs, bread))
        assert [(change.patch, change.inverse) for change in switches] == [([], [])] * 10
        assert [change.restores for change in switches] == [eggs_version, bread_version] * 5
        assert self.state()["shopping_list"][-1] == "bread"
        # Every version still reads as it was, the restored ones and the ones before them.
        session = ChatSession.objects.get()
        for version, state in states.items():
            assert session.state_at(version) == state
        assert session.state_at(eggs_version)["shopping_list"][-2:] == ["milk", "eggs"]
        assert session.state_at(bread_version - 2)["shopping_list"][-1] == "eggs"  # before the edit's restore
        assert session.state_at(0) == {}
        # The next run goes on from the restored state, and the timeline names the version restored.
        self.shop.run("add jam", session_id="s")
        assert self.state()["shopping_list"][-2:] == ["bread", "jam"]
        assert ChatSession.objects.get().state_at(switches[-1].version) == states[switches[-1].version]

    def test_switching_to_an_earlier_run_goes_to_its_newest_leaf(self):
        milk = self.shop.run("add milk", session_id="s")
        eggs = self.shop.run("add eggs", session_id="s")
        self.shop.run("add jam", session_id="s")
        self.shop.edit_and_rerun(eggs.run_id, "add bread", session_id="s")
        leaf = self.shop.set_current_branch(milk.run_id, session_id="s")
        assert leaf.input == "add bread"  # the newest leaf under milk
        assert self.path() == ["add milk", "add bread"]

    def test_fork_copies_the_path_to_a_new_session_with_the_state_as_of_that_run(self):
        milk = self.shop.run("add milk", session_id="s", user_id="alice")
        self.shop.run("add eggs", session_id="s", user_id="alice")

        new_id = self.shop.fork_session(milk.run_id, session_id="s", user_id="alice")

        fork = ChatSession.objects.get(session_id=new_id)
        assert fork.owner.username == "alice" and fork.session_state == {"shopping_list": ["milk"]}
        assert fork.metadata["forked_from_session_id"] == "s" and fork.metadata["forked_from_run_id"] == milk.run_id
        original = [m.content for m in self.shop.get_chat_history(session_id="s", user_id="alice")]
        assert [m.content for m in self.shop.get_chat_history(session_id=new_id, user_id="alice")] == [
            "add milk", "", "ok: Added milk"] == original[:3]
        self.shop.run("add tea", session_id=new_id, user_id="alice")
        assert self.shop.get_session_state(session_id=new_id, user_id="alice") == {"shopping_list": ["milk", "tea"]}
        assert self.shop.get_session_state(session_id="s", user_id="alice") == {"shopping_list": ["milk", "eggs"]}


class TestRefusals(BranchTestCase):
    def test_another_users_run_or_session_is_refused_and_writes_nothing(self):
        make_users("alice", "mallory")
        run = self.shop.run("add milk", session_id="s", user_id="alice")
        before = counts()
        for call in (lambda: self.shop.regenerate(run.run_id, session_id="s", user_id="mallory"),
                     lambda: self.shop.edit_and_rerun(run.run_id, "add gin", session_id="s", user_id="mallory"),
                     lambda: self.shop.set_current_branch(run.run_id, session_id="s", user_id="mallory"),
                     lambda: self.shop.fork_session(run.run_id, session_id="s", user_id="mallory")):
            with self.subTest(call=call), pytest.raises(SessionOwnershipError):
                call()
        assert counts() == before

    def test_a_run_of_another_session_is_not_found(self):
        self.shop.run("add milk", session_id="s")
        other = self.shop.run("add eggs", session_id="t")
        before = counts()
        with pytest.raises(RunNotFoundError):
            self.shop.set_current_branch(other.run_id, session_id="s")
        with pytest.raises(RunNotFoundError):
            self.shop.regenerate(other.run_id, session_id="s")
        assert counts() == before and self.state() == {"shopping_list": ["milk"]}

    def test_a_switch_while_a_run_holds_the_lease_is_refused(self):
        from datetime import timedelta

        from django.utils import timezone

        run = self.shop.run("add milk", session_id="s")
        ChatSession.objects.update(lease_token="other", lease_expires_at=timezone.now() + timedelta(seconds=30))
        with pytest.raises(SessionBusyError):
            self.shop.set_current_branch(run.run_id, session_id="s")


class TestQueries(BranchTestCase):
    def test_a_runs_statements_are_flat_with_500_runs_and_50_branches(self):
        self.shop.run("add milk", session_id="a")
        self.shop.run("add milk", session_id="b")
        b = ChatSession.objects.get(session_id="b")
        bulk_runs(b, 500)
        for _ in range(50):
            self.shop.regenerate(session_id="b")
        counted = []
        for session_id in ("a", "b"):
            with CaptureQueriesContext(connection) as queries:
                self.shop.run("add tea", session_id=session_id)
            counted.append(len(queries))
        assert counted[0] == counted[1]


class TestConcurrentRegenerate(EngineTestMixin, TransactionTestCase):
    def test_a_regenerate_while_a_run_is_in_flight_waits_for_it(self):
        shop = self.agent(tools=[add_item], session_state={"shopping_list": []})
        self.llm.responder = adds
        shop.run("add milk", session_id="s")
        with Gate() as held:
            def first_held(body):
                if body["messages"][-1]["content"] == "add eggs":
                    return ToolCalls([("add_item", {"item": "eggs"})])
                if body["messages"][-1]["content"] == "Added eggs":
                    return Text("eggs added", wait_event=held)
                return adds(body)

            self.llm.responder = first_held
            results = {}

            def in_flight():
                try:
                    results["run"] = shop.run("add eggs", session_id="s")
                finally:
                    connections.close_all()

            thread = threading.Thread(target=in_flight)
            thread.start()
            self.llm.wait_for_requests(3)  # milk's two, then eggs' first: the run holds the lease
            regenerating = threading.Thread(target=lambda: results.setdefault(
                "again", shop.regenerate(session_id="s")) and connections.close_all())
            regenerating.start()
            held.set()
            thread.join(30)
            regenerating.join(30)
        assert results["run"].status == "completed" and results["again"].status == "completed"
        assert results["again"].input == "add eggs"  # it regenerated the run it waited for
        assert shop.get_session_state(session_id="s") == {"shopping_list": ["milk", "eggs"]}


class TestBranchOfABranch(BranchTestCase):
    def test_editing_a_regenerated_run_starts_from_the_state_that_run_started_from(self):
        self.shop.run("add milk", session_id="s")
        self.shop.run("add eggs", session_id="s")
        again = self.shop.regenerate(session_id="s")
        self.shop.edit_and_rerun(again.run_id, "add bread", session_id="s")
        assert self.state() == {"shopping_list": ["milk", "bread"]}


class TestExport(BranchTestCase):
    def test_json_keeps_every_branch_and_markdown_reads_the_current_one(self):
        from sessions_core.export import export_json, export_markdown, import_json

        (alice,) = make_users("alice")
        self.shop.run("add milk", session_id="s", user_id="alice")
        eggs = self.shop.run("add eggs", session_id="s", user_id="alice")
        self.shop.edit_and_rerun(eggs.run_id, "add bread", session_id="s", user_id="alice")
        session = ChatSession.objects.get(session_id="s")

        markdown = "".join(export_markdown(session))
        assert "add bread" in markdown and "add eggs" not in markdown
        (copy,) = import_json("".join(export_json(session)), alice)

        def tree(of):
            runs = Run.objects.filter(session=of, parent_run__isnull=True).select_related("follows").order_by("pk")
            return [(run.input, run.follows.input if run.follows else None, run.abandoned) for run in runs]

        assert tree(copy) == tree(session) == [("add milk", None, False), ("add eggs", "add milk", True),
                                               ("add bread", "add milk", False)]
        assert copy.current_leaf.input == "add bread"
        self.shop.run("add jam", session_id=copy.session_id, user_id="alice")
        assert Run.objects.get(session=copy, input="add jam").follows.input == "add bread"
