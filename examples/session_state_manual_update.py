"""Session state, manual update: change the stored state between two runs through the API.

Port of Agno's cookbook/02_agents/05_state_and_session/session_state_manual_update.py (SPEC.md B.1 #11).
Turn 1 adds milk, eggs and bread; the script then reads the state, appends "chocolate" and writes it
back with `update_session_state`; turn 2 asks what is on the list, and its system prompt (the
instructions show the list) already includes chocolate.

    .venv/bin/python examples/session_state_manual_update.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb, RunContext


def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the shopping list."""
    run_context.session_state["shopping_list"].append(item)
    return f"The shopping list is now {run_context.session_state['shopping_list']}"


def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/agents.db"),
        session_state={"shopping_list": []},
        tools=[add_item],
        instructions="Current state (shopping list) is: {shopping_list}",
        markdown=True,
    )
    agent.print_response("Add milk, eggs, and bread to the shopping list", stream=True)

    current_session_state = agent.get_session_state()
    current_session_state["shopping_list"].append("chocolate")
    agent.update_session_state(current_session_state)

    agent.print_response("What's on my list?", stream=True)
    # What the model was told in turn 2 (Agno shows it with debug_mode=True).
    system_prompt = agent.get_last_run_output().messages[0].content
    print(f"Turn 2 system prompt: {system_prompt.splitlines()[0]}")

    state = agent.get_session_state()
    print(f"Final session state: {state}")
    return state


if __name__ == "__main__":
    main()
