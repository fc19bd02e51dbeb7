"""OpenAIChat reads the stream's bytes itself: SSE lines split anywhere, CRLF, several events per read,
compressed bodies, bytes that are not UTF-8; and `acomplete` parses the plain body itself."""

import asyncio
import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions_core.llm import ModelError, _SSELines
from tests.support.llm_server import Raw, Text, _chunk

HELLO = [{"role": "user", "content": "Say hello"}]


def event(delta: dict, finish_reason=None, line_end: bytes = b"\n") -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    payload = json.dumps(_chunk([choice]), ensure_ascii=False).encode()  # as servers send it: UTF-8
    return b"data: " + payload + line_end + line_end


def reply_bytes(words: list[str], line_end: bytes = b"\n") -> bytes:
    """A whole streamed reply as a server writes it: the words, the finish, usage, [DONE]."""
    counts = {"prompt_tokens": 2, "completion_tokens": len(words), "total_tokens": 2 + len(words)}
    usage = {**_chunk([]), "usage": counts}
    return b"".join([
        event({"role": "assistant", "content": ""}, line_end=line_end),
        *(event({"content": word}, line_end=line_end) for word in words),
        event({}, "stop", line_end=line_end),
        b"data: " + json.dumps(usage).encode() + line_end + line_end,
        b"data: [DONE]" + line_end + line_end,
    ])


def stream(model, messages=HELLO):
    async def collect():
        return [chunk async for chunk in model.astream(messages)]

    return asyncio.run(collect())


def text_of(chunks) -> str:
    return "".join(chunk.content for chunk in chunks)


# -- the line splitter on its own ------------------------------------------------------------------


def split_lines(data: bytes, cuts: list[int]) -> list[bytes]:
    splitter = _SSELines()
    lines = []
    start = 0
    for cut in sorted(cuts) + [len(data)]:
        lines += splitter.feed(data[start:cut])
        start = cut
    return [line for line in lines + [splitter.flush()] if line]


@given(st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_lines_are_the_same_wherever_the_reads_split_them(line_end, cuts):
    data = reply_bytes(["Hello ", "wörld, ", "\u00e9t\u00e9 ", "done."], line_end)
    expected = [line for line in data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n") if line]

    assert split_lines(data, [cut % (len(data) + 1) for cut in cuts]) == expected


def test_a_crlf_split_between_two_reads_is_one_line_end():
    splitter = _SSELines()

    assert splitter.feed(b"data: a\r") == [b"data: a"]
    assert splitter.feed(b"\ndata: b\r\n") == [b"", b"data: b"]  # the extra line is blank, which SSE skips
    assert splitter.flush() == b""


def test_the_last_line_without_a_line_end_is_kept():
    splitter = _SSELines()

    assert splitter.feed(b"data: [DO") == []
    assert splitter.feed(b"NE]") == []
    assert splitter.flush() == b"data: [DONE]"


# -- over HTTP: what the server's writes look like does not change the reply -----------------------------


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_line_ends_of_every_kind(llm_server, openai_model, line_end):
    llm_server.add(Raw([reply_bytes(["Hello ", "there."], line_end)]))

    chunks = stream(openai_model)

    assert text_of(chunks) == "Hello there."
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage == {"input_tokens": 2, "output_tokens": 2, "total_tokens": 4}


def test_a_data_line_split_across_reads(llm_server, openai_model):
    data = reply_bytes(["Split ", "mid-line ", "and mid-character: \u00e9\u00e8."])
    middle = data.index("\u00e9".encode()) + 1  # between the two bytes of a UTF-8 character
    cuts = [7, 30, middle, middle + 40]
    pieces = [data[start:end] for start, end in zip([0, *cuts], [*cuts, len(data)])]
    llm_server.add(Raw(pieces, gap=0.01))

    chunks = stream(openai_model)

    assert text_of(chunks) == "Split mid-line and mid-character: \u00e9\u00e8."
    assert [chunk.content for chunk in chunks[:-1]] == ["Split ", "mid-line ", "and mid-character: \u00e9\u00e8."]
    assert chunks[-1].finish_reason == "stop"


def test_several_events_in_one_write_stay_separate_deltas_in_order(llm_server, openai_model):
    words = [f"w{number} " for number in range(40)]
    llm_server.add(Raw([reply_bytes(words)]))

    chunks = stream(openai_model)

    assert [chunk.content for chunk in chunks[:-1]] == words


def test_comments_event_names_and_blank_lines_are_skipped(llm_server, openai_model):
    llm_server.add(Raw([b": keep-alive\n\nevent: message\nid: 1\n", event({"content": "ok"}), b"retry: 10\n\n",
                        event({}, "stop"), b"data: [DONE]\n\n"]))

    chunks = stream(openai_model)

    assert text_of(chunks) == "ok"
    assert chunks[-1].finish_reason == "stop"


def test_a_gzip_compressed_stream(llm_server, openai_model):
    llm_server.add(Raw([gzip.compress(reply_bytes(["Squeezed ", "text."]))], headers={"Content-Encoding": "gzip"}))

    assert text_of(stream(openai_model)) == "Squeezed text."


def test_bytes_that_are_not_utf8_become_replacement_characters(llm_server, openai_model):
    line = b'data: {"choices": [{"index": 0, "delta": {"content": "caf\xe9 ok"}, "finish_reason": null}]}\n\n'
    llm_server.add(Raw([line, event({}, "stop"), b"data: [DONE]\n\n"]))

    assert text_of(stream(openai_model)) == "caf\ufffd ok"


def test_numbers_only_the_json_module_reads_are_read(llm_server, openai_model):
    # A usage figure past 64 bits, and NaN: orjson refuses both; the stream was read with the json module.
    line = b'data: {"choices": [{"index": 0, "delta": {"content": "big"}, "finish_reason": null}], "x": NaN}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 18446744073709551616}}\n\n'
    llm_server.add(Raw([line, event({}, "stop"), usage, b"data: [DONE]\n\n"]))

    chunks = stream(openai_model)

    assert text_of(chunks) == "big"
    assert chunks[-1].usage["output_tokens"] == 18446744073709551616


def test_a_data_line_that_is_not_an_object_is_malformed(llm_server, openai_model):
    llm_server.add(Raw([event({"content": "so far"}), b"data: [1, 2]\n\n"]))

    with pytest.raises(ModelError, match=r"malformed data: '\[1, 2\]'"):
        stream(openai_model)


def test_a_stream_that_ends_without_its_finish_is_cut_off(llm_server, openai_model):
    llm_server.add(Raw([event({"content": "half a "}), b'data: {"choices": [{"index": 0, "del']))

    with pytest.raises(ModelError, match="malformed data"):
        stream(openai_model)


def test_a_stream_that_stops_between_events_is_cut_off(llm_server, openai_model):
    llm_server.add(Raw([event({"content": "half a "})]))

    with pytest.raises(ModelError, match="cut off mid-stream: it ended before it was finished"):
        stream(openai_model)


# -- acomplete's plain body ---------------------------------------------------------------------------


def completion_body(message) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


class Body:
    """A plain (not streamed) answer with this body and content type."""

    def __init__(self, payload: bytes, content_type: str = "application/json"):
        self.payload, self.content_type = payload, content_type

    def serve(self, handler, body):
        handler.send_raw(200, self.payload, {"Content-Type": self.content_type,
                                             "Content-Length": str(len(self.payload))})


def complete(model) -> str:
    return asyncio.run(model.acomplete(HELLO))


def test_acomplete_reads_the_message_text(llm_server, openai_model):
    llm_server.add(Text("A short title"))

    assert complete(openai_model) == "A short title"


def test_acomplete_with_no_text_returns_empty(llm_server, openai_model):
    llm_server.add(Body(json.dumps(completion_body({"role": "assistant", "content": None})).encode()))

    assert complete(openai_model) == ""


def test_acomplete_makes_the_text_storable(llm_server, openai_model):
    llm_server.add(Body(json.dumps(completion_body({"role": "assistant", "content": "a\x00b \ud800"})).encode()))

    assert complete(openai_model) == "a\ufffdb \ufffd"


@pytest.mark.parametrize("payload, content_type", [
    (b"[]", "application/json"),
    (b'{"object": "something else"}', "application/json"),
    (json.dumps(completion_body({"role": "assistant", "content": ["parts"]})).encode(), "application/json"),
    (b"<html>Bad gateway</html>", "text/html"),
], ids=["a list", "no choices", "content not text", "not JSON"])
def test_acomplete_refuses_a_body_that_is_not_a_completion(llm_server, openai_model, payload, content_type):
    llm_server.add(Body(payload, content_type))

    with pytest.raises(ModelError, match="malformed data"):
        complete(openai_model)


def test_acomplete_with_an_empty_choice_list(llm_server, openai_model):
    llm_server.add(Body(json.dumps({**completion_body({}), "choices": []}).encode()))

    with pytest.raises(ModelError, match="answered without any reply"):
        complete(openai_model)
