import json

import pytest

from sessions_core import Agent, RunEvent, SessionSummaryManager
from sessions_core.models import ChatSession
from tests.support.llm_server import Error, Text

pytestmark = pytest.mark.django_db


def summary_reply(text, topics=()):
    return Text(json.dumps({"summary": text, "topics": list(topics)}))


def is_summary_request(body):
    return body.get("stream") is not True and "response_format" in body


def test_manager_rejects_non_positive_limits():
    """last_n_runs and conversation_limit must be positive."""
    for kwargs in ({"last_n_runs": 0}, {"conversation_limit": -1}):
        with pytest.raises(ValueError, match="positive"):
            SessionSummaryManager(**kwargs)


def test_summary_is_regenerated_after_each_successful_run(openai_model, llm_server):
    """Each run replaces the summary; the request holds the whole conversation."""
    agent = Agent(model=openai_model, enable_session_summaries=True)
    llm_server.add(Text("Nice to meet you, John."), summary_reply("John lives in New York.", ["location"]))
    agent.run("I'm John and I live in New York", session_id="s1", user_id="john")
    summary = agent.get_session_summary(session_id="s1", user_id="john")
    assert summary.summary == "John lives in New York."
    assert summary.topics == ["location"]
    assert summary.updated_at is not None

    llm_server.add(Text("Great hobbies."), summary_reply("John, New York, likes basketball and hiking."))
    agent.run("I like basketball and hiking", session_id="s1", user_id="john")
    assert agent.get_session_summary(session_id="s1", user_id="john").summary.endswith("basketball and hiking.")
    request = llm_server.requests[-1]
    assert request["response_format"]["json_schema"]["name"] == "session_summary"
    transcript = request["messages"][0]["content"]
    assert "User: I'm John and I live in New York" in transcript
    assert "User: I like basketball and hiking" in transcript
    assert "Assistant: Great hobbies." in transcript


def test_summary_failure_keeps_the_previous_one_and_logs(openai_model, llm_server, caplog):
    """A failing summary call does not fail the run and keeps the old summary."""
    agent = Agent(model=openai_model, enable_session_summaries=True)
    llm_server.add(Text("Hi."), summary_reply("First summary."))
    agent.run("hello", session_id="s2", user_id="ann")
    llm_server.add(Text("Hi again."), Error(400, "bad request"))
    output = agent.run("hello again", session_id="s2", user_id="ann")
    assert output.status == "completed"
    assert agent.get_session_summary(session_id="s2", user_id="ann").summary == "First summary."
    assert any("s2" in record.getMessage() for record in caplog.records if record.levelname == "ERROR")


def test_no_summary_after_an_errored_run(openai_model, llm_server):
    agent = Agent(model=openai_model, enable_session_summaries=True)
    llm_server.add(Error(400, "nope"))
    output = agent.run("hello", session_id="s3", user_id="ann")
    assert output.status == "error"
    assert len(llm_server.requests) == 1
    assert ChatSession.objects.get(session_id="s3").summary is None


def test_summary_is_injected_into_later_runs(openai_model, llm_server):
    """The system prompt of the next run carries the summary and says the conversation takes precedence."""
    agent = Agent(model=openai_model, enable_session_summaries=True, instructions="Be brief.")
    llm_server.add(Text("Hello."), summary_reply("The user is called Zed."))
    agent.run("my name is Zed", session_id="s4", user_id="zed")
    llm_server.add(Text("Zed."), summary_reply("The user is called Zed."))
    agent.run("what is my name?", session_id="s4", user_id="zed")
    system = llm_server.requests[-2]["messages"][0]["content"]
    assert "<summary_of_previous_interactions>\nThe user is called Zed.\n</summary_of_previous_interactions>" in system
    assert "prefer information from this conversation" in system


def test_summary_comes_after_run_completed_in_the_stream(openai_model, llm_server):
    """RunCompleted is not held up by the summary: the summary events follow it."""
    agent = Agent(model=openai_model, enable_session_summaries=True)
    llm_server.add(Text("Hi."), summary_reply("A greeting."))
    events = [e.event for e in agent.run("hi", session_id="s5", user_id="u", stream=True, stream_events=True)]
    assert events[-3:] == [RunEvent.run_completed, RunEvent.session_summary_started, RunEvent.session_summary_completed]


def test_custom_manager_limits_runs_and_uses_its_prompt(openai_model, llm_server):
    manager = SessionSummaryManager(session_summary_prompt="Summarise tersely.", last_n_runs=1)
    agent = Agent(model=openai_model, session_summary_manager=manager)
    assert agent.enable_session_summaries
    llm_server.responder = lambda body: summary_reply("s") if is_summary_request(body) else Text("ok")
    agent.run("first topic", session_id="s6", user_id="u")
    agent.run("second topic", session_id="s6", user_id="u")
    transcript = llm_server.requests[-1]["messages"][0]["content"]
    assert transcript.startswith("Summarise tersely.")
    assert "second topic" in transcript and "first topic" not in transcript
    assert "previous_summary" not in transcript  # Agno's window: what is outside it is forgotten


def test_a_windowed_summary_can_carry_the_previous_one_so_nothing_outside_the_window_is_lost(openai_model,
                                                                                               llm_server):
    manager = SessionSummaryManager(last_n_runs=1, include_previous_summary=True)
    agent = Agent(model=openai_model, session_summary_manager=manager)
    summaries = iter(["The user asked about the first topic.", "First and second topics."])
    llm_server.responder = lambda body: summary_reply(next(summaries)) if is_summary_request(body) else Text("ok")

    agent.run("first topic", session_id="s7", user_id="u")
    first = llm_server.requests[-1]["messages"][0]["content"]
    agent.run("second topic", session_id="s7", user_id="u")
    second = llm_server.requests[-1]["messages"][0]["content"]

    assert "previous_summary" not in first  # none yet
    assert "<previous_summary>\nThe user asked about the first topic.\n</previous_summary>" in second
    assert "User: second topic" in second and "User: first topic" not in second
    assert agent.get_session_summary(session_id="s7", user_id="u").summary == "First and second topics."


def test_summary_of_another_users_session_is_refused(openai_model, llm_server):
    from sessions_core import SessionOwnershipError

    agent = Agent(model=openai_model, enable_session_summaries=True)
    llm_server.add(Text("Hi."), summary_reply("secret"))
    agent.run("hi", session_id="s7", user_id="owner")
    with pytest.raises(SessionOwnershipError):
        agent.get_session_summary(session_id="s7", user_id="intruder")
