"""Session options: history from the last 3 runs reaches the model, but is not stored again.

Port of Agno's cookbook/02_agents/05_state_and_session/session_options.py (SPEC.md B.1 #7).
`num_history_runs=3` sends earlier runs to the model; `store_history_messages=False` (the default)
keeps those copies out of the stored run: the run in flight carries the history messages, the run
read back from the database has none.

    .venv/bin/python examples/session_options.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb


def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=SqliteDb(db_file="tmp/example_no_history.db"),
        add_history_to_context=True,  # use history during the run
        num_history_runs=3,
        store_history_messages=False,  # do not store copies of it with the run
    )
    print("=== First run: establishing context ===")
    response1 = agent.run("My name is Alice and I love Python programming.")
    print(response1.content)

    print("=== Second run: using history (but not storing it) ===")
    response2 = agent.run("What is my name and what do I love?")
    print(response2.content)
    sent_history = [m for m in response2.messages if m.from_history]

    stored_run = agent.get_last_run_output()
    stored_history = [m for m in stored_run.messages if m.from_history]
    result = {
        "history_messages_sent": len(sent_history),
        "stored_messages": len(stored_run.messages),
        "stored_history_messages": len(stored_history),
    }
    print(f"History messages sent to the model in run 2: {len(sent_history)}")
    print(f"Messages stored with run 2: {len(stored_run.messages)} "
          f"({', '.join(m.role for m in stored_run.messages)})")
    print(f"History messages stored with run 2: {len(stored_history)}")
    print(f"Final result: {result}")
    return result


if __name__ == "__main__":
    main()
