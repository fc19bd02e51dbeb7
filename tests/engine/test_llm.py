"""OpenAIChat against the local OpenAI-compatible test server, and default_model()."""

import asyncio
import json
import threading

import pytest
from django.test import override_settings

from sessions_core.llm import ModelChunk, ModelError, OfflineModel, OpenAIChat, default_model
from tests.support.llm_server import Cut, Error, Hang, Malformed, Text, ToolCalls

HELLO = [{"role": "user", "content": "Say hello"}]
SHOPPING_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add_item",
            "description": "Add an item to the shopping list.",
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
        },
    }
]


def stream(model, messages=HELLO, tools=None, response_format=None) -> list[ModelChunk]:
    """Run one streamed completion to the end."""

    async def collect():
        return [chunk async for chunk in model.astream(messages, tools, response_format)]

    return asyncio.run(collect())


def stream_error(model, messages=HELLO) -> str:
    with pytest.raises(ModelError) as caught:
        stream(model, messages)
    return str(caught.value)


def test_text_streams_as_several_deltas(llm_server, openai_model):
    llm_server.add(Text("Hello there, how are you today?"))

    chunks = stream(openai_model)

    deltas = [chunk.content for chunk in chunks[:-1]]
    assert len(deltas) == 6
    assert "".join(deltas) == "Hello there, how are you today?"
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].tool_calls == []


def test_final_chunk_reports_usage(llm_server, openai_model):
    llm_server.add(Text("one two three"))

    final = stream(openai_model, [{"role": "user", "content": "count to three"}])[-1]

    assert final.usage == {"input_tokens": 3, "output_tokens": 3, "total_tokens": 6}


def test_request_carries_messages_tools_and_streaming_options(llm_server, openai_model):
    stream(openai_model, HELLO, SHOPPING_TOOLS)

    [body] = llm_server.requests
    assert body["model"] == "test-model"
    assert body["messages"] == HELLO
    assert body["tools"] == SHOPPING_TOOLS
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "summary", "strict": True, "schema": {
    "type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}}


@pytest.mark.parametrize("response_format, temperature", [({"type": "json_object"}, None), (SCHEMA_FORMAT, 0.2)],
                         ids=["json_object", "json_schema and temperature"])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "plain"])
def test_request_body_is_the_one_the_sdks_plain_create_sends(llm_server, response_format, temperature, streamed):
    """The request skips the SDK's transform (all but model and stream go in extra_body); the body is unchanged."""
    import openai

    model = OpenAIChat(id="test-model", base_url=llm_server.base_url, api_key="test", temperature=temperature)
    messages = [{"role": "system", "content": "Be brief."}, *HELLO,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "add_item", "arguments": '{"item": "x"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Added x"}]
    tools = SHOPPING_TOOLS if streamed else None
    llm_server.add(Text('{"summary": "Hi"}'))
    llm_server.add(Text('{"summary": "Hi"}'))
    if streamed:
        stream(model, messages, tools, response_format)
    else:
        asyncio.run(model.acomplete(messages, response_format))

    async def plain():
        client = openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="test", max_retries=0)
        options = {"temperature": temperature} if temperature is not None else {}
        if streamed:
            async with client.chat.completions.with_streaming_response.create(
                model="test-model", messages=messages, tools=tools, response_format=response_format,
                stream=True, stream_options={"include_usage": True}, **options,
            ) as response:
                async for _line in response.iter_lines():
                    pass
        else:
            await client.chat.completions.create(
                model="test-model", messages=messages, response_format=response_format, **options)
        await client.close()

    asyncio.run(plain())
    ours, sdks = llm_server.requests
    assert json.dumps(ours, sort_keys=True) == json.dumps(sdks, sort_keys=True)


def test_request_leaves_out_empty_tools_and_passes_response_format(llm_server, openai_model):
    response_format = {"type": "json_object"}

    stream(openai_model, HELLO, [], response_format)

    [body] = llm_server.requests
    assert "tools" not in body
    assert body["response_format"] == response_format


def test_tool_call_deltas_assemble_into_calls(llm_server, openai_model):
    llm_server.add(ToolCalls([("add_item", {"item": "oat milk", "quantity": 2})]))

    final = stream(openai_model, HELLO, SHOPPING_TOOLS)[-1]

    [call] = final.tool_calls
    assert (call.id, call.name) == ("call_1", "add_item")
    assert json.loads(call.arguments) == {"item": "oat milk", "quantity": 2}
    assert final.finish_reason == "tool_calls"


def test_two_tool_calls_in_one_turn_after_some_text(llm_server, openai_model):
    llm_server.add(ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})], text="On it."))

    chunks = stream(openai_model, HELLO, SHOPPING_TOOLS)

    assert "".join(chunk.content for chunk in chunks) == "On it."
    calls = chunks[-1].tool_calls
    assert [call.id for call in calls] == ["call_1", "call_2"]
    assert [json.loads(call.arguments) for call in calls] == [{"item": "milk"}, {"item": "eggs"}]


def test_server_error_names_the_status_and_message(llm_server, openai_model):
    llm_server.responder = lambda body: Error(500, "The GPU caught fire")

    message = stream_error(openai_model)

    assert message == "The model server answered 500 Internal Server Error: The GPU caught fire"


def test_bad_request_is_not_retried(llm_server, openai_model):
    llm_server.add(Error(400, "Unknown parameter 'foo'", "invalid_request_error"))

    assert "400 Bad Request: Unknown parameter 'foo'" in stream_error(openai_model)
    assert len(llm_server.requests) == 1


def test_rate_limit_twice_then_success(llm_server, openai_model):
    llm_server.add(Error(429, "Slow down"), Error(429, "Slow down"), Text("Finally"))

    chunks = stream(openai_model)

    assert "".join(chunk.content for chunk in chunks) == "Finally"
    assert len(llm_server.requests) == 3


def test_rate_limit_forever_gives_up_with_a_readable_error(llm_server, openai_model):
    llm_server.responder = lambda body: Error(429, "Slow down")

    message = stream_error(openai_model)

    assert "rate limit" in message.lower()
    assert "Slow down" in message
    assert len(llm_server.requests) == 3


def test_silent_server_times_out(llm_server):
    llm_server.add(Hang(30))
    model = OpenAIChat(id="test-model", base_url=llm_server.base_url, api_key="test", timeout=0.5, max_retries=0)

    assert stream_error(model) == "The model server did not answer within 0.5 s."


def test_refused_connection(llm_server_session):
    model = OpenAIChat(id="test-model", base_url="http://127.0.0.1:1/v1", api_key="test", max_retries=0)

    message = stream_error(model)

    assert message.startswith("Could not connect to the model server at http://127.0.0.1:1/v1")


def test_stream_cut_mid_reply(llm_server, openai_model):
    llm_server.add(Cut("This reply will never"))

    assert "cut off mid-stream" in stream_error(openai_model)


def test_malformed_chunk(llm_server, openai_model):
    llm_server.add(Malformed("Fine so far"))

    assert "malformed data" in stream_error(openai_model)


def test_closing_the_stream_closes_the_connection(llm_server, openai_model):
    release = threading.Event()
    llm_server.add(Text("a long reply " * 50, wait_event=release))

    async def read_one_delta_then_close():
        chunks = openai_model.astream(HELLO)
        first = await chunks.__anext__()
        await chunks.aclose()
        # Checked while this loop still runs: its end would close every connection anyway.
        disconnected = await asyncio.to_thread(llm_server.wait_for_disconnects, 1)
        return first, disconnected

    try:
        first, disconnected = asyncio.run(read_one_delta_then_close())
    finally:
        release.set()
    assert first.content == "a "
    assert disconnected


def test_one_model_serves_several_event_loops(llm_server, openai_model):
    llm_server.add(Text("first"), Text("second"))

    replies = ["".join(chunk.content for chunk in stream(openai_model)) for _ in range(2)]

    assert replies == ["first", "second"]


def test_acomplete_returns_the_text_of_a_plain_request(llm_server, openai_model):
    llm_server.add(Text('{"summary": "Talked about milk."}'))
    response_format = {"type": "json_object"}

    text = asyncio.run(openai_model.acomplete(HELLO, response_format))

    assert text == '{"summary": "Talked about milk."}'
    [body] = llm_server.requests
    assert "stream" not in body
    assert body["response_format"] == response_format


@pytest.mark.parametrize(
    "response, expected",
    [(Error(503, "Overloaded"), "503 Service Unavailable: Overloaded"), (Malformed(), "malformed data")],
)
def test_acomplete_wraps_errors(llm_server, openai_model, response, expected):
    llm_server.responder = lambda body: response

    with pytest.raises(ModelError, match=expected):
        asyncio.run(openai_model.acomplete(HELLO))


@override_settings(OPENAI_API_KEY="", OPENAI_BASE_URL="", OFFLINE_MODEL_DELAY=0.25)
def test_default_model_is_offline_without_settings():
    model = default_model()

    assert isinstance(model, OfflineModel)
    assert model.delay == 0.25


@override_settings(
    OPENAI_API_KEY="", OPENAI_BASE_URL="http://localhost:11434/v1", OPENAI_MODEL="llama3.2",
    OPENAI_TIMEOUT=12.0, OPENAI_MAX_RETRIES=4,
)
def test_default_model_uses_a_configured_server():
    model = default_model()

    assert isinstance(model, OpenAIChat)
    assert (model.id, model.base_url, model.api_key) == ("llama3.2", "http://localhost:11434/v1", "not-needed")
    assert (model.timeout, model.max_retries, model.provider) == (12.0, 4, "openai")


@override_settings(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="", OPENAI_MODEL="")
def test_default_model_with_only_an_api_key_talks_to_openai():
    model = default_model()

    assert isinstance(model, OpenAIChat)
    assert (model.id, model.base_url, model.api_key) == ("gpt-4o-mini", None, "sk-test")
