"""User memories: the agent learns facts about its user after each run and uses them in every later
session of that user; the user's memories can be listed, changed and deleted.

Modelled on Agno's cookbook memory examples (an agent with `update_memory_on_run=True` on a SqliteDb,
then `get_user_memories`). A second agent with `enable_agentic_memory=True` lets the model decide with its
`update_user_memory` tool. With the offline model, the facts it understands are simple ones: a name, a
town, a diet, likes and dislikes, and "forget that ...".

    .venv/bin/python examples/user_memories.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SqliteDb

USER_ID = "john_doe@example.com"


def main() -> dict:
    db = SqliteDb(db_file="tmp/agents.db")
    agent = Agent(model=example_model(), db=db, update_memory_on_run=True)
    agent.clear_user_memories(user_id=USER_ID)  # start fresh each time the script runs

    agent.print_response("My name is John and I live in New York. I don't like olives.", user_id=USER_ID,
                         session_id="memories_1")
    memories = agent.get_user_memories(user_id=USER_ID)
    print("Memories:", [memory.memory for memory in memories])

    # A new session: the memories are in its system message.
    answer = agent.run("What's my name?", user_id=USER_ID, session_id="memories_2")
    print("Answer in a new session:", answer.content)

    agent.print_response("Forget that I live in New York", user_id=USER_ID, session_id="memories_2")
    after = [memory.memory for memory in agent.get_user_memories(user_id=USER_ID)]
    print("After forgetting:", after)

    # The model keeps the memories itself, with its update_user_memory tool.
    agentic = Agent(model=example_model(), db=db, enable_agentic_memory=True)
    agentic.print_response("I am vegetarian", user_id=USER_ID, session_id="memories_3")
    final = [memory.memory for memory in agentic.get_user_memories(user_id=USER_ID)]
    print("Final memories:", final)
    return {"first": [memory.memory for memory in memories], "answer": answer.content, "after": after,
            "final": final}


if __name__ == "__main__":
    main()
