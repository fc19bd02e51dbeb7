"""Models: the only module that imports `openai`.

The run loop talks to a model through one method, `Model.astream(messages, tools)`, an async
iterator of `ModelChunk`s: text deltas while the reply streams, then one final chunk with the
assembled tool calls, the usage and the finish reason. Closing the iterator (``aclose()``) closes
the HTTP response, which is how a cancelled run stops the provider from generating.

Every failure surfaces as `ModelError` with a message a person can read.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx2
import openai
from django.conf import settings

from . import bridge
from .storable import storable, storable_json


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

    def _request(self, messages: list[dict], tools: list[dict] | None, response_format: dict | None) -> dict:
        """The keyword arguments of `chat.completions.create` for this request.

        The messages and tools go in `extra_body`, which the SDK sends as they are. Given as
        `messages=`, the SDK walks every message through its TypedDict transform first: 2.3-2.7 ms of
        Python for a 14-message request on a small machine, on the event loop, for a body that is
        already plain JSON (the transform renames aliased keys and formats files; the request has neither).
        The body sent is the same.
        """
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        request = {"model": self.id, "messages": [], "extra_body": body}
        if response_format:
            request["response_format"] = response_format
        if self.temperature is not None:
            request["temperature"] = self.temperature
        return request

    async def astream(self, messages, tools=None, response_format=None):
        """Stream one chat completion, parsing the raw SSE lines (the SDK's chunk objects are slow)."""
        reply = _StreamedReply()
        try:
            create = self._client().chat.completions.with_streaming_response.create
            request = self._request(messages, tools, response_format)
            async with create(**request, stream=True, stream_options={"include_usage": True}) as response:
                async for line in response.iter_lines():
                    text = reply.feed(line)
                    if text:
                        yield ModelChunk(content=text)
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._error(exc) from exc
        yield reply.final_chunk()

    async def acomplete(self, messages, response_format=None):
        """One non-streamed completion; returns the message text."""
        try:
            completion = await self._client().chat.completions.create(
                **self._request(messages, None, response_format)
            )
        except (openai.OpenAIError, httpx2.HTTPError) as exc:
            raise self._error(exc) from exc
        except ValueError as exc:  # the SDK lets a body that is not JSON through as a decode error
            raise ModelError(f"The model server sent malformed data: {exc}") from exc
        if not completion.choices:
            raise ModelError("The model server answered without any reply.")
        return storable(completion.choices[0].message.content or "")

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


TOOL_FIELD_CHARS = 128  # Message.tool_call_id and Message.tool_name


class _StreamedReply:
    """Accumulates one streamed completion from its raw `data:` lines."""

    def __init__(self):
        self.tool_calls: dict[int, dict] = {}  # by the delta's `index`
        self.usage: dict | None = None
        self.finish_reason: str | None = None
        self.done = False

    def feed(self, line: str) -> str:
        """Take one SSE line; return its text delta ("" if none)."""
        if not line.startswith("data:") or self.done:
            return ""
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return ""
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ModelError(f"The model server sent malformed data: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ModelError(f"The model server sent malformed data: {data[:200]!r}")
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
        return storable(delta.get("content") or "")

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
            ToolCall(id=storable(call["id"])[:TOOL_FIELD_CHARS], name=storable(call["name"])[:TOOL_FIELD_CHARS],
                     arguments=storable_json("".join(call["arguments"])) or "{}")
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


# --- The offline demo model -----------------------------------------------------------------------


class OfflineModel(Model):
    """A deterministic demo model: no network, but it really calls shopping-list tools."""

    id = "offline-demo"
    provider = "offline"

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    async def astream(self, messages, tools=None, response_format=None):
        """Stream the planned reply word by word, then the tool calls."""
        text, calls = _plan_turn(messages, tools or [])
        words = re.findall(r"\s*\S+\s*", text)
        for position, word in enumerate(words):
            if position and self.delay > 0:
                await asyncio.sleep(self.delay)
            yield ModelChunk(content=word)
        tool_calls = [
            ToolCall(id=f"call_{number}", name=name, arguments=json.dumps(arguments))
            for number, (name, arguments) in enumerate(calls, start=1)
        ]
        input_tokens = sum(len(_text(message.get("content")).split()) for message in messages)
        output_tokens = len(words) + sum(len(call.arguments.split()) for call in tool_calls)
        yield ModelChunk(
            tool_calls=tool_calls,
            usage={
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
            finish_reason="tool_calls" if tool_calls else "stop",
        )

    async def acomplete(self, messages, response_format=None):
        """Session summaries and titles from the prompt's transcript; else the plain reply."""
        schema_name = ((response_format or {}).get("json_schema") or {}).get("name")
        if schema_name == "session_summary":
            return json.dumps(_summary(messages))
        if any("at most five words" in _text(message.get("content")).lower() for message in messages):
            return _title(messages)
        return _plan_turn(messages, [])[0]


def _text(content) -> str:
    """A message's text, whether plain or a list of content parts."""
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _phrase(items: list) -> str:
    """'milk', 'milk and eggs', 'milk, eggs and bread'."""
    items = [str(item) for item in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class _ListRequest:
    """What the user asked of their shopping list."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    clear: bool = False
    show: bool = False


_SHOW = re.compile(r"what(?:'s|’s| is) on (?:my|the) (?:shopping )?list|\bshow\b.*\blist\b", re.I)
_CLEAR = re.compile(r"\bclear\b(?P<rest>.*)", re.I | re.S)
_CLEAR_THEN_ADD = re.compile(r"\b(?:start(?:ing)?(?: again| over)? with|and add|then add)\s+(?P<items>.+)", re.I | re.S)
_REMOVE = re.compile(r"\b(?:remove|delete|got|picked up)\s+(?P<items>.+)", re.I | re.S)
_ADD = re.compile(r"\b(?:add|need|buy)\s+(?P<items>.+)", re.I | re.S)
_LIST_WORD = re.compile(r"\blist\b", re.I)
_WHERE = re.compile(r"\s+(?:to|from|on|off|onto)\s+(?:my|the)\s+(?:shopping\s+)?list\b.*$", re.I | re.S)
_SEPARATORS = re.compile(r"\s*,\s*(?:and\s+)?|\s+and\s+|\s*&\s*", re.I)
_ARTICLE = re.compile(r"^(?:some|a|an|the)\s+", re.I)
_PLEASE = re.compile(r"[\s,]+please$", re.I)


def _parse_request(text: str) -> _ListRequest | None:
    """Read a shopping-list request from the user's words, or None if it is not one."""
    if _SHOW.search(text):
        return _ListRequest(show=True)
    if match := _CLEAR.search(text):
        then = _CLEAR_THEN_ADD.search(match["rest"])
        return _ListRequest(clear=True, add=_items(then["items"]) if then else [])
    if match := _REMOVE.search(text):
        return _ListRequest(remove=_items(match["items"]))
    if match := _ADD.search(text):
        return _ListRequest(add=_items(match["items"]))
    if _LIST_WORD.search(text):
        return _ListRequest(show=True)
    return None


def _items(text: str) -> list[str]:
    """'some milk, eggs and a loaf of bread to my list' -> ['milk', 'eggs', 'loaf of bread']."""
    text = _PLEASE.sub("", _WHERE.sub("", text.strip()).strip(" .!?"))
    items = (_ARTICLE.sub("", part.strip(" .!?")) for part in _SEPARATORS.split(text))
    return [item for item in items if item]


@dataclass
class _Toolbox:
    """The tools the offline model knows how to drive: names, or (name, argument name) pairs."""

    add: tuple[str, str] | None = None
    remove: tuple[str, str] | None = None
    clear: str | None = None
    show: str | None = None
    update_state: tuple[str, str] | None = None

    @classmethod
    def of(cls, tools: list[dict]) -> "_Toolbox":
        """Sort wire-format tools into the roles the offline model understands."""
        box = cls()
        for tool in tools:
            function = tool.get("function") or {}
            name = function.get("name", "")
            lowered = name.lower()
            parameters = function.get("parameters") or {}
            required = parameters.get("required") or []
            string_arg = _single_string_argument(parameters)
            if lowered == "update_session_state":
                box.update_state = (name, "session_state_updates")
            elif "clear" in lowered:
                box.clear = box.clear or name
            elif "add" in lowered and string_arg:
                box.add = box.add or (name, string_arg)
            elif ("remove" in lowered or "delete" in lowered) and string_arg:
                box.remove = box.remove or (name, string_arg)
            elif ("list" in lowered or "get" in lowered) and not required:
                box.show = box.show or name
        return box


def _single_string_argument(parameters: dict) -> str | None:
    required = parameters.get("required") or []
    if len(required) != 1:
        return None
    kind = (parameters.get("properties") or {}).get(required[0], {}).get("type", "string")
    return required[0] if kind == "string" else None


def _plan_turn(messages: list[dict], tools: list[dict]) -> tuple[str, list[tuple[str, dict]]]:
    """Decide the offline model's reply: (text, [(tool name, arguments), ...])."""
    said = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "").strip()
    names = {tool.get("function", {}).get("name") for tool in tools}
    if "search_past_sessions" in names:
        memory = _plan_memory(messages, said)
        if memory is not None:
            return memory
    if messages and messages[-1].get("role") == "tool":
        return _report_tool_results(messages), []
    request = _parse_request(said)
    if request is None:
        return _plain_reply(said), []
    box = _Toolbox.of(tools)
    calls = _direct_calls(request, box)
    if calls:
        return "", calls
    if box.update_state:
        return _update_state(request, box.update_state, _session_state(messages))
    return _plain_reply(said), []


_ASKS_ABOUT_PAST = re.compile(
    r"\b(discuss|discussed|talk(ed)? about|earlier|before|previous|last time|remember|past (session|conversation)s?)\b",
    re.I,
)
_ASKS_TO_FIND = re.compile(r"\b(find|read|open|look up|show me|tell me about)\b", re.I)
_SEARCH_STOPWORDS = {"find", "read", "open", "show", "tell", "about", "session", "sessions", "conversation", "the",
                     "one", "that", "what", "where", "when", "with", "please", "which", "our", "did", "discuss"}


def _plan_memory(messages: list[dict], said: str):
    """Past-session tools: list earlier sessions when asked about them, then read the one the user names."""
    last = messages[-1] if messages else {}
    if last.get("role") != "tool":
        names_a_session = _ASKS_TO_FIND.search(said) and re.search(r"\b(session|conversation|chat)\b", said, re.I)
        if _ASKS_ABOUT_PAST.search(said) or names_a_session:
            return "", [("search_past_sessions", {})]
        return None
    call = _last_tool_call(messages)
    if call is None:
        return None
    if call["name"] == "search_past_sessions":
        listed = _json_list(_text(last.get("content")))
        wanted = {word for word in re.findall(r"[a-z]{4,}", said.lower()) if word not in _SEARCH_STOPWORDS}
        if _ASKS_TO_FIND.search(said) and wanted:
            for session in listed:
                haystack = json.dumps(session).lower()
                if any(word in haystack for word in wanted):
                    return "", [("read_past_session", {"session_id": session.get("session_id")})]
        if not listed:
            return "I can't find any earlier conversations with you.", []
        topics = [session.get("name") or _first_user_line(session) for session in listed]
        topics = [topic.strip().rstrip(".?!") for topic in topics if topic and topic.strip()]
        return f"We've talked before about: {'; '.join(topics)}.", []
    if call["name"] == "read_past_session":
        transcript = _text(last.get("content"))
        first = re.search(r"^User: (.*)$", transcript, re.M)
        if not first:
            return "I couldn't read that session.", []
        return f'In that session you asked: "{first[1]}".', []
    return None


def _last_tool_call(messages: list[dict]) -> dict | None:
    for message in reversed(messages):
        if message.get("tool_calls"):
            return message["tool_calls"][-1]["function"]
    return None


def _json_list(text: str) -> list:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _first_user_line(session: dict) -> str:
    runs = session.get("recent_runs") or []
    return runs[-1].get("user", "") if runs else ""


def _plain_reply(said: str) -> str:
    if not said:
        return "I'm the offline demo model. Type a message and I'll echo it back."
    return (
        f'I\'m the offline demo model, so I can\'t really think, but I heard: "{said}". '
        "Set OPENAI_API_KEY or OPENAI_BASE_URL to talk to a real model."
    )


def _direct_calls(request: _ListRequest, box: _Toolbox) -> list[tuple[str, dict]]:
    """Calls of the list's own tools, or [] when one the request needs is missing."""
    needed = [
        (request.clear, box.clear),
        (request.remove, box.remove),
        (request.add, box.add),
        (request.show, box.show),
    ]
    if any(wanted and not tool for wanted, tool in needed):
        return []
    calls = [(box.clear, {})] if request.clear else []
    calls += [(box.remove[0], {box.remove[1]: item}) for item in request.remove]
    calls += [(box.add[0], {box.add[1]: item}) for item in request.add]
    calls += [(box.show, {})] if request.show else []
    return calls


def _update_state(request: _ListRequest, tool: tuple[str, str], state: dict):
    """Agentic state: answer a question from the state, or write the new list in one call."""
    current = state.get("shopping_list")
    items = [] if request.clear or not isinstance(current, list) else list(current)
    if request.show:
        return (f"Your list: {_phrase(items)}." if items else "Your list is empty."), []
    removed = {item.lower() for item in request.remove}
    items = [item for item in items if str(item).lower() not in removed]
    for item in request.add:
        if item.lower() not in {str(existing).lower() for existing in items}:
            items.append(item)
    return "", [(tool[0], {tool[1]: {"shopping_list": items}})]


_SESSION_STATE = re.compile(r"<session_state>\s*(.*?)\s*</session_state>", re.S)


def _session_state(messages: list[dict]) -> dict:
    """The state dict shown in the system message (a Python repr or JSON)."""
    for message in messages:
        if message.get("role") != "system":
            continue
        match = _SESSION_STATE.search(_text(message.get("content")))
        if not match:
            continue
        for parse in (ast.literal_eval, json.loads):
            try:
                state = parse(match[1])
            except (ValueError, SyntaxError):
                continue
            return state if isinstance(state, dict) else {}
    return {}


def _report_tool_results(messages: list[dict]) -> str:
    """Say in words what this turn's tool calls did, from their arguments and results."""
    turn = next(
        (index for index in range(len(messages) - 1, -1, -1) if messages[index].get("tool_calls")), None
    )
    if turn is None:
        return "Done."
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages[turn + 1 :] if m.get("role") == "tool"}
    cleared, removed, added, sentences, shown = [], [], [], [], []
    for call in messages[turn]["tool_calls"]:
        name = call["function"]["name"]
        arguments = _json_object(call["function"].get("arguments"))
        result = results.get(call.get("id"), "")
        lowered = name.lower()
        if result.lower().startswith("error"):
            sentences.append(f"{name} failed: {result.rstrip('.')}.")
        elif lowered == "update_session_state":
            updates = arguments.get("session_state_updates")
            items = updates.get("shopping_list") if isinstance(updates, dict) else None
            sentences.append(f"Your list now: {_phrase(items)}." if items else "Your list is now empty.")
        elif "clear" in lowered:
            cleared = ["Cleared your list."]
        elif "add" in lowered:
            added += [value for value in arguments.values() if isinstance(value, str)]
        elif "remove" in lowered or "delete" in lowered:
            removed += [value for value in arguments.values() if isinstance(value, str)]
        elif "list" in lowered or "get" in lowered:
            shown.append(_describe_list(result))
        else:
            sentences.append(f"{name} returned: {result.rstrip('.')}.")
    removed = [f"Removed {_phrase(removed)}."] if removed else []
    added = [f"Added {_phrase(added)} to your list."] if added else []
    return " ".join(cleared + removed + added + sentences + shown) or "Done."


def _json_object(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _describe_list(result: str) -> str:
    """'Your list: milk, bread.' from a list tool's result, JSON or plain text."""
    try:
        value = json.loads(result)
    except ValueError:
        value = result
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, list)), value)
    if isinstance(value, list):
        return f"Your list: {_phrase(value)}." if value else "Your list is empty."
    text = str(value).strip().rstrip(".")
    if not text:
        return "Your list is empty."
    label, colon, items = text.partition(":")
    if colon and items.strip() and len(label) <= 40:  # "Shopping list: milk, bread": the items after the label
        return f"Your list: {items.strip()}."
    if "," not in text and len(text.split()) > 2:  # a sentence of the tool's own ("The list is empty.")
        return f"{text}."
    return f"Your list: {text}."


_USER_LINE = re.compile(r"^\s*user:\s*(.+?)\s*$", re.I | re.M)
_STOPWORDS = frozenset(
    """about above after again also and any are because been before being but can could did does doing
    for from had has have having her here hers him his how into its just like more most much not now off
    once only other our out over own please same she should some such than that the their them then there
    these they this those through too under until very was were what when where which while who whom why
    will with would you your yours i'm it's what's don't can't hi hello hey thanks thank okay
    add remove show tell need want get got make list""".split()
)


def _user_lines(messages: list[dict]) -> list[str]:
    return [line for message in messages for line in _USER_LINE.findall(_text(message.get("content")))]


def _summary(messages: list[dict]) -> dict:
    """{"summary", "topics"} built from the transcript's 'User:' lines."""
    lines = _user_lines(messages)
    if not lines:
        return {"summary": "The user has not said anything yet.", "topics": []}
    words = re.findall(r"[a-z][a-z'’]+", " ".join(lines).lower())
    salient = Counter(word for word in words if len(word) > 2 and word not in _STOPWORDS)
    # most_common keeps first-seen order among equal counts, so topics stay deterministic.
    return {
        "summary": "The user said: " + _phrase([f'"{line}"' for line in lines]) + ".",
        "topics": [word for word, _ in salient.most_common(5)],
    }


_FILLER = re.compile(r"^(?:hi|hello|hey|ok|okay|so|please|can you|could you|would you|will you)\b[\s,.!]*", re.I)


def _title(messages: list[dict]) -> str:
    """At most five words from the first sentence of the conversation's first 'USER:' line."""
    lines = _user_lines(messages)
    text = lines[0] if lines else ""
    while (shorter := _FILLER.sub("", text)) != text:
        text = shorter
    text = re.split(r"(?<=[.!?])\s+", text, maxsplit=1)[0]  # the first sentence: "What can you do? Please..."
    words = re.sub(r"[\"“”‘’`]", "", text).strip(" .!?").split()[:5]
    title = " ".join(words).strip(" .!?,")
    return title[:1].upper() + title[1:] if title else "Offline demo chat"
