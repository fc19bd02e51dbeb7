"""Past-session search limited to the 2 most recent sessions, with two users who never see each other's.

Port of Agno's cookbook/02_agents/05_state_and_session/last_n_session_messages.py (SPEC.md B.1 #4).
user_1 has three sessions about capital cities, user_2 two about population and currency. Each then
asks, in a new session, what they talked about: each is told about their own sessions only, at most
two of them (the current session is left out before the limit). The offline demo model does not call
the past-session tools: it says what it heard.

    .venv/bin/python examples/last_n_session_messages.py
"""

import asyncio

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, AsyncSqliteDb, SessionNotFoundError

# The cookbook's session ids: distinct from session_state_multiple_users' (user_1_session_1 is john_doe's).
SESSIONS = {
    "user_1": [("user1_session_1", "What is the capital of South Africa?"),
               ("user1_session_2", "What is the capital of China?"),
               ("user1_session_3", "What is the capital of France?")],
    "user_2": [("user2_session_1", "What is the population of India?"),
               ("user2_session_2", "What is the currency of Japan?")],
}
NEW_SESSION = {"user_1": "user1_session_4", "user_2": "user2_session_3"}


async def main() -> dict:
    agent = Agent(
        model=example_model(),
        db=AsyncSqliteDb(db_file="tmp/data.db"),
        search_past_sessions=True,
        num_past_sessions_to_search=2,
    )
    answers = {}
    for user, sessions in SESSIONS.items():
        for session_id in [sid for sid, _ in sessions] + [NEW_SESSION[user]]:
            try:
                await agent.adelete_session(session_id=session_id, user_id=user)  # start fresh each run
            except SessionNotFoundError:
                pass
        for session_id, question in sessions:
            await agent.arun(question, session_id=session_id, user_id=user)
    for user in SESSIONS:
        output = await agent.arun("What did we discuss in our previous sessions?", session_id=NEW_SESSION[user],
                                  user_id=user)
        answers[user] = output
        print(f"{user}:", output.content)
    return answers


if __name__ == "__main__":
    asyncio.run(main())
