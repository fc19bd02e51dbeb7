"""The offline model learns, uses and forgets simple facts about the user, with no network."""

import pytest

from sessions_core import Agent
from sessions_core.llm import OfflineModel

pytestmark = pytest.mark.django_db


def texts(agent, user="ana"):
    return sorted(memory.memory for memory in agent.get_user_memories(user_id=user))


def test_it_learns_facts_and_answers_from_them_in_a_new_session():
    agent = Agent(model=OfflineModel(), update_memory_on_run=True)
    first = agent.run("My name is Ana and I live in Lyon", session_id="one", user_id="ana")
    assert first.content == "Nice to meet you, Ana! I'll remember that you live in Lyon."
    agent.run("I am vegetarian. I don't like olives", session_id="one", user_id="ana")
    assert texts(agent) == ["The user does not like olives", "The user is vegetarian", "The user lives in Lyon",
                            "The user's name is Ana"]
    assert agent.run("What's my name?", session_id="two", user_id="ana").content == "Your name is Ana."
    assert agent.run("Where do I live?", session_id="two", user_id="ana").content == "You live in Lyon."
    assert agent.get_user_memories(user_id="bob") == []
    assert agent.run("What's my name?", session_id="three", user_id="bob").content == "I don't know your name yet."


def test_a_changed_fact_updates_the_memory_and_forget_deletes_it():
    agent = Agent(model=OfflineModel(), update_memory_on_run=True)
    agent.run("I live in Lyon", session_id="s", user_id="ana")
    [lyon] = agent.get_user_memories(user_id="ana")
    agent.run("I moved to Paris", session_id="s", user_id="ana")
    [paris] = agent.get_user_memories(user_id="ana")
    assert (paris.memory_id, paris.memory) == (lyon.memory_id, "The user lives in Paris")
    agent.run("I like jazz", session_id="s", user_id="ana")
    out = agent.run("Forget that I live in Paris", session_id="s", user_id="ana")
    assert out.content == "OK, I'll forget that you live in Paris."
    assert texts(agent) == ["The user likes jazz"]
    agent.run("forget everything", session_id="s", user_id="ana")
    assert texts(agent) == []


def test_a_shopping_reply_leaves_off_what_the_user_dislikes():
    from chatapp.assistants import add_item, list_items

    agent = Agent(model=OfflineModel(), update_memory_on_run=True, tools=[add_item, list_items],
                  session_state={"shopping_list": []})
    agent.run("I don't like olives", session_id="s", user_id="ana")
    out = agent.run("Add milk, olives and bread", session_id="s", user_id="ana")
    assert agent.get_session_state(session_id="s", user_id="ana")["shopping_list"] == ["milk", "bread"]
    assert out.content.endswith("I left olives off: you don't like them.")
    only = agent.run("add olives", session_id="s", user_id="ana")
    assert only.content == "I left olives off: you don't like them." and only.tools == []


def test_agentic_memory_with_the_offline_model():
    agent = Agent(model=OfflineModel(), enable_agentic_memory=True)
    out = agent.run("I am vegan", session_id="s", user_id="ana")
    assert [t.tool_name for t in out.tools] == ["update_user_memory"]
    assert out.content == "I'll remember that you are vegan."
    assert texts(agent) == ["The user is vegan"]
