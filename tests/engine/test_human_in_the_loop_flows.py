"""Teams and workflows that wait for a person (SPEC Part 1 item 26): a member's pause pauses the team, a
step's review or its agent's tool pauses the workflow; the continuation resumes the member (then the
team) or the step, keeping every state write. Runs on SQLite and PostgreSQL."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connections
from django.test import TestCase, TransactionTestCase

from sessions_core import (
    HumanReview,
    RunContext,
    RunNotContinuableError,
    Step,
    StepRequirement,
    Team,
    UnresolvedRequirementsError,
    Workflow,
    tool,
)
from sessions_core.models import ChatSession, Run, RunStatus, StateChange
from sessions_core.steps import WorkflowDefinitionError
from tests.support.engine_helpers import EngineTestMixin, kinds
from tests.support.llm_server import Text, ToolCalls
from tests.guarantees.test_restart import database_url

ROOT = Path(__file__).resolve().parents[2]


def add_item(item: str, run_context: RunContext) -> str:
    """Add an item to the list.

    Args:
        item: The item.
    """
    run_context.session_state.setdefault("items", []).append(item)
    return f"Added {item}"


@tool(requires_confirmation=True)
def clear_items(run_context: RunContext) -> str:
    """Empty the list."""
    run_context.session_state["items"] = []
    run_context.session_state["cleared"] = run_context.session_state.get("cleared", 0) + 1
    return "The list is empty"


def first_message(body: dict) -> str:
    return body["messages"][0].get("content") or ""


def scripted(team: list, member: list):
    """A responder: the team's model and the member's each answer from their own list, in turn."""
    team, member = list(team), list(member)

    def respond(body):
        return (team if "<team_members>" in first_message(body) else member).pop(0)

    return respond


class TeamCase(EngineTestMixin, TestCase):
    def team(self, **options):
        keeper = self.agent(name="Keeper", tools=[add_item, clear_items])
        options.setdefault("members", [keeper])
        return Team(name="Crew", model=self.model, user_id="ann", session_id="t", **options)

    def pause_in_member(self, **kwargs):
        delegate = ("delegate_task_to_member", {"member_id": "keeper", "task": "add milk then clear the list"})
        self.llm.responder = scripted(
            [ToolCalls([delegate]), Text("The list is clear.")],
            [ToolCalls([("add_item", {"item": "milk"}), ("clear_items", {})]), Text("I cleared it.")])
        return self.team().run("tidy the list", **kwargs)


class TestTeamPause(TeamCase):
    def test_a_members_pause_pauses_the_team_and_the_requirement_names_the_member(self):
        output = self.pause_in_member()

        assert (output.status, output.is_paused) == (RunStatus.PAUSED, True)
        (requirement,) = output.active_requirements
        member_run = Run.objects.get(parent_run__run_id=output.run_id)
        assert (requirement.tool_execution.tool_name, requirement.member_agent_id, requirement.member_agent_name,
                requirement.member_run_id) == ("clear_items", "keeper", "Keeper", member_run.run_id)
        assert member_run.status == RunStatus.PAUSED and Run.objects.get(run_id=output.run_id).status == "paused"
        # The member's write before the pause is committed with the pause.
        assert ChatSession.objects.get(session_id="t").session_state == {"items": ["milk"]}

    def test_a_stream_shows_the_members_pause_then_the_teams(self):
        events = list(self.pause_in_member(stream=True, stream_events=True))
        assert kinds(events)[-2:] == ["RunPaused", "TeamRunPaused"]
        assert events[-1].active_requirements[0].member_agent_name == "Keeper"

    def test_continue_finishes_the_member_then_the_team_keeping_the_members_writes(self):
        paused = self.pause_in_member()
        requirement = paused.active_requirements[0]
        requirement.confirm()

        # A fresh team instance, by run id.
        output = self.team().continue_run(run_id=paused.run_id, session_id="t", requirements=[requirement])

        assert (output.status, output.run_id, output.content) == (RunStatus.COMPLETED, paused.run_id,
                                                                   "The list is clear.")
        assert output.session_state == {"items": [], "cleared": 1}
        assert ChatSession.objects.get(session_id="t").session_state == {"items": [], "cleared": 1}
        member_run = Run.objects.get(parent_run__run_id=paused.run_id)
        assert (member_run.status, member_run.content) == (RunStatus.COMPLETED, "I cleared it.")
        assert member_run.requirements[0]["confirmation"] is True and member_run.requirements[0]["answered_by"] == "ann"
        sources = list(StateChange.objects.order_by("version").values_list("source", "run__run_id"))
        assert sources == [("member:Keeper/tool:add_item", member_run.run_id),
                           ("member:Keeper/tool:clear_items", member_run.run_id)]
        # The team's model read the member's reply as its delegation's result.
        team_request = self.llm.requests[-1]["messages"]
        assert team_request[-1]["role"] == "tool" and team_request[-1]["content"] == "I cleared it."

    def test_a_rejected_member_call_tells_the_member_with_the_note(self):
        paused = self.pause_in_member()
        paused.active_requirements[0].reject("keep the milk")
        output = self.team().continue_run(run_response=paused)

        assert output.status == RunStatus.COMPLETED and output.session_state == {"items": ["milk"]}
        member_request = self.llm.requests[-2]["messages"]
        assert "rejected" in member_request[-1]["content"] and "keep the milk" in member_request[-1]["content"]

    def test_the_teams_own_tool_pauses_the_team_without_a_member(self):
        self.llm.responder = scripted([ToolCalls([("clear_items", {})]), Text("Done.")], [])
        team = self.team(tools=[clear_items])
        paused = team.run("clear it")
        (requirement,) = paused.active_requirements
        assert requirement.member_run_id is None and requirement.tool_execution.tool_name == "clear_items"
        requirement.confirm()
        output = team.continue_run(run_response=paused)
        assert (output.status, output.session_state) == (RunStatus.COMPLETED, {"items": [], "cleared": 1})

    def test_cancel_ends_the_paused_team_and_its_member_and_it_cannot_be_continued(self):
        paused = self.pause_in_member()
        assert Team.cancel_run(paused.run_id) is True
        assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}
        paused.active_requirements[0].confirm()
        with pytest.raises(RunNotContinuableError, match="cancelled, not paused"):
            self.team().continue_run(run_response=paused)
        assert ChatSession.objects.get(session_id="t").session_state == {"items": ["milk"]}

    def test_an_unanswered_member_requirement_is_refused_and_changes_nothing(self):
        paused = self.pause_in_member()
        with pytest.raises(UnresolvedRequirementsError, match="clear_items"):
            self.team().continue_run(run_response=paused)
        assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.PAUSED}


def note(step_input, run_context: RunContext) -> str:
    run_context.session_state.setdefault("log", []).append(f"note:{step_input.input}")
    return "noted"


def publish(step_input, run_context: RunContext) -> str:
    extra = (step_input.additional_data or {}).get("user_input") or {}
    run_context.session_state.setdefault("log", []).append(f"publish:{extra.get('channel', '-')}")
    return f"published after {step_input.previous_step_content}"


def tally(step_input, run_context: RunContext) -> str:
    items = run_context.session_state.get("items", [])
    run_context.session_state["tally"] = len(items)
    return f"{len(items)} items"


class WorkflowCase(EngineTestMixin, TestCase):
    def reviewed(self, **review):
        review.setdefault("requires_confirmation", True)
        return Workflow(name="Publisher", user_id="ann", session_id="w",
                        steps=[Step(name="Note", executor=note),
                               Step(name="Publish", executor=publish, description="Publish the note",
                                    human_review=HumanReview(**review))])


class TestWorkflowReview(WorkflowCase):
    def test_a_review_pauses_before_the_step_and_continue_resumes_there(self):
        paused = self.reviewed(confirmation_message="Publish it?").run("hello")

        assert paused.status == RunStatus.PAUSED and paused.paused_step_name == "Publish"
        (requirement,) = paused.active_step_requirements
        assert isinstance(requirement, StepRequirement) and requirement.needs_confirmation
        assert (requirement.step_index, requirement.confirmation_message) == (1, "Publish it?")
        assert ChatSession.objects.get(session_id="w").session_state["log"] == ["note:hello"]  # committed
        requirement.confirm()

        events = list(self.reviewed().continue_run(run_id=paused.run_id, session_id="w",
                                                   step_requirements=[requirement], stream=True,
                                                   stream_events=True, yield_run_output=True))
        output = events[-1]
        assert kinds(events[:1]) == ["StepContinued"] and events[0].step_name == "Publish"
        assert (output.status, output.run_id, output.content) == ("completed", paused.run_id,
                                                                  "published after noted")
        assert output.session_state["log"] == ["note:hello", "publish:-"]  # Note did not run again
        assert Run.objects.filter(step_name="Note").count() == 1

    def test_a_stream_ends_with_step_paused(self):
        events = list(self.reviewed().run("hello", stream=True, stream_events=True))
        assert kinds(events)[-1] == "StepPaused" and events[-1].step_name == "Publish"
        assert events[-1].step_requirement.requires_confirmation

    def test_a_rejection_skips_the_step_or_cancels_the_run(self):
        paused = self.reviewed().run("hello")
        paused.active_requirements[0].reject("not today")
        output = self.reviewed().continue_run(run_response=paused)
        assert output.status == RunStatus.COMPLETED and output.session_state["log"] == ["note:hello"]
        stored = Run.objects.get(run_id=paused.run_id)
        assert stored.requirements[0]["confirmed"] is False and stored.requirements[0]["rejection_feedback"] == "not today"

        workflow = self.reviewed(on_reject="cancel")
        paused = workflow.run("again", session_id="w2")
        paused.active_requirements[0].reject()
        output = workflow.continue_run(run_response=paused)
        assert output.status == RunStatus.CANCELLED and output.content == "Workflow cancelled: Step 'Publish' was rejected"
        assert Run.objects.get(run_id=paused.run_id).status == RunStatus.CANCELLED

    def test_user_input_is_checked_and_reaches_the_step(self):
        workflow = self.reviewed(requires_confirmation=False, user_input_schema=[
            {"name": "channel", "field_type": "str", "allowed_values": ["blog", "mail"]},
            {"name": "copies", "field_type": "int", "required": False}])
        paused = workflow.run("hello")
        requirement = paused.active_requirements[0]
        assert requirement.needs_user_input
        with pytest.raises(ValueError, match="channel must be one of blog, mail"):
            requirement.set_user_input(channel="fax")
        with pytest.raises(ValueError, match="copies must be a whole number"):
            requirement.set_user_input(copies="two")
        with pytest.raises(UnresolvedRequirementsError, match="Publish"):
            workflow.continue_run(run_response=paused)
        requirement.set_user_input(channel="mail", copies="2")
        assert requirement.user_input == {"channel": "mail", "copies": 2}
        output = workflow.continue_run(run_response=paused)
        assert output.session_state["log"] == ["note:hello", "publish:mail"]
        assert Run.objects.get(run_id=paused.run_id).requirements[0]["user_input"] == {"channel": "mail", "copies": 2}

    def test_a_review_below_the_top_level_is_refused(self):
        from sessions_core import Steps

        with pytest.raises(WorkflowDefinitionError, match="top-level"):
            Workflow(steps=[Steps(steps=[Step(executor=note, human_review=HumanReview(requires_confirmation=True))])])
        with pytest.raises(ValueError, match="on_reject"):
            HumanReview(on_reject="retry")

    def test_a_completed_run_cannot_be_continued(self):
        paused = self.reviewed().run("hello")
        paused.active_requirements[0].confirm()
        self.reviewed().continue_run(run_response=paused)
        with pytest.raises(RunNotContinuableError, match="completed, not paused"):
            self.reviewed().continue_run(run_response=paused)


class TestWorkflowExecutorPause(EngineTestMixin, TestCase):
    def test_an_agent_steps_tool_pauses_the_workflow_and_its_writes_survive_the_resume(self):
        keeper = self.agent(name="Keeper", tools=[add_item, clear_items])
        workflow = Workflow(name="Tidy", user_id="ann", session_id="w", steps=[keeper, Step(name="Tally", executor=tally)])
        self.llm.add(ToolCalls([("add_item", {"item": "milk"}), ("clear_items", {})]), Text("Cleared."))
        paused = workflow.run("tidy")

        (requirement,) = paused.active_requirements
        assert (requirement.requires_executor_input, requirement.executor_name, requirement.step_name) == (
            True, "Keeper", "Keeper")
        (inner,) = requirement.executor_requirements
        assert inner.tool_execution.tool_name == "clear_items"
        inner.confirm()
        output = workflow.continue_run(run_response=paused)

        assert (output.status, output.content) == (RunStatus.COMPLETED, "0 items")
        assert output.session_state == {"items": [], "cleared": 1, "tally": 0}
        assert ChatSession.objects.get(session_id="w").session_state == output.session_state
        step_run = Run.objects.get(parent_run__run_id=paused.run_id, step_name="Keeper")
        assert (step_run.status, step_run.content) == (RunStatus.COMPLETED, "Cleared.")

    def test_a_team_steps_member_pauses_the_workflow_and_its_writes_survive_the_resume(self):
        keeper = self.agent(name="Keeper", tools=[add_item, clear_items])
        team = Team(name="Crew", model=self.model, members=[keeper])
        workflow = Workflow(name="Tidy", user_id="ann", session_id="w", steps=[team, Step(name="Tally", executor=tally)])
        delegate = ("delegate_task_to_member", {"member_id": "keeper", "task": "clear"})
        self.llm.responder = scripted(
            [ToolCalls([delegate]), Text("Team done.")],
            [ToolCalls([("add_item", {"item": "milk"}), ("clear_items", {})]), Text("Cleared.")])
        paused = workflow.run("tidy")

        (requirement,) = paused.active_requirements
        (inner,) = requirement.executor_requirements
        assert (requirement.executor_type, inner.member_agent_name) == ("team", "Keeper")
        inner.confirm()
        output = workflow.continue_run(run_id=paused.run_id, session_id="w", step_requirements=[requirement])

        assert output.status == RunStatus.COMPLETED, output.error
        assert output.session_state == {"items": [], "cleared": 1, "tally": 0}
        assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}


class TestRecords(TeamCase):
    """Every pause and answer is kept with its run: admin shows it, export and import keep it."""

    def test_admin_shows_who_answered_what_and_when(self):
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.urls import reverse

        paused = self.pause_in_member()
        paused.active_requirements[0].reject("keep the milk")
        self.team().continue_run(run_response=paused)
        admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
        client = Client()
        client.force_login(admin)
        run = Run.objects.get(run_id=paused.run_id)
        body = client.get(reverse("admin:sessions_core_run_change", args=[run.pk])).content.decode()
        assert "clear_items — rejected by ann at " in body and ": keep the milk" in body

    def test_export_and_import_keep_a_paused_run_which_cannot_be_continued(self):
        from sessions_core import export
        from sessions_core.decisions import decisions

        paused = self.pause_in_member()
        session = ChatSession.objects.get(session_id="t")
        document = "".join(export.export_json(session))
        assert '"requirements"' in document and "The reply waits for a person" in "".join(
            export.export_markdown(session))
        (copy,) = export.import_json(document, session.owner)

        run = Run.objects.get(session=copy, parent_run__isnull=True)
        assert (run.status, run.finished_at) == (RunStatus.PAUSED, None)
        (item,) = decisions(run.requirements)
        assert (item.title, item.outcome, item.imported, item.member) == ("clear_items", "waiting", True, "Keeper")
        answer = paused.active_requirements[0]
        answer.confirm()
        with pytest.raises(RunNotContinuableError, match="imported"):
            self.team().continue_run(run_id=run.run_id, session_id=copy.session_id, requirements=[answer])
        assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED


class TestRaceAndProcesses(EngineTestMixin, TransactionTestCase):
    def test_of_two_simultaneous_team_continuations_one_wins_and_the_member_tool_runs_once(self):
        keeper = self.agent(name="Keeper", tools=[add_item, clear_items])
        team = lambda: Team(name="Crew", model=self.model, members=[keeper], user_id="ann", session_id="t")  # noqa: E731
        delegate = ("delegate_task_to_member", {"member_id": "keeper", "task": "clear"})
        self.llm.responder = scripted([ToolCalls([delegate]), Text("Clear."), Text("Clear.")],
                                      [ToolCalls([("add_item", {"item": "milk"}), ("clear_items", {})]),
                                       Text("Cleared."), Text("Cleared.")])
        paused = team().run("tidy")
        paused.active_requirements[0].confirm()
        barrier, results = threading.Barrier(2), []

        def continue_once():
            try:
                barrier.wait(10)
                results.append(team().continue_run(run_response=paused))
            except RunNotContinuableError as exc:
                results.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=continue_once) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(type(result).__name__ for result in results) == ["RunNotContinuableError", "TeamRunOutput"]
        assert ChatSession.objects.get(session_id="t").session_state == {"items": [], "cleared": 1}  # ran once

    def test_a_workflow_paused_by_one_process_is_resumed_by_another(self):
        paused = run_script("pause")  # the process exits here
        assert (paused["status"], paused["step"]) == ("paused", "Publish")
        resumed = run_script("continue", paused["run_id"])
        assert resumed["pid"] != paused["pid"]
        assert (resumed["run_id"], resumed["status"], resumed["content"]) == (paused["run_id"], "completed",
                                                                                "published after noted")
        assert resumed["state"]["log"] == ["note:hello", "publish:-"]
        stored = Run.objects.get(run_id=paused["run_id"])
        assert stored.requirements[0]["confirmed"] is True and stored.requirements[0]["answered_by"] == "ann"


WORKFLOW_SCRIPT = """
import json, sys

from sessions_core import HumanReview, Step, Workflow
from tests.engine.test_human_in_the_loop_flows import note, publish

workflow = Workflow(name="Publisher", user_id="ann", session_id="kept",
                    steps=[Step(name="Note", executor=note),
                           Step(name="Publish", executor=publish, human_review=HumanReview(requires_confirmation=True))])
if sys.argv[1] == "pause":
    output = workflow.run("hello")
else:  # a process that knows only the run's id
    output = workflow.get_run_output(run_id=sys.argv[2])
    for requirement in output.active_step_requirements:
        requirement.confirm()
    output = workflow.continue_run(run_response=output)
print(json.dumps({"run_id": output.run_id, "status": output.status, "content": output.content,
                  "state": output.session_state, "pid": __import__("os").getpid(),
                  "step": output.paused_step_name}))
"""


def run_script(*args: str) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatapp.settings", "DATABASE_URL": database_url()}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", WORKFLOW_SCRIPT, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
