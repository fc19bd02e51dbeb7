"""Session state, advanced: add (idempotent, case-insensitive), remove, list and clear a shopping list.

Port of Agno's cookbook/02_agents/05_state_and_session/session_state_advanced.py (SPEC.md B.1 #8).
Five turns: add milk/eggs/bread -> [milk, eggs, bread]; "I got bread" -> [milk, eggs]; "I need apples
and oranges" -> [milk, eggs, apples, oranges]; "whats on my list?" -> unchanged; clear and start over
with bananas and yogurt -> [bananas, yogurt].

Changes from the original besides the model line: a `clear_list` tool (the original leaves clearing to
the model calling remove_item once per item, which the offline demo model cannot plan), and the last
prompt says "with bananas and yogurt" instead of "with just bananas and yogurt" (the offline model
would add an item called "just bananas").

    .venv/bin/python examples/session_state_advanced.py
"""

from textwrap import dedent

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb, RunContext


def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the shopping list, unless it is already on it (ignoring case)."""
    shopping_list = run_context.session_state["shopping_list"]
    if item.lower() in (existing.lower() for existing in shopping_list):
        return f"'{item}' is already in the shopping list"
    shopping_list.append(item)
    return f"Added '{item}' to the shopping list"


def remove_item(run_context: RunContext, item: str) -> str:
    """Remove an item from the shopping list by name (ignoring case)."""
    shopping_list = run_context.session_state["shopping_list"]
    for position, existing in enumerate(shopping_list):
        if existing.lower() == item.lower():
            shopping_list.pop(position)
            return f"Removed '{existing}' from the shopping list"
    return f"'{item}' was not found in the shopping list"


def list_items(run_context: RunContext) -> str:
    """List every item on the shopping list."""
    shopping_list = run_context.session_state["shopping_list"]
    if not shopping_list:
        return "The shopping list is empty."
    return "Current shopping list:\n" + "\n".join(f"- {item}" for item in shopping_list)


def clear_list(run_context: RunContext) -> str:
    """Remove every item from the shopping list."""
    run_context.session_state["shopping_list"] = []
    return "The shopping list is now empty."


PROMPTS = [
    "Add milk, eggs, and bread to the shopping list",
    "I got bread",
    "I need apples and oranges",
    "whats on my list?",
    "Clear everything from my list and start over with bananas and yogurt",
]


def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/example.db"),
        session_state={"shopping_list": []},
        tools=[add_item, remove_item, list_items, clear_list],
        instructions=dedent("""\
            Your job is to manage a shopping list.

            The shopping list starts empty. You can add items, remove items by name, list all items
            and clear the list.

            Current shopping list: {shopping_list}
        """),
        markdown=True,
    )
    state = {}
    for prompt in PROMPTS:
        print(f"> {prompt}")
        agent.print_response(prompt, stream=True)
        state = agent.get_session_state()
        print(f"Session state: {state}")
    print(f"Final session state: {state}")
    return state


if __name__ == "__main__":
    main()
