"""The offline demo model: deterministic, no network, and able to drive the assistants' tools.

It reads the user's words and the tools on offer, calls the tools a simple request needs
("add milk and eggs", "remove eggs", "what is on my list", "add a task to call the dentist (high)",
"mark groceries as completed", "organize my tasks by priority", "what is the status of the
project?"), clause by clause ("add X, then mark Y as completed"), then says in words what the tools
did, from their results: a tool that changed nothing or failed is reported as such, and a clause no
tool on offer can do is said ("I have no tool to ..."), for a workflow's next step to read. A JSON
record passed on by an earlier step (structured output) is saved with the tool that takes its
fields. As a team's model it uses the team's own tools for what they can do, else hands the request
to the member whose id, name or role words it names (a word of the name counts twice one of the
role) and reports the member's reply. Under a JSON schema it answers with JSON that fits the
schema, filled from the user's words where it can.
Summaries and titles come from the transcript in the prompt.

User memories (facts learnt, used, forgotten) are offline_memory.py's, which `_plan_turn` asks first.

Sections: shopping-list requests, the toolbox (tools on offer sorted into roles), the turn's plan,
past sessions, team delegation, task tools, the report of tool results, structured output,
summaries and titles.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from . import offline_memory
from .model_api import Model, ModelChunk, ToolCall
from .naming import short_title
from .tools import DELEGATE_TOOL



class OfflineModel(Model):
    """A deterministic demo model: no network, but it really calls list, task and team tools."""

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


@dataclass
class _ListRequest:
    """What the user asked of their shopping list."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    clear: bool = False
    show: bool = False


_SHOW = re.compile(r"what(?:'s|’s| is) on (?:my|the) (?:shopping )?list|\bshow\b.*\blist\b"
                   r"|\bshow\b.*\b(?:what(?:'s|’s| is) left|what remains)", re.I)
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


_EXTRA_PARAMS = {  # what the user may say besides the subject, and the words naming its parameter
    "priority": ("priority",),
    "status": ("status",),
    "assignee": ("assignee", "assigned", "owner"),
    "notes": ("notes", "note", "comment"),
}
_SUBJECT_PARAMS = ("name", "task", "task_name", "item", "title", "step", "step_name", "item_name")
_TASK_NOUNS = {"task", "tasks", "step", "steps", "todo", "todos"}


@dataclass(frozen=True)
class _Tool:
    """One tool on offer: its name, the string parameter naming what it acts on, and its parameters."""

    name: str
    subject: str | None = None
    params: tuple[str, ...] = ()

    def call(self, subject: str | None = None, **extras) -> tuple[str, dict]:
        """(name, arguments): the subject, plus each extra (priority, status...) the tool has a parameter for."""
        arguments = {self.subject: subject} if self.subject and subject is not None else {}
        for extra, value in extras.items():
            param = self.param(extra)
            if param and value is not None:
                arguments[param] = value
        return self.name, arguments

    def param(self, extra: str) -> str | None:
        """The parameter that takes `extra` ("priority", "status", "assignee"), if the tool has one."""
        words = _EXTRA_PARAMS[extra]
        return next((param for param in self.params if any(word in param.lower() for word in words)), None)


@dataclass
class _Toolbox:
    """The tools the offline model knows how to drive, by role, and whether they keep tasks or a list."""

    add: _Tool | None = None
    remove: _Tool | None = None
    clear: _Tool | None = None
    show: _Tool | None = None
    complete: _Tool | None = None
    assign: _Tool | None = None
    clear_completed: _Tool | None = None
    update_state: _Tool | None = None
    tasks: bool = False  # tasks or project steps (names, priorities, statuses) rather than a shopping list
    roles: dict[str, str] = field(default_factory=dict)  # tool name -> role
    record_tools: set[str] = field(default_factory=set)  # tools with no one subject: they take a whole record

    @classmethod
    def of(cls, tools: list[dict]) -> "_Toolbox":
        """Sort wire-format tools into the roles the offline model understands."""
        box = cls()
        for wire in tools:
            function = wire.get("function") or {}
            tool = _tool_of(function)
            parameters = function.get("parameters") or {}
            role = _role(tool.name, tool.subject is not None, bool(parameters.get("required")))
            if role and getattr(box, role) is None:
                setattr(box, role, tool)
            if role:
                box.roles[tool.name] = role
            elif tool.subject is None and parameters.get("required"):
                box.record_tools.add(tool.name)
            box.tasks = box.tasks or bool(_TASK_NOUNS & set(_name_words(tool.name))) or bool(
                tool.param("priority") or tool.param("status"))
        return box

    def role(self, name: str) -> str | None:
        """The role of a called tool: as sorted from the tools on offer, else guessed from its name."""
        return self.roles.get(name) or _role(name, has_subject=True, has_required=False)


def _tool_of(function: dict) -> _Tool:
    """A wire-format function as a _Tool: the subject is its one required string that is no extra."""
    name = function.get("name", "")
    if name == "update_session_state":
        return _Tool(name, "session_state_updates", ("session_state_updates",))
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    extras = {word for words in _EXTRA_PARAMS.values() for word in words}
    candidates = [param for param in parameters.get("required") or []
                  if properties.get(param, {}).get("type", "string") == "string"
                  and not any(word in param.lower() for word in extras)]
    subject = next((param for param in candidates if param.lower() in _SUBJECT_PARAMS), None)
    if subject is None and len(candidates) == 1:
        subject = candidates[0]
    return _Tool(name, subject, tuple(properties))


_ROLE_VERBS = (  # (role, verbs in the tool's name, needs a subject); the first that fits wins
    ("clear_completed", {"clear", "clean", "purge"}, False),
    ("clear", {"clear", "clean", "reset", "empty"}, False),
    ("complete", {"complete", "finish", "done", "mark", "status"}, True),
    ("assign", {"assign", "reassign"}, True),
    ("add", {"add", "create", "new", "save", "insert"}, True),
    ("remove", {"remove", "delete", "drop"}, True),
    ("show", {"list", "get", "show", "view", "read"}, False),
)
_DONE_WORDS = {"completed", "complete", "done", "finished"}


def _role(name: str, has_subject: bool, has_required: bool) -> str | None:
    """The role a tool's name gives it: add, remove, clear, show, complete, assign, clear_completed,
    update_state."""
    if name == "update_session_state":
        return "update_state"
    words = set(_name_words(name))
    if not has_subject and "all" in words and words & {"remove", "delete"}:
        return "clear"  # remove_all_items
    for role, verbs, needs_subject in _ROLE_VERBS:
        if not verbs & words:
            continue
        if role == "clear_completed" and not _DONE_WORDS & words:
            continue
        if needs_subject and not has_subject:
            continue
        if role == "show" and has_required:
            continue
        return role
    return None


def _name_words(name: str) -> list[str]:
    """'clear_completed_tasks' or 'clearCompletedTasks' -> ['clear', 'completed', 'tasks']."""
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower().replace("-", "_").split("_")


def _respond(messages: list[dict], tools: list[dict], response_format: dict | None):
    """The turn's (text, calls); a final answer under a JSON schema is JSON that fits it."""
    text, calls = _plan_turn(messages, tools)
    schema = _json_schema(response_format)
    if schema is not None and not calls:
        return json.dumps(_structured(schema, _last_user_text(messages))), []
    return text, calls


def _last_user_text(messages: list[dict]) -> str:
    """What the user said last."""
    return next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "").strip()


def _plan_turn(messages: list[dict], tools: list[dict]) -> tuple[str, list[tuple[str, dict]]]:
    """Decide the offline model's reply: (text, [(tool name, arguments), ...])."""
    said = _last_user_text(messages)
    names = {tool.get("function", {}).get("name") for tool in tools}
    if (remembered := offline_memory.plan(messages, said, names)) is not None:
        return remembered
    if "search_past_sessions" in names:
        memory = _plan_memory(messages, said)
        if memory is not None:
            return memory
    last_is_tool = bool(messages) and messages[-1].get("role") == "tool"
    box = _Toolbox.of([tool for tool in tools if tool.get("function", {}).get("name") != DELEGATE_TOOL])
    if last_is_tool:
        return _report_tool_results(messages, box) + _left_off(messages, said), []
    if (record := _json_record(said)) and (call := _record_call(tools, record)):
        return "", [call]
    left = []
    if box.tasks:  # a team's own task tools come before its members
        calls, left = _task_plan(said, box, messages)
        if calls:
            return "", calls
    if DELEGATE_TOOL in names:
        return "", [_delegation(_team_members(messages), said)]
    calls, list_left = _list_plan(said, box)
    if calls and (avoided := offline_memory.disliked(messages, _added(calls, box))):
        calls = [call for call in calls if call not in [box.add.call(item) for item in avoided]]
        if not calls:
            return _left_off(messages, said).strip(), []
    if calls:
        return "", calls
    if call := _named_tool_call(said, tools, box):
        return "", [call]
    request = _parse_request(said)
    if request is not None and box.update_state:
        return _update_state(request, box.update_state, _session_state(messages))
    left = left or list_left
    if left and box.roles:  # asked what its tools cannot do: said so (a next step may do it)
        return _no_tool(left), []
    return _plain_reply(said), []


def _added(calls: list[tuple[str, dict]], box: _Toolbox) -> list[str]:
    """The items the list's add calls add."""
    if box.add is None:
        return []
    return [arguments.get(box.add.subject) for name, arguments in calls if name == box.add.name]


def _left_off(messages: list[dict], said: str) -> str:
    """' I left olives off: you don't like them.' for the items asked for that the user's memories say
    they dislike ('' when none)."""
    request = _parse_request(said)
    avoided = offline_memory.disliked(messages, request.add if request else [])
    return f" I left {_phrase(avoided)} off: you don't like {'them' if len(avoided) > 1 or avoided[0].endswith('s') else 'it'}." if avoided else ""


def _list_plan(said: str, box: _Toolbox) -> tuple[list[tuple[str, dict]], list[str]]:
    """The list tools' calls for each clause of `said` they can do, and the clauses they cannot."""
    calls, left = [], []
    for clause in _CLAUSES.split(said):
        clause = clause.strip(_QUOTES + ",.")
        request = _parse_request(clause)
        if request is None:
            continue
        made = _direct_calls(request, box)
        calls += [call for call in made if call not in calls]  # 'Added eggs. Your list: ...' shows it once
        if not made:
            left.append(clause)
    return calls, left


_ASKED_TO = re.compile(r"^(?:please\s+)?(?:add|create|delete|remove|drop|mark|set|re-?assign|assign|complete|finish|show"
                       r"|list|view|clear|clean|organi[sz]e|tidy|sort|prioriti[sz]e|buy|get|update|change)\b", re.I)


def _no_tool(clauses: list[str]) -> str:
    """'I have no tool to clear the list.' (or, for a question, 'I have no tool for "...".'), a sentence a
    clause."""
    return " ".join(f"I have no tool to {clause[:1].lower() + clause[1:].rstrip('.!?')}."
                    if _ASKED_TO.match(clause) else f'I have no tool for "{clause}".' for clause in clauses)


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


# --- team delegation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    """One line of a team's <team_members> block."""

    id: str
    name: str
    role: str = ""


_TEAM_MEMBERS = re.compile(r"<team_members>\s*(.*?)\s*</team_members>", re.S)
_MEMBER_LINE = re.compile(
    r"^\s*-\s*member_id:\s*(?P<id>[^|\n]+?)\s*\|\s*name:\s*(?P<name>[^|\n]+?)\s*(?:\|\s*role:\s*(?P<role>.*?))?\s*$",
    re.M)
_FUNCTION_WORDS = frozenset(
    "a an and the to of in on at for with from by my our your me it is are be this that please can could "
    "would will you i".split())


def _team_members(messages: list[dict]) -> list[_Member]:
    """The members listed in the system message's <team_members> block, in their order."""
    for message in messages:
        if message.get("role") != "system":
            continue
        block = _TEAM_MEMBERS.search(_text(message.get("content")))
        if block:
            return [_Member(m["id"], m["name"], m["role"] or "") for m in _MEMBER_LINE.finditer(block[1])]
    return []


def _delegation(members: list[_Member], said: str) -> tuple[str, dict]:
    """The delegation call: the user's request, to the member it names best (else the first)."""
    member = _best_member(members, said)
    return DELEGATE_TOOL, {"member_id": member.id if member else "", "task": said}


def _best_member(members: list[_Member], said: str) -> _Member | None:
    """The member sharing the most words with `said`, a word of its id or name counting twice one of its
    role ('the status of the project' is the Status tracker's, not the Planner's who 'adds project
    steps'); ties go to the first listed."""
    if not members:
        return None
    wanted = _stems(said)
    scores = [2 * len(wanted & _stems(f"{m.id.replace('-', ' ')} {m.name}")) + len(wanted & _stems(m.role))
              for m in members]
    return members[scores.index(max(scores))]


def _stems(text: str) -> set[str]:
    """The content words of `text`, lightly stemmed ('adds', 'added' and 'add' are one)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {_stem(word) for word in words if word not in _FUNCTION_WORDS and len(word) > 1}


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _delegation_report(arguments: dict, result: str, members: list[_Member]) -> str:
    """The member's reply, as given, under the member's name; a failed delegation as the failure."""
    wanted = str(arguments.get("member_id", ""))
    member = next((m for m in members if wanted in (m.id, m.name)), None)
    name = member.name if member else wanted or "The member"
    if result.startswith("Error"):
        return f"I could not hand this to {name}: {_without_error_prefix(result)}"
    return f"{name}: {result.strip()}" if result.strip() else f"{name} gave no reply."


# --- task tools ----------------------------------------------------------------------------------


@dataclass
class _TaskRequest:
    """What the user asked of their tasks (or a project's steps)."""

    add: list[tuple[str, dict]] = field(default_factory=list)  # (name, {"priority": ..., "assignee": ...})
    complete: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    status: str = "completed"  # what `complete` sets
    show: bool = False
    show_status: str | None = None  # "pending", "completed", or None for all
    clear_completed: bool = False
    assign: tuple[list[str], str] | None = None  # (names, to whom)
    notes: str | None = None  # said with a status change ('with notes "..."')


_DONE = r"(?:completed?|done|finished)"
_STATUS_WORDS = r"(?:completed?|done|finished|pending|in[ _-]progress|blocked|cancell?ed|todo|open)"
_TASK_NOUN = r"(?:tasks?|steps?|to-?dos?)"
_TASK_CLEAR_DONE = re.compile(rf"\b(?:clear|clean(?:\s+up)?|remove|delete|purge)\b.*\b{_DONE}\b", re.I | re.S)
_TASK_STATUS = [
    re.compile(rf"\b(?:mark|set)\s+(?P<items>.+?)\s+(?:as|to)\s+(?P<status>{_STATUS_WORDS})\b", re.I | re.S),
    re.compile(r"\b(?:complete|finish|finished|completed)\s+(?P<items>.+)", re.I | re.S),
    re.compile(rf"(?P<items>\S.*?)\s+(?:is|are)\s+(?:now\s+)?(?P<status>{_DONE})\b", re.I | re.S),
]
_TASK_SHOW = re.compile(
    rf"\b(?:show|list|view|see|display|what(?:'s|’s| is| are))\b.*?\b(?:(?P<status>pending|completed|done|open)\s+)?"
    rf"{_TASK_NOUN}\b", re.I | re.S)
# 'what is the status of the project?', 'how is the project progressing': show the tasks or steps.
_TASK_STATUS_ASKED = re.compile(
    r"\b(?:what(?:'s|’s| is)|how(?:'s|’s| is)|show|give me|report)\b.*\b(?:status|progress(?:ing)?)\b"
    r"(?!\s+(?:to|as)\b)", re.I | re.S)
# 'organize my tasks', 'tidy up the to-do list': clear what is done and show what is left.
_TASK_ORGANIZE = re.compile(
    rf"\b(?:re)?(?:organi[sz]e|tidy|clean|sort|prioriti[sz]e)\b.*\b{_TASK_NOUN}\b", re.I | re.S)
_TASK_ASSIGN = re.compile(r"\b(?:re)?assign\s+(?P<items>.+?)\s+to\s+(?P<who>[A-Z][\w-]*)", re.I | re.S)
_TASK_SHOW_REST = re.compile(r"\b(?:show|list|tell)\b.*\b(?:what(?:'s|’s| is) left|what remains|the rest)\b",
                             re.I | re.S)
_NOTES = re.compile(r"\s*,?\s*\bwith\s+(?:the\s+)?notes?\s*:?\s*['\"‘“](?P<notes>.+?)(?:['\"’”]|$)",
                    re.I | re.S)
# Where one request holds several ('add X, then mark Y as done', 'delete X and add Y'): each clause alone.
_CLAUSES = re.compile(
    r"(?<=[.!?])\s+(?=[A-Z\"'‘“])|\s*;\s*|\s*,?\s*\bthen\b\s*"
    r"|\s*,?\s+and\s+(?=(?:add|create|delete|remove|mark|set|reassign|assign|complete|finish|show|list|clear|clean)\b)",
    re.I)
_QUOTES = " '\"‘’“”"
_PRONOUNS = {"it", "them", "this", "that", "this one", "that one"}
_TASK_REMOVE = re.compile(r"\b(?:delete|remove|drop|cancel)\s+(?P<items>.+)", re.I | re.S)
_TASK_ADD = re.compile(r"\b(?:add|create|schedule)\s+(?P<items>.+)", re.I | re.S)
_TASK_ADD_LEAD = re.compile(
    rf"^(?:(?:a|an|the|some|these|those|my|the following|following|one|two|three|four|five|\d+)\s+)?(?:new\s+)?"
    rf"{_TASK_NOUN}\b\s*"
    r"(?:(?:to|called|named|for)\b|:)?\s*", re.I)
_PRIORITY = re.compile(
    r"\s*\(\s*(?P<a>low|medium|high)(?:\s+priority)?\s*\)"
    r"|\s*,?\s*\b(?:with\s+)?(?:a\s+)?(?P<b>low|medium|high)[\s-]+priority\b"
    r"|\s*,?\s*\bpriority\s*(?::|=|of|is)?\s*(?P<c>low|medium|high)\b", re.I)
_ASSIGNEE = re.compile(r"\s*,?\s*\b(?:assigned\s+to|assign\s+(?:it\s+)?to|owned\s+by)\s+(?P<who>[A-Za-z][\w-]*)", re.I)
_TASK_WHERE = re.compile(rf"\s+(?:from|to|in|on|off)\s+(?:my|the)\s+(?:\w+\s+)?{_TASK_NOUN}(?:\s+list)?\b.*$", re.I | re.S)
_TASK_NOUN_EDGES = re.compile(rf"^(?:{_TASK_NOUN}\s+)|(?:\s+{_TASK_NOUN})$", re.I)


def _task_requests(text: str) -> list[tuple[str, _TaskRequest]]:
    """Each clause of the user's words that is a request about tasks or project steps, with it; a name
    said as 'it' is the one named in the clause before."""
    found, last = [], []
    for clause in _CLAUSES.split(text):
        request = _parse_task_request(clause.strip(_QUOTES + ",."))
        if request is None:
            continue
        for names in (request.complete, request.remove, request.assign[0] if request.assign else []):
            names[:] = [name for said in names for name in (last if said.lower() in _PRONOUNS else [said])]
        last = request.complete or request.remove or (request.assign[0] if request.assign else []) or [
            name for name, _ in request.add] or last
        found.append((clause.strip(), request))
    return found


def _parse_task_request(text: str) -> _TaskRequest | None:
    """Read a request about tasks or project steps from one clause of the user's words, or None if it
    is not one."""
    notes = None
    if match := _NOTES.search(text):
        notes, text = match["notes"], text[: match.start()] + text[match.end():]
    if _TASK_CLEAR_DONE.search(text):
        return _TaskRequest(clear_completed=True, show=bool(_TASK_SHOW_REST.search(text)))
    if _TASK_SHOW_REST.search(text):
        return _TaskRequest(show=True)
    if match := _TASK_ASSIGN.search(text):
        return _TaskRequest(assign=(_task_names(match["items"]), match["who"]))
    if match := (_TASK_SHOW.search(text) or _TASK_STATUS_ASKED.search(text)):
        status = match.groupdict().get("status")
        status = status and _status_word(status.lower())
        return _TaskRequest(show=True, show_status=status)
    for pattern in _TASK_STATUS:
        if match := pattern.search(text):
            status = (match.groupdict().get("status") or "completed").lower()
            return _TaskRequest(complete=_task_names(match["items"]), status=_status_word(status), notes=notes)
    if match := _TASK_REMOVE.search(text):
        return _TaskRequest(remove=_task_names(match["items"]))
    if match := _TASK_ADD.search(text):
        added: list[tuple[str, dict]] = []
        for name, details in map(_task_details, _task_parts(match["items"])):
            if name:
                added.append((name, details))
            elif added:  # 'write the report, high priority': a part of details alone is the last task's
                added[-1][1].update(details)
        return _TaskRequest(add=added) if added else None
    if _TASK_ORGANIZE.search(text):
        return _TaskRequest(clear_completed=True, show=True)
    return None


def _status_word(status: str) -> str:
    """'done', 'finished' and 'complete' are 'completed'; other statuses stay as said."""
    return "completed" if re.fullmatch(_DONE, status) else status


def _task_parts(text: str) -> list[str]:
    """The comma/and-separated parts of a list of tasks, without the words leading in ('a task to')."""
    text = _TASK_ADD_LEAD.sub("", _PLEASE.sub("", text.strip().strip(" .!?")))
    return [part.strip(" .!?") for part in _SEPARATORS.split(text) if part.strip(" .!?")]


def _task_details(part: str) -> tuple[str, dict]:
    """'review the proposal with high priority' -> ('Review the proposal', {'priority': 'high'})."""
    details = {}
    if match := _PRIORITY.search(part):
        details["priority"] = (match["a"] or match["b"] or match["c"]).lower()
        part = part[: match.start()] + part[match.end():]
    if match := _ASSIGNEE.search(part):
        details["assignee"] = match["who"]
        part = part[: match.start()] + part[match.end():]
    name = _ARTICLE.sub("", _TASK_WHERE.sub("", part).strip(" ,.!?"))
    # 'a step called "Deploy"', "'Deploy' step" -> Deploy
    name = _TASK_NOUN_EDGES.sub("", _TASK_ADD_LEAD.sub("", name)).strip(_QUOTES + ",.!?")
    return name[:1].upper() + name[1:], details


def _task_names(text: str) -> list[str]:
    """'the Write Tests step and groceries from my tasks' -> ['Write Tests', 'groceries']."""
    text = _PLEASE.sub("", _TASK_WHERE.sub("", text.strip()).strip(" .!?"))
    names = (_TASK_NOUN_EDGES.sub("", _ARTICLE.sub("", part.strip(" .!?"))) for part in _SEPARATORS.split(text))
    return [name.strip(_QUOTES) for name in names if name.strip(_QUOTES)]


def _task_plan(said: str, box: _Toolbox, messages: list[dict]) -> tuple[list[tuple[str, dict]], list[str]]:
    """The task tools' calls for each clause of `said` the tools on offer can do, and the clauses they
    cannot (another step's or member's work, as the cookbook's team is told)."""
    known = _known_names(_session_state(messages))
    calls, left = [], []
    for clause, request in _task_requests(said):
        made = _task_calls(request, box, known)
        calls += [call for call in made if call not in calls]
        if not made:
            left.append(clause)
    return calls, left


def _task_calls(request: _TaskRequest, box: _Toolbox, known: list[str]) -> list[tuple[str, dict]]:
    """Calls of the task tools for `request`, or [] when a tool it needs is not on offer."""
    if request.clear_completed:
        calls = [box.clear_completed.call()] if box.clear_completed else []
        if request.show and box.show:
            calls.append(box.show.call(status=None))
        return calls
    if request.complete:
        tool = box.complete
        if tool is None or (request.status != "completed" and not tool.param("status")):
            return []
        return [tool.call(_known_name(name, known), status=request.status, notes=request.notes)
                for name in request.complete]
    if request.assign:
        names, who = request.assign
        return [box.assign.call(_known_name(name, known), assignee=who) for name in names] if box.assign else []
    if request.show:
        return [box.show.call(status=request.show_status)] if box.show else []
    if request.remove:
        return [box.remove.call(_known_name(name, known)) for name in request.remove] if box.remove else []
    if request.add and box.add:
        default = {"priority": "medium"} if box.add.param("priority") else {}
        return [box.add.call(name, **{**default, **details}) for name, details in request.add]
    return []


_NAME_KEYS = ("name", "title", "task", "task_name", "step_name", "item")


def _known_names(state: dict) -> list[str]:
    """The names of the things kept in the state shown to the model (task or step names, list items)."""
    names = []
    for value in state.values():
        for entry in value if isinstance(value, list) else []:
            if isinstance(entry, str):
                names.append(entry)
            elif isinstance(entry, dict):
                names += [str(entry[key]) for key in _NAME_KEYS if isinstance(entry.get(key), str)][:1]
    return names


def _known_name(said: str, known: list[str]) -> str:
    """The known name the user meant ('groceries' -> 'Buy groceries'), else the words as said."""
    lowered, stems = said.lower(), _stems(said)
    for matches in (lambda name: name.lower() == lowered, lambda name: lowered in name.lower(),
                    lambda name: bool(stems) and stems <= _stems(name)):
        found = next((name for name in known if matches(name)), None)
        if found is not None:
            return found
    return said


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
    calls = [box.clear.call()] if request.clear else []
    calls += [box.remove.call(item) for item in request.remove]
    calls += [box.add.call(item) for item in request.add]
    calls += [box.show.call()] if request.show else []
    return calls


def _update_state(request: _ListRequest, tool: _Tool, state: dict):
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
    return "", [tool.call({"shopping_list": items})]


def _json_record(text: str) -> dict | None:
    """`text` as a JSON object (an earlier step's structured output, passed on), else None."""
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_RECORD_VERBS = {"save", "add", "create", "insert", "record", "store", "track", "log", "register"}


def _record_call(tools: list[dict], record: dict) -> tuple[str, dict] | None:
    """A record handed on by an earlier step, saved with the tool that takes it: one whose name says it
    saves (save, add, track, ...) and whose required parameters the record fills; the one taking the
    most of its fields wins."""
    best, taken = None, 0
    for wire in tools:
        function = wire.get("function") or {}
        parameters = function.get("parameters") or {}
        required = parameters.get("required") or []
        if not required or not _RECORD_VERBS & set(_name_words(function.get("name", ""))):
            continue
        arguments = {key: record[key] for key in parameters.get("properties") or {}
                     if record.get(key) not in (None, "", [], {})}
        if all(key in arguments for key in required) and len(arguments) > taken:
            best, taken = (function["name"], arguments), len(arguments)
    return best


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


@dataclass
class _Report:
    """What this turn's tool calls did, gathered by kind, to be said in that order."""

    cleared: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)  # what did not fit the lists above, in call order
    shown: list[str] = field(default_factory=list)

    def text(self, tasks: bool) -> str:
        """The report in words; 'Done.' when there is nothing to say."""
        where = "" if tasks else " to your list"
        parts = self.cleared + ([f"Removed {_phrase(self.removed)}."] if self.removed else [])
        parts += [f"Added {_phrase(self.added)}{where}."] if self.added else []
        parts += self.completed + self.sentences + self.shown
        return " ".join(parts) or "Done."


def _report_tool_results(messages: list[dict], box: _Toolbox) -> str:
    """Say in words what this turn's tool calls did, from their arguments and results: a call whose result
    says it failed or changed nothing is reported as such, never as done."""
    turn = next(
        (index for index in range(len(messages) - 1, -1, -1) if messages[index].get("tool_calls")), None
    )
    if turn is None:
        return "Done."
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages[turn + 1 :] if m.get("role") == "tool"}
    report = _Report()
    by_priority = bool(_BY_PRIORITY.search(_last_user_text(messages)))
    for call in messages[turn]["tool_calls"]:
        name = call["function"]["name"]
        arguments = _json_object(call["function"].get("arguments"))
        result = results.get(call.get("id"), "")
        if name == DELEGATE_TOOL:
            report.sentences.append(_delegation_report(arguments, result, _team_members(messages)))
        elif result.startswith(_REJECTED):
            report.sentences.append(_rejection_report(name, result))
        elif _failed(result, box.role(name)):
            report.sentences.append(f"{name} failed: {_sentence(_without_error_prefix(result))}")
        elif _unchanged(result, box.role(name)) or name in box.record_tools:
            report.sentences.append(_sentence(result))  # a record's tool says best what it saved
        else:
            _report_success(report, box.role(name), name, arguments, result, box.tasks, by_priority)
    if not box.update_state and not any(call["function"]["name"] == DELEGATE_TOOL
                                        for call in messages[turn]["tool_calls"]):
        said = _last_user_text(messages)
        _, left = _task_plan(said, box, messages) if box.tasks else _list_plan(said, box)
        if left:
            report.sentences.append(_no_tool(left))
    return report.text(box.tasks)


_BY_PRIORITY = re.compile(r"\b(?:by|in order of)\s+priority\b|\bprioriti[sz]e\b", re.I)


def _report_success(report: _Report, role: str | None, name: str, arguments: dict, result: str,
                    tasks: bool, by_priority: bool = False) -> None:
    """Add a call that did what it was asked to the report, in the words of its role."""
    subject = next((value for value in arguments.values() if isinstance(value, str)), "")
    if role == "update_state":
        updates = arguments.get("session_state_updates")
        items = updates.get("shopping_list") if isinstance(updates, dict) else None
        report.sentences.append(f"Your list now: {_phrase(items)}." if items else "Your list is now empty.")
    elif role == "clear":
        report.cleared = ["Cleared your tasks." if tasks else "Cleared your list."]
    elif role == "clear_completed":
        report.cleared = ["Cleared the completed tasks."]
    elif role == "add":
        priority = next((value for key, value in arguments.items() if "priority" in key.lower()), None)
        report.added.append(f"{subject} ({priority} priority)" if tasks and priority else subject)
    elif role == "remove":
        report.removed.append(subject)
    elif role == "assign":
        who = next((value for key, value in arguments.items()
                    if any(word in key.lower() for word in _EXTRA_PARAMS["assignee"])), "")
        report.completed.append(f"Reassigned {subject} to {who}.")
    elif role == "complete":
        status = next((value for key, value in arguments.items() if "status" in key.lower()), "completed")
        report.completed.append(f"Marked {subject} as {status}.")
    elif role == "show":
        report.shown.append(_describe_list(result, "Your tasks" if tasks else "Your list", by_priority))
    else:
        report.sentences.append(f"{name} returned: {result.rstrip('.')}.")


_FAILED = re.compile(
    r"^\s*error\b|\bnot found\b|\bnot on (?:the|your) list\b|\bno such\b|\b(?:does not|doesn't) exist\b"
    r"|\bcould not\b|\bcouldn't\b|\bcannot\b|\bfailed\b", re.I)
_UNCHANGED = re.compile(r"\balready\b|\bnothing to\b|\bno changes?\b|\bthere (?:were|was|are|is) no\b", re.I)


def _failed(result: str, role: str | None) -> bool:
    """Whether a tool's result says it failed (an error, or what it was to act on was not found); a list's
    result only by starting with 'Error', since what it lists may say anything."""
    if role == "show":
        return result.lstrip().lower().startswith("error")
    return bool(_FAILED.search(result))


def _unchanged(result: str, role: str | None) -> bool:
    """Whether a change's result says it changed nothing ('apples is already on the list.')."""
    return role != "show" and bool(_UNCHANGED.search(result))


def _without_error_prefix(result: str) -> str:
    return re.sub(r"^\s*error\s*:\s*", "", result.strip(), flags=re.I)


def _sentence(text: str) -> str:
    """`text` as one sentence: stripped, capitalised, ending with a full stop unless it has its own mark."""
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _json_object(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_PRIORITY_RANK = {"high": 0, "medium": 1, "low": 2}


def _priority_rank(text) -> int:
    """0 for high, 1 medium, 2 low, by the first of those words in `text`; 3 with none."""
    match = re.search(r"\b(high|medium|low)\b", str(text), re.I)
    return _PRIORITY_RANK[match[1].lower()] if match else len(_PRIORITY_RANK)


def _describe_list(result: str, label: str = "Your list", by_priority: bool = False) -> str:
    """'Your list: milk, bread.' from a list tool's result, JSON or plain text; tasks with their details,
    highest priority first when `by_priority`."""
    try:
        value = json.loads(result)
    except ValueError:
        value = result
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, list)), value)
    if by_priority and isinstance(value, list):
        value = sorted(value, key=lambda item: _priority_rank(item.get("priority") if isinstance(item, dict) else ""))
    empty = "Your list is empty." if label == "Your list" else "There are no tasks."
    if isinstance(value, list):
        return f"{label}: {_phrase([_label(item) for item in value])}." if value else empty
    text = str(value).strip().rstrip(".")
    if not text:
        return empty
    head, colon, items = text.partition(":")
    if colon and items.strip() and len(head) <= 40:  # "Shopping list: milk, bread": the items after the label
        if by_priority and ";" in items:  # "Tasks: a (low, pending); b (high, pending)"
            items = "; ".join(sorted((item.strip() for item in items.split(";")), key=_priority_rank))
        return f"{label}: {items.strip()}."
    if "," not in text and len(text.split()) > 2:  # a sentence of the tool's own ("The list is empty.")
        return f"{text}."
    return f"{label}: {text}."


_DETAIL_ORDER = ("priority", "status", "assignee")


def _detail_order(key: str) -> tuple[int, str]:
    """Priority, status and assignee first, then the other keys by name: the same order whatever the
    database did to the keys (PostgreSQL's jsonb sorts them)."""
    return (_DETAIL_ORDER.index(key) if key in _DETAIL_ORDER else len(_DETAIL_ORDER), key)


def _label(item) -> str:
    """A listed item in words: a string as is, a task as 'Buy milk (low, pending)'."""
    if not isinstance(item, dict):
        return str(item)
    name = next((str(item[key]) for key in _NAME_KEYS if key in item), None)
    keys = sorted((key for key, value in item.items() if key not in _NAME_KEYS and key.lower() != "id"
                   and isinstance(value, (str, int, float, bool))), key=_detail_order)
    details = [str(item[key]) for key in keys]
    if name is None:
        return ", ".join(details)
    return f"{name} ({', '.join(details)})" if details else name


# --- structured output ---------------------------------------------------------------------------


def _json_schema(response_format: dict | None) -> dict | None:
    """The JSON schema a reply must follow, if `response_format` asks for one."""
    if not response_format or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else None


def _structured(schema: dict, said: str) -> object:
    """A value fitting `schema` (pydantic's JSON schema of a simple model), filled from the user's words."""
    return _fill(schema, schema.get("$defs") or {}, said, "")


def _fill(node: dict, defs: dict, said: str, field_name: str):
    """The value of one schema node: objects field by field, enums and strings from `said`, else zeros."""
    node = _resolved(node, defs)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return _enum_choice(node, said)
    kind = node.get("type")
    if kind == "object":
        return {name: _fill(sub, defs, said, name) for name, sub in (node.get("properties") or {}).items()}
    if kind == "array":
        items = _resolved(node.get("items") or {}, defs)
        return _salient_words(said)[:3] if items.get("type") == "string" and "enum" not in items else []
    if kind == "string":
        return _string_field(field_name, said)
    if kind in ("number", "integer"):
        return 0
    if kind == "boolean":
        return False
    return None


def _resolved(node: dict, defs: dict) -> dict:
    """`node` with a `$ref` followed and an Optional's `anyOf` reduced to its first non-null choice."""
    while True:
        if "$ref" in node:
            node = {**defs.get(node["$ref"].rsplit("/", 1)[-1], {}), **{k: v for k, v in node.items() if k != "$ref"}}
        elif choices := node.get("anyOf") or node.get("oneOf") or node.get("allOf"):
            chosen = next((choice for choice in choices if choice.get("type") != "null"), choices[0])
            node = {**{k: v for k, v in node.items() if k not in ("anyOf", "oneOf", "allOf")}, **chosen}
        else:
            return node


def _enum_choice(node: dict, said: str):
    """The enum value the user's words name ('applied'), else the field's default, else the first value."""
    lowered = said.lower()
    for value in node["enum"]:
        if isinstance(value, str) and re.search(rf"\b{re.escape(value.lower().replace('_', ' '))}\b", lowered):
            return value
    return node.get("default", node["enum"][0])


_SAID_FIELDS = {"text", "message", "query", "content", "input", "request", "task", "question", "topic", "subject"}
_NOTE_FIELDS = {"notes", "note", "summary", "comment", "comments", "explanation", "reasoning", "description"}
_COMPANY = re.compile(r"\b(?:to|at|with|for|from|by)\s+(?P<value>[A-Z][\w&.-]*(?:\s+[A-Z][\w&.-]*)*)")
_JOB = re.compile(r"\b(?P<value>(?:[\w-]+\s+){1,3}?)(?:role|position|job|opening)\b|\bas\s+an?\s+(?P<as>[\w-]+(?:\s+[\w-]+)?)", re.I)
_STATUS = re.compile(r"\b(?P<value>applied|interview(?:ing)?(?:\s+scheduled)?|offer(?:ed)?|rejected|accepted|hired"
                     r"|pending|in progress|completed|done)\b", re.I)
_PRIORITY_WORD = re.compile(r"\b(?P<value>low|medium|high)\b", re.I)
_URL = re.compile(r"(?P<value>https?://[^\s<>\"')]+[^\s<>\"').,;:!?])")
_SOURCE = re.compile(r"\b(?:via|through|on|from)\s+(?:an?\s+|the\s+)?(?P<value>[\w-]+(?:\s+(?:board|site|website|referral|"
                     r"fair|ad|post(?:ing)?|network|recruiter))?)\b", re.I)
_PROPER_NAME = re.compile(r"(?<!^)(?<![.!?]\s)\b(?P<value>(?!I\b)[A-Z][\w&.-]*(?:\s+[A-Z][\w&.-]*)*)")
_STRING_FIELDS = (  # (words in a field's name, what fills it); the first that fits wins
    (("company", "organization", "organisation", "employer", "org"), _COMPANY),
    (("role", "position", "job", "title"), _JOB),
    (("status", "stage", "state"), _STATUS),
    (("priority",), _PRIORITY_WORD),
    (("url", "link", "href", "website"), _URL),
    (("source", "channel", "via"), _SOURCE),
    (("name", "person", "who"), _PROPER_NAME),
)


def _string_field(field_name: str, said: str) -> str:
    """A string field from the user's words: by what its name says it holds, else the words themselves;
    a notes or summary field says the offline model filled it in."""
    words = set(_name_words(field_name))
    if words & _NOTE_FIELDS:
        return f'Filled in by the offline demo model from your words: "{said}".'
    for names, pattern in _STRING_FIELDS:
        if words & set(names):
            return _first_value(pattern, said)
    return said if words & _SAID_FIELDS else ""


def _first_value(pattern: re.Pattern, said: str) -> str:
    """The first match's value in `said`; for a job, only the words just before 'role' that name it."""
    for match in pattern.finditer(said):
        value = match.groupdict().get("as") or match["value"] or ""
        if pattern is _JOB and not match.groupdict().get("as"):
            value = " ".join(_trailing_content_words(value.split()))
        if value.strip():
            return value.strip()
    return ""


def _trailing_content_words(words: list[str]) -> list[str]:
    """The last words before the first function word from the end: 'for a backend engineer' -> backend engineer."""
    kept = []
    for word in reversed(words):
        if word.lower() in _FUNCTION_WORDS:
            break
        kept.insert(0, word)
    return kept


def _salient_words(text: str) -> list[str]:
    """The words of `text` that say the most (not stopwords), most frequent first, then first seen."""
    words = re.findall(r"[a-z][a-z'’]+", text.lower())
    return [word for word, _ in Counter(w for w in words if len(w) > 2 and w not in _STOPWORDS).most_common()]


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
    # most_common keeps first-seen order among equal counts, so topics stay deterministic.
    return {
        "summary": "The user said: " + _phrase([f'"{line}"' for line in lines]) + ".",
        "topics": _salient_words(" ".join(lines))[:5],
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


# --- runs that wait for a person (human in the loop) ---------------------------------------------------

_REJECTED = "Function call was rejected by the user."  # run/pause.py's words for a rejected call
_GENERIC_WORDS = {"get", "set", "do", "make", "the", "a", "an", "my", "to", "of", "for"}


def _named_tool_call(said: str, tools: list[dict], box: _Toolbox) -> tuple[str, dict] | None:
    """A tool of no known role offered without arguments (a person gives them: its user-input fields)
    whose name the user says ("schedule the delivery" calls schedule_delivery), with no arguments."""
    words = _stems(said)
    for tool in tools:
        function = tool.get("function", {})
        if (function.get("parameters") or {}).get("properties") or box.role(function.get("name", "")):
            continue
        wanted = {_stem(word) for word in _name_words(function.get("name", ""))} - _GENERIC_WORDS
        if wanted and wanted <= words:
            return function["name"], {}
    return None


def _rejection_report(name: str, result: str) -> str:
    """What the model says of a call the user rejected: nothing was done, and the user's note."""
    note = result[len(_REJECTED):].strip().removeprefix("Note:").strip()
    return f"You did not approve {name}, so nothing was changed." + (f" Your note: {_sentence(note)}" if note else "")
