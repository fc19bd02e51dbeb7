"""Session state, basic: a tool appends to a list kept in the session state.

Port of Agno's cookbook/02_agents/05_state_and_session/session_state_basic.py (SPEC.md B.1 #9).
The default state {"shopping_list": []} starts every new session; the instructions show the list.
One turn adds milk, eggs and bread; the run's own state equals the stored state.

    .venv/bin/python examples/session_state_basic.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb, RunContext


def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the shopping list."""
    if run_context.session_state is None:
        run_context.session_state = {}
    run_context.session_state["shopping_list"].append(item)
    return f"The shopping list is now {run_context.session_state['shopping_list']}"


def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/agents.db"),
        session_state={"shopping_list": []},  # the default state of every new session
        tools=[add_item],
        instructions="Current state (shopping list) is: {shopping_list}",  # filled from the state
        markdown=True,
    )
    response = agent.run("Add milk, eggs, and bread to the shopping list")
    print(response.content)
    stored = agent.get_session_state()
    print(f"Run output state: {response.session_state}")
    print(f"Final session state: {stored}")
    return stored


if __name__ == "__main__":
    main()
