"""A local OpenAI-compatible server: the one mock boundary of the test suite.

`LLMServer` serves `POST /v1/chat/completions` on 127.0.0.1 (a free port) from a daemon thread, so
the real `OpenAIChat`, the sync SDK and a daphne subprocess can all talk to it. It streams (SSE,
chunked) when the body says `stream: true` and answers a plain `chat.completion` otherwise.

Scripting a test:

    llm_server.add(Text("Hello there"), ToolCalls([("add_item", {"item": "milk"})]))  # FIFO queue
    llm_server.responder = lambda body: Text("ok")  # decides once the queue is empty
    llm_server.side_responder = summaries  # answers the requests it returns a response for, before the queue

Response kinds:

* `Text(text, chunk_delay=0.0, wait_event=None)` streams `text` in word-sized deltas. With
  `wait_event`, the first delta is sent and the server then holds the rest until the event is set
  (so a test can act mid-reply); a client leaving meanwhile counts as a disconnect.
* `ToolCalls([(name, args_dict), ...], text="")` streams optional text, then each call as the API
  does (index/id/type/name with empty arguments, then the arguments JSON in fragments), finishing
  with "tool_calls". Call ids run "call_1", "call_2", ... across the test.
* `Error(status, message="...", type="...")` answers with that status and an OpenAI error body;
  429 and 5xx carry `retry-after-ms: 1` so the client's retries are immediate.
* `Hang(seconds)` answers nothing for `seconds` (released early by a reset or shutdown).
* `Cut(text)` streams `text`, then drops the connection without the final chunk or `[DONE]`.
* `Malformed(text="")` streams `text`, then a `data: {not json` line.
* `Raw(pieces, gap=0.0, headers=None)` streams the bytes of `pieces` as they are, each in an HTTP chunk
  of its own, `gap` seconds apart (so they tend to reach the client in reads of their own): SSE
  lines split anywhere, CRLF endings, several events in one write.

Records: `requests` (the JSON bodies, in arrival order), `disconnects` (clients that left
mid-stream), with `wait_for_requests(n)` / `wait_for_disconnects(n)` to wait for them.

Fixtures: `llm_server_session` (one server per test session), `llm_server` (that server, reset for
each test) and `openai_model` (an `OpenAIChat` pointed at it).
"""

from __future__ import annotations

import itertools
import json
import re
import select
import socket
import sys
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sessions_core.llm import OpenAIChat

HOLD_LIMIT = 10.0  # a held reply never outlives a forgotten event by more than this


def _words(text: str) -> list[str]:
    return re.findall(r"\s*\S+\s*", text)


@dataclass
class Text:
    text: str
    chunk_delay: float = 0.0
    wait_event: threading.Event | None = None  # held after `hold_after` words until set
    end_event: threading.Event | None = None  # held after the last word (the reply still running) until set
    hold_after: int = 1

    def serve(self, handler: _Handler, body: dict) -> None:
        if not handler.streaming:
            handler.send_completion(body, {"role": "assistant", "content": self.text}, "stop")
            return
        handler.start_stream()
        for position, word in enumerate(_words(self.text)):
            if position == self.hold_after and self.wait_event and not handler.hold(self.wait_event):
                return
            handler.pause(self.chunk_delay)
            handler.send_delta({"content": word})
        if self.end_event and not handler.hold(self.end_event):
            return
        handler.finish_stream(body, "stop", len(_words(self.text)))


@dataclass
class ToolCalls:
    calls: list[tuple[str, dict]]
    text: str = ""

    def serve(self, handler: _Handler, body: dict) -> None:
        ids = [handler.server.next_call_id() for _ in self.calls]
        if not handler.streaming:
            tool_calls = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, (name, args) in zip(ids, self.calls)
            ]
            message = {"role": "assistant", "content": self.text or None, "tool_calls": tool_calls}
            handler.send_completion(body, message, "tool_calls")
            return
        handler.start_stream()
        for word in _words(self.text):
            handler.send_delta({"content": word})
        for index, (call_id, (name, args)) in enumerate(zip(ids, self.calls)):
            first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            handler.send_delta({"tool_calls": [first]})
            for fragment in _fragments(json.dumps(args)):
                handler.send_delta({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        handler.finish_stream(body, "tool_calls", len(_words(self.text)) + len(self.calls))


def _fragments(text: str, size: int = 7) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


@dataclass
class Error:
    status: int
    message: str = "Something went wrong on the test server."
    type: str = "server_error"

    def serve(self, handler: _Handler, body: dict) -> None:
        # Tell the client to retry at once: the SDK's own backoff would slow every retry test.
        headers = {"retry-after-ms": "1"} if self.status == 429 or self.status >= 500 else {}
        handler.send_json(self.status, {"error": {"message": self.message, "type": self.type}}, headers)


@dataclass
class Hang:
    seconds: float

    def serve(self, handler: _Handler, body: dict) -> None:
        handler.server.released.wait(self.seconds)
        handler.close_connection = True


@dataclass
class Cut:
    text: str = "This reply stops"

    def serve(self, handler: _Handler, body: dict) -> None:
        if not handler.streaming:
            handler.send_raw(200, b'{"id": "chatcmpl-test", "choi', {"Content-Length": "500"})
        else:
            handler.start_stream()
            for word in _words(self.text):
                handler.send_delta({"content": word})
        handler.close_connection = True  # the server then closes the socket mid-body


@dataclass
class Malformed:
    text: str = ""

    def serve(self, handler: _Handler, body: dict) -> None:
        if not handler.streaming:
            handler.send_raw(200, b"{not json", {"Content-Type": "application/json", "Content-Length": "9"})
            return
        handler.start_stream()
        for word in _words(self.text):
            handler.send_delta({"content": word})
        handler.send_chunk(b"data: {not json\n\n")
        handler.send_chunk(b"data: [DONE]\n\n")
        handler.send_chunk(b"")


@dataclass
class Raw:
    pieces: list[bytes]
    gap: float = 0.0
    headers: dict | None = None

    def serve(self, handler: _Handler, body: dict) -> None:
        handler.send_response(200)
        for name, value in {"Content-Type": "text/event-stream", **(self.headers or {})}.items():
            handler.send_header(name, value)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for piece in self.pieces:
            handler.pause(self.gap)
            handler.send_chunk(piece)
        handler.send_chunk(b"")


def is_summary_request(body: dict) -> bool:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name") == "session_summary"


def is_memory_request(body: dict) -> bool:
    messages = body.get("messages") or [{}]
    return (messages[0].get("content") or "").startswith("You are a Memory Manager")


def summary_responder(body: dict):
    """A side responder for tests that are not about summaries or memories: a fixed summary, and no memory
    change, leaving the queue alone."""
    if is_memory_request(body):
        return Text("No change.")
    return Text(json.dumps({"summary": "A conversation.", "topics": ["test"]})) if is_summary_request(body) else None


def is_title_request(body: dict) -> bool:
    messages = body.get("messages") or [{}]
    return "at most five words" in (messages[0].get("content") or "")


def background_responder(body: dict):
    """A side responder for browser tests: summaries and titles (background jobs that may outlive the
    test that started them) are answered aside, so they never take a later test's scripted replies."""
    if is_title_request(body):
        return Text("A generated title")
    return summary_responder(body)


def default_responder(body: dict) -> Text:
    """Answer "Done." after a tool result and "ok" otherwise."""
    messages = body.get("messages") or [{}]
    return Text("Done." if messages[-1].get("role") == "tool" else "ok")


class _ClientGone(Exception):
    """The client closed the connection while we were answering."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE writes would otherwise wait on delayed ACKs (~40 ms each)
    server: LLMServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    def do_POST(self):
        if self.path.rstrip("/") != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": f"No route {self.path}", "type": "not_found"}})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.streaming = bool(body.get("stream"))
        response = self.server.next_response(body)
        try:
            response.serve(self, body)
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            if self.streaming:
                self.server.record_disconnect()
            self.close_connection = True

    # -- plain JSON --

    def send_raw(self, status: int, payload: bytes, headers: dict) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
        self.send_raw(status, data, headers)

    def send_completion(self, body: dict, message: dict, finish_reason: str) -> None:
        completion_tokens = len((message.get("content") or "").split()) + len(message.get("tool_calls", []))
        self.send_json(200, {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "test-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": _usage(body, completion_tokens),
        })

    # -- streaming --

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.send_delta({"role": "assistant", "content": ""})

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_event(self, payload: dict) -> None:
        self.send_chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def send_delta(self, delta: dict, finish_reason: str | None = None) -> None:
        self.send_event(_chunk([{"index": 0, "delta": delta, "finish_reason": finish_reason}]))

    def finish_stream(self, body: dict, finish_reason: str, completion_tokens: int) -> None:
        self.send_delta({}, finish_reason)
        if (body.get("stream_options") or {}).get("include_usage"):
            self.send_event({**_chunk([]), "usage": _usage(body, completion_tokens)})
        self.send_chunk(b"data: [DONE]\n\n")
        self.send_chunk(b"")

    def pause(self, seconds: float) -> None:
        if seconds:
            self.server.released.wait(seconds)

    def hold(self, event: threading.Event) -> bool:
        """Wait for `event` while watching the socket; False if the client left meanwhile."""
        for _ in range(int(HOLD_LIMIT / 0.02)):
            if event.wait(0.02):
                return True
            if self._client_left():
                raise _ClientGone
        return False

    def _client_left(self) -> bool:
        # A closed peer makes the socket readable with nothing to read.
        readable, _, _ = select.select([self.connection], [], [], 0)
        return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""


def _chunk(choices: list) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "test", "choices": choices}


def _usage(body: dict, completion_tokens: int) -> dict:
    prompt_tokens = sum(len(str(message.get("content") or "").split()) for message in body.get("messages", []))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class LLMServer(ThreadingHTTPServer):
    """The test server; see the module docstring for how to script it."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        self._changed = threading.Condition()
        # shutdown() waits up to one poll interval; the default half second would slow every test run.
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="llm-test-server", daemon=True
        )
        self.released = threading.Event()
        self.reset()

    def start(self) -> LLMServer:
        """Serve from a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release any held or hanging replies."""
        self.released.set()
        self.shutdown()
        self.server_close()

    def reset(self) -> None:
        """Forget the queue, the responder and the records; release hanging replies."""
        with self._changed:
            self.released.set()
            self.released = threading.Event()
            self.queue: deque = deque()
            self.responder = default_responder
            self.side_responder = None  # answers some requests before the queue is consulted
            self.requests: list[dict] = []
            self.disconnects = 0
            self._call_ids = itertools.count(1)

    def add(self, *responses) -> None:
        """Queue responses, served first in first out before the responder is asked."""
        with self._changed:
            self.queue.extend(responses)

    def next_response(self, body: dict):
        """Record the request and pick its response."""
        with self._changed:
            self.requests.append(body)
            self._changed.notify_all()
            side = self.side_responder and self.side_responder(body)
            if side is not None:
                return side
            if self.queue:
                return self.queue.popleft()
            responder = self.responder
        return responder(body)

    def next_call_id(self) -> str:
        with self._changed:
            return f"call_{next(self._call_ids)}"

    def record_disconnect(self) -> None:
        with self._changed:
            self.disconnects += 1
            self._changed.notify_all()

    def wait_for_requests(self, count: int, timeout: float = 10) -> bool:
        """Wait until at least `count` requests arrived; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.requests) >= count, timeout)

    def wait_for_disconnects(self, count: int, timeout: float = 10) -> bool:
        """Wait until at least `count` clients left mid-stream; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.disconnects >= count, timeout)

    def handle_error(self, request, client_address):
        # Keep-alive clients that go away cause resets; those are expected, anything else is not.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@pytest.fixture(scope="session")
def llm_server_session():
    """One test server for the whole session."""
    server = LLMServer().start()
    yield server
    server.stop()


@pytest.fixture
def llm_server(llm_server_session):
    """The session's test server, reset before and after the test."""
    llm_server_session.reset()
    yield llm_server_session
    llm_server_session.reset()


@pytest.fixture
def openai_model(llm_server):
    """The real OpenAIChat pointed at the test server."""
    return OpenAIChat(id="test-model", base_url=llm_server.base_url, api_key="test", timeout=5, max_retries=2)
