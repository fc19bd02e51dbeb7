import json

import pytest

from sessions_core import Agent
from sessions_core.models import ChatSession
from sessions_core.run import lifecycle
from tests.support.llm_server import Text, ToolCalls

pytestmark = pytest.mark.django_db

TOPICS = {
    "session_space": ("Tell me about black holes", "Black holes are regions of spacetime..."),
    "session_cooking": ("How do I make carbonara?", "Whisk eggs and pecorino, toss with guanciale and pasta."),
    "session_music": ("Who wrote The Four Seasons?", "Antonio Vivaldi."),
}


def tool_results(body):
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


@pytest.fixture
def alice_sessions(openai_model, llm_server):
    agent = Agent(name="Historian", model=openai_model, search_past_sessions=True, num_past_sessions_to_search=10)
    for session_id, (question, answer) in TOPICS.items():
        llm_server.add(Text(answer))
        agent.run(question, session_id=session_id, user_id="alice")
    return agent


def test_two_step_flow_lists_then_reads_the_cooking_session(alice_sessions, llm_server):
    """The model lists alice's sessions, picks the cooking one and reads its transcript."""
    llm_server.add(
        ToolCalls([("search_past_sessions", {})]),
        Text("We talked about black holes, carbonara and Vivaldi."),
        ToolCalls([("search_past_sessions", {})]),
        ToolCalls([("read_past_session", {"session_id": "session_cooking"})]),
        Text("In the cooking session you asked about carbonara."),
    )
    output = alice_sessions.run("What did we discuss before?", session_id="session_new", user_id="alice")
    listed = json.loads(tool_results(llm_server.requests[-1])[0])
    assert [s["session_id"] for s in listed] == ["session_music", "session_cooking", "session_space"]
    assert listed[1]["recent_runs"] == [{"user": TOPICS["session_cooking"][0], "assistant": TOPICS["session_cooking"][1]}]
    assert output.content == "We talked about black holes, carbonara and Vivaldi."

    output = alice_sessions.run("Find the cooking one", session_id="session_new", user_id="alice")
    transcript = tool_results(llm_server.requests[-1])[-1]
    assert "Session: session_cooking" in transcript
    assert "User: How do I make carbonara?" in transcript
    assert "Assistant: Whisk eggs and pecorino" in transcript
    assert output.content == "In the cooking session you asked about carbonara."


def test_current_session_is_excluded_before_the_limit(alice_sessions, llm_server):
    """With a limit of 2 and the current session the newest, two *other* sessions are listed."""
    alice_sessions.num_past_sessions_to_search = 2
    llm_server.add(Text("first turn in music"))
    alice_sessions.run("More Vivaldi please", session_id="session_music", user_id="alice")
    llm_server.add(ToolCalls([("search_past_sessions", {})]), Text("ok"))
    alice_sessions.run("What did we discuss?", session_id="session_music", user_id="alice")
    listed = json.loads(tool_results(llm_server.requests[-1])[0])
    assert [s["session_id"] for s in listed] == ["session_cooking", "session_space"]


def test_another_user_sees_none_of_it(alice_sessions, llm_server):
    """bob lists nothing and reading alice's session id reads as not found."""
    llm_server.add(
        ToolCalls([("search_past_sessions", {}), ("read_past_session", {"session_id": "session_cooking"})]),
        Text("Nothing."),
    )
    alice_sessions.run("What did we discuss?", session_id="bob_new", user_id="bob")
    listed, read = tool_results(llm_server.requests[-1])
    assert json.loads(listed) == []
    assert read == "Session not found."


def test_other_assistants_sessions_are_not_listed(alice_sessions, llm_server, openai_model):
    other = Agent(name="Chef", model=openai_model, search_past_sessions=True)
    llm_server.add(ToolCalls([("search_past_sessions", {}), ("read_past_session", {"session_id": "session_space"})]),
                   Text("ok"))
    other.run("What did we discuss?", session_id="chef_new", user_id="alice")
    listed, read = tool_results(llm_server.requests[-1])
    assert json.loads(listed) == []
    assert read == "Session not found."


def test_without_a_user_only_ownerless_sessions_are_listed(openai_model, llm_server, alice_sessions):
    llm_server.add(Text("anonymous answer"))
    alice_sessions.run("anonymous question", session_id="anon_old")
    llm_server.add(ToolCalls([("search_past_sessions", {})]), Text("ok"))
    alice_sessions.run("What did we discuss?", session_id="anon_new")
    listed = json.loads(tool_results(llm_server.requests[-1])[0])
    assert [s["session_id"] for s in listed] == ["anon_old"]


def test_read_past_session_limits_runs(alice_sessions, llm_server):
    llm_server.add(Text("second answer"))
    alice_sessions.run("second question", session_id="session_space", user_id="alice")
    llm_server.add(ToolCalls([("read_past_session", {"session_id": "session_space", "num_runs": 1})]), Text("ok"))
    alice_sessions.run("read it", session_id="session_other", user_id="alice")
    transcript = tool_results(llm_server.requests[-1])[0]
    assert "black holes" in transcript and "second question" not in transcript


def test_tools_are_offered_only_when_enabled(openai_model, llm_server):
    Agent(model=openai_model).run("hi", session_id="plain", user_id="u")
    assert "tools" not in llm_server.requests[-1]
    Agent(model=openai_model, search_past_sessions=True).run("hi", session_id="plain2", user_id="u")
    names = {tool["function"]["name"] for tool in llm_server.requests[-1]["tools"]}
    assert names == {"search_past_sessions", "read_past_session"}
    read = next(t for t in llm_server.requests[-1]["tools"] if t["function"]["name"] == "read_past_session")
    assert "run_context" not in read["function"]["parameters"]["properties"]


def test_an_edited_turn_is_read_as_the_session_reads_now(alice_sessions, llm_server):
    """read_past_session and the search preview give the current branch only (an edited turn's first
    version is gone from the conversation) and never a queued run that has not begun."""
    llm_server.add(Text("Rome in three days: the Forum, the Vatican, Trastevere."))
    alice_sessions.run("Plan three days in Rome", session_id="session_trip", user_id="alice")
    llm_server.add(Text("Paris: the Louvre first."))
    paris = alice_sessions.run("What about Paris?", session_id="session_trip", user_id="alice")
    llm_server.add(Text("Lisbon: trams and custard tarts."))
    alice_sessions.edit_and_rerun(paris.run_id, "What about Lisbon?", session_id="session_trip", user_id="alice")
    lifecycle.enqueue(ChatSession.objects.get(session_id="session_trip"), "Not begun yet")
    alice_sessions.num_past_session_runs_in_search = 2

    llm_server.add(ToolCalls([("search_past_sessions", {}), ("read_past_session", {"session_id": "session_trip"})]),
                   Text("ok"))
    alice_sessions.run("What did we plan?", session_id="session_new", user_id="alice")

    listed, transcript = tool_results(llm_server.requests[-1])
    trip = next(s for s in json.loads(listed) if s["session_id"] == "session_trip")
    assert [turn["user"] for turn in trip["recent_runs"]] == ["Plan three days in Rome", "What about Lisbon?"]
    assert "Paris" not in transcript and "Not begun yet" not in transcript
    assert transcript.split("\n\n")[1:] == [
        "User: Plan three days in Rome", "Assistant: Rome in three days: the Forum, the Vatican, Trastevere.",
        "User: What about Lisbon?", "Assistant: Lisbon: trams and custard tarts.\n"]
