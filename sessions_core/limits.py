"""Limits on the JSON that enters: how deep it nests and how large it is, checked before any recursive
work (a parse, a diff, a copy), and how large a session's stored state may grow.

Every JSON that comes from outside goes through here: the web socket's frames, state edits and
imports (chatapp), and in the engine the tool arguments a model sends, a tool's result, the state a
caller passes to `run` and every state about to be stored (`state.dumps`, which tools, the agentic
tool, manual edits, imports and defaults all go through). Text is measured without being parsed
(`text_depth` scans it once, outside strings); Python values are walked with a stack
(`tree_depth`), so a value nested 100,000 deep costs a loop, not a RecursionError.

The limits are Django settings, with the defaults below when a setting is absent; 0 turns a limit
off. A check reads them again whenever the settings changed through `override_settings`:

    CHAT_MAX_JSON_DEPTH    deepest nesting of arrays and objects (64)
    CHAT_MAX_JSON_BYTES    largest JSON text, UTF-8 encoded (1,000,000); an import has its own
                           size limit, CHAT_IMPORT_MAX_BYTES (chatapp)
    CHAT_MAX_STATE_BYTES   largest session state, as stored (JSON text, UTF-8; 1,000,000)

And one limit on time: CHAT_TOOL_TIMEOUT_SECONDS (60), how long one tool call may take before the
model is told it timed out (`within_tool_timeout`); and one on work: CHAT_MAX_MODEL_CALLS (25, at
least 1), how many requests one run may make of its model before it is stopped as an error (a run
that should stop sooner with the calls it made has Agno's `tool_call_limit`).
"""

from __future__ import annotations

import asyncio
import re
from itertools import accumulate

from django.conf import settings

DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_MAX_JSON_BYTES = 1_000_000
DEFAULT_MAX_STATE_BYTES = 1_000_000
DEFAULT_TOOL_TIMEOUT_SECONDS = 60.0
DEFAULT_MAX_MODEL_CALLS = 25

# A JSON string (escapes included), and the brackets left once strings are gone.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_BRACKETS_BYTES = re.compile(rb"[\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1, b"[": 1, b"{": 1, b"]": -1, b"}": -1}


class LimitExceeded(ValueError):
    """An input over one of the limits; the message names the setting, for the user or the log."""

    def __init__(self, message: str, setting: str):
        self.setting = setting
        super().__init__(message)


_read: dict[str, int] = {}  # the settings as read, for the settings object they were read from
_read_from: list = [None]
# Where the lazy settings keep the object they stand for (read without LazyObject's attribute hook).
_lazy_settings = object.__getattribute__(settings, "__dict__")


def _setting(name: str, default: int) -> int:
    """A limit's setting, read once per settings object: `override_settings` (and pytest-django's
    `settings`) put a new one in place, so a changed limit is seen at the next check."""
    holder = _lazy_settings["_wrapped"]
    if holder is not _read_from[0]:
        _read.clear()
        _read_from[0] = holder
    try:
        return _read[name]
    except KeyError:
        value = _read[name] = getattr(settings, name, default)
        return value


def max_json_depth() -> int:
    return _setting("CHAT_MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH)


def max_json_bytes() -> int:
    return _setting("CHAT_MAX_JSON_BYTES", DEFAULT_MAX_JSON_BYTES)


def max_state_bytes() -> int:
    return _setting("CHAT_MAX_STATE_BYTES", DEFAULT_MAX_STATE_BYTES)


def tool_timeout() -> float:
    return _setting("CHAT_TOOL_TIMEOUT_SECONDS", DEFAULT_TOOL_TIMEOUT_SECONDS)


def max_model_calls() -> int:
    return _setting("CHAT_MAX_MODEL_CALLS", DEFAULT_MAX_MODEL_CALLS)


def too_many_model_calls(calls: int) -> LimitExceeded:
    """A run's model asked for tools in each of its `calls` requests, CHAT_MAX_MODEL_CALLS of them."""
    return LimitExceeded(f"The model kept calling tools after {calls} requests; the run was stopped. Raise "
                         "CHAT_MAX_MODEL_CALLS to allow more, or give the agent a tool_call_limit to end such a "
                         "run with the calls made so far.", "CHAT_MAX_MODEL_CALLS")


class ToolTimeout(TimeoutError):
    """A tool call that did not finish in time; reported to the model like a tool that raised."""


async def within_tool_timeout(awaitable, name: str):
    """Await a tool call for at most CHAT_TOOL_TIMEOUT_SECONDS (0: as long as it takes).

    An async tool is cancelled at the timeout. A sync tool runs on the thread that does the run's
    database work, which Python cannot stop: the run's next database step waits for it to return."""
    seconds = tool_timeout()
    if not seconds:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise ToolTimeout(f"{name} did not finish within {seconds:g} s (CHAT_TOOL_TIMEOUT_SECONDS).") from None


def text_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of JSON text nest, without parsing it (brackets inside strings
    do not count; text that is not JSON gets a number that may be too high, never a crash)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        brackets = _BRACKETS_BYTES.findall(_STRING_BYTES.sub(b"", bytes(text)))
    else:
        brackets = _BRACKETS.findall(_STRING.sub("", text))
    return max(accumulate(_STEP[bracket] for bracket in brackets), default=0)


def tree_depth(value, stop_after: int = 0) -> int:
    """How deep dicts, lists and tuples nest in `value`, walked with a stack (no recursion); the walk
    ends as soon as the depth passes `stop_after` (when given)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if stop_after and deepest > stop_after:
                return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def _utf8_size(text: str | bytes, limit: int) -> int:
    """The UTF-8 size of `text`, or a number over `limit` once that is certain (no encoding needed)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return len(text)
    if len(text) > limit or len(text) * 4 <= limit:  # a character is 1 to 4 bytes
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _too_deep(what: str, limit: int) -> LimitExceeded:
    return LimitExceeded(f"{what} is nested more than {limit:,} levels deep; the limit is {limit:,} "
                         "(CHAT_MAX_JSON_DEPTH).", "CHAT_MAX_JSON_DEPTH")


def check_size(text: str | bytes, what: str, limit: int | None = None, setting: str = "CHAT_MAX_JSON_BYTES") -> None:
    """Refuse `text` over `limit` bytes (default: CHAT_MAX_JSON_BYTES; 0: no limit)."""
    limit = max_json_bytes() if limit is None else limit
    if limit and (size := _utf8_size(text, limit)) > limit:
        raise LimitExceeded(f"{what} is {size:,} bytes; the limit is {limit:,} ({setting}).", setting)


def check_depth(text: str | bytes, what: str) -> None:
    """Refuse JSON text nested deeper than CHAT_MAX_JSON_DEPTH (0: no limit)."""
    limit = max_json_depth()
    # The number of opening brackets bounds the depth: most texts need no scan at all.
    if isinstance(text, str):
        opening = text.count("[") + text.count("{")
    else:
        opening = bytes(text).count(b"[") + bytes(text).count(b"{")
    if limit and opening > limit and text_depth(text) > limit:
        raise _too_deep(what, limit)


def check_text(text: str | bytes, what: str, max_bytes: int | None = None) -> None:
    """Refuse JSON text over the size limit or the depth limit, before it is parsed. `what` names it
    in the message ("The message", "The state"); `max_bytes` replaces CHAT_MAX_JSON_BYTES."""
    check_size(text, what, max_bytes)
    check_depth(text, what)


def check_tree(value, what: str) -> None:
    """Refuse a Python value (a tool's result, a state) nested deeper than CHAT_MAX_JSON_DEPTH, before
    anything recursive (an encoder, a copy) walks it."""
    limit = max_json_depth()
    if limit and tree_depth(value, stop_after=limit) > limit:
        raise _too_deep(what, limit)


def check_state_size(text: str, what: str = "The session state") -> None:
    """Refuse a state (the JSON text it is stored as) over CHAT_MAX_STATE_BYTES."""
    check_size(text, what, max_state_bytes(), setting="CHAT_MAX_STATE_BYTES")


def check_patch(patch: list, what: str = "The session state") -> None:
    """Refuse a change (an RFC 6902 patch) that would nest the state deeper than CHAT_MAX_JSON_DEPTH.

    A stored state is within the limit, so only what the change puts in can pass it: a value at
    path /a/b sits two levels down. The cost follows the size of the change, not of the state."""
    limit = max_json_depth()
    if not limit:
        return
    for operation in patch:
        value = operation.get("value")
        if isinstance(value, (dict, list)) or operation["path"].count("/") > limit:
            levels = operation["path"].count("/")
            if levels + tree_depth(value, stop_after=max(limit - levels, 1)) > limit:
                raise _too_deep(what, limit)
