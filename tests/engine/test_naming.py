import asyncio

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from sessions_core import Agent, StepInput, StepOutput, Workflow
from sessions_core.history import ChatMessage
from sessions_core.llm import OfflineModel
from sessions_core.models import ChatSession, NameSource
from sessions_core.naming import generate_session_name, short_title
from tests.support.llm_server import Error, Text

pytestmark = pytest.mark.django_db


def test_set_session_name_by_hand(openai_model, llm_server):
    agent = Agent(model=openai_model)
    agent.run("hi", session_id="n1", user_id="u")
    agent.set_session_name(session_id="n1", session_name="  My trip  ", user_id="u")
    assert agent.get_session_name(session_id="n1", user_id="u") == "My trip"
    assert ChatSession.objects.get(session_id="n1").name_source == NameSource.USER
    with pytest.raises(ValueError, match="No session name provided"):
        agent.set_session_name(session_id="n1", session_name=" ", user_id="u")


def test_autogenerate_makes_one_call_and_strips_quotes(openai_model, llm_server):
    agent = Agent(model=openai_model)
    llm_server.add(Text("Sure."), Text('"Planning a Lisbon trip."'))
    agent.run("Help me plan a trip to Lisbon", session_id="n2", user_id="u")
    session = agent.set_session_name(session_id="n2", autogenerate=True, user_id="u")
    assert session.session_name == "Planning a Lisbon trip"
    assert ChatSession.objects.get(session_id="n2").name_source == NameSource.AUTO
    request = llm_server.requests[-1]
    assert "at most five words" in request["messages"][0]["content"]
    assert "USER: Help me plan a trip to Lisbon" in request["messages"][1]["content"]


def test_autogenerate_retries_when_too_long_then_truncates(openai_model, llm_server):
    agent = Agent(model=openai_model)
    llm_server.add(Text("ok"))
    agent.run("hello", session_id="n3", user_id="u")
    too_long = "one two three four five six seven"
    llm_server.add(Text(too_long), Text(""), Text(too_long))
    session = agent.set_session_name(session_id="n3", autogenerate=True, user_id="u")
    assert session.session_name == "one two three four five"
    assert len(llm_server.requests) == 4  # the run, then three naming attempts


def test_autogenerate_falls_back_when_the_model_fails(openai_model, llm_server):
    agent = Agent(model=openai_model)
    llm_server.add(Text("ok"))
    agent.run("Budget for the new kitchen project please", session_id="n4", user_id="u")
    llm_server.add(Error(400, "x"), Error(400, "x"), Error(400, "x"))
    session = agent.set_session_name(session_id="n4", autogenerate=True, user_id="u")
    assert session.session_name == "Budget for the new kitchen"
    assert session.name_source == NameSource.FALLBACK  # so a caller knows to try again later


def test_a_failed_generation_keeps_the_title_already_there(openai_model, llm_server):
    agent = Agent(model=openai_model)
    llm_server.add(Text("ok"))
    agent.run("Budget for the new kitchen project please", session_id="n6", user_id="u")
    ChatSession.objects.filter(session_id="n6").update(name="Budget for the new kitchen project", name_source="fallback")
    llm_server.add(Error(400, "x"), Error(400, "x"), Error(400, "x"))
    session = agent.set_session_name(session_id="n6", autogenerate=True, user_id="u")
    assert (session.session_name, session.name_source) == ("Budget for the new kitchen project", NameSource.FALLBACK)


def test_autogenerate_never_replaces_a_users_title(openai_model, llm_server):
    agent = Agent(model=openai_model)
    agent.run("hi", session_id="n5", user_id="u")
    agent.set_session_name(session_id="n5", session_name="Mine", user_id="u")
    llm_server.add(Text("Generated"))
    assert agent.set_session_name(session_id="n5", autogenerate=True, user_id="u").session_name == "Mine"


def test_naming_for_a_user_reads_no_user_row(openai_model, llm_server):
    # The session's owner is the User the name was asked for, checked against the session: its
    # name in the returned session comes with no read of the users' table.
    user = get_user_model().objects.create_user("namer")
    agent = Agent(model=openai_model)
    llm_server.add(Text("ok"), Text("Garden plans"))
    agent.run("Plan the garden", session_id="n8", user_id=user)
    with CaptureQueriesContext(connection) as queries:
        session = agent.set_session_name(session_id="n8", autogenerate=True, user_id=user)
    assert (session.session_name, session.user_id) == ("Garden plans", "namer")
    assert queries.captured_queries
    assert not [query for query in queries.captured_queries if "auth_user" in query["sql"]]


def test_offline_model_titles_from_the_first_message():
    messages = [ChatMessage(role="user", content="Can you help me plan a birthday party for my son"),
                ChatMessage(role="assistant", content="Sure!")]
    title, generated = asyncio.run(generate_session_name(OfflineModel(), messages))
    assert generated
    assert 0 < len(title.split()) <= 5
    assert '"' not in title
    assert title == "Plan a birthday party"  # "Can you help me" said nothing of the subject


@pytest.mark.django_db(transaction=True)
def test_a_rename_made_while_the_title_is_generated_is_kept(openai_model, llm_server):
    agent = Agent(model=openai_model)
    llm_server.add(Text("ok"))
    agent.run("Plan the garden", session_id="n7", user_id="u")

    def rename_then_answer(body):  # the user renames the chat while the model writes its title
        try:
            ChatSession.objects.filter(session_id="n7").update(name="My garden", name_source=NameSource.USER)
        finally:
            # The model server's request thread: nothing else closes its connection, which would keep
            # PostgreSQL from dropping the test database at the end of the run.
            connections.close_all()
        return Text("Garden plans")

    llm_server.responder = rename_then_answer
    session = agent.set_session_name(session_id="n7", autogenerate=True, user_id="u")

    assert (session.session_name, session.name_source) == ("My garden", NameSource.USER)
    assert ChatSession.objects.values_list("name", "name_source").get(session_id="n7") == ("My garden", "user")


def greet(step_input: StepInput) -> StepOutput:
    return StepOutput(content=f"Hello, {step_input.input}")


@pytest.mark.parametrize("description, title", [
    ("Short description", "Short description"),
    ("Exactly forty characters of description.", "Exactly forty characters of description."),
    ("Automated article creation from research and writing", "Automated article creation from research-"),
])
def test_a_workflows_generated_name_uses_a_short_description_whole(description, title, llm_server):
    """SPEC item 22, as Agno: a description of 40 characters or less is used whole; a longer one is cut to
    40 and marked "-"; either way " - " and the session's creation time follow. No model call."""
    workflow = Workflow(name="Greeter", description=description, steps=[greet])
    workflow.run("Ann", session_id="w")

    session = workflow.set_session_name(session_id="w", autogenerate=True)

    created = ChatSession.objects.get(session_id="w").created_at
    assert session.session_name == f"{title} - {created:%Y-%m-%d %H:%M}"
    assert llm_server.requests == []


@pytest.mark.parametrize(("text", "title"), [
    ("Plan a weekend trip to Lisbon in May", "Plan a weekend trip"),  # never ends on "to"
    ("Add a step: design the homepage and footer", "Add a step"),  # ends with its clause
    ("This is a very long message about the garden", "a very long message"),
    ("Short and whole", "Short and whole"),
    ("one two three four five six seven", "one two three four five"),
])
def test_a_title_cut_to_five_words_ends_where_it_reads(text, title):
    assert short_title(text) == title
