"""The long-memory examples (summaries, past-session search, naming) against the local test server,
and two of them as real one-line commands on the offline model."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.support.example_support import EXAMPLES, example, examples_folder  # noqa: F401  (fixture)
from tests.support.llm_server import Text, ToolCalls
from tests.support.store_support import db_access, pg_url  # noqa: F401  (fixtures)

# The examples name their own stores (SqliteDb, PostgresDb, InMemoryDb), made while the test runs:
# no Django test case around them, which would refuse databases it was not told about.
pytestmark = pytest.mark.usefixtures("db_access", "examples_folder")


def last_user(body):
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def test_session_summary_example(served, pg_url, monkeypatch):
    monkeypatch.setenv("PG_URL", pg_url)  # the example's PostgresDb
    def responder(body):
        if "response_format" in body:
            said = [line for line in body["messages"][0]["content"].splitlines() if line.startswith("User:")]
            return Text(json.dumps({"summary": " / ".join(said), "topics": ["john"]}))
        return Text("Noted.")

    served.responder = responder
    result = example("session_summary").main()
    assert "New York City" in result["summary"] and "basketball" in result["summary"]
    assert result["topics"] == ["john"]
    assert "Thai food" in result["manager"]


def test_search_session_history_example_lists_then_reads(served):
    def responder(body):
        said = last_user(body)
        tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
        if said.startswith("What topics"):
            if not tool_messages:
                return ToolCalls([("search_past_sessions", {})])
            return Text("Listed: " + tool_messages[-1]["content"])
        if said.startswith("Find the carbonara"):
            if not tool_messages:
                return ToolCalls([("search_past_sessions", {})])
            if len(tool_messages) == 1:
                return ToolCalls([("read_past_session", {"session_id": "session_cooking"})])
            return Text("Read: " + tool_messages[-1]["content"])
        if said.startswith("What have we discussed"):
            return ToolCalls([("search_past_sessions", {})]) if not tool_messages else Text(tool_messages[-1]["content"])
        return Text(f"Answer to: {said}")

    served.responder = responder
    result = asyncio.run(example("search_session_history").main())
    listed = json.loads(result["topics"].content.removeprefix("Listed: "))
    assert [s["session_id"] for s in listed] == ["session_music", "session_cooking", "session_space"]
    assert "User: How do I make carbonara?" in result["found"].content
    assert json.loads(result["bob"].content) == []


def test_last_n_session_messages_example_limits_and_isolates(served):
    def responder(body):
        tools = [m for m in body["messages"] if m["role"] == "tool"]
        if last_user(body).startswith("What did we discuss"):
            return ToolCalls([("search_past_sessions", {})]) if not tools else Text(tools[-1]["content"])
        return Text("An answer.")

    served.responder = responder
    answers = asyncio.run(example("last_n_session_messages").main())
    user_1 = [s["session_id"] for s in json.loads(answers["user_1"].content)]
    user_2 = [s["session_id"] for s in json.loads(answers["user_2"].content)]
    assert user_1 == ["user1_session_3", "user1_session_2"]
    assert user_2 == ["user2_session_2", "user2_session_1"]


def test_session_naming_example(served):
    served.responder = lambda body: Text("Birthday party planning") if body.get("stream") is not True else Text("Sure!")
    result = example("session_naming").main()
    assert result == {"generated": "Birthday party planning", "kept": "Leo's 8th birthday"}


@pytest.mark.parametrize("name, expected", [
    ("search_session_history", ["alice, what we discussed: I'm the offline demo model, so I can't really think, but "
                                "I heard: \"What topics have we discussed before?\"", "bob, what we discussed: I'm the "
                                "offline demo model"]),
    ("session_naming", ["Generated name: Plan a birthday party", "After autogenerate over a user's name: Leo's 8th birthday"]),
    ("user_memories", ["Memories: [\"The user's name is John\", 'The user lives in New York', "
                       "'The user does not like olives']", "Answer in a new session: Your name is John.",
                       "After forgetting: [\"The user's name is John\", 'The user does not like olives']",
                       "Final memories: [\"The user's name is John\", 'The user does not like olives', "
                       "'The user is vegetarian']"]),
])
def test_memory_examples_run_offline_with_one_command(tmp_path, name, expected):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "DJANGO_"))}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'examples.sqlite3'}", OFFLINE_MODEL_DELAY="0")
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for line in expected:
        assert line in result.stdout
