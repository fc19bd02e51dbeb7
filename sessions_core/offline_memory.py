"""The offline model's part in user memories: simple facts learnt, used and forgotten with no network.

As a memory manager's model it reads the user's words for a few kinds of fact ("my name is Ana", "I am
vegetarian", "I live in Lyon", "I don't like olives", "I like jazz") and asks to forget ("forget that I
live in Lyon", "forget everything"), and calls the manager's tools: a new fact is added, a changed one
(a new name, a new town) updated, a forgotten one deleted. As an agent's model it answers from the
memories in its system message ("what's my name?", "where do I live?", "what do you know about me?"),
acknowledges what it was told, calls `update_user_memory` when that tool is on offer, and keeps what the
user dislikes off a shopping list. `offline_model.py` calls `plan` and `disliked` and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MANAGER = "You are a Memory Manager"
_MEMORIES = re.compile(r"<memories_from_previous_interactions>\n(.*?)\n</memories_from_previous_interactions>", re.S)
_CAN_REMEMBER = re.compile(r"retain memories|user info and preferences from previous interactions")
_EXISTING = re.compile(r"ID: (\S+)\nMemory: (.*)")
_END = r"(?=\s*(?:[.,;!?]|\band\b|\bbut\b|$))"
_VALUE = r"([^.,;!?]+?)" + _END


@dataclass(frozen=True)
class _Fact:
    kind: str  # name, diet, home, dislike, like
    value: str

    @property
    def memory(self) -> str:
        return {
            "name": f"The user's name is {self.value}",
            "diet": f"The user is {self.value}",
            "home": f"The user lives in {self.value}",
            "dislike": f"The user does not like {self.value}",
            "like": f"The user likes {self.value}",
        }[self.kind]

    @property
    def topics(self) -> list[str]:
        return [{"name": "name", "diet": "food", "home": "location", "dislike": "preferences",
                 "like": "preferences"}[self.kind]]

    @property
    def said_back(self) -> str:
        """The fact in the second person."""
        return _second_person(self.memory)


_FACTS = [
    ("name", re.compile(r"\b(?:my name is|my name's|call me|i am called|i'm called)\s+" + _VALUE, re.I)),
    ("diet", re.compile(r"\b(?:i am|i'm)\s+(?:a\s+|an\s+)?(vegetarian|vegan|pescatarian)\b", re.I)),
    ("home", re.compile(r"\b(?:i live in|i moved to|i'm living in|i am living in)\s+" + _VALUE, re.I)),
    ("dislike", re.compile(r"\b(?:i don't like|i do not like|i dislike|i hate|i can't stand)\s+" + _VALUE, re.I)),
    ("like", re.compile(r"\b(?:i like|i love|i enjoy)\s+" + _VALUE, re.I)),
]
_SINGLE = {"name", "diet", "home"}  # one of these at a time: a new one replaces the old
_FORGET = re.compile(r"\bforget\b(?:\s+(?:that|about))?\s*(?P<what>[^.!?]*)", re.I)
_EVERYTHING = re.compile(r"^(?:everything|all|it all|all about me|everything about me|what you know about me)\b", re.I)


def _facts(text: str) -> list[_Fact]:
    found = []
    for kind, pattern in _FACTS:
        for match in pattern.finditer(text):
            value = match[1].strip().strip("'\"")
            if kind == "like" and re.match(r"^(?:to\b|it\b|that\b)", value, re.I):
                continue
            if kind == "name":
                value = value.split()[0].capitalize() if value else value
            if value and _Fact(kind, value) not in found:
                found.append(_Fact(kind, value))
    return found


def _second_person(memory: str) -> str:
    for third, second in (("The user's", "your"), ("The user is", "you are"), ("The user lives", "you live"),
                          ("The user does not like", "you don't like"), ("The user likes", "you like"),
                          ("The user", "you")):
        if memory.startswith(third):
            return second + memory[len(third):]
    return memory


def _kind_of(memory: str) -> str | None:
    for kind, prefix in (("name", "The user's name is "), ("diet", "The user is "), ("home", "The user lives in "),
                         ("dislike", "The user does not like "), ("like", "The user likes ")):
        if memory.startswith(prefix):
            return kind
    return None


def _words(text: str) -> set[str]:
    return {word.rstrip("s") for word in re.findall(r"[a-z']{3,}", text.lower())} - {"the", "user", "that", "you"}


# -- the manager's model --------------------------------------------------------------------------------


def _manager_calls(said: str, existing: list[tuple[str, str]], tools: set[str]) -> list[tuple[str, dict]]:
    calls = []
    forget = _FORGET.search(said)
    if forget and "delete_memory" in tools:
        what = forget["what"].strip()
        if _EVERYTHING.match(what):
            return [("delete_memory", {"memory_id": memory_id}) for memory_id, _ in existing]
        wanted = [fact.memory for fact in _facts(what)] or [what]
        for memory_id, memory in existing:
            if any(memory.lower() == text.lower() or (_words(text) and _words(text) <= _words(memory))
                   for text in wanted):
                calls.append(("delete_memory", {"memory_id": memory_id}))
        return calls
    for fact in _facts(said):
        if any(memory.lower() == fact.memory.lower() for _, memory in existing):
            continue  # known already
        same_kind = [memory_id for memory_id, memory in existing if fact.kind in _SINGLE and _kind_of(memory) == fact.kind]
        if same_kind and "update_memory" in tools:
            calls.append(("update_memory", {"memory_id": same_kind[0], "memory": fact.memory, "topics": fact.topics}))
        elif "add_memory" in tools:
            calls.append(("add_memory", {"memory": fact.memory, "topics": fact.topics}))
    return calls


# -- the agent's model ----------------------------------------------------------------------------------


def _remembered(messages: list[dict]) -> list[str] | None:
    """The memories in the system message; None when the model was not told it can remember."""
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    if not isinstance(system, str) or not _CAN_REMEMBER.search(system):
        return None
    match = _MEMORIES.search(system)
    return [line[2:] for line in match[1].splitlines() if line.startswith("- ")] if match else []


_ASKS_NAME = re.compile(r"\bwhat(?:'s| is)\s+my name\b|\bwho am i\b|\bdo you know my name\b", re.I)
_ASKS_HOME = re.compile(r"\bwhere do i live\b|\bwhere am i from\b", re.I)
_ASKS_ALL = re.compile(r"\bwhat do you (?:know|remember) about me\b|\bwhat do you remember\b", re.I)


def _answer(said: str, memories: list[str]) -> str | None:
    def find(kind: str) -> str | None:
        return next((memory for memory in reversed(memories) if _kind_of(memory) == kind), None)

    if _ASKS_NAME.search(said):
        name = find("name")
        return f"Your name is {name[len('The user' + chr(39) + 's name is '):]}." if name else "I don't know your name yet."
    if _ASKS_HOME.search(said):
        home = find("home")
        return f"You live in {home[len('The user lives in '):]}." if home else "I don't know where you live yet."
    if _ASKS_ALL.search(said):
        if not memories:
            return "I don't remember anything about you yet."
        return "I remember that " + _joined([_second_person(memory) for memory in memories]) + "."
    return None


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _acknowledgement(said: str) -> str | None:
    forget = _FORGET.search(said)
    if forget:
        what = forget["what"].strip()
        if _EVERYTHING.match(what):
            return "OK, I'll forget everything I know about you."
        facts = _facts(what)
        return f"OK, I'll forget that {facts[0].said_back}." if facts else f"OK, I'll forget {what or 'that'}."
    facts = _facts(said)
    if not facts:
        return None
    name = next((fact.value for fact in facts if fact.kind == "name"), None)
    rest = [fact.said_back for fact in facts if fact.kind != "name"]
    parts = [f"Nice to meet you, {name}!"] if name else []
    if rest:
        parts.append(f"I'll remember that {_joined(rest)}.")
    return " ".join(parts)


def plan(messages: list[dict], said: str, tools: set[str]):
    """The offline model's turn when it is about memories: (text, calls), else None."""
    first = messages[0] if messages else {}
    if first.get("role") == "system" and str(first.get("content") or "").startswith(_MANAGER):
        if messages[-1].get("role") == "tool":
            return "Done.", []
        existing = _EXISTING.findall(first["content"])
        return "", _manager_calls(said, existing, tools)
    if "update_user_memory" in tools:
        last = messages[-1] if messages else {}
        if last.get("role") == "tool" and last.get("name", "update_user_memory") == "update_user_memory" \
                and _last_call_name(messages) == "update_user_memory":
            return _acknowledgement(said) or "Done.", []
        if last.get("role") != "tool" and (_FORGET.search(said) or _facts(said)):
            return "", [("update_user_memory", {"task": said})]
    memories = _remembered(messages)
    if memories is None or (messages and messages[-1].get("role") == "tool"):
        return None
    answer = _answer(said, memories)
    if answer is not None:
        return answer, []
    acknowledgement = _acknowledgement(said)
    return (acknowledgement, []) if acknowledgement else None


def _last_call_name(messages: list[dict]) -> str | None:
    for message in reversed(messages):
        if message.get("tool_calls"):
            return message["tool_calls"][-1]["function"]["name"]
    return None


def disliked(messages: list[dict], items: list[str]) -> list[str]:
    """Those of `items` the memories in the system message say the user does not like."""
    dislikes = [memory[len("The user does not like "):] for memory in _remembered(messages) or []
                if _kind_of(memory) == "dislike"]
    return [item for item in items
            if any(_words(dislike) and _words(dislike) & _words(item) for dislike in dislikes)]
