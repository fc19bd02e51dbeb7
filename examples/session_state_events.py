"""Session state in events: stream a run with its events and read the state from RunCompleted.

Port of Agno's cookbook/02_agents/05_state_and_session/session_state_events.py (SPEC.md B.1 #10).
Besides Agno's events the stream carries our StateChanged event after each tool call that changed
the state; the RunCompleted event holds the final state.

    .venv/bin/python examples/session_state_events.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb, RunCompletedEvent, RunContext, StateChangedEvent


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
    final_state = {}
    response = agent.run("Add milk, eggs, and bread to the shopping list", stream=True, stream_events=True)
    for event in response:
        if isinstance(event, StateChangedEvent):
            print(f"State changed ({event.source}): {event.patch}")
        if isinstance(event, RunCompletedEvent):
            final_state = event.session_state
            print(f"Session state: {event.session_state}")
    print(f"Final session state: {final_state}")
    return final_state


if __name__ == "__main__":
    main()
