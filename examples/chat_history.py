"""Chat history: read a session's user and assistant messages with get_chat_history().

Port of Agno's cookbook/02_agents/05_state_and_session/chat_history.py (SPEC.md B.1 #2). The agent
has a fixed session id and history on; after each of two turns the script prints the history:
2 messages, then 4 (more when the script ran before: the session is stored and continues).

    .venv/bin/python examples/chat_history.py
"""

import os

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, PostgresDb

SESSION_ID = "chat_history"


def db_url() -> str:
    """Agno's example server (docker, port 5532), or the PostgreSQL that PG_URL names."""
    return os.environ.get("PG_URL", "postgresql+psycopg://ai:ai@localhost:5532/ai")


def print_history(messages) -> None:
    print(f"Chat history ({len(messages)} messages):")
    for message in messages:
        print(f"  {message.role}: {message.content}")


def main() -> list:
    agent = Agent(
        model=example_model(),
        db=PostgresDb(db_url=db_url(), session_table="sessions"),
        session_id=SESSION_ID,
        instructions="You are a helpful assistant that can answer questions about space and oceans.",
        add_history_to_context=True,
    )
    agent.print_response("Tell me a new interesting fact about space")
    print_history(agent.get_chat_history())

    agent.print_response("Tell me a new interesting fact about oceans")
    history = agent.get_chat_history()
    print_history(history)
    return history


if __name__ == "__main__":
    main()
