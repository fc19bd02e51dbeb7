"""Runs that wait for a person (SPEC Part 1, items 23-25): tools that need a confirmation, the user's input
or an external result pause the run; the pause is stored like a finish; `continue_run` resumes it in any
process, once. Runs on SQLite and PostgreSQL."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection, connections
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext

from sessions_core import (
    RunContext,
    RunEvent,
    RunNotContinuableError,
    RunRequirement,
    SessionOwnershipError,
    Toolkit,
    UnresolvedRequirementsError,
    UserInputField,
    tool,
)
from sessions_core.component import Component
from sessions_core.branches import RunNotFoundError
from sessions_core.models import ChatSession, Message, Run, RunStatus, StateChange
from sessions_core.run import lifecycle, registry
from tests.support.engine_helpers import EngineTestMixin, Gate, bulk_runs, kinds, make_users, snapshot
from tests.support.factories import make_run, make_session, make_user
from tests.support.llm_server import Text, ToolCalls
from tests.guarantees.test_restart import database_url
from tests.engine.test_run_lifecycle import until

ROOT = Path(__file__).resolve().parents[2]


def lookup(name: str, run_context: RunContext) -> str:
    """Look a file up.

    Args:
        name: The file's name.
    """
    run_context.session_state.setdefault("looked_up", []).append(name)
    return f"{name} is here"


@tool(requires_confirmation=True)
def delete_file(path: str, run_context: RunContext) -> str:
    """Delete a file.

    Args:
        path: The file to delete.
    """
    run_context.session_state.setdefault("deleted", []).append(path)
    return f"deleted {path} (state had {sorted(run_context.session_state)})"


@tool(requires_user_input=True, user_input_fields=["to_address"])
def send_email(subject: str, body: str, to_address: str, run_context: RunContext) -> str:
    """Send an email.

    Args:
        subject: The subject line.
        body: The text.
        to_address: Who gets it.
    """
    run_context.session_state.setdefault("sent", []).append([to_address, subject, body])
    return f"sent {subject!r} to {to_address}"


@tool(external_execution=True)
def run_shell(command: str) -> str:
    """Run a shell command on the user's machine.

    Args:
        command: The command.
    """
    raise AssertionError("an external tool never runs in the engine")


TOOLS = [lookup, delete_file, send_email, run_shell]


class HumanInTheLoopMixin(EngineTestMixin):
    def shopper(self, **options):
        options.setdefault("tools", TOOLS)
        options.setdefault("user_id", "ann")
        options.setdefault("session_id", "s")
        return self.agent(**options)

    def pause_on_delete(self, agent=None, **kwargs):
        """A run whose model looks a file up and asks to delete another in one turn: it pauses."""
        self.llm.add(ToolCalls([("lookup", {"name": "notes.txt"}), ("delete_file", {"path": "a.txt"})]))
        return (agent or self.shopper()).run("tidy up", **kwargs)

    def stored(self, run_id: str) -> Run:
        return Run.objects.get(run_id=run_id)


class TestDeclaringTools(EngineTestMixin, TestCase):
    def test_the_decorator_takes_agnos_options_and_checks_them(self):
        assert delete_file.requires_confirmation and delete_file.needs_person
        assert send_email.requires_user_input and send_email.user_input_fields == ["to_address"]
        assert run_shell.external_execution
        # The model is not asked for what the user gives.
        assert set(send_email.parameters["properties"]) == {"subject", "body"}
        assert send_email.parameters["required"] == ["subject", "body"]
        assert [(f.name, f.field_type) for f in send_email.user_input_schema] == [
            ("subject", str), ("body", str), ("to_address", str)]
        assert tool(lookup).name == "lookup" and not tool(lookup).needs_person  # bare @tool
        with pytest.raises(ValueError, match="Only one of"):
            tool(requires_confirmation=True, external_execution=True)
        with pytest.raises(ValueError, match="Invalid tool configuration arguments"):
            tool(requires_confirmaton=True)
        with pytest.raises(ValueError, match="user_input_fields names no argument"):
            tool(user_input_fields=["nope"])(lookup)

    def test_a_toolkit_flags_its_tools_by_name(self):
        def rename(old: str, new: str) -> str:
            """Rename a file."""
            return f"{old} -> {new}"

        toolkit = Toolkit(tools=[lookup, delete_file, rename], requires_confirmation_tools=["lookup"],
                          requires_user_input_tools=["rename"], external_execution_required_tools=["missing"])
        with self.assertLogs("sessions_core", "WARNING") as logs:
            functions = {function.name: function for function in toolkit.functions()}
        assert "missing" in logs.output[0]
        assert functions["lookup"].requires_confirmation
        assert functions["rename"].requires_user_input and functions["rename"].parameters["required"] == ["old", "new"]
        assert [field.name for field in functions["rename"].user_input_schema] == ["old", "new"]
        assert functions["delete_file"].requires_confirmation  # its own flag stays
        with pytest.raises(ValueError, match="two lists"):
            Toolkit(tools=[lookup], requires_confirmation_tools=["lookup"],
                    external_execution_required_tools=["lookup"])
        with pytest.raises(ValueError, match="Only one of"):  # a list that contradicts the tool's own flag
            Toolkit(tools=[delete_file], external_execution_required_tools=["delete_file"]).functions()


class TestPause(HumanInTheLoopMixin, TestCase):
    def test_the_run_pauses_before_the_tool_runs_and_the_other_calls_run(self):
        output = self.pause_on_delete()

        assert (output.status, output.is_paused) == (RunStatus.PAUSED, True)
        assert output.content == "I have tools to execute, but I need confirmation."
        (requirement,) = output.active_requirements
        assert output.requirements == [requirement] and isinstance(requirement, RunRequirement)
        execution = requirement.tool_execution
        assert (execution.tool_name, execution.tool_args, execution.tool_call_id) == ("delete_file", {"path": "a.txt"},
                                                                                     "call_2")
        assert requirement.needs_confirmation and output.tools_requiring_confirmation == [execution]
        assert output.session_state == {"looked_up": ["notes.txt"]}  # the other call ran; delete_file did not
        assert len(self.llm.requests) == 1  # no model call after the pause

    def test_the_pause_is_stored_like_a_finish_and_releases_the_lease(self):
        output = self.pause_on_delete()

        run = self.stored(output.run_id)
        assert (run.status, run.finished_at, run.state_version) == (RunStatus.PAUSED, None, 1)
        assert [(r["tool_execution"]["tool_name"], r["tool_execution"]["tool_args"]) for r in run.requirements] == [
            ("delete_file", {"path": "a.txt"})]
        assert [(m.role, m.tool_name) for m in run.messages.order_by("seq")] == [
            ("user", ""), ("assistant", ""), ("tool", "lookup")]
        change = StateChange.objects.get()
        assert (change.run_id, change.version, change.source) == (run.pk, 1, "tool:lookup")
        session = ChatSession.objects.get(session_id="s")
        assert (session.session_state, session.state_version) == ({"looked_up": ["notes.txt"]}, 1)
        assert session.lease_token == "" and not session.is_running

    def test_a_stream_ends_with_run_paused_with_or_without_events(self):
        self.llm.add(ToolCalls([("lookup", {"name": "x"}), ("delete_file", {"path": "a.txt"})], text="Let me see."))
        events = list(self.shopper().run("tidy up", stream=True, stream_events=True))
        assert kinds(events) == ["RunStarted", "RunContent", "RunContent", "RunContent", "ToolCallStarted",
                                 "ToolCallCompleted", "StateChanged", "RunPaused"]
        paused = events[-1]
        assert paused.is_paused and [r.tool_execution.tool_name for r in paused.active_requirements] == ["delete_file"]
        assert [tool.tool_name for tool in paused.tools] == ["delete_file"]

        self.llm.add(ToolCalls([("delete_file", {"path": "b.txt"})]))
        events = list(self.shopper(session_id="t").run("tidy up", stream=True))
        assert kinds(events) == ["RunPaused"]

    def test_a_step_below_a_workflows_top_level_never_runs_such_a_tool_unanswered(self):
        from sessions_core import Parallel, Workflow

        agent = self.agent(name="Helper", tools=[delete_file])
        workflow = Workflow(name="W", steps=[Parallel(agent)], user_id="ann", session_id="wf")
        self.llm.add(ToolCalls([("delete_file", {"path": "a.txt"})]), Text("I could not."))
        output = workflow.run("delete a.txt")

        assert output.status == RunStatus.COMPLETED and "deleted" not in output.session_state
        assert "waits for a person's answer" in self.llm.requests[1]["messages"][-1]["content"]


class TestContinue(HumanInTheLoopMixin, TestCase):
    def test_a_confirmed_call_runs_and_the_model_goes_on_under_the_same_run_id(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        self.llm.add(Text("Deleted it."))

        result = agent.continue_run(run_response=output)

        assert (result.run_id, result.status, result.content) == (output.run_id, RunStatus.COMPLETED, "Deleted it.")
        assert result.session_state == {"looked_up": ["notes.txt"], "deleted": ["a.txt"]}
        assert result.metrics["model_calls"] == 2  # the paused part's and the continuation's
        sent = self.llm.requests[-1]["messages"]
        assert [(m["role"], m.get("tool_call_id")) for m in sent if m["role"] != "system"] == [
            ("user", None), ("assistant", None), ("tool", "call_1"), ("tool", "call_2")]
        assert sent[-1]["content"].startswith("deleted a.txt")
        run = self.stored(output.run_id)
        assert (run.status, run.content, Run.objects.count()) == (RunStatus.COMPLETED, "Deleted it.", 1)
        assert [m.role for m in run.messages.order_by("seq")] == ["user", "assistant", "tool", "tool", "assistant"]

    def test_a_rejected_call_tells_the_model_with_the_note(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].reject(note="not today")
        self.llm.add(Text("Kept it."))

        result = agent.continue_run(run_response=output)

        assert result.status == RunStatus.COMPLETED and "deleted" not in result.session_state
        tool_message = self.llm.requests[-1]["messages"][-1]
        assert tool_message == {"role": "tool", "tool_call_id": "call_2",
                                "content": "Function call was rejected by the user. Note: not today"}
        (record,) = self.stored(output.run_id).requirements
        assert (record["confirmation"], record["confirmation_note"], record["answered_by"]) == (False, "not today",
                                                                                               "ann")
        assert record["answered_at"] >= record["created_at"]
        assert Message.objects.get(tool_call_id="call_2").tool_error

    def test_user_input_fills_the_named_arguments(self):
        agent = self.shopper()
        self.llm.add(ToolCalls([("send_email", {"subject": "Hello", "body": "Hi Bob"})]))
        output = agent.run("mail bob")
        assert "to_address" not in json.dumps(self.llm.requests[0]["tools"])  # not asked of the model
        (requirement,) = output.active_requirements
        assert output.content == "I have tools to execute, but I need user input."
        assert [(f.name, f.value) for f in requirement.user_input_schema] == [
            ("subject", "Hello"), ("body", "Hi Bob"), ("to_address", None)]
        assert isinstance(requirement.user_input_schema[0], UserInputField) and requirement.needs_user_input

        requirement.provide_user_input({"to_address": "bob@example.com"})
        self.llm.add(Text("Sent."))
        result = agent.continue_run(run_response=output)

        assert result.session_state["sent"] == [["bob@example.com", "Hello", "Hi Bob"]]
        assert self.llm.requests[-1]["messages"][-1]["content"] == "sent 'Hello' to bob@example.com"
        assert self.stored(output.run_id).requirements[0]["user_input"] == {"to_address": "bob@example.com"}
        with pytest.raises(ValueError, match="no input field named nope"):
            RunRequirement.for_call("c", {}, send_email).provide_user_input({"nope": 1})

    def test_an_external_result_becomes_the_calls_result(self):
        agent = self.shopper()
        self.llm.add(ToolCalls([("run_shell", {"command": "ls"})]))
        output = agent.run("what is there?")
        assert output.tools_awaiting_external_execution[0].tool_args == {"command": "ls"}
        output.requirements[0].set_external_execution_result("app.log backup.tar")
        self.llm.add(Text("Two files."))

        result = agent.continue_run(run_response=output)

        assert result.content == "Two files."
        assert self.llm.requests[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                                         "content": "app.log backup.tar"}

    def test_a_fresh_agent_continues_by_run_id_with_what_the_run_stored(self):
        output = self.pause_on_delete()
        fresh = self.agent(tools=TOOLS)  # no session or user of its own

        stored = fresh.get_run_output(run_id=output.run_id, session_id="s", user_id="ann")
        assert stored.is_paused and stored.content == output.content
        (requirement,) = stored.active_requirements
        requirement.tool_execution.tool_args["path"] = "/"  # only the answer is taken, never the call
        requirement.confirm()
        self.llm.add(Text("Done."))
        result = fresh.continue_run(run_id=output.run_id, session_id="s", user_id="ann", requirements=[requirement])

        assert result.run_id == output.run_id and result.session_state["deleted"] == ["a.txt"]
        assert fresh.get_run_output(run_id=output.run_id, session_id="s", user_id="ann").status == "completed"
        with pytest.raises(ValueError, match="Session ID is required"):
            fresh.continue_run(run_id=output.run_id)

    def test_the_continuation_works_with_the_sessions_current_state(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        agent.update_session_state({"note": "made during the pause"})
        output.requirements[0].confirm()
        self.llm.add(Text("Done."))

        result = agent.continue_run(run_response=output)

        assert "'note'" in Message.objects.get(tool_call_id="call_2").content  # the tool saw it
        assert result.session_state == {"looked_up": ["notes.txt"], "note": "made during the pause",
                                        "deleted": ["a.txt"]}
        versions = list(StateChange.objects.order_by("version").values_list("version", "source", "run__run_id"))
        assert versions == [(1, "tool:lookup", output.run_id), (2, "manual", None),
                            (3, "tool:delete_file", output.run_id)]

    def test_another_run_goes_on_while_one_is_paused_and_sees_it_only_once_it_completed(self):
        agent = self.shopper(add_history_to_context=True)
        output = self.pause_on_delete(agent)
        self.llm.add(Text("Hello."))
        between = agent.run("hi")  # no lease held: it runs at once
        assert between.status == RunStatus.COMPLETED
        assert [m["role"] for m in self.llm.requests[-1]["messages"]] == ["user"]  # the paused run is not history

        output.requirements[0].confirm()
        self.llm.add(Text("Deleted."), Text("Bye."))
        agent.continue_run(run_response=output)
        assert [m.get("content") for m in self.llm.requests[-1]["messages"]][:2] == ["hi", "Hello."]
        agent.run("bye")

        # Later runs see the continued run whole (a tool call is followed by its results), then the other.
        sent = [(m["role"], m.get("tool_call_id") or m.get("content")) for m in self.llm.requests[-1]["messages"]]
        assert sent == [("user", "tidy up"), ("assistant", None), ("tool", "call_1"), ("tool", "call_2"),
                        ("assistant", "Deleted."), ("user", "hi"), ("assistant", "Hello."), ("user", "bye")]

    def test_it_may_pause_again_under_the_same_run_id(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        self.llm.add(ToolCalls([("delete_file", {"path": "b.txt"})]))

        again = agent.continue_run(run_response=output)

        assert (again.run_id, again.status) == (output.run_id, RunStatus.PAUSED)
        assert [r.tool_execution.tool_args["path"] for r in again.requirements] == ["a.txt", "b.txt"]
        assert [r.tool_execution.tool_args["path"] for r in again.active_requirements] == ["b.txt"]
        again.active_requirements[0].reject()
        self.llm.add(Text("Deleted a, kept b."))
        done = agent.continue_run(run_response=again)
        assert done.status == RunStatus.COMPLETED and done.session_state["deleted"] == ["a.txt"]
        records = self.stored(output.run_id).requirements
        assert [(r["tool_execution"]["tool_args"]["path"], r["confirmation"]) for r in records] == [
            ("a.txt", True), ("b.txt", False)]
        assert self.llm.requests[-1]["messages"][-1]["content"] == "Function call was rejected by the user."

    def test_a_streamed_continuation_starts_with_run_continued(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        self.llm.add(Text("All done."))

        events = list(agent.continue_run(run_response=output, stream=True, stream_events=True))

        assert kinds(events) == ["RunContinued", "ToolCallStarted", "ToolCallCompleted", "StateChanged",
                                 "RunContent", "RunContent", "RunCompleted"]
        assert {event.run_id for event in events} == {output.run_id}
        assert events[-1].session_state["deleted"] == ["a.txt"]

    async def test_acontinue_run_is_the_async_twin(self):
        agent = self.shopper()
        self.llm.add(ToolCalls([("delete_file", {"path": "a.txt"})]), Text("Gone."))
        output = await agent.arun("delete a.txt")
        output.requirements[0].confirm()

        events = [event async for event in agent.acontinue_run(run_response=output, stream=True)]

        assert [event.event for event in events] == [RunEvent.run_continued, RunEvent.run_content]
        assert (await agent.aget_run_output(output.run_id)).status == RunStatus.COMPLETED

    def test_store_tool_messages_false_drops_the_tool_traffic_once_the_run_completes(self):
        agent = self.shopper(store_tool_messages=False)
        output = self.pause_on_delete(agent)
        assert [m.role for m in self.stored(output.run_id).messages.all()] == ["user", "assistant", "tool"]
        output.requirements[0].confirm()
        self.llm.add(Text("Done."))

        agent.continue_run(run_response=output)

        assert [m.role for m in self.stored(output.run_id).messages.all()] == ["user", "assistant"]


class TestRefusals(HumanInTheLoopMixin, TestCase):
    """A continuation that cannot go on is a clear error that changes nothing."""

    def assert_refused(self, call, error, message=None):
        before, requests = snapshot("s"), len(self.llm.requests)
        with pytest.raises(error, match=message):
            call()
        assert snapshot("s") == before and len(self.llm.requests) == requests

    def test_an_unresolved_requirement(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)

        self.assert_refused(lambda: agent.continue_run(run_response=output), UnresolvedRequirementsError,
                            r"unresolved requirements: \['delete_file'\]")
        self.assert_refused(lambda: agent.continue_run(run_id=output.run_id), UnresolvedRequirementsError)
        assert self.stored(output.run_id).status == RunStatus.PAUSED

    def test_a_run_that_is_not_paused(self):
        agent = self.shopper()
        self.llm.add(Text("Hi."))
        done = agent.run("hello")

        self.assert_refused(lambda: agent.continue_run(run_id=done.run_id), RunNotContinuableError,
                            "it is completed, not paused")

    def test_another_agents_run_or_an_unknown_run(self):
        output = self.pause_on_delete()
        output.requirements[0].confirm()

        other = self.shopper(name="Other")
        self.assert_refused(lambda: other.continue_run(run_response=output), RunNotContinuableError,
                            "it is a run of 'tester', not of 'other'")
        self.assert_refused(lambda: self.shopper().continue_run(run_id="no-such-run"), RunNotFoundError)

    def test_a_pause_that_a_stop_from_another_process_reached_first_ends_cancelled(self):
        session = make_session(owner=make_user("ann"))
        stopped = make_run(session, status=RunStatus.RUNNING, cancel_requested=True)
        waiting = make_run(session, status=RunStatus.RUNNING)

        assert lifecycle.pause(stopped.pk, "default") == RunStatus.CANCELLED
        assert lifecycle.pause(waiting.pk, "default") == RunStatus.PAUSED
        assert lifecycle.resume(waiting.pk, "default") and not lifecycle.resume(waiting.pk, "default")
        assert dict(Run.objects.values_list("pk", "status")) == {stopped.pk: RunStatus.CANCELLED,
                                                                  waiting.pk: RunStatus.RUNNING}

    def test_another_users_run_by_id_or_by_its_output(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        make_users("bob")

        self.assert_refused(lambda: agent.continue_run(run_id=output.run_id, user_id="bob"), SessionOwnershipError)
        self.assert_refused(lambda: agent.continue_run(run_response=output, user_id="bob"), SessionOwnershipError)
        anonymous = self.agent(tools=TOOLS)
        self.assert_refused(lambda: anonymous.continue_run(run_response=output), SessionOwnershipError)
        assert self.stored(output.run_id).status == RunStatus.PAUSED

    def test_cancel_run_ends_a_paused_run_which_cannot_then_be_continued(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)

        assert Component.cancel_run(output.run_id)
        run = self.stored(output.run_id)
        assert run.status == RunStatus.CANCELLED and run.finished_at is not None
        output.requirements[0].confirm()
        self.assert_refused(lambda: agent.continue_run(run_response=output), RunNotContinuableError,
                            "it is cancelled, not paused")
        assert not Component.cancel_run(output.run_id)
        assert ChatSession.objects.get(session_id="s").session_state == {"looked_up": ["notes.txt"]}


class TestStatements(HumanInTheLoopMixin, TestCase):
    def pause_and_continue(self, session_id: str, earlier: int) -> int:
        owner, = make_users(f"owner-of-{session_id}")
        bulk_runs(ChatSession.objects.create(session_id=session_id, owner=owner, component_id="tester"), earlier)
        agent = self.shopper(session_id=session_id, user_id=owner.username, add_history_to_context=True)
        with CaptureQueriesContext(connection) as queries:
            output = self.pause_on_delete(agent)
            output.requirements[0].confirm()
            self.llm.add(Text("Done."))
            assert agent.continue_run(run_response=output).status == RunStatus.COMPLETED
        return len(queries)

    def test_a_pause_and_its_continuation_cost_the_same_in_a_long_session(self):
        assert self.pause_and_continue("short", 3) == self.pause_and_continue("long", 60)


class TestTwoContinuations(HumanInTheLoopMixin, TransactionTestCase):
    def test_of_two_simultaneous_continuations_exactly_one_wins(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        self.llm.responder = lambda body: Text("Deleted.")
        barrier, results = threading.Barrier(2), []

        def continue_once():
            try:
                barrier.wait(10)
                results.append(self.shopper().continue_run(run_response=output))
            except RunNotContinuableError as exc:
                results.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=continue_once) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

        won = [result for result in results if not isinstance(result, Exception)]
        lost = [result for result in results if isinstance(result, RunNotContinuableError)]
        assert len(won) == 1 and len(lost) == 1, results
        assert won[0].status == RunStatus.COMPLETED and "nothing was changed" in str(lost[0])
        session = ChatSession.objects.get(session_id="s")
        assert session.session_state["deleted"] == ["a.txt"]  # the tool ran once
        assert len(self.llm.requests) == 2 and Message.objects.filter(tool_call_id="call_2").count() == 1

    def test_a_continuation_waits_its_turn_while_another_run_holds_the_session(self):
        agent = self.shopper()
        output = self.pause_on_delete(agent)
        output.requirements[0].confirm()
        session_pk = ChatSession.objects.get(session_id="s").pk
        results = {}

        def in_thread(name, call):
            def work():
                try:
                    results[name] = call()
                finally:
                    connections.close_all()
            thread = threading.Thread(target=work)
            thread.start()
            return thread

        with Gate() as gate:
            self.llm.add(Text("Busy reply.", wait_event=gate), Text("Deleted."))
            other = in_thread("other", lambda: self.shopper().run("something else"))
            assert self.llm.wait_for_requests(2)  # the other run holds the lease, its reply held
            waiting = in_thread("continued", lambda: self.shopper().continue_run(run_response=output))
            until(lambda: registry._lease_waiters.get(session_pk))  # it waits for the lease
            assert self.stored(output.run_id).status == RunStatus.PAUSED and len(self.llm.requests) == 2
        other.join(30)
        waiting.join(30)

        assert results["other"].content == "Busy reply." and results["continued"].status == RunStatus.COMPLETED
        assert [request["messages"][-1].get("tool_call_id") for request in self.llm.requests[1:]] == [None, "call_2"]

    def test_the_pause_is_committed_for_other_connections(self):
        output = self.pause_on_delete()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(
            (Run.objects.values_list("status", flat=True).get(run_id=output.run_id),
             ChatSession.objects.get(session_id="s").session_state)) or connections.close_all())
        thread.start()
        thread.join(10)
        assert seen == [(RunStatus.PAUSED, {"looked_up": ["notes.txt"]})]


SCRIPT = """
import json, sys

from sessions_core import Agent, RunContext, tool


@tool(requires_confirmation=True)
def delete_file(path: str, run_context: RunContext) -> str:
    '''Delete a file.

    Args:
        path: The file to delete.
    '''
    run_context.session_state.setdefault("deleted", []).append(path)
    return "deleted " + path


agent = Agent(name="Tester", tools=[delete_file], user_id="ann", session_id="kept")
if sys.argv[1] == "pause":
    output = agent.run("delete a.txt")
else:  # a process that knows only the run's id
    output = agent.get_run_output(run_id=sys.argv[2])
    for requirement in output.active_requirements:
        requirement.confirm()
    output = agent.continue_run(run_response=output)
print(json.dumps({"run_id": output.run_id, "status": output.status, "content": output.content,
                  "state": output.session_state, "pid": __import__("os").getpid()}))
"""


class TestAnotherProcess(HumanInTheLoopMixin, TransactionTestCase):
    def run_script(self, *args: str) -> dict:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatapp.settings", "DATABASE_URL": database_url(),
               "OPENAI_BASE_URL": self.llm.base_url, "OPENAI_API_KEY": "test", "OPENAI_MODEL": "test-model"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def test_a_run_paused_by_one_process_is_continued_by_another_after_it_exited(self):
        self.llm.add(ToolCalls([("delete_file", {"path": "a.txt"})]), Text("Deleted a.txt."))

        paused = self.run_script("pause")  # the process exits here
        assert (paused["status"], paused["state"]) == ("paused", {})
        assert Run.objects.values_list("status", flat=True).get(run_id=paused["run_id"]) == RunStatus.PAUSED

        continued = self.run_script("continue", paused["run_id"])

        assert continued["pid"] != paused["pid"]
        assert (continued["run_id"], continued["status"], continued["content"]) == (
            paused["run_id"], "completed", "Deleted a.txt.")
        assert continued["state"] == {"deleted": ["a.txt"]}
        run = Run.objects.get(run_id=paused["run_id"])
        assert (run.status, run.requirements[0]["confirmation"], run.requirements[0]["answered_by"]) == (
            RunStatus.COMPLETED, True, "ann")
        assert [m.role for m in run.messages.order_by("seq")] == ["user", "assistant", "tool", "assistant"]
