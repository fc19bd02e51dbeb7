"""Workflows: one session state shared by every kind of step, stored as a tree of runs, with our contract
(SPEC Part 1 items 14-20) where Agno differs. Agent steps talk to the local test model server."""

import asyncio
import json
import threading

import pydantic
import pytest
from django.db import connection, connections
from django.db.models import F
from django.test import TestCase, TransactionTestCase
from django.test.utils import CaptureQueriesContext

from sessions_core import (
    Condition,
    Loop,
    Parallel,
    RunContext,
    Router,
    SessionNotFoundError,
    SessionOwnershipError,
    Step,
    StepInput,
    StepOutput,
    Steps,
    Workflow,
    WorkflowRunOutput,
)
from sessions_core.models import ChatSession, Message, Run, StateChange
from tests.support.engine_helpers import (
    EngineTestMixin,
    Gate,
    RefuseFinishOnce,
    bulk_runs,
    counts,
    kinds,
    make_users,
    refused_calls,
    tool_then_text,
)
from tests.support.llm_server import Text, ToolCalls
from tests.engine.test_memory_db import MemoryDbTestMixin


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the shopping list.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].append(item)
    return f"Added {item}"


def remove_item(item: str, run_context: RunContext) -> str:
    """Remove an item from the shopping list.

    Args:
        item: The item.
    """
    run_context.session_state["shopping_list"].remove(item)
    return f"Removed {item}"


def count_up(step_input: StepInput, run_context: RunContext) -> StepOutput:
    run_context.session_state["counter"] = run_context.session_state.get("counter", 0) + 1
    return StepOutput(content=f"counter is {run_context.session_state['counter']}")


class WorkflowTestCase(EngineTestMixin, TestCase):
    def shopper(self, **options):
        return self.agent(name="Shopper", tools=[add_item, remove_item], **options)

    def workflow(self, steps, **options):
        options.setdefault("name", "Shop")
        return Workflow(steps=steps, **options)


class TestStateSharing(WorkflowTestCase):
    def test_agent_function_condition_and_router_steps_share_one_state_that_persists(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))

        def has_milk(step_input, run_context):
            return "milk" in run_context.session_state["shopping_list"]

        def pick(step_input, run_context):
            run_context.session_state["routed"] = True
            return "counter"

        workflow = self.workflow([
            self.shopper(),
            Condition(evaluator=has_milk, steps=[Step(name="counted", executor=count_up)]),
            Router(selector=pick, choices=[Step(name="counter", executor=count_up), Step(name="other", executor=count_up)]),
        ], session_state={"shopping_list": []})

        output = workflow.run("add milk", session_id="w", user_id="alice")

        assert isinstance(output, WorkflowRunOutput) and output.status == "completed", output.error
        final = {"shopping_list": ["milk"], "counter": 2, "routed": True}
        assert output.session_state == final
        assert workflow.get_session_state(session_id="w", user_id="alice") == final
        assert output.content == "counter is 2" and output.workflow_id == "shop" and output.workflow_name == "Shop"
        assert [result.step_name for result in output.step_results] == ["Shopper", "condition", "router"]
        assert output.step_results[1].steps[0].content == "counter is 1"

    def test_the_tree_of_runs_their_messages_and_the_changes_naming_each_step(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        workflow = self.workflow([self.shopper(), Step(name="counter", executor=count_up)],
                                 session_state={"shopping_list": []})
        output = workflow.run("add milk", session_id="w", user_id="alice")

        session = ChatSession.objects.get(session_id="w")
        top = Run.objects.get(run_id=output.run_id)
        steps = list(top.children.order_by("id"))
        assert session.kind == "workflow" and top.kind == "workflow" and top.parent_run is None
        assert [(run.kind, run.step_name, run.status) for run in steps] == [
            ("agent", "Shopper", "completed"), ("function", "counter", "completed")]
        assert list(top.messages.values_list("role", "content")) == [("user", "add milk"),
                                                                    ("assistant", "counter is 1")]
        assert list(steps[0].messages.values_list("role", "content")) == [
            ("user", "add milk"), ("assistant", ""), ("tool", "Added milk"), ("assistant", "Added milk.")]
        assert not steps[1].messages.exists() and steps[1].input == "add milk"  # a function step: its input only
        assert [(c.source, c.run_id) for c in StateChange.objects.order_by("version")] == [
            ("defaults", top.pk), ("step:Shopper/tool:add_item", steps[0].pk), ("step:counter/function", steps[1].pk)]
        seqs = list(Message.objects.filter(session=session).values_list("seq", flat=True))
        assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1)) and session.last_seq == len(seqs)

    def test_while_a_step_runs_the_steps_before_it_are_stored_as_they_ended(self):
        # (A step's row is stored as it starts and its end as it ends: a reload mid-run draws both.)
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."), Text("Second."))
        seen = {}

        def look(step_input, run_context):
            seen[len(seen)] = list(Run.objects.filter(parent_run__run_id=run_context.run_id).order_by("id").values_list(
                "step_name", "status", "content"))
            return "looked"

        workflow = self.workflow([Step(name="first", executor=count_up), Step(name="look1", executor=look),
                                  self.shopper(), Step(name="look2", executor=look), self.agent(name="Second")],
                                 session_state={"shopping_list": []})
        output = workflow.run("add milk", session_id="w")

        assert output.status == "completed", output.error
        assert seen == {
            0: [("first", "completed", "counter is 1"), ("look1", "running", "")],
            1: [("first", "completed", "counter is 1"), ("look1", "completed", "looked"),
                ("Shopper", "completed", "Added milk."), ("look2", "running", "")],
        }
        steps = Run.objects.get(run_id=output.run_id).children.order_by("id")
        assert [(run.step_name, run.status) for run in steps] == [
            ("first", "completed"), ("look1", "completed"), ("Shopper", "completed"), ("look2", "completed"),
            ("Second", "completed")]
        assert list(steps[4].messages.values_list("role", "content")) == [("user", "looked"), ("assistant", "Second.")]

    def test_a_step_agent_runs_as_the_runs_user_and_its_defaults_fill_missing_keys(self):
        seen = {}

        def whoami(run_context: RunContext) -> str:
            """Say who is asking."""
            seen["user"], seen["session"] = run_context.user_id, run_context.session_id
            return "ok"

        self.llm.add(ToolCalls([("whoami", {})]), Text("done"))
        agent = self.agent(name="Who", tools=[whoami], session_state={"agent_key": 1, "shared": "agent"})
        workflow = self.workflow([agent], session_state={"shared": "workflow"}, user_id="default-user")

        workflow.run("hi", session_id="w", user_id="bob")

        assert seen == {"user": "bob", "session": "w"}
        assert workflow.get_session_state(session_id="w", user_id="bob") == {"shared": "workflow", "agent_key": 1}
        assert ChatSession.objects.count() == 1  # the step agent made no session of its own

    def test_injected_keys_are_seen_and_never_stored_and_user_keys_of_those_names_are_kept(self):
        seen = {}

        def look(step_input, run_context):
            seen.update(run_context.session_state)
            run_context.session_state["run_id"] = "mine"

        workflow = self.workflow([look], session_state={"session_id": "user value"})
        output = workflow.run("hi", session_id="w", user_id="alice")

        assert seen["workflow_id"] == "shop" and seen["workflow_name"] == "Shop"
        assert seen["current_user_id"] == "alice" and seen["current_session_id"] == "w"
        assert seen["current_run_id"] == output.run_id
        stored = {"session_id": "user value", "run_id": "mine"}
        assert output.session_state == stored and ChatSession.objects.get().session_state == stored

    def test_precedence_and_overwrite_mode(self):
        workflow = self.workflow([count_up], session_state={"a": "default", "counter": 0})
        workflow.run("1", session_id="w", session_state={"a": "run", "b": 1})
        assert workflow.get_session_state(session_id="w") == {"a": "run", "b": 1, "counter": 1}
        workflow.run("2", session_id="w")
        assert workflow.get_session_state(session_id="w") == {"a": "run", "b": 1, "counter": 2}

        overwriting = self.workflow([count_up], session_state={"a": "default"}, overwrite_db_session_state=True)
        overwriting.run("3", session_id="w", session_state={"c": True})
        assert overwriting.get_session_state(session_id="w") == {"c": True, "a": "default", "counter": 1}
        overwriting.run("4", session_id="w")  # no run state: kept (Agno wipes it)
        assert overwriting.get_session_state(session_id="w") == {"c": True, "a": "default", "counter": 2}

    def test_a_structured_step_output_is_the_next_steps_input(self):
        class Job(pydantic.BaseModel):
            company: str
            role: str

        self.llm.add(Text('{"company": "Acme", "role": "engineer"}'), Text("Saved."))
        seen = {}

        def keep(step_input):
            seen["content"] = step_input.previous_step_content
            return "kept"

        extractor = self.agent(name="Extract", output_schema=Job)
        tracker = self.agent(name="Track")
        workflow = self.workflow([extractor, tracker, keep])
        workflow.run("I applied to Acme as an engineer", session_id="w")

        assert self.sent(-1)[-1] == {"role": "user", "content": '{"company":"Acme","role":"engineer"}'}
        assert seen["content"] == "Saved."
        assert self.llm.requests[0]["response_format"]["json_schema"]["name"] == "Job"


class TestExecutors(WorkflowTestCase):
    def test_every_kind_of_executor_edits_the_state_and_passes_its_content_on(self):
        def plain(step_input, session_state):
            session_state["seen"].append("plain")
            return "plain done"

        async def awaited(step_input, session_state):
            await asyncio.sleep(0)
            session_state["seen"].append("awaited")
            return StepOutput(content="awaited done")

        def generator(step_input, session_state):
            session_state["seen"].append("generator")
            yield "gene"
            yield "rator done"

        async def async_generator(step_input, session_state):
            await asyncio.sleep(0)
            session_state["seen"].append("async generator")
            yield "async "
            yield StepOutput(content=f"generator done after {step_input.previous_step_content}")

        output = self.workflow([plain, awaited, generator, async_generator], session_state={"seen": []}).run(
            "go", session_id="w")

        assert output.status == "completed", output.error
        assert [result.content for result in output.step_results] == [
            "plain done", "awaited done", "generator done", "generator done after generator done"]
        assert output.session_state == {"seen": ["plain", "awaited", "generator", "async generator"]}
        assert list(StateChange.objects.order_by("version").values_list("source", flat=True)) == ["defaults", *(
            f"step:{name}/function" for name in ("plain", "awaited", "generator", "async_generator"))]


class TestInMemoryDb(MemoryDbTestMixin, WorkflowTestCase):
    def test_state_carries_over_between_runs_with_an_in_memory_db(self):
        workflow = self.workflow([count_up], session_state={"counter": 0}, db=self.db)
        workflow.run("1", session_id="w")
        output = workflow.run("2", session_id="w")
        assert output.session_state == {"counter": 2} == workflow.get_session_state(session_id="w")
        assert not ChatSession.objects.exists()  # all of it in the in-memory database


class TestFailures(WorkflowTestCase):
    def failing(self, fails: list):
        def flaky(step_input, run_context):
            run_context.session_state["attempts"] = run_context.session_state.get("attempts", 0) + 1
            if fails and fails.pop(0):
                raise RuntimeError("boom")
            return "fine"
        return flaky

    def test_by_default_a_failing_step_fails_the_run_loudly_and_the_state_stays_as_before(self):
        workflow = self.workflow([count_up, Step(name="flaky", executor=self.failing([False, True])), count_up],
                                 session_state={"counter": 0})
        assert workflow.run("first", session_id="w").status == "completed"
        stored = {"counter": 2, "attempts": 1}
        assert workflow.get_session_state(session_id="w") == stored
        events = list(workflow.run("second", session_id="w", stream=True, stream_events=True))

        assert kinds(events)[-1] == "WorkflowError"
        assert "Step 'flaky' failed: RuntimeError: boom" in events[-1].content
        assert "StepError" in kinds(events)
        assert workflow.get_session_state(session_id="w") == stored  # as it was before the failed run
        last = workflow.get_last_run_output(session_id="w")
        assert last.status == "error" and "Step 'flaky' failed" in last.error
        top = Run.objects.get(run_id=last.run_id)
        assert list(top.children.order_by("id").values_list("step_name", "status")) == [
            ("count_up", "completed"), ("flaky", "error")]  # the third step never started

    def test_skip_goes_on_without_the_failed_steps_own_changes(self):
        workflow = self.workflow([count_up, Step(name="flaky", executor=self.failing([True]), on_error="skip"),
                                  count_up], session_state={"counter": 0})
        output = workflow.run("go", session_id="w")

        assert output.status == "completed"
        assert output.session_state == {"counter": 2}  # the failed step's "attempts" was undone
        failed = output.step_results[1]
        assert (failed.success, failed.error) == (False, "Step 'flaky' failed: RuntimeError: boom")
        sources = list(StateChange.objects.order_by("version").values_list("source", flat=True))
        assert sources == ["defaults", "step:count_up/function", "step:flaky/function", "step:flaky/undone",
                           "step:count_up/function"]

    def test_retries_run_a_failing_step_again_and_keep_only_the_successful_attempts_changes(self):
        workflow = self.workflow([Step(name="flaky", executor=self.failing([True, True, False]), max_retries=2)])
        output = workflow.run("go", session_id="w")

        assert output.status == "completed" and output.content == "fine"
        assert output.session_state == {"attempts": 1}
        statuses = list(Run.objects.filter(parent_run__isnull=False).order_by("id").values_list("status", flat=True))
        assert statuses == ["error", "error", "completed"]

    def test_retries_exhausted_then_the_policy_applies(self):
        workflow = self.workflow([Step(name="flaky", executor=self.failing([True, True]), max_retries=1)])
        output = workflow.run("go", session_id="w")
        assert output.status == "error" and output.session_state == {}
        assert Run.objects.filter(parent_run__isnull=False).count() == 2

    def test_a_router_choosing_a_name_outside_its_choices_is_an_error(self):
        workflow = self.workflow([Router(selector=lambda step_input: "nowhere", choices=[Step(name="a", executor=count_up)],
                                         name="pick")])
        output = workflow.run("go", session_id="w")
        assert output.status == "error"
        assert "Router 'pick' chose 'nowhere', which is not one of its choices ('a')" in output.error

    def test_stop_ends_the_workflow_early_and_successfully(self):
        def stopper(step_input):
            return StepOutput(content="enough", stop=True)

        workflow = self.workflow([count_up, Steps(steps=[stopper, count_up]), count_up])
        output = workflow.run("go", session_id="w")
        assert (output.status, output.content, output.session_state) == ("completed", "enough", {"counter": 1})


class TestRefusedFinish(WorkflowTestCase):
    def test_a_database_refusing_the_outcome_leaves_no_step_running(self):
        # Each step's end is stored as it ends; the workflow's refused finish leaves none running.
        refuse_once = RefuseFinishOnce()
        self.llm.add(Text("A reply that is lost."))
        workflow = self.workflow([Step(name="count", executor=count_up), self.agent(name="Replier")])
        with connection.execute_wrapper(refuse_once):
            output = workflow.run("hello", session_id="w")

        assert refuse_once.refused and output.status == "error" and "could not be stored" in output.error
        top = Run.objects.get(run_id=output.run_id)
        assert top.status == "error" and not ChatSession.objects.get(session_id="w").lease_token
        assert [(run.step_name, run.status, run.finished_at is not None) for run in top.children.order_by("id")] == [
            ("count", "completed", True), ("Replier", "completed", True)]

    def test_a_function_step_whose_row_was_to_go_with_the_refused_outcome_is_stored_as_it_ended(self):
        refuse_once = RefuseFinishOnce()
        self.llm.add(Text("A reply."))
        workflow = self.workflow([self.agent(name="Replier"), Step(name="count", executor=count_up)])
        with connection.execute_wrapper(refuse_once):
            output = workflow.run("hello", session_id="w")

        assert refuse_once.refused and output.status == "error"
        top = Run.objects.get(run_id=output.run_id)
        assert [(run.step_name, run.status, run.content) for run in top.children.order_by("id")] == [
            ("Replier", "completed", "A reply."), ("count", "completed", "counter is 1")]
        assert not StateChange.objects.exists()  # the outcome, with its changes, was refused


class TestEditedDuringTheRun(WorkflowTestCase):
    def test_a_function_steps_change_names_its_row_when_the_finish_merges_onto_an_edit(self):
        def edit_then_count(step_input, run_context):
            # Someone else writes the session meanwhile: the finish finds the state moved and merges.
            ChatSession.objects.filter(session_id="w").update(session_state={"counter": 10, "note": "edited"},
                                                               state_version=F("state_version") + 1)
            return count_up(step_input, run_context)

        workflow = self.workflow([Step(name="first", executor=count_up), Step(name="edit", executor=edit_then_count)])
        output = workflow.run("go", session_id="w")

        assert output.status == "completed", output.error
        # The changes replay onto the edit as patches: the second step set the counter to 2.
        assert workflow.get_session_state(session_id="w") == {"counter": 2, "note": "edited"}
        steps = {run.step_name: run.pk for run in Run.objects.get(run_id=output.run_id).children.all()}
        assert list(StateChange.objects.order_by("version").values_list("source", "run_id")) == [
            ("step:first/function", steps["first"]), ("step:edit/function", steps["edit"])]


class TestContainers(WorkflowTestCase):
    def test_a_loop_without_an_end_condition_runs_max_iterations_times(self):
        output = self.workflow([Loop(steps=[count_up], max_iterations=4)]).run("go", session_id="w")
        assert output.session_state == {"counter": 4} and len(output.step_results[0].steps) == 4

    def test_a_loop_with_an_end_condition_stops_when_it_is_true(self):
        def enough(outputs):
            return outputs[-1].content == "counter is 2"

        output = self.workflow([Loop(steps=[count_up], max_iterations=10, end_condition=enough)]).run("go", session_id="w")
        assert output.session_state == {"counter": 2}

    def test_a_condition_not_met_skips_and_says_so_else_steps_run_otherwise(self):
        workflow = self.workflow([Condition(evaluator=False, steps=[count_up], name="never")])
        assert workflow.run("go", session_id="w").content == "Condition never not met - skipped 1 steps"
        workflow = self.workflow([Condition(evaluator=lambda step_input: False, steps=[count_up],
                                            else_steps=[Step(name="else", executor=lambda si: "else ran")])])
        assert workflow.run("go", session_id="v").content == "else ran"


class TestParallel(EngineTestMixin, TransactionTestCase):
    def test_two_branches_incrementing_one_counter_lose_no_update(self):
        async def increment(step_input, run_context):
            for _ in range(100):
                value = run_context.session_state["counter"]
                await asyncio.sleep(0)  # a yield point between the read and the write, where a race would be
                run_context.session_state["counter"] = value + 1

        def add_ten(step_input, run_context):
            run_context.session_state["counter"] += 10

        workflow = Workflow(name="P", steps=[Parallel(Step(name="a", executor=increment),
                                                      Step(name="b", executor=increment),
                                                      Step(name="c", executor=add_ten))],
                            session_state={"counter": 0})
        output = workflow.run("go", session_id="p")
        assert output.session_state == {"counter": 210} == workflow.get_session_state(session_id="p")
        assert [result.step_name for result in output.step_results[0].steps] == ["a", "b", "c"]

    def test_branch_model_calls_overlap_and_the_next_step_sees_every_branch(self):
        with Gate() as held:
            def respond(body):
                name = body["messages"][0]["content"]
                if "First" in name:
                    return Text("first done", wait_event=held)
                held.set()  # the second branch's request arrived while the first's reply is held: overlap
                return Text("second done")

            self.llm.responder = respond
            seen = {}

            def after(step_input):
                seen["content"] = step_input.previous_step_content

            first = self.agent(name="First", instructions="First")
            second = self.agent(name="Second", instructions="Second")
            workflow = Workflow(name="P", steps=[Parallel(first, second), after])
            output = workflow.run("go", session_id="p")

        assert output.status == "completed", output.error
        assert len(self.llm.requests) == 2
        assert seen["content"] == "## First\n\nfirst done\n\n## Second\n\nsecond done"


class TestEvents(WorkflowTestCase):
    def test_events_in_order_nested_with_run_and_parent_ids(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added."))
        workflow = self.workflow([self.shopper(), Condition(evaluator=True, steps=[count_up])],
                                 session_state={"shopping_list": []})
        events = list(workflow.run("add milk", session_id="w", stream=True, stream_events=True))

        assert kinds(events) == [
            "WorkflowStarted", "StepStarted", "RunStarted", "ToolCallStarted", "ToolCallCompleted", "StateChanged",
            "RunContent", "RunCompleted", "StepCompleted", "ConditionExecutionStarted", "StepStarted", "RunStarted",
            "StateChanged", "RunCompleted", "StepCompleted", "ConditionExecutionCompleted", "WorkflowCompleted"]
        top = events[0].run_id
        step_run = events[1].run_id
        assert all(e.parent_run_id == top for e in events[1:3]) and events[2].run_id == step_run
        assert events[5].source == "step:Shopper/tool:add_item" and events[5].step_name == "Shopper"
        assert events[-1].session_state == {"shopping_list": ["milk"], "counter": 1}
        assert events[-1].run_id == top and events[-1].parent_run_id == ""

    def test_without_executor_events_steps_and_state_changes_still_arrive(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added."))
        workflow = self.workflow([self.shopper()], session_state={"shopping_list": []}, stream_executor_events=False)
        events = list(workflow.run("add milk", session_id="w", stream=True, stream_events=True))
        assert kinds(events) == ["WorkflowStarted", "StepStarted", "StateChanged", "StepCompleted",
                                 "WorkflowCompleted"]


class TestHistory(WorkflowTestCase):
    def test_print_response_takes_agnos_display_options(self):
        import contextlib
        import io

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            self.workflow([count_up]).print_response("go", session_id="w", markdown=True, show_message=False)
        assert printed.getvalue() == "counter is 1\n"

    def test_a_stream_without_events_is_the_steps_text_and_the_workflows_own_error(self):
        import contextlib
        import io

        self.llm.responder = tool_then_text("add_item", lambda body: {"item": "milk"}, reply="Added milk.")
        workflow = self.workflow([self.shopper(), count_up], session_state={"shopping_list": [], "counter": 0})
        events = list(workflow.run("add milk", session_id="w", stream=True))
        assert set(kinds(events)) == {"RunContent"} and "".join(e.content for e in events) == "Added milk."

        printed = io.StringIO()  # each run's text on its line, and the function step's, which was not streamed
        with contextlib.redirect_stdout(printed):
            workflow.print_response("add milk", session_id="w", stream=True)
        assert printed.getvalue() == "Added milk.\ncounter is 2\n"

        def boom(step_input):
            raise RuntimeError("boom")

        failing = self.workflow([count_up, Step(name="flaky", executor=boom)])
        events = list(failing.run("go", session_id="w2", stream=True))
        assert kinds(events) == ["WorkflowError"] and "Step 'flaky' failed" in events[0].content

    def test_chat_history_is_the_workflows_input_and_output_pairs(self):
        workflow = self.workflow([count_up])
        workflow.run("one", session_id="w")
        workflow.run("two", session_id="w")
        history = workflow.get_chat_history(session_id="w")
        assert [(m.role, m.content) for m in history] == [("user", "one"), ("assistant", "counter is 1"),
                                                           ("user", "two"), ("assistant", "counter is 2")]

    def test_workflow_history_reaches_agent_steps_with_the_workflow_window_and_a_steps_own_window_winning(self):
        self.llm.responder = lambda body: Text("ok")
        plain = self.agent(name="Plain")
        workflow = self.workflow([plain], add_workflow_history_to_steps=True, num_history_runs=1)
        for text in ("one", "two", "three"):
            workflow.run(text, session_id="w")
        sent = self.sent(-1)[-1]["content"]
        assert sent.startswith("<workflow_history_context>\n[Workflow Run-1]\nUser input: two\n")
        assert "one" not in sent and sent.endswith("</workflow_history_context>\n\nthree")

        own = self.workflow([Step(agent=plain, num_history_runs=2)], add_workflow_history_to_steps=True,
                            num_history_runs=1)
        own.run("four", session_id="w")
        assert "User input: two" in self.sent(-1)[-1]["content"] and "User input: three" in self.sent(-1)[-1]["content"]

    def test_a_step_agent_with_history_sees_its_own_earlier_step_runs(self):
        self.llm.responder = lambda body: Text(f"about {body['messages'][-1]['content']}")
        agent = self.agent(name="Remembers", add_history_to_context=True, num_history_runs=1)
        workflow = self.workflow([agent])
        for text in ("one", "two", "three"):
            workflow.run(text, session_id="w")
        assert self.sent_pairs(-1) == [("user", "two"), ("assistant", "about two"), ("user", "three")]

    def test_a_step_agent_in_a_loop_sees_its_run_of_the_iteration_before(self):
        # That run's end waits for the next write, the next iteration's start, whose history must see it.
        self.llm.responder = lambda body: Text(f"round {len(self.llm.requests)}")
        agent = self.agent(name="Remembers", add_history_to_context=True, num_history_runs=1)
        self.workflow([Loop(steps=[agent], max_iterations=2)]).run("go", session_id="w")
        first, second = self.sent_pairs(0), self.sent_pairs(1)
        assert first == [("user", "go")]
        assert second[:2] == [("user", "go"), ("assistant", "round 1")] and len(second) == 3
        steps = Run.objects.filter(parent_run__isnull=False, kind="agent").order_by("pk")
        assert [(run.status, run.content) for run in steps] == [("completed", "round 1"), ("completed", "round 2")]


class TestNamingAndAccessors(WorkflowTestCase):
    def test_autogenerated_name_without_a_model_call(self):
        workflow = self.workflow([count_up], description="Automated article creation from research and writing")
        with pytest.raises(SessionNotFoundError):
            workflow.set_session_name(session_id="w", autogenerate=True)
        workflow.run("go", session_id="w")
        session = workflow.set_session_name(session_id="w", autogenerate=True)
        stamp = ChatSession.objects.get().created_at.strftime("%Y-%m-%d %H:%M")
        assert session.session_name == f"Automated article creation from research- - {stamp}"
        assert self.llm.requests == []
        bare = self.workflow([count_up], name="Bare")
        bare.run("go", session_id="b")
        assert bare.get_session_name(session_id="b") == ""
        assert bare.set_session_name(session_id="b", autogenerate=True).session_name.startswith("Workflow Session-")

    def test_every_accessor_refuses_another_users_session_and_writes_nothing(self):
        make_users("alice", "mallory")
        workflow = self.workflow([count_up])
        workflow.run("go", session_id="w", user_id="alice")
        before = counts()
        for call in refused_calls(workflow, "w", "mallory"):
            with self.subTest(call=call), pytest.raises(SessionOwnershipError):
                call()
        assert counts() == before
        assert workflow.get_sessions(user_id="mallory") == []
        assert [s.session_id for s in workflow.get_sessions(user_id="alice")] == ["w"]


class TestQueries(WorkflowTestCase):
    def test_a_workflow_runs_statements_do_not_grow_with_the_sessions_length(self):
        self.llm.responder = lambda body: Text("ok") if body["messages"][-1]["role"] == "tool" else ToolCalls(
            [("add_item", {"item": "x"})])
        workflow = self.workflow([count_up, self.shopper(add_history_to_context=True),
                                  Condition(evaluator=lambda si: True, steps=[count_up])],
                                 session_state={"shopping_list": []}, add_workflow_history_to_steps=True)
        statements = []
        for earlier in (5, 500):
            session_id = f"w{earlier}"
            workflow.run("warm up", session_id=session_id)
            bulk_runs(ChatSession.objects.get(session_id=session_id), earlier)
            with CaptureQueriesContext(connection) as queries:
                output = workflow.run("add x", session_id=session_id)
            assert output.status == "completed", output.error
            statements.append(len(queries))
        assert statements[0] == statements[1]


class TestStepRowStatements(EngineTestMixin, TransactionTestCase):
    def test_each_function_step_of_a_chain_adds_the_same_statements(self):
        # (Outside a test's transaction, as served.)
        def statements(steps: int) -> list[str]:
            workflow = Workflow(name="Chain", steps=[Step(name=f"s{n}", executor=count_up) for n in range(steps)])
            workflow.run("warm up", session_id=f"chain{steps}")
            with CaptureQueriesContext(connection) as queries:
                workflow.run("go", session_id=f"chain{steps}")
            return [query["sql"].split()[0].upper() for query in queries]

        one, two, three = statements(1), statements(2), statements(3)
        # Its row as it starts and its end as it ends; its state change goes in the finish's one INSERT of changes.
        step = [sql for sql in two if sql not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]
        assert len(three) - len(two) == len(two) - len(one) <= 6
        assert len(step) - len([sql for sql in one if sql not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]) == 2


class TestConcurrency(EngineTestMixin, TransactionTestCase):
    def test_two_workflow_runs_on_one_session_at_once_both_persist_and_lose_nothing(self):
        workflow = Workflow(name="C", steps=[count_up, Step(name="again", executor=count_up)],
                            session_state={"counter": 0})
        workflow.run("warm", session_id="c")
        errors = []

        def run(text):
            try:
                output = workflow.run(text, session_id="c")
                assert output.status == "completed", output.error
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()  # this thread's own connection

        threads = [threading.Thread(target=run, args=(f"run {n}",)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert workflow.get_session_state(session_id="c") == {"counter": 6}
        assert Run.objects.filter(parent_run__isnull=True).count() == 3
        assert Run.objects.filter(parent_run__isnull=False, status="completed").count() == 6


class TestCancellation(EngineTestMixin, TransactionTestCase):
    def test_cancelling_mid_step_stops_the_step_and_no_later_step_starts(self):
        with Gate() as held:
            self.llm.add(Text("a long reply that never ends", wait_event=held))
            agent = self.agent(name="Slow")
            workflow = Workflow(name="Cx", steps=[agent, count_up])
            events = []
            for event in workflow.run("go", session_id="x", stream=True, stream_events=True):
                events.append(event)
                if event.event == "RunContent":
                    Workflow.cancel_run(events[0].run_id)
        assert kinds(events)[-2:] == ["WorkflowCancelled", "WorkflowCompleted"]
        statuses = dict(Run.objects.values_list("step_name", "status"))
        assert statuses == {"": "cancelled", "Slow": "cancelled"}  # count_up never started
        assert ChatSession.objects.get().lease_token == ""
        assert self.llm.wait_for_disconnects(1)


class TestExport(WorkflowTestCase):
    def test_a_workflow_session_exports_and_imports_with_its_steps(self):
        from sessions_core.export import export_json, import_json

        (alice,) = make_users("alice")
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        workflow = self.workflow([self.shopper(), Step(name="counter", executor=count_up)],
                                 session_state={"shopping_list": []})
        workflow.run("add milk", session_id="w", user_id="alice")
        original = ChatSession.objects.get(session_id="w")
        document = "".join(export_json(original))
        exported = json.loads(document)
        assert exported["kind"] == "workflow" and exported["runs"][0]["kind"] == "workflow"
        assert [(step["step_name"], step["kind"]) for step in exported["runs"][0]["steps"]] == [
            ("Shopper", "agent"), ("counter", "function")]

        (copy,) = import_json(document, alice)

        def tree(session):
            return [(run.kind, run.step_name, run.status, run.input, run.content, run.parent_run is not None,
                     list(run.messages.values_list("role", "content")))
                    for run in Run.objects.filter(session=session).order_by("pk").select_related("parent_run")]

        assert copy.kind == "workflow" and tree(copy) == tree(original)
        assert copy.session_state == original.session_state
