"""Scripting the memory manager's model call on the local test server."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tests.support.llm_server import HOLD_LIMIT, Text, ToolCalls, is_memory_request


@dataclass
class HeldToolCalls(ToolCalls):
    """Tool calls sent once `event` is set (a request answered later, without holding the server)."""

    event: threading.Event | None = None

    def serve(self, handler, body: dict) -> None:
        self.event.wait(HOLD_LIMIT)
        super().serve(handler, body)


def memory_responder(calls_for):
    """A side responder: a memory manager request is answered with the tool calls `calls_for(user text,
    system prompt)` returns (none: a plain "No change."), then "Done." once the tool results are in.
    Every other request is left to the queue."""

    def respond(body: dict):
        if not is_memory_request(body):
            return None
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return Text("Done.")
        calls = calls_for(messages[-1]["content"], messages[0]["content"])
        return ToolCalls(calls) if calls else Text("No change.")

    return respond


def memory_requests(llm_server) -> list[dict]:
    return [body for body in llm_server.requests if is_memory_request(body)]
