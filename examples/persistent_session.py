"""A persistent session: run the script twice and the second run continues the stored session.

Port of Agno's cookbook/02_agents/05_state_and_session/persistent_session.py (SPEC.md B.1 #5). The
session id is fixed and history is on, so each process sends the earlier turns to the model and adds
one more: the stored chat history grows by 2 messages per run of the script.

    .venv/bin/python examples/persistent_session.py   # twice
"""

import os

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, PostgresDb

SESSION_ID = "session_storage"


def db_url() -> str:
    """Agno's example server (docker, port 5532), or the PostgreSQL that PG_URL names."""
    return os.environ.get("PG_URL", "postgresql+psycopg://ai:ai@localhost:5532/ai")


def main() -> list:
    agent = Agent(
        model=example_model(),
        db=PostgresDb(db_url=db_url(), session_table="sessions"),
        session_id=SESSION_ID,
        add_history_to_context=True,
    )
    agent.print_response("Tell me a new interesting fact about space")
    history = agent.get_chat_history()
    runs = len([message for message in history if message.role == "user"])
    print(f"Session {SESSION_ID!r} holds {runs} runs and {len(history)} chat messages")
    return history


if __name__ == "__main__":
    main()
