"""The workflow cookbook ports in examples/workflows/: each runs against the local test model server
with the replies a real model would send (tool calls, then text), and ends in the state SPEC.md B.2
gives. The job tracker runs as three separate processes; every command also runs on the offline model.
"""

import ast
import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from sessions_core.models import ChatSession, Run
from tests.support.example_support import EXAMPLES, ROOT, offline_env
from tests.support.llm_server import Text, ToolCalls
from tests.guarantees.test_restart import database_url

pytestmark = pytest.mark.django_db

WORKFLOWS = EXAMPLES / "workflows"


def workflow_example(name: str):
    """Import examples/workflows/<name>.py afresh, as its script sees it: its module-level agents take
    the model that default_model() gives now (the test server)."""
    if str(WORKFLOWS) not in sys.path:
        sys.path.insert(0, str(WORKFLOWS))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def run_command(llm_server, name: str, *args: str) -> str:
    """Run `examples/workflows/<name>.py` as its documented command, in a process of its own, on this
    test's database and the test model server; its output."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatapp.settings", "DATABASE_URL": database_url(),
           "OPENAI_BASE_URL": llm_server.base_url, "OPENAI_API_KEY": "test", "OPENAI_MODEL": "test-model"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, f"examples/workflows/{name}.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def system_prompt(body: dict) -> str:
    return body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""


def said(body: dict) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def tool_names(body: dict) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools") or []]


def scripted(agents: dict[str, dict]):
    """A responder for several agents at once. `agents` maps a phrase of an agent's system prompt to
    {its input: (tool calls, reply)}; the tool calls come first, the reply after their results. An input
    not listed gets a plain echo (and no tool call), so a test's final state shows what was missed."""

    def responder(body):
        system = system_prompt(body)
        phrase = next((phrase for phrase in agents if phrase in system), None)
        calls, reply = agents.get(phrase, {}).get(said(body), ([], f"Unscripted: {said(body)}"))
        if body["messages"][-1]["role"] == "tool" or not calls:
            return Text(reply)
        return ToolCalls(calls)

    return responder


def step_runs(session_id: str) -> list[tuple[str, str]]:
    """(step name, status) of the session's step and member runs, in the order they ran."""
    runs = Run.objects.filter(session__session_id=session_id, parent_run__isnull=False).order_by("id")
    return list(runs.values_list("step_name", "status"))


def workflow_statuses(session_id: str) -> list[str]:
    runs = Run.objects.filter(session__session_id=session_id, parent_run__isnull=True).order_by("id")
    return list(runs.values_list("status", flat=True))


# -- state_with_agent ------------------------------------------------------------------------------


def test_state_with_agent_two_steps_four_turns_end_with_an_empty_list(served, capsys):
    adds = lambda *items: [("add_item", {"item": item}) for item in items]  # noqa: E731
    served.responder = scripted({
        "helpful shopping assistant": {
            "Please add milk, bread, and eggs to my shopping list.":
                (adds("milk", "bread", "eggs"), "Added milk, bread and eggs."),
            "Add apples and bananas to the list, then show me the complete list.":
                ([*adds("apples", "bananas"), ("list_items", {})], "Added apples and bananas; here is the list."),
            "Remove bread from the list and show me what's left.":
                ([("remove_item", {"item": "bread"}), ("list_items", {})], "Removed bread."),
            "Clear the entire shopping list and confirm it's empty.":
                ([], "I can't clear the whole list myself: please clear the entire shopping list."),
        },
        "list management specialist": {
            "Added milk, bread and eggs.": ([("list_items", {})], "Your list: milk, bread, eggs."),
            "Added apples and bananas; here is the list.": ([("list_items", {})], "Five items."),
            "Removed bread.": ([("list_items", {})], "Four items left."),
            "I can't clear the whole list myself: please clear the entire shopping list.":
                ([("remove_all_items", {}), ("list_items", {})], "Your shopping list is now empty."),
        },
    })
    module = workflow_example("state_with_agent")

    state = module.main()

    assert state == {"shopping_list": []}
    out = capsys.readouterr().out
    states = [ast.literal_eval(line.split(": ", 1)[1]) for line in out.splitlines()
              if line.startswith("Workflow session state:")]
    assert states == [
        {"shopping_list": ["milk", "bread", "eggs"]},
        {"shopping_list": ["milk", "bread", "eggs", "apples", "bananas"]},
        {"shopping_list": ["milk", "eggs", "apples", "bananas"]},
    ]
    assert "Final workflow session state: {'shopping_list': []}" in out
    assert "Your shopping list is now empty." in out  # the last step's reply is the workflow's
    assert step_runs(module.SESSION_ID) == [("manage_items", "completed"), ("view_list", "completed")] * 4
    # The second step's agent sees the first step's reply as its input, and only its own tools.
    manager_calls = [body for body in served.requests if "list management specialist" in system_prompt(body)]
    assert said(manager_calls[0]) == "Added milk, bread and eggs."
    assert tool_names(manager_calls[0]) == ["list_items", "remove_all_items"]
    sources = ChatSession.objects.get(session_id=module.SESSION_ID).state_changes.values_list("source", flat=True)
    assert "step:view_list/tool:remove_all_items" in list(sources)


# -- job_application_tracker: three processes ------------------------------------------------------

EXTRACTED = {
    "Applied to a Backend Engineer role at Acme Robotics via a job board, https://acme.example/careers/123": {
        "company": "Acme Robotics", "role": "Backend Engineer", "url": "https://acme.example/careers/123",
        "source": "job board", "status": "Applied", "notes": None},
    "Got an interview scheduled for a Python Developer position at Globex, found via a referral": {
        "company": "Globex", "role": "Python Developer", "url": None, "source": "referral",
        "status": "Interview Scheduled", "notes": None},
    "Submitted an application for a Data Scientist role at Initech": {
        "company": "Initech", "role": "Data Scientist", "url": None, "source": None, "status": "Applied",
        "notes": None},
}


def job_tracker_responder(body):
    if body.get("response_format"):  # the extraction step: JSON for the JobApplication schema
        assert body["response_format"]["json_schema"]["name"] == "JobApplication"
        return Text(json.dumps(EXTRACTED[said(body)]))
    if body["messages"][-1]["role"] == "tool":
        return Text("Saved. Your tracker:\n" + body["messages"][-1]["content"])
    application = json.loads(said(body))  # the tracker step receives the structured application
    fields = {key: value for key, value in application.items() if value is not None}
    return ToolCalls([("save_application", fields), ("list_applications", {})])


@pytest.mark.django_db(transaction=True)
def test_job_application_tracker_grows_across_three_processes(llm_server):
    llm_server.responder = job_tracker_responder

    # The documented command, three times: each process runs the next application.
    outputs = [run_command(llm_server, "job_application_tracker") for _ in range(3)]

    assert [re.findall(r"Applications tracked: (\d+)", out) for out in outputs] == [["1"], ["2"], ["3"]]
    session = ChatSession.objects.get(session_id="job_tracker_demo")
    applications = session.session_state["applications"]
    assert [(a["id"], a["company"], a["role"], a["status"]) for a in applications] == [
        (1, "Acme Robotics", "Backend Engineer", "Applied"),
        (2, "Globex", "Python Developer", "Interview Scheduled"),
        (3, "Initech", "Data Scientist", "Applied"),
    ]
    assert applications[0]["url"] == "https://acme.example/careers/123"
    assert "#3 Data Scientist at Initech - Applied" in outputs[2]
    assert workflow_statuses("job_tracker_demo") == ["completed"] * 3
    # The extraction step's structured content reached the tracker step as JSON.
    tracker_inputs = [said(body) for body in llm_server.requests
                      if "save_application" in tool_names(body) and body["messages"][-1]["role"] == "user"]
    assert [json.loads(text)["company"] for text in tracker_inputs] == ["Acme Robotics", "Globex", "Initech"]


def test_job_application_tracker_takes_an_application_as_its_argument_and_resets(served):
    served.responder = job_tracker_responder
    EXTRACTED["Applied to Umbrella as a Site Reliability Engineer"] = {
        "company": "Umbrella", "role": "Site Reliability Engineer", "status": "Applied"}
    try:
        module = workflow_example("job_application_tracker")
        state = module.main(["Applied to Umbrella as a Site Reliability Engineer"])
        again = module.main(["2"])
    finally:
        del EXTRACTED["Applied to Umbrella as a Site Reliability Engineer"]

    assert [a["company"] for a in state["applications"]] == ["Umbrella"]
    assert [a["company"] for a in again["applications"]] == ["Umbrella", "Globex"]
    assert module.main(["--reset"]) == {}
    assert not ChatSession.objects.filter(session_id="job_tracker_demo").exists()


# -- state_in_function -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_state_in_function_counts_plans_in_executors_and_streams_the_planner(llm_server):
    def responder(body):
        system = system_prompt(body)
        if "You lead a team" in system:
            if body["messages"][-1]["role"] == "tool":
                return Text(f"Research on {said(body)}: {body['messages'][-1]['content']}")
            return ToolCalls([("delegate_task_to_member", {"member_id": "hackernews-agent",
                                                           "task": f"Find posts about {said(body)}"})])
        if "Hackernews posts" in system:
            return Text("Three popular posts.")
        if "Plan a content schedule" in system:
            topic = re.search(r"Core Topic: (.+)", said(body))[1]
            return Text(f"Week 1-4 plan for {topic}.")
        return Text(f"Unscripted: {said(body)}")

    llm_server.responder = responder

    # A process of its own: the planners' InMemoryDb is a database Django's test cases would refuse.
    out = run_command(llm_server, "state_in_function")

    finals = [ast.literal_eval(line.split(": ", 1)[1]) for line in out.splitlines()
              if line.startswith("Final Session State:")]
    assert len(finals) == 2  # the workflow, then its streaming twin
    for state in finals:
        assert state["plan_counter"] == 2
        assert state["session_summarized"] is True and state["total_plans_summarized"] == 2
        assert [(p["id"], p["topic"], p["has_research"]) for p in state["content_plans"]] == [
            (1, "AI trends in 2024", True), (2, "Machine Learning automation tools", True)]
        assert state["content_plans"][1]["content"] == "Week 1-4 plan for Machine Learning automation tools."
    assert ChatSession.objects.get(session_id="workflow_state_in_function_stream").session_state == finals[1]
    assert "### Plan #2 - Machine Learning automation tools" in out  # the summary step's content
    # The streaming twin: the planner's own content events reach the caller as they come.
    streaming_part = out.split("=== First Streaming Workflow Run ===", 1)[1]
    assert "Week 1-4 plan for AI trends in 2024." in streaming_part
    # The planner's research input came from the team step, which delegated to a member.
    planner_prompt = said(next(b for b in llm_server.requests if "Plan a content schedule" in system_prompt(b)))
    assert "Research Results: Research on AI trends in 2024: Three popular posts." in planner_prompt
    assert step_runs("workflow_state_in_function") == [
        ("Research Step", "completed"), ("Hackernews Agent", "completed"), ("Content Planning Step", "completed"),
        ("Content Summary Step", "completed")] * 2
    # The planners ran in their own InMemoryDb sessions: only the two workflow sessions are stored.
    assert set(ChatSession.objects.values_list("session_id", flat=True)) == {
        "workflow_state_in_function", "workflow_state_in_function_stream"}


# -- state_in_condition ----------------------------------------------------------------------------


def test_state_in_condition_greets_once_the_second_run_skips_the_greeting(served, capsys):
    served.responder = scripted({
        "Greet the user warmly": {"Hi, can you help me with something?": ([], "Hello! I'm your assistant.")},
        "You already know the user": {
            "User has been greeted. Total greetings: 1": ([], "How can I help?"),
            "Condition Check If New User not met - skipped 2 steps": ([], "Why did the chicken cross the road?"),
        },
    })
    module = workflow_example("state_in_condition")

    result = module.run_example()

    assert result == {"after_first": {"has_been_greeted": True, "greeting_count": 1},
                      "final": {"has_been_greeted": True, "greeting_count": 1}}
    out = capsys.readouterr().out
    assert re.findall(r"Has been greeted: (\w+)", out) == ["False", "True"]
    assert out.count("=== Marking User as Greeted ===") == 1
    assert "User ID: user-123" in out and "Session ID: user-123" in out
    assert step_runs("user-123") == [("Greet User", "completed"), ("Mark as Greeted", "completed"),
                                     ("Handle Query", "completed"), ("Handle Query", "completed")]
    assert ChatSession.objects.get(session_id="user-123").owner.username == "user-123"
    assert sum("Greet the user warmly" in system_prompt(body) for body in served.requests) == 1


# -- state_in_router -------------------------------------------------------------------------------


def test_state_in_router_routes_by_preference_and_by_keywords(served, capsys):
    task = lambda name, priority: ("add_task", {"name": name, "priority": priority})  # noqa: E731
    served.responder = scripted({
        "task management specialist": {
            "Add these tasks: 'Review project proposal' with high priority, 'Buy groceries' with low priority, "
            "and 'Call dentist' with medium priority.":
                ([task("Review project proposal", "high"), task("Buy groceries", "low"),
                  task("Call dentist", "medium")], "Added three tasks."),
            "Mark 'Buy groceries' as completed": ([("complete_task", {"name": "Buy groceries"})], "Done."),
        },
        "task viewing specialist": {
            "Show me all my current tasks": ([("list_tasks", {})], "Three pending tasks."),
            "Show me only my pending tasks": ([("list_tasks", {"status_filter": "pending"})], "Two pending tasks."),
        },
        "task organization specialist": {
            "Clean up my completed tasks and show me what's left":
                ([("clear_completed_tasks", {}), ("list_tasks", {})], "Removed the completed task."),
        },
    })
    module = workflow_example("state_in_router")

    result = module.main()

    assert result["adaptive"] == {"agent_preference": "technical", "interaction_count": 4}
    routed = [name for name, _ in step_runs("user-456") if name != "Update Preferences"]
    assert routed == ["Onboard User", "Technical Response", "Friendly Response", "General Response"]
    assert result["tasks"] == {"task_list": [
        {"name": "Review project proposal", "priority": "high", "status": "pending", "id": 1},
        {"name": "Call dentist", "priority": "medium", "status": "pending", "id": 3},
    ]}
    # Organize words win over manage words, which win over view words.
    assert [name for name, _ in step_runs("workflow_state_in_router_tasks")] == [
        "manage_tasks", "view_tasks", "manage_tasks", "organize_tasks", "view_tasks"]
    out = capsys.readouterr().out
    assert re.findall(r"Set preference to: (\w+)", out) == ["technical", "friendly", "general", "technical"]
    last_list = [body["messages"][-1]["content"] for body in served.requests if body["messages"][-1]["role"] == "tool"][-1]
    assert last_list == ("Task list (pending):\n- [PENDING] Review project proposal (Priority: high)\n"
                         "- [PENDING] Call dentist (Priority: medium)")


# -- state_with_team -------------------------------------------------------------------------------


def test_state_with_team_adds_deletes_and_updates_project_steps(served, capsys):
    module = workflow_example("state_with_team")
    turns = [text for _, text in module.TURNS]
    handed_on = lambda text: f"Step changes done; for the status manager: {text}"  # noqa: E731
    add = lambda name, who, priority: ("add_step", {"step_name": name, "assignee": who, "priority": priority})  # noqa: E731
    status = lambda name, new, notes="": ("update_step_status", {"step_name": name, "new_status": new, "notes": notes})  # noqa: E731
    team_calls = [
        [add("Setup Database", "Alice", "high"), add("Create API", "Bob", "medium")],
        [],
        [],
        [add("Write Tests", "Dave", "low")],
        [("delete_step", {"step_name": "Write Tests"}), add("Deploy to Production", "Eve", "high"),
         ("delegate_task_to_member", {"member_id": "stepcoordinator", "task": "Confirm the new deployment step."})],
    ]
    status_calls = [
        [],
        [status("Setup Database", "in_progress", "Started database schema design")],
        [("assign_step", {"step_name": "Create API", "new_assignee": "Charlie"}),
         status("Create API", "completed", "API endpoints implemented and tested")],
        [status("Setup Database", "completed")],
        [],
    ]
    served.responder = scripted({
        "You lead a team": {text: (calls, handed_on(text)) for text, calls in zip(turns, team_calls)},
        "You manage step statuses": {handed_on(text): (calls, "Statuses updated.")
                                     for text, calls in zip(turns, status_calls)},
        "You coordinate with the StepManager": {"Confirm the new deployment step.": ([], "Confirmed.")},
    })

    state = module.main()

    assert [(s["name"], s["assignee"], s["priority"], s["status"]) for s in state["steps"]] == [
        ("Setup Database", "Alice", "high", "completed"),
        ("Create API", "Charlie", "medium", "completed"),
        ("Deploy to Production", "Eve", "high", "pending"),
    ]
    assert state["steps"][0]["notes"] == "Started database schema design"
    assert state["steps"][1]["notes"] == "API endpoints implemented and tested"
    out = capsys.readouterr().out
    assert "  3. [PENDING] [LOW] Write Tests (assigned to: Dave, status: pending)" in out  # after run 4
    assert "  3. [PENDING] [HIGH] Deploy to Production (assigned to: Eve, status: pending)" in out
    assert step_runs("workflow_state_with_team")[-3:] == [
        ("manage_steps", "completed"), ("StepCoordinator", "completed"), ("update_status", "completed")]
    assert workflow_statuses("workflow_state_with_team") == ["completed"] * 5
    sources = set(ChatSession.objects.get(session_id="workflow_state_with_team")
                  .state_changes.values_list("source", flat=True))
    assert {"step:manage_steps/tool:delete_step", "step:update_status/tool:assign_step"} <= sources


# -- rename_session --------------------------------------------------------------------------------


def test_rename_session_names_the_workflow_session_from_its_description(served):
    served.responder = scripted({
        "Research the given topic": {"Write an article about the benefits of renewable energy":
                                     ([], "Solar and wind are cheap and clean.")},
        "Write a comprehensive article": {"Solar and wind are cheap and clean.": ([], "# Renewable energy\n...")},
    })
    module = workflow_example("rename_session")

    name = module.main()

    session = ChatSession.objects.get(session_id="workflow_rename_session")
    assert name == f"Automated article creation from research- - {session.created_at:%Y-%m-%d %H:%M}"
    assert session.name == name
    assert len(served.requests) == 2  # research and writing; naming a workflow session calls no model
    assert step_runs("workflow_rename_session") == [("research", "completed"), ("writing", "completed")]


# -- the documented commands, on the offline model -------------------------------------------------


def test_every_workflow_command_runs_on_the_offline_model_in_sequence_on_one_database(tmp_path):
    env = offline_env(tmp_path, "workflows")
    outputs = {}
    for name in ("state_with_agent", "job_application_tracker", "state_in_function", "state_in_condition",
                 "state_in_router", "state_with_team", "rename_session"):
        done = subprocess.run([sys.executable, f"examples/workflows/{name}.py"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"{name}: {done.stderr}"
        assert "Traceback" not in done.stderr, f"{name}: {done.stderr}"
        outputs[name] = done.stdout

    def final(name: str, prefix: str):
        """The value printed on the last line that starts with `prefix`."""
        lines = [line for line in outputs[name].splitlines() if line.startswith(prefix)]
        return ast.literal_eval(lines[-1][len(prefix):])

    # What does not depend on the model following instructions is exact.
    assert final("state_in_condition", "Final session state: ") == {"has_been_greeted": True, "greeting_count": 1}
    assert final("state_in_router", "Adaptive assistant session state: ") == {
        "agent_preference": "technical", "interaction_count": 4}
    assert final("state_in_function", "Final Session State: ")["plan_counter"] == 2
    assert re.search(r"^New session name: Automated article creation from research- - \d{4}-\d\d-\d\d \d\d:\d\d$",
                     outputs["rename_session"], re.M)
    # The offline model drives the shopping list's and the task manager's tools for plain requests, and answers
    # the rest by saying what it heard (the tests above script what a real model does).
    assert final("state_with_agent", "Final workflow session state: ") == {"shopping_list": []}
    assert [(task["name"], task["priority"], task["status"])
            for task in final("state_in_router", "Final workflow session state: ")["task_list"]] == [
        ("Review project proposal", "medium", "pending"), ("Buy groceries", "medium", "pending"),
        ("Call dentist", "medium", "pending")]
    assert final("state_with_team", "Workflow Session State: ") == {"steps": []}
    assert final("job_application_tracker", "Workflow session state: ") == {"applications": []}
    assert "Applications tracked: 0" in outputs["job_application_tracker"]
