"""State with agent: two agent steps whose tools share one workflow session state.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/state_with_agent.py
(SPEC.md B.2 #6). Every run goes through a shopping assistant (add/remove/list) and then a list
manager (list/clear), both working on the workflow's {"shopping_list": [...]}. Four turns: add milk,
bread and eggs; add apples and bananas and show the list; remove bread; clear it. The list ends empty.

    .venv/bin/python examples/workflows/state_with_agent.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, RunContext, SessionNotFoundError, Step, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: SqliteDb(db_file="tmp/workflow.db"))
# ---------------------------------------------------------------------------
db = None

SESSION_ID = "workflow_state_with_agent"


# ---------------------------------------------------------------------------
# Session-state tools
# ---------------------------------------------------------------------------
def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the shopping list."""
    if run_context.session_state is None:
        run_context.session_state = {}

    existing_items = [existing.lower() for existing in run_context.session_state["shopping_list"]]
    if item.lower() not in existing_items:
        run_context.session_state["shopping_list"].append(item)
        return f"Added '{item}' to the shopping list."
    return f"'{item}' is already in the shopping list."


def remove_item(run_context: RunContext, item: str) -> str:
    """Remove an item from the shopping list."""
    if run_context.session_state is None:
        run_context.session_state = {}

    if len(run_context.session_state["shopping_list"]) == 0:
        return f"Shopping list is empty. Cannot remove '{item}'."

    shopping_list = run_context.session_state["shopping_list"]
    for position, existing in enumerate(shopping_list):
        if existing.lower() == item.lower():
            removed = shopping_list.pop(position)
            return f"Removed '{removed}' from the shopping list."
    return f"'{item}' not found in the shopping list."


def remove_all_items(run_context: RunContext) -> str:
    """Remove every item from the shopping list."""
    if run_context.session_state is None:
        run_context.session_state = {}

    run_context.session_state["shopping_list"] = []
    return "Removed all items from the shopping list."


def list_items(run_context: RunContext) -> str:
    """Show the shopping list."""
    if run_context.session_state is None:
        run_context.session_state = {}

    if len(run_context.session_state["shopping_list"]) == 0:
        return "Shopping list is empty."
    items = "\n".join(f"- {item}" for item in run_context.session_state["shopping_list"])
    return f"Shopping list:\n{items}"


# ---------------------------------------------------------------------------
# Agents
# ---------------------------------------------------------------------------
shopping_assistant = Agent(
    name="Shopping Assistant",
    model=example_model(),
    tools=[add_item, remove_item, list_items],
    instructions=[
        "You are a helpful shopping assistant.",
        "You can help users manage their shopping list by adding, removing, and listing items.",
        "Always use the provided tools to interact with the shopping list.",
        "Be friendly and helpful in your responses.",
    ],
)

list_manager = Agent(
    name="List Manager",
    model=example_model(),
    tools=[list_items, remove_all_items],
    instructions=[
        "You are a list management specialist.",
        "You can view the current shopping list and clear it when needed.",
        "Always show the current list when asked.",
        "Confirm actions clearly to the user.",
    ],
)

# ---------------------------------------------------------------------------
# Steps and workflow
# ---------------------------------------------------------------------------
manage_items_step = Step(
    name="manage_items",
    description="Help manage shopping list items (add/remove)",
    agent=shopping_assistant,
)

view_list_step = Step(
    name="view_list",
    description="View and manage the complete shopping list",
    agent=list_manager,
)

shopping_workflow = Workflow(
    name="Shopping List Workflow",
    db=db,
    steps=[manage_items_step, view_list_step],
    session_state={"shopping_list": []},
    session_id=SESSION_ID,
)


def main() -> dict:
    try:
        shopping_workflow.delete_session()  # start fresh each time the script runs
    except SessionNotFoundError:
        pass

    print("=== Example 1: Adding Items ===")
    shopping_workflow.print_response(input="Please add milk, bread, and eggs to my shopping list.")
    print("Workflow session state:", shopping_workflow.get_session_state())

    print("\n=== Example 2: Adding More Items ===")
    shopping_workflow.print_response(input="Add apples and bananas to the list, then show me the complete list.")
    print("Workflow session state:", shopping_workflow.get_session_state())

    print("\n=== Example 3: Removing Items ===")
    shopping_workflow.print_response(input="Remove bread from the list and show me what's left.")
    print("Workflow session state:", shopping_workflow.get_session_state())

    print("\n=== Example 4: Clearing List ===")
    shopping_workflow.print_response(input="Clear the entire shopping list and confirm it's empty.")
    final = shopping_workflow.get_session_state()
    print("Final workflow session state:", final)
    return final


if __name__ == "__main__":
    main()
