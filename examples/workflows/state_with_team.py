"""State with team: a team's tools and a status agent's tools edit one list of project steps.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/state_with_team.py
(SPEC.md B.2 #7). Step 1, a management team (two members) with add_step/delete_step tools; step 2,
a status manager agent with update_step_status/assign_step. Five runs end with three steps:
Setup Database (Alice, high, completed), Create API (Charlie, medium, completed) and Deploy to
Production (Eve, high, pending); Write Tests is added in run 4 and deleted in run 5.

    .venv/bin/python examples/workflows/state_with_team.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, RunContext, SessionNotFoundError, Step, Team, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: SqliteDb(db_file="tmp/workflow.db"))
# ---------------------------------------------------------------------------
db = None


# ---------------------------------------------------------------------------
# Team tools
# ---------------------------------------------------------------------------
def add_step(run_context: RunContext, step_name: str, assignee: str, priority: str = "medium") -> str:
    """Add a project step, assigned to someone, with a priority (low, medium or high)."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if "steps" not in run_context.session_state:
        run_context.session_state["steps"] = []

    step = {"name": step_name, "assignee": assignee, "status": "pending", "priority": priority, "created_at": "now"}
    run_context.session_state["steps"].append(step)
    return (f"[OK] Successfully added step '{step_name}' assigned to {assignee} (priority: {priority}). "
            f"Total steps: {len(run_context.session_state['steps'])}")


def delete_step(run_context: RunContext, step_name: str) -> str:
    """Delete a project step by name."""
    if run_context.session_state is None or "steps" not in run_context.session_state:
        return "[ERROR] No steps found to delete"

    steps = run_context.session_state["steps"]
    for position, step in enumerate(steps):
        if step["name"] == step_name:
            deleted_step = steps.pop(position)
            return (f"[OK] Successfully deleted step '{step_name}' (was assigned to {deleted_step['assignee']}). "
                    f"Remaining steps: {len(steps)}")
    return f"[ERROR] Step '{step_name}' not found in the list"


# ---------------------------------------------------------------------------
# Agent tools
# ---------------------------------------------------------------------------
def update_step_status(run_context: RunContext, step_name: str, new_status: str, notes: str = "") -> str:
    """Change a project step's status, with optional notes."""
    if run_context.session_state is None or "steps" not in run_context.session_state:
        return "[ERROR] No steps found in workflow session state"

    for step in run_context.session_state["steps"]:
        if step["name"] == step_name:
            old_status = step["status"]
            step["status"] = new_status
            if notes:
                step["notes"] = notes
            step["last_updated"] = "now"
            result = f"[OK] Updated step '{step_name}' status from '{old_status}' to '{new_status}'"
            if notes:
                result += f" with notes: {notes}"
            return result
    return f"[ERROR] Step '{step_name}' not found in the list"


def assign_step(run_context: RunContext, step_name: str, new_assignee: str) -> str:
    """Reassign a project step to someone else."""
    if run_context.session_state is None or "steps" not in run_context.session_state:
        return "[ERROR] No steps found in workflow session state"

    for step in run_context.session_state["steps"]:
        if step["name"] == step_name:
            old_assignee = step["assignee"]
            step["assignee"] = new_assignee
            step["last_updated"] = "now"
            return f"[OK] Reassigned step '{step_name}' from {old_assignee} to {new_assignee}"
    return f"[ERROR] Step '{step_name}' not found in the list"


# ---------------------------------------------------------------------------
# Agents, team, steps and workflow
# ---------------------------------------------------------------------------
step_manager = Agent(
    name="StepManager",
    model=example_model(),
    instructions=[
        "You are a precise step manager. Your ONLY job is to use the provided tools.",
        "When asked to add a step: ALWAYS use add_step(step_name, assignee, priority).",
        "When asked to delete a step: ALWAYS use delete_step(step_name).",
        "Do NOT create imaginary steps or lists.",
        "Do NOT provide explanations beyond what the tool returns.",
        "Be direct and use the tools immediately.",
    ],
)

step_coordinator = Agent(
    name="StepCoordinator",
    model=example_model(),
    instructions=[
        "You coordinate with the StepManager to ensure tasks are completed.",
        "Support the team by confirming actions and helping with coordination.",
        "Be concise and focus on the specific request.",
    ],
)

status_manager = Agent(
    name="StatusManager",
    model=example_model(),
    tools=[update_step_status, assign_step],
    instructions=[
        "You manage step statuses and assignments using the provided tools.",
        "Use update_step_status(step_name, new_status, notes) to change step status.",
        "Use assign_step(step_name, new_assignee) to reassign steps.",
        "Valid statuses: 'pending', 'in_progress', 'completed', 'blocked', 'cancelled'.",
        "Be precise and only use the tools provided.",
    ],
)

management_team = Team(
    name="ManagementTeam",
    model=example_model(),
    members=[step_manager, step_coordinator],
    tools=[add_step, delete_step],
    instructions=[
        "You are a step management team that ONLY uses the provided tools for adding and deleting steps.",
        "CRITICAL: Use add_step(step_name, assignee, priority) to add steps.",
        "CRITICAL: Use delete_step(step_name) to delete steps.",
        "IMPORTANT: You do NOT handle status updates - that's handled by the status manager in the next step.",
        "IMPORTANT: Do NOT delete steps when asked to mark them as completed - only delete when explicitly asked to delete.",
        "If asked to mark a step as completed, respond that status updates are handled by the status manager.",
        "Do NOT create fictional content or step lists.",
        "Execute only the requested add/delete actions using tools and report the result.",
    ],
)

manage_steps_step = Step(
    name="manage_steps",
    description="Management team uses tools to add/delete steps in the workflow session state",
    team=management_team,
)

update_status_step = Step(
    name="update_status",
    description="Status manager updates step statuses and assignments",
    agent=status_manager,
)

project_workflow = Workflow(
    name="Project Management Workflow",
    db=db,
    steps=[manage_steps_step, update_status_step],
    session_state={"steps": []},
    session_id="workflow_state_with_team",
)


def print_current_steps(workflow) -> None:
    session_state = workflow.get_session_state()
    if not session_state or "steps" not in session_state:
        print("No steps in workflow")
        return
    steps = session_state["steps"]
    if not steps:
        print("Step list is empty")
        return

    print("Current Project Steps:")
    for number, step in enumerate(steps, 1):
        status_label = {
            "pending": "[PENDING]",
            "in_progress": "[IN_PROGRESS]",
            "completed": "[COMPLETED]",
            "blocked": "[BLOCKED]",
            "cancelled": "[CANCELLED]",
        }.get(step["status"], "[UNKNOWN]")
        priority_label = {"high": "[HIGH]", "medium": "[MEDIUM]", "low": "[LOW]"}.get(
            step.get("priority", "medium"), "[MEDIUM]")
        print(f"  {number}. {status_label} {priority_label} {step['name']} "
              f"(assigned to: {step['assignee']}, status: {step['status']})")
        if "notes" in step:
            print(f"     Notes: {step['notes']}")
    print()


TURNS = [
    ("Add Multiple Steps",
     "Add a high priority step called 'Setup Database' assigned to Alice, and a medium priority step called "
     "'Create API' assigned to Bob"),
    ("Update Step Status", "Mark 'Setup Database' as in_progress with notes 'Started database schema design'"),
    ("Reassign and Complete Step",
     "Reassign 'Create API' to Charlie, then mark it as completed with notes 'API endpoints implemented and tested'"),
    ("Add and Manage More Steps",
     "Add a low priority step 'Write Tests' assigned to Dave, then mark 'Setup Database' as completed"),
    ("Delete Step",
     "Delete the 'Write Tests' step and add a high priority 'Deploy to Production' step assigned to Eve"),
]


def main() -> dict:
    try:
        project_workflow.delete_session()  # start fresh each time the script runs
    except SessionNotFoundError:
        pass

    print("Starting Project Management Workflow Tests")
    for number, (title, text) in enumerate(TURNS, 1):
        print("=" * 60)
        print(f"Example {number}: {title}")
        print("=" * 60)
        project_workflow.print_response(input=text)
        print_current_steps(project_workflow)
        print(f"Workflow Session State: {project_workflow.get_session_state()}")
        print()
    return project_workflow.get_session_state()


if __name__ == "__main__":
    main()
