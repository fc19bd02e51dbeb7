"""Teams: a coordinating model delegates to members through a tool; every member works on the team's
one state (deletions included), each member run is a Run under the team's (SPEC Part 1 item 21)."""

import pytest
from django.test import TestCase

from sessions_core import RunContext, SessionOwnershipError, Team, TeamRunOutput, Workflow
from sessions_core.models import ChatSession, Run, StateChange
from tests.support.engine_helpers import EngineTestMixin, counts, kinds, make_users, refused_calls
from tests.support.llm_server import Text, ToolCalls


def add_step(name: str, run_context: RunContext) -> str:
    """Add a project step.

    Args:
        name: The step's name.
    """
    run_context.session_state["steps"].append({"name": name, "status": "pending"})
    return f"Added {name}"


def delete_step(name: str, run_context: RunContext) -> str:
    """Delete a project step.

    Args:
        name: The step's name.
    """
    steps = run_context.session_state["steps"]
    run_context.session_state["steps"] = [step for step in steps if step["name"] != name]
    return f"Deleted {name}"


def mark_done(name: str, run_context: RunContext) -> str:
    """Mark a step completed (the team's own tool).

    Args:
        name: The step's name.
    """
    for step in run_context.session_state["steps"]:
        if step["name"] == name:
            step["status"] = "completed"
    return f"{name} completed"


def team_then_member(delegations, member_calls, team_reply="All done."):
    """A responder: the team delegates `delegations` in turn; a member makes its calls, then says what it did."""
    delegations, member_calls = list(delegations), list(member_calls)

    def respond(body):
        messages = body["messages"]
        is_team = "<team_members>" in (messages[0].get("content") or "")
        if messages[-1]["role"] == "tool":
            return Text(team_reply if is_team else f"Member finished: {messages[-1]['content']}")
        if is_team:
            return ToolCalls([delegations.pop(0)]) if delegations else Text(team_reply)
        return ToolCalls([member_calls.pop(0)])

    return respond


class TeamTestCase(EngineTestMixin, TestCase):
    def team(self, **options):
        planner = self.agent(name="Planner", role="Adds and deletes project steps", tools=[add_step, delete_step])
        options.setdefault("members", [planner])
        options.setdefault("name", "Project Team")
        options.setdefault("session_state", {"steps": []})
        return Team(model=self.model, **options)


class TestDelegation(TeamTestCase):
    def test_the_members_reply_is_the_tools_result_and_its_run_is_under_the_teams(self):
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "planner",
                                                                          "task": "Add Setup Database"})],
                                              [("add_step", {"name": "Setup Database"})])
        team = self.team()
        output = team.run("add a setup database step", session_id="t", user_id="alice")

        assert isinstance(output, TeamRunOutput) and output.status == "completed", output.error
        assert output.session_state == {"steps": [{"name": "Setup Database", "status": "pending"}]}
        assert [member.content for member in output.member_responses] == ["Member finished: Added Setup Database"]
        assert output.tools[0].result == "Member finished: Added Setup Database"
        assert "<team_members>\n- member_id: planner | name: Planner | role: Adds and deletes project steps" in (
            self.llm.requests[0]["messages"][0]["content"])
        assert [tool["function"]["name"] for tool in self.llm.requests[0]["tools"]] == ["delegate_task_to_member"]
        top = Run.objects.get(run_id=output.run_id)
        member = top.children.get()
        assert (top.kind, member.kind, member.step_name, member.input) == ("team", "agent", "Planner",
                                                                           "Add Setup Database")
        assert ChatSession.objects.get().kind == "team"
        assert list(StateChange.objects.order_by("version").values_list("source", "run_id")) == [
            ("defaults", top.pk), ("member:Planner/tool:add_step", member.pk)]

    def test_a_stream_without_events_is_the_teams_own_text_and_print_response_prints_it(self):
        import contextlib
        import io

        delegation = ("delegate_task_to_member", {"member_id": "planner", "task": "Add Setup Database"})
        self.llm.responder = team_then_member([delegation], [("add_step", {"name": "Setup Database"})],
                                              team_reply="The planner added Setup Database.")
        events = list(self.team().run("add a setup database step", session_id="t", stream=True))

        # The member's words reach the team as its tool's result; the caller streams the team's answer.
        assert set(kinds(events)) == {"TeamRunContent"}
        assert "".join(event.content for event in events) == "The planner added Setup Database."

        self.llm.responder = team_then_member([delegation], [("add_step", {"name": "Setup Database"})],
                                              team_reply="Added again.")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            self.team().print_response("once more", session_id="t", stream=True)
        assert printed.getvalue() == "Added again.\n"

    def test_a_members_deletions_and_the_teams_own_tools_edit_the_one_state(self):
        team = self.team(tools=[mark_done])
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "Planner", "task": "add"})],
                                              [("add_step", {"name": "A"})])
        team.run("add A", session_id="t")
        team.update_session_state({"steps": [{"name": "A", "status": "pending"}, {"name": "B", "status": "pending"}]},
                                  session_id="t")
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "planner", "task": "del"})],
                                              [("delete_step", {"name": "A"})])
        team.run("delete A", session_id="t")
        assert team.get_session_state(session_id="t") == {"steps": [{"name": "B", "status": "pending"}]}

        self.llm.add(ToolCalls([("mark_done", {"name": "B"})]), Text("B is done."))
        team.run("B is done", session_id="t")
        assert team.get_session_state(session_id="t") == {"steps": [{"name": "B", "status": "completed"}]}

    def test_an_unknown_member_is_told_to_the_model_and_nothing_runs(self):
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "nobody", "task": "x"})], [])
        output = self.team().run("do it", session_id="t")
        assert output.status == "completed"
        assert output.tools[0].result == "Error: there is no member 'nobody' in this team (members: planner)."
        assert output.tools[0].tool_call_error is True and Run.objects.count() == 1

    def test_events_nest_the_members_run_under_the_teams(self):
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "planner", "task": "add"})],
                                              [("add_step", {"name": "A"})])
        events = list(self.team().run("add A", session_id="t", stream=True, stream_events=True))
        assert kinds(events) == [
            "TeamRunStarted", "TeamToolCallStarted", "RunStarted", "ToolCallStarted", "ToolCallCompleted",
            "StateChanged", "RunContent", "RunContent", "RunContent", "RunContent", "RunCompleted",
            "TeamToolCallCompleted", "TeamRunContent", "TeamRunContent", "TeamRunCompleted"]
        team_run = events[0].run_id
        assert events[2].parent_run_id == team_run and events[2].step_name == "Planner"
        assert events[5].source == "member:Planner/tool:add_step"

    def test_a_team_as_a_workflow_step(self):
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "planner", "task": "add"})],
                                              [("add_step", {"name": "A"})])
        workflow = Workflow(name="With team", steps=[self.team()], session_state={"steps": []})
        output = workflow.run("add A", session_id="w")
        assert output.status == "completed", output.error
        assert output.session_state == {"steps": [{"name": "A", "status": "pending"}]}
        top = Run.objects.get(run_id=output.run_id)
        team_run = top.children.get()
        assert (team_run.kind, team_run.step_name) == ("team", "Project Team")
        assert team_run.children.get().step_name == "Planner"
        assert StateChange.objects.order_by("-version").first().source == "step:Project Team/member:Planner/tool:add_step"


class TestTeamAccessors(TeamTestCase):
    def test_every_accessor_refuses_another_users_session_and_writes_nothing(self):
        make_users("alice", "mallory")
        self.llm.responder = lambda body: Text("hello")
        team = self.team()
        team.run("hi", session_id="t", user_id="alice")
        before = counts()
        for call in refused_calls(team, "t", "mallory"):
            with self.subTest(call=call), pytest.raises(SessionOwnershipError):
                call()
        assert counts() == before
        assert [(m.role, m.content) for m in team.get_chat_history(session_id="t", user_id="alice")] == [
            ("user", "hi"), ("assistant", "hello")]

    def test_get_session_messages_reads_the_teams_runs_or_its_members(self):
        """Agno's Team.get_session_messages: the team's own messages; with member_ids those of the members'
        runs; with skip_member_messages=False both, in the order they were written."""
        self.llm.responder = team_then_member([("delegate_task_to_member", {"member_id": "planner",
                                                                          "task": "Add Setup Database"})],
                                              [("add_step", {"name": "Setup Database"})])
        team = self.team()
        team.run("add a setup database step", session_id="t")

        def read(**selection):
            return [(m.role, m.content) for m in team.get_session_messages(session_id="t", skip_roles=["system"],
                                                                           **selection)]

        own, members, both = read(), read(member_ids=["planner"]), read(skip_member_messages=False)
        assert own == [("user", "add a setup database step"), ("assistant", ""),
                       ("tool", "Member finished: Added Setup Database"), ("assistant", "All done.")]
        assert members == [("user", "Add Setup Database"), ("assistant", ""), ("tool", "Added Setup Database"),
                           ("assistant", "Member finished: Added Setup Database")]
        assert sorted(both) == sorted(own + members) and both[:2] == [own[0], members[0]]
        assert read(member_ids=["someone-else"]) == []
        assert read(member_ids=["planner"], limit=1) == [("assistant", "Member finished: Added Setup Database")]
        view = team.get_session(session_id="t")
        assert [(m.role, m.content) for m in view.get_messages(team_id=team.id, skip_roles=["system"])] == own
        assert view.get_messages(agent_id="planner", team_id=team.id) == []

    def test_a_team_has_the_agents_tool_call_limit_and_introduction(self):
        """Agno's Team takes them too: delegations past the limit are not run (the team's model is told), and
        the introduction is the team session's first reply."""
        def respond(body):
            messages = body["messages"]
            if "<team_members>" not in (messages[0].get("content") or ""):  # the member
                if messages[-1]["role"] == "tool":
                    return Text(f"Member finished: {messages[-1]['content']}")
                return ToolCalls([("add_step", {"name": messages[-1]["content"].removeprefix("Add ")})])
            if messages[-1]["role"] == "tool":
                return Text("Added A; B was not delegated.")
            return ToolCalls([("delegate_task_to_member", {"member_id": "planner", "task": "Add A"}),
                              ("delegate_task_to_member", {"member_id": "planner", "task": "Add B"})])

        self.llm.responder = respond
        team = self.team(tool_call_limit=1, introduction="We plan projects.")

        output = team.run("add A and B", session_id="t")

        assert output.status == "completed" and output.content == "Added A; B was not delegated."
        assert output.session_state == {"steps": [{"name": "A", "status": "pending"}]}
        assert [member.input for member in output.member_responses] == ["Add A"]
        assert [m.content for m in team.get_session_messages(session_id="t", skip_roles=["system"])][-3:] == [
            "Member finished: Added A",
            "Tool call limit reached. Tool call delegate_task_to_member not executed. Don't try to execute it again.",
            "Added A; B was not delegated."]
        assert [(m.role, m.content) for m in team.get_chat_history(session_id="t")][:2] == [
            ("assistant", "We plan projects."), ("user", "add A and B")]
