"""The offline demo model: deterministic, no network, and able to drive the assistants' tools.

It reads the user's words and the tools on offer, calls the tools a simple request needs
("add milk and eggs", "remove eggs", "what is on my list"), then says in words what the tools did.
Summaries and titles come from the transcript in the prompt.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from .model_api import Model, ModelChunk, ToolCall


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
