"""Session summaries: after each successful run the session gets a fresh summary with topics.

Port of Agno's cookbook/02_agents/05_state_and_session/session_summary.py (SPEC.md B.1 #13). The summary
is regenerated after every turn (after RunCompleted, so the reply is never held up by it) and injected
into the next turn's system prompt. The second agent shows an explicit SessionSummaryManager.

    .venv/bin/python examples/session_summary.py
"""

import os

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, PostgresDb, SessionSummaryManager

SESSION_ID = "session_summary"
USER_ID = "john"


def db_url() -> str:
    """Agno's example server (docker, port 5532), or the PostgreSQL that PG_URL names."""
    return os.environ.get("PG_URL", "postgresql+psycopg://ai:ai@localhost:5532/ai")


def main() -> dict:
    model = example_model()
    db = PostgresDb(db_url=db_url(), session_table="sessions")
    agent = Agent(model=model, db=db, session_id=SESSION_ID, user_id=USER_ID, enable_session_summaries=True)
    try:
        agent.delete_session()  # start fresh each time the script runs
    except Exception:
        pass
    agent.print_response("Hi, my name is John and I live in New York City.")
    print("Summary after turn 1:", agent.get_session_summary().summary)
    agent.print_response("I like to play basketball and hike in the mountains.")
    summary = agent.get_session_summary()
    print("Summary after turn 2:", summary.summary)
    print("Topics:", summary.topics)

    # Alternatively, with a manager of its own (here limited to the last run).
    manager = SessionSummaryManager(model=model, last_n_runs=1)
    other = Agent(model=model, db=db, session_id=SESSION_ID + "_manager", user_id=USER_ID,
                  session_summary_manager=manager)
    try:
        other.delete_session()
    except Exception:
        pass
    other.print_response("I'm learning to cook Thai food.")
    print("Manager summary:", other.get_session_summary().summary)
    return {"summary": summary.summary, "topics": summary.topics, "manager": other.get_session_summary().summary}


if __name__ == "__main__":
    main()
