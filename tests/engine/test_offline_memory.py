"""The offline demo model drives the past-session tools too, so long memory can be tried with no network."""

import pytest

from sessions_core import Agent
from sessions_core.llm import OfflineModel

pytestmark = pytest.mark.django_db


def test_offline_model_lists_then_reads_a_named_session():
    agent = Agent(name="Memory", model=OfflineModel(), search_past_sessions=True)
    agent.run("How do I make carbonara?", session_id="cook", user_id="ann")
    agent.run("Who composed the Four Seasons?", session_id="music", user_id="ann")
    listed = agent.run("What did we discuss before?", session_id="now", user_id="ann")
    assert [t.tool_name for t in listed.tools] == ["search_past_sessions"]
    assert listed.content == "We've talked before about: Who composed the Four Seasons; How do I make carbonara."
    found = agent.run("Find the carbonara session", session_id="now", user_id="ann")
    assert [t.tool_name for t in found.tools] == ["search_past_sessions", "read_past_session"]
    assert found.tools[1].tool_args == {"session_id": "cook"}
    assert found.content == 'In that session you asked: "How do I make carbonara?".'


def test_offline_model_finds_nothing_for_another_user():
    agent = Agent(name="Memory", model=OfflineModel(), search_past_sessions=True)
    agent.run("How do I make carbonara?", session_id="cook2", user_id="ann")
    output = agent.run("What did we talk about earlier?", session_id="bobs", user_id="bob")
    assert output.content == "I can't find any earlier conversations with you."


def test_offline_model_answers_plainly_without_memory_tools():
    output = Agent(model=OfflineModel()).run("What did we discuss before?", session_id="plain", user_id="ann")
    assert output.tools == [] and "offline demo model" in output.content
