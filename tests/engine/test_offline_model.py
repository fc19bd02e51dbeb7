"""OfflineModel: the deterministic demo model that drives a shopping list's tools in the OpenAI wire format."""

import asyncio
import enum
import json

import pydantic
import pytest

from chatapp.demo_tools import add_item, clear_list, list_items, remove_item
from sessions_core import Agent
from sessions_core.llm import OfflineModel


def tool(name, **string_params):
    """A wire-format tool whose keyword arguments are required string parameters."""
    properties = {param: {"type": "string", "description": text} for param, text in string_params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


SHOPPING_TOOLS = [
    tool("add_item", item="What to add"),
    tool("remove_item", item="What to remove"),
    tool("get_list"),
    tool("clear_list"),
]


def user(text):
    return {"role": "user", "content": text}


def stream(messages, tools=None, response_format=None):
    async def collect():
        return [chunk async for chunk in OfflineModel().astream(messages, tools, response_format)]

    return asyncio.run(collect())


def planned_calls(text, tools=SHOPPING_TOOLS):
    """The (name, arguments) pairs the model calls for one user message."""
    final = stream([user(text)], tools)[-1]
    assert final.finish_reason == "tool_calls"
    return [(call.name, json.loads(call.arguments)) for call in final.tool_calls]


def reply_text(chunks):
    return "".join(chunk.content for chunk in chunks)


def tool_turn(said, *calls):
    """The messages of a turn whose tool calls ran: (name, arguments, result) each."""
    ids = [f"call_{number}" for number in range(1, len(calls) + 1)]
    return [
        user(said),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for call_id, (name, arguments, _) in zip(ids, calls)
        ]},
        *({"role": "tool", "tool_call_id": call_id, "content": result} for call_id, (_, _, result) in zip(ids, calls)),
    ]


def test_adds_each_item_in_one_turn():
    final = stream([user("Add milk, eggs and bread")], SHOPPING_TOOLS)[-1]

    assert [call.id for call in final.tool_calls] == ["call_1", "call_2", "call_3"]
    assert [(call.name, json.loads(call.arguments)) for call in final.tool_calls] == [
        ("add_item", {"item": "milk"}),
        ("add_item", {"item": "eggs"}),
        ("add_item", {"item": "bread"}),
    ]


def test_need_drops_articles_and_where_to_put_it():
    assert planned_calls("I need some apples and a loaf of bread on my list please") == [
        ("add_item", {"item": "apples"}),
        ("add_item", {"item": "loaf of bread"}),
    ]


def test_remove_and_got_call_the_remove_tool():
    assert planned_calls("Remove eggs") == [("remove_item", {"item": "eggs"})]
    assert planned_calls("I got the milk and the eggs") == [
        ("remove_item", {"item": "milk"}),
        ("remove_item", {"item": "eggs"}),
    ]


def test_question_about_the_list_calls_the_list_tool():
    assert planned_calls("What's on my list?") == [("get_list", {})]
    assert planned_calls("show me the list") == [("get_list", {})]


def test_a_change_then_show_in_one_turn():
    assert planned_calls("Add apples and bananas to the list, then show me the complete list.") == [
        ("add_item", {"item": "apples"}), ("add_item", {"item": "bananas"}), ("get_list", {})]
    assert planned_calls("remove bread and show me the list") == [("remove_item", {"item": "bread"}), ("get_list", {})]


def test_a_quoted_name_is_the_item_and_a_verb_inside_a_name_asks_for_nothing():
    assert planned_calls("Add 'Buy groceries' with low priority and 'Call dentist'") == [
        ("add_item", {"item": "Buy groceries"}), ("add_item", {"item": "Call dentist"})]
    assert "offline demo model" in reply_text(stream([user("Mark 'Buy groceries' as completed")], SHOPPING_TOOLS))


def test_clear_then_add_in_one_turn():
    assert planned_calls("Clear the list and start with rice and beans") == [
        ("clear_list", {}),
        ("add_item", {"item": "rice"}),
        ("add_item", {"item": "beans"}),
    ]


def test_a_tools_role_is_the_first_word_of_its_name():
    tools = [tool("create_note", text="The note"), tool("delete_note", text="Which"), tool("view_notes"),
             tool("empty_notes")]
    removing_all = [tool("remove_all_items"), tool("add_item", item="What")]

    assert planned_calls("add buy stamps", tools) == [("create_note", {"text": "buy stamps"})]
    assert planned_calls("delete buy stamps", tools) == [("delete_note", {"text": "buy stamps"})]
    assert planned_calls("what is on my list?", tools) == [("view_notes", {})]
    assert planned_calls("clear everything", tools) == [("empty_notes", {})]
    assert planned_calls("clear the list", removing_all) == [("remove_all_items", {})]


def test_a_tool_with_no_parameters_is_called_when_its_name_is_said():
    asking = {"type": "function", "function": {"name": "schedule_delivery", "parameters": {"type": "object"}}}

    assert planned_calls("please schedule the delivery", [*SHOPPING_TOOLS, asking]) == [("schedule_delivery", {})]


def test_plain_answer_says_it_is_the_offline_demo_model():
    chunks = stream([user("Tell me a joke")])

    text = reply_text(chunks)
    assert "offline demo model" in text
    assert '"Tell me a joke"' in text
    assert chunks[-1].tool_calls == []
    assert chunks[-1].finish_reason == "stop"


def test_request_without_a_fitting_tool_gets_the_plain_answer():
    chunks = stream([user("add milk")], [tool("get_weather", city="Where")])

    assert chunks[-1].tool_calls == []
    assert "offline demo model" in reply_text(chunks)


def test_what_the_user_dislikes_is_left_off_the_list_and_said_only_where_a_tool_would_add_it():
    system = {"role": "system", "content": "You know user info and preferences from previous interactions.\n"
              "<memories_from_previous_interactions>\n- The user does not like olives\n"
              "</memories_from_previous_interactions>"}

    with_tools = stream([system, user("add milk and olives")], SHOPPING_TOOLS)[-1]
    only_olives = reply_text(stream([system, user("add olives")], SHOPPING_TOOLS))
    no_tools = reply_text(stream([system, user("add olives")]))

    assert [(call.name, json.loads(call.arguments)) for call in with_tools.tool_calls] == [
        ("add_item", {"item": "milk"})]
    assert only_olives == "I left olives off: you don't like them."
    assert "offline demo model" in no_tools and "left olives off" not in no_tools


def test_reply_streams_word_by_word_and_counts_words_as_tokens():
    chunks = stream([user("hello there")])

    words = chunks[:-1]
    assert len(words) > 5
    assert all(chunk.content.strip() and " " not in chunk.content.strip() for chunk in words)
    assert chunks[-1].usage == {"input_tokens": 2, "output_tokens": len(words), "total_tokens": 2 + len(words)}


def test_after_tool_results_it_passes_on_what_the_tools_said():
    messages = tool_turn("add milk and eggs, remove bread",
                         ("add_item", {"item": "milk"}, "Added milk"),
                         ("add_item", {"item": "eggs"}, "eggs is already on the list."),
                         ("remove_item", {"item": "bread"}, "Error: bread is not on the list."))

    chunks = stream(messages, SHOPPING_TOOLS)

    assert reply_text(chunks) == "Added milk. eggs is already on the list. Error: bread is not on the list."
    assert chunks[-1].tool_calls == []
    assert chunks[-1].finish_reason == "stop"


def test_only_the_last_turns_results_are_passed_on():
    messages = [*tool_turn("add milk", ("add_item", {"item": "milk"}, "Added milk.")),
                {"role": "assistant", "content": "Added milk."},
                *tool_turn("what's on my list", ("get_list", {}, "Shopping list: milk"))]

    assert reply_text(stream(messages, SHOPPING_TOOLS)) == "Shopping list: milk."


def test_title_has_at_most_five_words_without_filler():
    prompt = [
        {"role": "system", "content": "Name this conversation in at most five words. No quotes."},
        {"role": "user", "content": "USER: Hi, can you please help me plan a birthday party?\nASSISTANT: Sure!"},
    ]

    title = asyncio.run(OfflineModel().acomplete(prompt))

    assert title == "Plan a birthday party"


@pytest.mark.parametrize(("said", "title"), [
    ("Hello! What can you do? Please answer with a list.", "What can you do"),
    ("Plan a trip to Rome. Then book it", "Plan a trip to Rome"),
    ("version 2.5 of the app crashes on start", "Version 2.5 of the app"),
    ("Plan a weekend trip to Lisbon in May", "Plan a weekend trip"),
])
def test_title_comes_from_the_first_sentence(said, title):
    prompt = [
        {"role": "system", "content": "Name this conversation in at most five words. No quotes."},
        {"role": "user", "content": f"USER: {said}\nASSISTANT: Sure!"},
    ]

    assert asyncio.run(OfflineModel().acomplete(prompt)) == title


def test_summary_follows_the_session_summary_schema():
    prompt = [{"role": "user", "content": "Summarise.\nUser: add oat milk\nAssistant: Added.\nUser: remove the milk"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "session_summary", "schema": {}}}

    summary = json.loads(asyncio.run(OfflineModel().acomplete(prompt, response_format)))

    assert summary == {"summary": 'The user said: "add oat milk" and "remove the milk".', "topics": ["milk", "oat"]}


def test_acomplete_otherwise_gives_the_plain_answer():
    text = asyncio.run(OfflineModel().acomplete([user("What is the capital of France?")]))

    assert text.startswith("I'm the offline demo model")


def test_identity():
    model = OfflineModel(delay=0.5)

    assert (model.id, model.provider, model.delay) == ("offline-demo", "offline", 0.5)


# -- structured output ------------------------------------------------------------------------------


class Status(str, enum.Enum):
    applied = "applied"
    offer = "offer"


class Contact(pydantic.BaseModel):
    email: str | None = None
    phone_number: str


class Application(pydantic.BaseModel):
    company: str
    status: Status = Status.offer
    salary: float
    years: int
    remote: bool
    skills: list[str]
    contact: Contact


def json_format(model):
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": model.model_json_schema()}}


def test_under_a_schema_the_reply_is_json_that_validates():
    said = "I applied to Acme Robotics"
    schema = json_format(Application)
    before = json.dumps(schema)

    chunks = stream([user(said)], None, schema)

    application = Application.model_validate_json(reply_text(chunks))  # the schema's own validation
    assert application == Application(company=said, status=Status.offer, salary=0, years=0, remote=False, skills=[],
                                      contact=Contact(email=said, phone_number=said))
    assert json.dumps(schema) == before  # the schema is read, never changed
    assert chunks[-1].tool_calls == []


def test_after_tool_results_a_schema_still_gets_json():
    class Outcome(pydantic.BaseModel):
        status: str

    messages = tool_turn("add milk", ("add_item", {"item": "milk"}, "Added milk."))

    assert Outcome.model_validate_json(reply_text(stream(messages, SHOPPING_TOOLS, json_format(Outcome)))).status == (
        "add milk")


# -- through a real agent on the test database ----------------------------------------------------------


@pytest.mark.django_db
def test_an_agent_keeps_a_shopping_list_with_the_demo_tools():
    agent = Agent(model=OfflineModel(), tools=[add_item, remove_item, list_items, clear_list],
                  session_state={"shopping_list": []})

    def say(text):
        return agent.run(text, session_id="list", user_id="ann").content

    assert say("add milk, eggs and bread") == ("Added milk. The list now has 1 item(s). Added eggs. The list now has "
                                               "2 item(s). Added bread. The list now has 3 item(s).")
    assert say("remove eggs") == "Removed eggs."
    assert say("remove tea") == "Error: tea is not on the list."
    assert say("what's on my list") == "Shopping list: milk, bread."
    assert agent.get_session_state(session_id="list", user_id="ann") == {"shopping_list": ["milk", "bread"]}


@pytest.mark.django_db
def test_an_agent_with_an_output_schema_gets_a_model_instance():
    output = Agent(model=OfflineModel(), output_schema=Application).run(
        "I applied to Acme Robotics", session_id="jobs", user_id="ann")

    assert isinstance(output.content, Application)
    assert (output.content.company, output.content.status) == ("I applied to Acme Robotics", Status.offer)
