"""The model interface the run loop talks to: `Model.astream`, its `ModelChunk`s and `ModelError`.

The run loop talks to a model through one method, `Model.astream(messages, tools)`, an async
iterator of `ModelChunk`s: text deltas while the reply streams, then one final chunk with the
assembled tool calls, the usage and the finish reason. Closing the iterator (``aclose()``) closes
the HTTP response, which is how a cancelled run stops the provider from generating.

Every failure surfaces as `ModelError` with a message a person can read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field


TOOL_FIELD_CHARS = 128  # Message.tool_call_id and Message.tool_name: longer ids and names are cut


class ModelError(Exception):
    """A model call failed; the message says why in words a user can read."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text the model produced, parsed by the run loop

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass
class ModelChunk:
    content: str = ""  # a text delta
    tool_calls: list[ToolCall] = field(default_factory=list)  # only on the final chunk
    usage: dict | None = None  # {"input_tokens", "output_tokens", "total_tokens"}, final chunk
    finish_reason: str | None = None  # final chunk: "stop", "tool_calls", "length", ...


class Model:
    """Base class. `id` names the model; `provider` names who serves it."""

    id: str = ""
    provider: str = ""

    def astream(
        self, messages: list[dict], tools: list[dict] | None = None, response_format: dict | None = None
    ) -> AsyncIterator[ModelChunk]:
        """Stream one chat completion. `messages` and `tools` use the OpenAI chat wire format."""
        raise NotImplementedError

    async def acomplete(self, messages: list[dict], response_format: dict | None = None) -> str:
        """One non-streamed completion; returns the text (used for titles and summaries)."""
        parts = []
        stream = self.astream(messages, None, response_format)
        try:
            async for chunk in stream:
                parts.append(chunk.content)
        finally:
            await stream.aclose()
        return "".join(parts)
