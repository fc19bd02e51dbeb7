"""OfflineModel: the deterministic demo model that drives tools in the OpenAI wire format."""

import asyncio
import json

import pytest

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
STATE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "update_session_state",
            "description": "Merge updates into the session state.",
            "parameters": {
                "type": "object",
                "properties": {"session_state_updates": {"type": "object"}},
                "required": ["session_state_updates"],
            },
        },
    }
]


def user(text):
    return {"role": "user", "content": text}


def stream(messages, tools=None):
    async def collect():
        return [chunk async for chunk in OfflineModel().astream(messages, tools)]

    return asyncio.run(collect())


def planned_calls(text, tools=SHOPPING_TOOLS, system=None):
    """The (name, arguments) pairs the model calls for one user message."""
    messages = ([{"role": "system", "content": system}] if system else []) + [user(text)]
    final = stream(messages, tools)[-1]
    assert final.finish_reason == "tool_calls"
    return [(call.name, json.loads(call.arguments)) for call in final.tool_calls]


def reply_text(chunks):
    return "".join(chunk.content for chunk in chunks)


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


def test_clear_then_add_in_one_turn():
    assert planned_calls("Clear the list and start with rice and beans") == [
        ("clear_list", {}),
        ("add_item", {"item": "rice"}),
        ("add_item", {"item": "beans"}),
    ]


def test_agentic_state_gets_one_update_with_the_new_list():
    system = "You keep a shopping list.\n<session_state>\n{'shopping_list': ['milk', 'eggs']}\n</session_state>"

    assert planned_calls("add bread", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["milk", "eggs", "bread"]}})
    ]
    assert planned_calls("remove eggs", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["milk"]}})
    ]


def test_agentic_state_also_reads_json_and_clears():
    system = '<session_state>{"shopping_list": ["milk"], "done": false}</session_state>'

    assert planned_calls("clear it all and add tea", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["tea"]}})
    ]


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


def test_reply_streams_word_by_word_and_counts_words_as_tokens():
    chunks = stream([user("hello there")])

    words = chunks[:-1]
    assert len(words) > 5
    assert all(chunk.content.strip() and " " not in chunk.content.strip() for chunk in words)
    assert chunks[-1].usage == {"input_tokens": 2, "output_tokens": len(words), "total_tokens": 2 + len(words)}


def test_after_tool_results_it_answers_in_words():
    calls = [("call_1", "add_item", {"item": "milk"}), ("call_2", "add_item", {"item": "eggs"}),
             ("call_3", "remove_item", {"item": "bread"}), ("call_4", "get_list", {})]
    messages = [
        user("add milk and eggs, remove bread and show my list"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, name, args in calls
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_4", "content": '["milk", "eggs"]'},
    ]

    chunks = stream(messages, SHOPPING_TOOLS)

    assert reply_text(chunks) == "Removed bread. Added milk and eggs to your list. Your list: milk and eggs."
    assert chunks[-1].tool_calls == []
    assert chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize(("result", "reply"), [
    ("Shopping list: milk, bread", "Your list: milk, bread."),
    ("The list is empty.", "The list is empty."),
    ("milk, bread", "Your list: milk, bread."),
    ('{"shopping_list": ["milk", "bread"]}', "Your list: milk and bread."),
    ("", "Your list is empty."),
])
def test_a_list_tool_result_in_words(result, reply):
    messages = [
        user("what's on my list"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_list", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]

    assert reply_text(stream(messages, SHOPPING_TOOLS)) == reply


def test_after_a_state_update_it_reports_the_new_list():
    messages = [
        user("clear my list"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "update_session_state",
                    "arguments": '{"session_state_updates": {"shopping_list": []}}',
                },
            }],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Updated."},
    ]

    assert reply_text(stream(messages, STATE_TOOLS)) == "Your list is now empty."


def test_title_has_at_most_five_words_without_filler():
    prompt = [
        {"role": "system", "content": "Name this conversation in at most five words. No quotes."},
        {"role": "user", "content": "USER: Hi, can you please help me plan a birthday party?\nASSISTANT: Sure!"},
    ]

    title = asyncio.run(OfflineModel().acomplete(prompt))

    assert title == "Help me plan a birthday"


@pytest.mark.parametrize(("said", "title"), [
    ("Hello! What can you do? Please answer with a list.", "What can you do"),
    ("Plan a trip to Rome. Then book it", "Plan a trip to Rome"),
    ("version 2.5 of the app crashes on start", "Version 2.5 of the app"),
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
