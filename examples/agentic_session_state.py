"""Agentic state: the model edits the session state itself through the built-in tool.

Port of Agno's cookbook/02_agents/05_state_and_session/agentic_session_state.py (SPEC.md B.1 #1).
`enable_agentic_state=True` gives the model `update_session_state(session_state_updates)`;
`add_session_state_to_context=True` shows it the current state. Turn 1 writes [milk, eggs, bread];
turn 2 rewrites the list without eggs. The offline demo model has no part in agentic state: on it, both turns
only say what it heard and the state stays at its default (`{'shopping_list': []}`).

    .venv/bin/python examples/agentic_session_state.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb


def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/agents.db"),
        session_state={"shopping_list": []},
        add_session_state_to_context=True,  # the model must see the state to edit it
        enable_agentic_state=True,
    )
    agent.print_response("Add milk, eggs, and bread to the shopping list")
    agent.print_response("I picked up the eggs, now what's on my list?")
    state = agent.get_session_state()
    print(f"Final session state: {state}")
    return state


if __name__ == "__main__":
    main()
