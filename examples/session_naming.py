"""Session names: set one by hand, or let the model write one of at most five words.

Based on Agno's `set_session_name(autogenerate=True)` (SPEC.md section 7). A generated name never
replaces a name the user set.

    .venv/bin/python examples/session_naming.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb

SESSION_ID = "session_naming"


def main() -> dict:
    agent = Agent(model=example_model(), db=SqliteDb(db_file="tmp/agents.db"), session_id=SESSION_ID, user_id="john")
    try:
        agent.delete_session()  # start fresh each time the script runs
    except Exception:
        pass
    agent.print_response("Can you help me plan a birthday party for my son?")
    generated = agent.set_session_name(autogenerate=True).session_name
    print("Generated name:", generated)
    agent.set_session_name(session_name="Leo's 8th birthday")
    kept = agent.set_session_name(autogenerate=True).session_name
    print("After autogenerate over a user's name:", kept)
    return {"generated": generated, "kept": kept}


if __name__ == "__main__":
    main()
