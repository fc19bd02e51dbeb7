"""The offline demo model: deterministic, no network, enough for the demo assistants and README's first steps.

It lives in sessions_core, not beside the demo assistants, because the engine's own `default_model()`
answers with it when no model server is configured, and sessions_core never imports the web app.

What it understands is the user's last message and the names of the tools on offer:

* "add milk, eggs and bread" ("I need ...", "buy ..."): the add tool, once per item;
* "remove eggs" ("delete ...", "I got ..."): the remove tool, once per item;
* "what's on my list" ("show the list"): the tool that lists;
* "clear the list" ("... and start over with X"): the clear tool (then the add tool);
* a tool the message names whose arguments a person gives ("schedule the delivery");
* simple facts about the user, learnt, used and forgotten (`offline_memory.py`).

A tool's role comes from the first word of its name: add/create/new and remove/delete/drop (one required
string, the item), list/show/get/view (no required parameter), clear/empty/reset (or remove, with no
required parameter). Once the tools ran, it passes their results on as they are: each tool says what it
did, or why it did nothing, in its own words. Anything else gets a reply saying it is the offline demo
model and what it heard. Under a JSON schema it answers with a
value that fits the schema (strings hold the user's words). Titles and session summaries come from the
transcript's user lines.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from . import offline_memory
from .model_api import Model, ModelChunk, ToolCall
from .naming import short_title


class OfflineModel(Model):
    """A deterministic demo model: no network, but it really calls a shopping list's tools."""

    id = "offline-demo"
    provider = "offline"

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    async def astream(self, messages, tools=None, response_format=None):
        """Stream the planned reply word by word, then the tool calls."""
        text, calls = _respond(messages, tools or [], response_format)
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
        """Session summaries and titles from the prompt's transcript; else the plain (or JSON) reply."""
        schema_name = ((response_format or {}).get("json_schema") or {}).get("name")
        if schema_name == "session_summary":
            return json.dumps(_summary(messages))
        if any("at most five words" in _text(message.get("content")).lower() for message in messages):
            return _title(messages)
        return _respond(messages, [], response_format)[0]


def _text(content) -> str:
    """A message's text, whether plain or a list of content parts."""
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _phrase(items: list) -> str:
    """'milk', 'milk and eggs', 'milk, eggs and bread'."""
    items = [str(item) for item in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _sentence(text: str) -> str:
    """`text` as a sentence: stripped, ending with a full stop unless it has its own mark."""
    text = text.strip()
    return text if not text or text.endswith((".", "!", "?")) else f"{text}."


# --- what the user asked of their list -----------------------------------------------------------


@dataclass
class _Request:
    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    clear: bool = False
    show: bool = False


_SHOW = re.compile(r"what(?:'s|’s| is) on (?:my|the) (?:shopping )?list|\bshow\b.*\blist\b", re.I)
_CLEAR = re.compile(r"\bclear\b(?P<rest>.*)", re.I | re.S)
_CLEAR_THEN_ADD = re.compile(r"\b(?:start(?:ing)?(?: again| over)? with|and add|then add)\s+(?P<items>.+)", re.I | re.S)
# Adding and removing are asked verb first ("add milk", "I need eggs"): "Mark 'Buy milk' as done" buys nothing.
_LEAD = r"^(?:(?:please|now|so|ok|okay|i|we|can you|could you)[\s,]+)*"
_REMOVE = re.compile(_LEAD + r"(?:remove|delete|got|picked up)\s+(?P<items>.+)", re.I | re.S)
_ADD = re.compile(_LEAD + r"(?:add|need|buy)\s+(?P<items>.+)", re.I | re.S)
_LIST_WORD = re.compile(r"\blist\b", re.I)
_WHERE = re.compile(r"\s+(?:to|from|on|off|onto)\s+(?:my|the)\s+(?:shopping\s+)?list\b.*$"
                    r"|,?\s+(?:and|then)\s+(?:then\s+)?show\b.*$", re.I | re.S)
_SEPARATORS = re.compile(r"\s*,\s*(?:and\s+)?|\s+and\s+|\s*&\s*", re.I)
_ARTICLE = re.compile(r"^(?:some|a|an|the)\s+", re.I)
_PLEASE = re.compile(r"[\s,]+please$", re.I)


def _parse_request(text: str) -> _Request | None:
    """Read a shopping-list request from the user's words ("add X, then show me the list" is both), or None
    if it is not one."""
    request = _Request(show=bool(_SHOW.search(text)))
    if match := _CLEAR.search(text):
        then = _CLEAR_THEN_ADD.search(match["rest"])
        request.clear, request.add = True, _items(then["items"]) if then else []
    elif match := _REMOVE.search(text):
        request.remove = _items(match["items"])
    elif match := _ADD.search(text):
        request.add = _items(match["items"])
    elif _LIST_WORD.search(text):
        request.show = True
    return request if request != _Request() else None


_QUOTED = re.compile(r"['\"‘“](.+?)['\"’”]")


def _items(text: str) -> list[str]:
    """'some milk, eggs and a loaf of bread to my list' -> ['milk', 'eggs', 'loaf of bread']; a part with a
    quoted name is that name ("'Call dentist' with medium priority" -> 'Call dentist')."""
    text = _PLEASE.sub("", _WHERE.sub("", text.strip()).strip(" .!?"))
    parts = (_ARTICLE.sub("", part.strip(" .!?")) for part in _SEPARATORS.split(text))
    items = ((quoted[1] if (quoted := _QUOTED.search(part)) else part) for part in parts)
    return [item for item in items if item]


# --- the tools on offer, by the first word of their names ----------------------------------------

_ROLES = {"add": {"add", "create", "new"}, "remove": {"remove", "delete", "drop"},
          "show": {"list", "show", "get", "view"}, "clear": {"clear", "empty", "reset"}}
_TAKES_SUBJECT = {"add", "remove"}  # one required string: the item; the others take no required argument
_GENERIC_WORDS = {"get", "set", "do", "make", "the", "a", "an", "my", "to", "of", "for"}


@dataclass(frozen=True)
class _Tool:
    name: str
    subject: str | None  # the one required string parameter, if it has exactly one
    required: tuple[str, ...]
    has_params: bool


def _tool_of(wire: dict) -> _Tool:
    function = wire.get("function") or {}
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = tuple(parameters.get("required") or ())
    strings = [name for name in required if properties.get(name, {}).get("type", "string") == "string"]
    return _Tool(function.get("name", ""), strings[0] if len(required) == 1 and strings else None, required,
                 bool(properties))


def _name_words(name: str) -> list[str]:
    """'clear_list' or 'clearList' -> ['clear', 'list']."""
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower().replace("-", "_").split("_")


def _toolbox(tools: list[dict]) -> dict[str, _Tool]:
    """The first tool on offer for each role."""
    box: dict[str, _Tool] = {}
    for tool in map(_tool_of, tools):
        first = _name_words(tool.name)[0]
        for role, verbs in _ROLES.items():
            fits = tool.subject is not None if role in _TAKES_SUBJECT else not tool.required
            verbs = verbs | _ROLES["remove"] if role == "clear" else verbs  # remove_all_items clears
            if first in verbs and fits and role not in box:
                box[role] = tool
    return box


def _list_calls(request: _Request, box: dict[str, _Tool]) -> list[tuple[str, dict]]:
    """The list tools' calls for `request`, or [] when a tool it needs is not on offer."""
    wanted = {"clear": request.clear, "remove": request.remove, "add": request.add, "show": request.show}
    if any(asked and role not in box for role, asked in wanted.items()):
        return []
    calls = [(box["clear"].name, {})] if request.clear else []
    calls += [(box["remove"].name, {box["remove"].subject: item}) for item in request.remove]
    calls += [(box["add"].name, {box["add"].subject: item}) for item in request.add]
    return calls + ([(box["show"].name, {})] if request.show else [])


def _named_call(said: str, tools: list[dict]) -> tuple[str, dict] | None:
    """A tool offered without parameters (a person gives them) whose name the user says: "schedule the
    delivery" calls schedule_delivery."""
    words = set(re.findall(r"[a-z]+", said.lower()))
    for tool in map(_tool_of, tools):
        wanted = set(_name_words(tool.name)) - _GENERIC_WORDS
        if not tool.has_params and wanted and wanted <= words:
            return tool.name, {}
    return None


# --- the turn ------------------------------------------------------------------------------------


def _respond(messages: list[dict], tools: list[dict], response_format: dict | None):
    """The turn's (text, calls); a final answer under a JSON schema is JSON that fits it."""
    text, calls = _plan_turn(messages, tools)
    schema = _json_schema(response_format)
    if schema is not None and not calls:
        return json.dumps(_fill(schema, schema.get("$defs") or {}, _last_user_text(messages))), []
    return text, calls


def _last_user_text(messages: list[dict]) -> str:
    return next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "").strip()


def _plan_turn(messages: list[dict], tools: list[dict]) -> tuple[str, list[tuple[str, dict]]]:
    """The offline model's reply: (text, [(tool name, arguments), ...])."""
    said = _last_user_text(messages)
    names = {tool.get("function", {}).get("name") for tool in tools}
    if (remembered := offline_memory.plan(messages, said, names)) is not None:
        return remembered
    if messages and messages[-1].get("role") == "tool":
        return _tool_results(messages) + _left_off(messages, said), []
    request = _parse_request(said)
    calls = _list_calls(request, _toolbox(tools)) if request else []
    if calls and (avoided := offline_memory.disliked(messages, request.add)):
        calls = [call for call in calls if not set(call[1].values()) & set(avoided)]
        if not calls:
            return _left_off(messages, said).strip(), []
    if calls:
        return "", calls
    if call := _named_call(said, tools):
        return "", [call]
    return _plain_reply(said), []


def _tool_results(messages: list[dict]) -> str:
    """The results of this turn's tool calls, passed on as the tools said them."""
    turn = max((index for index, message in enumerate(messages) if message.get("tool_calls")), default=-1)
    results = [_sentence(_text(m.get("content"))) for m in messages[turn + 1:] if m.get("role") == "tool"]
    return " ".join(result for result in results if result) or "Done."


def _left_off(messages: list[dict], said: str) -> str:
    """' I left olives off: you don't like them.' for the items asked for that the user's memories say
    they dislike ('' when none)."""
    request = _parse_request(said)
    avoided = offline_memory.disliked(messages, request.add if request else [])
    if not avoided:
        return ""
    them = "them" if len(avoided) > 1 or avoided[0].endswith("s") else "it"
    return f" I left {_phrase(avoided)} off: you don't like {them}."


def _plain_reply(said: str) -> str:
    if not said:
        return "I'm the offline demo model. Type a message and I'll echo it back."
    return (
        f'I\'m the offline demo model, so I can\'t really think, but I heard: "{said}". '
        "Set OPENAI_API_KEY or OPENAI_BASE_URL to talk to a real model."
    )


# --- structured output ---------------------------------------------------------------------------


def _json_schema(response_format: dict | None) -> dict | None:
    """The JSON schema a reply must follow, if `response_format` asks for one."""
    if not response_format or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else None


def _fill(node: dict, defs: dict, said: str):
    """A value fitting one schema node (pydantic's JSON schema): objects field by field, the default or first
    choice of an enum, the user's words for a string, zeros and empties for the rest."""
    while "$ref" in node or "anyOf" in node or "allOf" in node:
        rest = {key: value for key, value in node.items() if key not in ("$ref", "anyOf", "allOf")}
        if "$ref" in node:
            node = {**defs.get(node["$ref"].rsplit("/", 1)[-1], {}), **rest}
        else:
            choices = node.get("anyOf") or node["allOf"]
            node = {**rest, **next((c for c in choices if c.get("type") != "null"), choices[0])}
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node.get("default", node["enum"][0])
    kind = node.get("type")
    if kind == "object":
        return {name: _fill(sub, defs, said) for name, sub in (node.get("properties") or {}).items()}
    return {"array": [], "string": said, "number": 0, "integer": 0, "boolean": False}.get(kind)


# --- summaries and titles ------------------------------------------------------------------------

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
    # most_common keeps first-seen order among equal counts, so topics stay deterministic.
    counted = Counter(word for word in words if len(word) > 2 and word not in _STOPWORDS)
    return {
        "summary": "The user said: " + _phrase([f'"{line}"' for line in lines]) + ".",
        "topics": [word for word, _ in counted.most_common(5)],
    }


_FILLER = re.compile(r"^(?:hi|hello|hey|ok|okay|so|please|can you|could you|would you|will you)\b[\s,.!]*", re.I)


def _title(messages: list[dict]) -> str:
    """At most five words from the first sentence of the conversation's first 'USER:' line."""
    lines = _user_lines(messages)
    text = lines[0] if lines else ""
    while (shorter := _FILLER.sub("", text)) != text:
        text = shorter
    text = re.split(r"(?<=[.!?])\s+", text, maxsplit=1)[0]  # the first sentence: "What can you do? Please..."
    title = short_title(re.sub(r"[\"“”‘’`]", "", text).strip(" .!?")).strip(" .!?,")
    return title[:1].upper() + title[1:] if title else "Offline demo chat"
