"""Models: OpenAI-compatible servers through the `openai` client (the only module that imports it).

`OpenAIChat` streams chat completions from OpenAI or any OpenAI-compatible server; `default_model()`
picks it when the settings name a server, else the offline demo model (`offline_model.py`). The
interface both implement is in `model_api.py`; its names are re-exported here, where users look.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from contextlib import aclosing

import httpx2
import openai
import orjson
from django.conf import settings

from . import bridge
from .model_api import TOOL_FIELD_CHARS, Model, ModelChunk, ModelError, ToolCall
from .offline_model import OfflineModel
from .storable import replace_unstorable, replace_unstorable_json

__all__ = ["Model", "ModelChunk", "ModelError", "OfflineModel", "OpenAIChat", "ToolCall", "default_model"]


# --- OpenAI-compatible servers --------------------------------------------------------------------


class OpenAIChat(Model):
    """Chat completions from OpenAI or any OpenAI-compatible server (Ollama, vLLM, llama.cpp)."""

    provider = "openai"

    def __init__(
        self,
        id: str = "gpt-4o-mini",
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
    ):
        self.id = id
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        # Pooled connections belong to the loop that opened them, so each running loop gets its own
        # client. Keyed weakly: a client goes away with its loop. (A task waiting to close it would be
        # left pending by loop owners that do not cancel leftovers, and its finalizer then fails.)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = openai.AsyncOpenAI(
                api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=self.max_retries
            )
            bridge.at_loop_close(self.aclose)  # the loop of a sync caller's thread that has ended
        return client

    async def aclose(self) -> None:
        """Close this loop's HTTP connections now (they are otherwise closed with the loop)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _request(self, messages: list[dict], tools: list[dict] | None, response_format: dict | None,
                 stream: bool = False) -> dict:
        """The keyword arguments of `chat.completions.create` for this request.

        Everything but the model and the stream flag goes in `extra_body`, which the SDK sends as it
        is. Given as typed parameters (`messages=` most of all), the SDK walks them through its
        TypedDict transform first, in Python on the event loop, for a body that is already plain JSON
        (the transform renames aliased keys and formats files; the request has neither). The body
        sent is the same.
        """
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        if response_format:
            body["response_format"] = response_format
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if stream:
            body["stream_options"] = {"include_usage": True}
        request = {"model": self.id, "messages": [], "extra_body": body}
        if stream:
            request["stream"] = True
        return request

    async def astream(self, messages, tools=None, response_format=None):
        """Stream one chat completion, reading the response's bytes and parsing its SSE lines here.

        The SDK's chunk objects are slow, and so is a text line read through the HTTP client (a
        byte, a text and a line decoder, each an async generator, for every SSE event): the raw
        bytes are split into lines by `_SSELines` and each `data:` line parsed by orjson.
        """
        reply = _StreamedReply()
        try:
            create = self._client().chat.completions.with_streaming_response.create
            async with create(**self._request(messages, tools, response_format, stream=True)) as response:
                lines = _SSELines()
                async with aclosing(_body_bytes(response.http_response)) as reads:
                    async for data in reads:
                        for line in lines.feed(data):
                            if line:  # a blank line ends an SSE event: nothing to read in it
                                text = reply.feed(line)
                                if text:
                                    yield ModelChunk(content=text)
                text = reply.feed(lines.flush())
                if text:
                    yield ModelChunk(content=text)
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._error(exc) from exc
        yield reply.final_chunk()

    async def acomplete(self, messages, response_format=None):
        """One non-streamed completion; returns the message text.

        Read as the raw response (the SDK still builds the request, retries, and raises its errors)
        and its body parsed as JSON here, rather than built into the SDK's pydantic objects, which
        are slow to build and not needed for one string.
        """
        try:
            raw = await self._client().chat.completions.with_raw_response.create(
                **self._request(messages, None, response_format)
            )
            body = _json(raw.http_response.content)
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._error(exc) from exc
        except ValueError as exc:  # a body that is not JSON
            raise ModelError(f"The model server sent malformed data: {exc}") from exc
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list):
            raise ModelError(f"The model server sent malformed data: {raw.http_response.text[:200]!r}")
        if not choices:
            raise ModelError("The model server answered without any reply.")
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if content is not None and not isinstance(content, str):
            raise ModelError(f"The model server sent malformed data: a message content of {content!r:.200}")
        return replace_unstorable(content or "")

    def _error(self, exc: Exception) -> ModelError:
        """Translate an SDK or transport failure into words."""
        if isinstance(exc, openai.RateLimitError):
            return ModelError(
                f"The model server rate limited the request (429 Too Many Requests) and still refused "
                f"after {self.max_retries} retries: {_error_detail(exc)}"
            )
        if isinstance(exc, openai.APIStatusError):
            return ModelError(
                f"The model server answered {exc.status_code} {exc.response.reason_phrase}: {_error_detail(exc)}"
            )
        if isinstance(exc, (openai.APITimeoutError, httpx2.TimeoutException)):
            return ModelError(f"The model server did not answer within {self.timeout:g} s.")
        # The SDK wraps transport failures of the whole exchange as APIConnectionError.
        cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) else exc
        if isinstance(cause, (httpx2.RemoteProtocolError, httpx2.ReadError)):
            return ModelError("The model's reply was cut off mid-stream: the connection closed early.")
        if isinstance(exc, (openai.APIConnectionError, httpx2.TransportError)):
            where = self.base_url or "the OpenAI API"
            return ModelError(f"Could not connect to the model server at {where}: {cause or exc}")
        return ModelError(f"The model call failed: {exc}")


def _error_detail(exc: openai.APIStatusError) -> str:
    """The server's own explanation from an error body, else the SDK's message."""
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    if isinstance(body, str) and body:
        return body[:300]
    return exc.message


# --- reading the stream ---------------------------------------------------------------------------


def _body_bytes(response: httpx2.Response):
    """The response body's bytes as they arrive: raw unless the server compressed them."""
    if response.headers.get("content-encoding", "identity").strip().lower() in ("", "identity"):
        return response.aiter_raw()
    return response.aiter_bytes()


class _SSELines:
    """Splits a byte stream into lines, whichever of LF, CRLF or CR ends them.

    Only `data:` lines carry anything here, so a CRLF split between two reads may make one blank
    line more, which SSE ignores as it ignores every blank line.
    """

    def __init__(self):
        self.pending = b""  # the start of a line whose end has not arrived

    def feed(self, data: bytes) -> list[bytes]:
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self.pending:
            data = self.pending + data
        lines = data.split(b"\n")
        self.pending = lines.pop()
        return lines

    def flush(self) -> bytes:
        """The last line, if the stream ended without a line break."""
        line, self.pending = self.pending, b""
        return line


def _json(data: bytes):
    """Parsed JSON; orjson first, else the json module, which takes what orjson refuses (NaN,
    integers past 64 bits, lone surrogate escapes, bytes that are not UTF-8 as U+FFFD)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(_text(data))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class _StreamedReply:
    """Accumulates one streamed completion from its raw `data:` lines."""

    def __init__(self):
        self.tool_calls: dict[int, dict] = {}  # by the delta's `index`
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.done = False

    def feed(self, line: bytes) -> str:
        """Take one SSE line; return its text delta ("" if none)."""
        if not line.startswith(b"data:") or self.done:
            return ""
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return ""
        try:
            chunk = _json(data)
        except ValueError:
            raise ModelError(f"The model server sent malformed data: {_text(data)[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ModelError(f"The model server sent malformed data: {_text(data)[:200]!r}")
        if chunk.get("error"):  # some servers report failures inside the stream
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise ModelError(f"The model server reported an error mid-stream: {message}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not chunk.get("choices"):
            return ""
        choice = chunk["choices"][0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        for position, fragment in enumerate(delta.get("tool_calls") or ()):
            self._add_tool_fragment(fragment.get("index", position), fragment)
        return replace_unstorable(delta.get("content") or "")

    def _add_tool_fragment(self, index: int, fragment: dict) -> None:
        call = self.tool_calls.setdefault(index, {"id": "", "name": "", "arguments": []})
        function = fragment.get("function") or {}
        # id and name arrive whole in the first fragment; arguments arrive in pieces.
        call["id"] = fragment.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        call["arguments"].append(function.get("arguments") or "")

    def final_chunk(self) -> ModelChunk:
        """The closing chunk: assembled tool calls, usage and finish reason."""
        if not self.done and self.finish_reason is None:
            raise ModelError("The model's reply was cut off mid-stream: it ended before it was finished.")
        # Ids and names are stored in columns of 128 characters (PostgreSQL refuses more; real ones are
        # far shorter): a longer one, cut here, stays the same in the call and in its result.
        calls = [
            ToolCall(id=replace_unstorable(call["id"])[:TOOL_FIELD_CHARS], name=replace_unstorable(call["name"])[:TOOL_FIELD_CHARS],
                     arguments=replace_unstorable_json("".join(call["arguments"])) or "{}")
            for _, call in sorted(self.tool_calls.items())
        ]
        return ModelChunk(
            tool_calls=calls,
            usage=_usage(self.usage) if self.usage else None,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
        )


def _usage(usage: dict) -> dict:
    input_tokens = usage.get("prompt_tokens") or 0
    output_tokens = usage.get("completion_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": usage.get("total_tokens") or input_tokens + output_tokens,
    }


def default_model() -> Model:
    """The app's model: an OpenAI-compatible server when one is configured, else the offline demo."""
    if settings.OPENAI_API_KEY or settings.OPENAI_BASE_URL:
        return OpenAIChat(
            id=settings.OPENAI_MODEL or "gpt-4o-mini",
            base_url=settings.OPENAI_BASE_URL or None,
            api_key=settings.OPENAI_API_KEY or "not-needed",
            timeout=settings.OPENAI_TIMEOUT,
            max_retries=settings.OPENAI_MAX_RETRIES,
        )
    return OfflineModel(delay=settings.OFFLINE_MODEL_DELAY)
