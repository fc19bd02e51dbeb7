"""Several users, several sessions: tools key an external store by the current user and session.

Port of Agno's cookbook/02_agents/05_state_and_session/session_state_multiple_users.py (SPEC.md B.1
#12). The run injects `current_user_id` and `current_session_id` into the state the tools see and
into the instructions; nothing is written to the session state itself, so every stored session
state stays {}. A user id string names a Django user (created on first use), who owns the session.

    .venv/bin/python examples/session_state_multiple_users.py
"""

import json

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb, RunContext

# The external store: {user id: {session id: [items]}}.
shopping_list: dict[str, dict[str, list[str]]] = {}


def _key(run_context: RunContext) -> tuple[str, str]:
    return run_context.session_state["current_user_id"], run_context.session_state["current_session_id"]


def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the current user's shopping list."""
    user_id, session_id = _key(run_context)
    shopping_list.setdefault(user_id, {}).setdefault(session_id, []).append(item)
    return f"Item {item} added to the shopping list"


def remove_item(run_context: RunContext, item: str) -> str:
    """Remove an item from the current user's shopping list."""
    user_id, session_id = _key(run_context)
    items = shopping_list.get(user_id, {}).get(session_id)
    if items is None:
        return f"No shopping list found for user {user_id} and session {session_id}"
    if item not in items:
        return f"Item '{item}' not found in the shopping list for user {user_id} and session {session_id}"
    items.remove(item)
    return f"Item {item} removed from the shopping list"


def get_shopping_list(run_context: RunContext) -> str:
    """Get the current user's shopping list."""
    user_id, session_id = _key(run_context)
    items = shopping_list.get(user_id, {}).get(session_id, [])
    return f"Shopping list for user {user_id} and session {session_id}: \n{json.dumps(items, indent=2)}"


TURNS = [
    ("john_doe", "user_1_session_1", "Add milk, eggs, and bread to the shopping list"),
    ("mark_smith", "user_2_session_1", "Add tacos to the shopping list"),
    ("carmen_sandiago", "user_3_session_1", "Add apples and grapes to the shopping list"),
    ("john_doe", "user_1_session_1", "Remove milk from the shopping list"),
    ("mark_smith", "user_2_session_1", "Add minced beef to the shopping list"),
    ("mark_smith", "user_2_session_1", "What is on Mark Smith's shopping list?"),
    ("mark_smith", "user_3_session_2", "Add chicken and soup to my list."),  # a new session, a new list
]


def main() -> dict:
    shopping_list.clear()
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/data.db"),
        tools=[add_item, remove_item, get_shopping_list],
        instructions=[
            "Current User ID: {current_user_id}",
            "Current Session ID: {current_session_id}",
        ],
        markdown=True,
    )
    for user_id, session_id, prompt in TURNS:
        print(f"[{user_id} / {session_id}] > {prompt}")
        agent.print_response(prompt, stream=True, user_id=user_id, session_id=session_id)

    stored_states = {
        f"{user_id}/{session_id}": agent.get_session_state(session_id=session_id, user_id=user_id)
        for user_id, session_id in dict.fromkeys((user, session) for user, session, _ in TURNS)
    }
    print(f"Stored session states: {stored_states}")
    print(f"Final shopping lists: \n{json.dumps(shopping_list, indent=2)}")
    return {"shopping_lists": shopping_list, "session_states": stored_states}


if __name__ == "__main__":
    main()
