"""State in router: Router selectors that read and change the workflow session state.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/state_in_router.py
(SPEC.md B.2 #5), two workflows:

(a) Adaptive assistant: the selector routes by the stored preference (onboarding on the first
    interaction) and counts interactions; a function then sets the preference from the count. The
    state persists between runs (SPEC item 14), so four queries route onboarding -> technical ->
    friendly -> general, as the cookbook intends.
(b) Task router: by keywords, organize words first, then manage words, then view words, to an
    organizer, a manager or a viewer agent with task tools. Five runs: add three tasks, show them,
    complete "Buy groceries", clean up completed tasks, show the pending ones: two are left (Review
    project proposal, high; Call dentist, medium).

    .venv/bin/python examples/workflows/state_in_router.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, Router, RunContext, SessionNotFoundError, Step, StepInput, StepOutput, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: none for (a), SqliteDb(db_file="tmp/workflow.db") for (b))
# ---------------------------------------------------------------------------
db = None


# ---------------------------------------------------------------------------
# (a) Preference-based routing
# ---------------------------------------------------------------------------
def route_based_on_user_preference(step_input: StepInput, run_context: RunContext) -> Step:
    print("\n=== Routing Decision ===")
    print(f"User ID: {run_context.session_state.get('current_user_id')}")
    print(f"Session ID: {run_context.session_state.get('current_session_id')}")

    user_preference = run_context.session_state.get("agent_preference", "general")
    interaction_count = run_context.session_state.get("interaction_count", 0)

    print(f"User Preference: {user_preference}")
    print(f"Interaction Count: {interaction_count}")

    run_context.session_state["interaction_count"] = interaction_count + 1

    if user_preference == "technical":
        print("Routing to Technical Expert")
        return technical_step
    if user_preference == "friendly":
        print("Routing to Friendly Assistant")
        return friendly_step
    if interaction_count == 0:
        print("Routing to Onboarding (first interaction)")
        return onboarding_step

    print("Routing to General Assistant")
    return general_step


def set_user_preference(step_input: StepInput, run_context: RunContext) -> StepOutput:
    print("\n=== Setting User Preference ===")
    interaction_count = run_context.session_state.get("interaction_count", 0)

    if interaction_count % 3 == 1:
        preference = "technical"
    elif interaction_count % 3 == 2:
        preference = "friendly"
    else:
        preference = "general"
    run_context.session_state["agent_preference"] = preference

    print(f"Set preference to: {preference}")
    return StepOutput(content=f"Preference set to: {preference}")


onboarding_agent = Agent(
    name="Onboarding Agent",
    model=example_model(),
    instructions=(
        "Welcome new users and ask about their preferences. "
        "Determine if they prefer technical or friendly assistance."
    ),
    markdown=True,
)

technical_agent = Agent(
    name="Technical Expert",
    model=example_model(),
    instructions="You are a technical expert. Provide detailed, technical answers with code examples and best practices.",
    markdown=True,
)

friendly_agent = Agent(
    name="Friendly Assistant",
    model=example_model(),
    instructions="You are a friendly, casual assistant. Use simple language and make the conversation engaging.",
    markdown=True,
)

general_agent = Agent(
    name="General Assistant",
    model=example_model(),
    instructions="You are a balanced assistant. Provide helpful answers that are neither too technical nor too casual.",
    markdown=True,
)

onboarding_step = Step(name="Onboard User", description="Onboard new user and set preferences",
                       agent=onboarding_agent)
technical_step = Step(name="Technical Response", description="Provide technical assistance", agent=technical_agent)
friendly_step = Step(name="Friendly Response", description="Provide friendly assistance", agent=friendly_agent)
general_step = Step(name="General Response", description="Provide general assistance", agent=general_agent)

adaptive_assistant_workflow = Workflow(
    name="Adaptive Assistant Workflow",
    db=db,
    steps=[
        Router(
            name="Route to Appropriate Agent",
            description="Route to the appropriate agent based on user preferences",
            selector=route_based_on_user_preference,
            choices=[onboarding_step, technical_step, friendly_step, general_step],
        ),
        Step(
            name="Update Preferences",
            description="Update user preferences based on interaction",
            executor=set_user_preference,
        ),
    ],
    session_state={
        "agent_preference": "general",
        "interaction_count": 0,
    },
)


# ---------------------------------------------------------------------------
# (b) Task routing: task tools (the task's name is `name` in each of them)
# ---------------------------------------------------------------------------
def add_task(run_context: RunContext, name: str, priority: str = "medium") -> str:
    """Add a task to the task list, with a priority (low, medium or high)."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if "task_list" not in run_context.session_state:
        run_context.session_state["task_list"] = []

    existing_tasks = [existing["name"].lower() for existing in run_context.session_state["task_list"]]
    if name.lower() not in existing_tasks:
        run_context.session_state["task_list"].append({
            "name": name,
            "priority": priority,
            "status": "pending",
            "id": len(run_context.session_state["task_list"]) + 1,
        })
        return f"Added task '{name}' with {priority} priority to the task list."
    return f"Task '{name}' already exists in the task list."


def complete_task(run_context: RunContext, name: str) -> str:
    """Mark a task as completed."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if "task_list" not in run_context.session_state:
        run_context.session_state["task_list"] = []
        return f"Task list is empty. Cannot complete '{name}'."

    for task in run_context.session_state["task_list"]:
        if task["name"].lower() == name.lower():
            task["status"] = "completed"
            return f"Marked task '{task['name']}' as completed."
    return f"Task '{name}' not found in the task list."


def set_task_priority(run_context: RunContext, name: str, priority: str) -> str:
    """Change a task's priority (low, medium or high)."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if "task_list" not in run_context.session_state:
        run_context.session_state["task_list"] = []
        return f"Task list is empty. Cannot update priority for '{name}'."

    valid_priorities = ["low", "medium", "high"]
    if priority.lower() not in valid_priorities:
        return f"Invalid priority '{priority}'. Must be one of: {', '.join(valid_priorities)}"

    for task in run_context.session_state["task_list"]:
        if task["name"].lower() == name.lower():
            old_priority = task["priority"]
            task["priority"] = priority.lower()
            return f"Updated task '{task['name']}' priority from {old_priority} to {priority}."
    return f"Task '{name}' not found in the task list."


def list_tasks(run_context: RunContext, status_filter: str = "all") -> str:
    """List the tasks: all of them, or only the pending or the completed ones."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if not run_context.session_state.get("task_list"):
        return "Task list is empty."

    tasks = run_context.session_state["task_list"]
    if status_filter != "all":
        tasks = [task for task in tasks if task["status"] == status_filter]
        if not tasks:
            return f"No {status_filter} tasks found."

    priority_order = {"high": 1, "medium": 2, "low": 3}
    tasks = sorted(tasks, key=lambda task: (priority_order.get(task["priority"], 3), task["id"]))
    lines = "\n".join(f"- [{task['status'].upper()}] {task['name']} (Priority: {task['priority']})" for task in tasks)
    return f"Task list ({status_filter}):\n{lines}"


def clear_completed_tasks(run_context: RunContext) -> str:
    """Remove the completed tasks from the list."""
    if run_context.session_state is None:
        run_context.session_state = {}
    if "task_list" not in run_context.session_state:
        run_context.session_state["task_list"] = []
        return "Task list is empty."

    original_count = len(run_context.session_state["task_list"])
    run_context.session_state["task_list"] = [
        task for task in run_context.session_state["task_list"] if task["status"] != "completed"
    ]
    completed_count = original_count - len(run_context.session_state["task_list"])
    return f"Removed {completed_count} completed tasks from the list."


task_manager = Agent(
    name="Task Manager",
    model=example_model(),
    tools=[add_task, complete_task, set_task_priority],
    instructions=[
        "You are a task management specialist.",
        "You can add new tasks, mark tasks as completed, and update task priorities.",
        "Always use the provided tools to interact with the task list.",
        "When adding tasks, consider setting appropriate priorities based on urgency and importance.",
        "Be efficient and clear in your responses.",
    ],
)

task_viewer = Agent(
    name="Task Viewer",
    model=example_model(),
    tools=[list_tasks],
    instructions=[
        "You are a task viewing specialist.",
        "You can display tasks with various filters (all, pending, completed).",
        "Present task information in a clear, organized format.",
        "Help users understand their task status and priorities.",
    ],
)

task_organizer = Agent(
    name="Task Organizer",
    model=example_model(),
    tools=[list_tasks, clear_completed_tasks, set_task_priority],
    instructions=[
        "You are a task organization specialist.",
        "You can view tasks, clean up completed tasks, and reorganize priorities.",
        "Focus on helping users maintain an organized and efficient task list.",
        "Suggest improvements to task organization when appropriate.",
    ],
)

manage_tasks_step = Step(name="manage_tasks", description="Add new tasks, complete tasks, or update priorities",
                         agent=task_manager)
view_tasks_step = Step(name="view_tasks", description="View and display task lists with filtering", agent=task_viewer)
organize_tasks_step = Step(name="organize_tasks",
                           description="Organize tasks, clean up completed items, adjust priorities",
                           agent=task_organizer)

MANAGEMENT_KEYWORDS = ["add", "create", "new task", "complete", "finish", "done", "mark as", "priority", "urgent",
                       "important", "update"]
VIEWING_KEYWORDS = ["show", "list", "display", "view", "see", "what tasks", "current", "pending", "completed",
                    "status"]
ORGANIZING_KEYWORDS = ["clean", "organize", "clear", "remove completed", "reorganize", "cleanup", "tidy", "sort",
                       "arrange"]


def task_router(step_input: StepInput) -> list[Step]:
    message = step_input.previous_step_content or step_input.input or ""
    message_lower = str(message).lower()

    if any(keyword in message_lower for keyword in ORGANIZING_KEYWORDS):
        print("[INFO] Organization request detected: Using Task Organizer")
        return [organize_tasks_step]
    if any(keyword in message_lower for keyword in MANAGEMENT_KEYWORDS):
        print("[INFO] Management request detected: Using Task Manager")
        return [manage_tasks_step]
    if any(keyword in message_lower for keyword in VIEWING_KEYWORDS):
        print("[INFO] Viewing request detected: Using Task Viewer")
        return [view_tasks_step]

    print("[INFO] Ambiguous request: Defaulting to Task Manager")
    return [manage_tasks_step]


task_workflow = Workflow(
    name="Smart Task Management Workflow",
    description="Intelligently routes task management requests to specialized agents",
    steps=[
        Router(
            name="task_management_router",
            selector=task_router,
            choices=[manage_tasks_step, view_tasks_step, organize_tasks_step],
            description="Routes requests to the most appropriate task management agent",
        )
    ],
    session_state={"task_list": []},
    db=db,
    session_id="workflow_state_in_router_tasks",
)


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------
def run_adaptive_assistant_example() -> dict:
    try:
        adaptive_assistant_workflow.delete_session(session_id="user-456", user_id="user-456")  # start fresh
    except SessionNotFoundError:
        pass

    queries = [
        "Hello! I'm new here.",
        "How do I implement a binary search tree in Python?",
        "What's the best pizza topping?",
        "Explain quantum computing",
    ]
    for number, query in enumerate(queries, 1):
        print("\n" + "=" * 80)
        print(f"Interaction {number}: {query}")
        print("=" * 80)
        adaptive_assistant_workflow.print_response(input=query, session_id="user-456", user_id="user-456",
                                                   stream=True)
    final = adaptive_assistant_workflow.get_session_state(session_id="user-456", user_id="user-456")
    print("\nAdaptive assistant session state:", final)
    return final


def run_task_workflow_example() -> dict:
    try:
        task_workflow.delete_session()  # start fresh each time the script runs
    except SessionNotFoundError:
        pass

    print("=== Example 1: Adding Tasks ===")
    task_workflow.print_response(
        input="Add these tasks: 'Review project proposal' with high priority, 'Buy groceries' with low priority, "
              "and 'Call dentist' with medium priority."
    )
    print("Workflow session state:", task_workflow.get_session_state())

    print("\n=== Example 2: Viewing Tasks ===")
    task_workflow.print_response(input="Show me all my current tasks")
    print("Workflow session state:", task_workflow.get_session_state())

    print("\n=== Example 3: Completing Tasks ===")
    task_workflow.print_response(input="Mark 'Buy groceries' as completed")
    print("Workflow session state:", task_workflow.get_session_state())

    print("\n=== Example 4: Organizing Tasks ===")
    task_workflow.print_response(input="Clean up my completed tasks and show me what's left")
    print("Workflow session state:", task_workflow.get_session_state())

    print("\n=== Example 5: Filtered View ===")
    task_workflow.print_response(input="Show me only my pending tasks")
    final = task_workflow.get_session_state()
    print("\nFinal workflow session state:", final)
    return final


def main() -> dict:
    return {"adaptive": run_adaptive_assistant_example(), "tasks": run_task_workflow_example()}


if __name__ == "__main__":
    main()
