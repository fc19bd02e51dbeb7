"""Past-session search, two steps: the model lists your earlier sessions, then reads the one you name.

Port of Agno's cookbook/02_agents/05_state_and_session/search_session_history.py (SPEC.md B.1 #6).
alice talks about black holes, carbonara and the Four Seasons in three sessions; in a fourth she asks
what they discussed (the model calls search_past_sessions) and then for the carbonara session (the model
lists again, then calls read_past_session). bob, in a session of his own, finds nothing of alice's.
The offline demo model does not call the past-session tools: it says what it heard.

    .venv/bin/python examples/search_session_history.py
"""

import asyncio

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, AsyncSqliteDb, SessionNotFoundError

EARLIER = [
    ("session_space", "Tell me about black holes and how they form."),
    ("session_cooking", "How do I make carbonara?"),
    ("session_music", "Who composed the Four Seasons?"),
]


async def main() -> dict:
    agent = Agent(
        name="Memory",
        model=example_model(),
        db=AsyncSqliteDb(db_file="tmp/agent_session_history.db"),
        search_past_sessions=True,
        num_past_sessions_to_search=10,
        instructions="You can look up earlier conversations with the user when they refer to them.",
    )
    for session_id, user in [(sid, "alice") for sid, _ in EARLIER] + [("alice_new", "alice"), ("bob_new", "bob")]:
        try:
            await agent.adelete_session(session_id=session_id, user_id=user)  # start fresh each run
        except SessionNotFoundError:
            pass
    for session_id, question in EARLIER:
        await agent.arun(question, session_id=session_id, user_id="alice")

    topics = await agent.arun("What topics have we discussed before?", session_id="alice_new", user_id="alice")
    print("alice, what we discussed:", topics.content)
    found = await agent.arun("Find the carbonara session and tell me about it.", session_id="alice_new",
                             user_id="alice")
    print("alice, the carbonara session:", found.content)
    bob = await agent.arun("What have we discussed before?", session_id="bob_new", user_id="bob")
    print("bob, what we discussed:", bob.content)
    return {"topics": topics, "found": found, "bob": bob}


if __name__ == "__main__":
    asyncio.run(main())
