"""Pure functions on session state: merge, JSON validation, diffs and placeholder templating."""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import json
import math
import operator
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import jsonpatch
import orjson

from . import limits
from .storable import is_storable, replace_unstorable_json, without_escaped_nul

# Visible to tools, hooks, templates and the state block during a run; never persisted or returned.
# (A workflow run adds the workflow's id and name.)
INJECTED_KEYS = ("current_user_id", "current_session_id", "current_run_id", "workflow_id", "workflow_name")


class StateNotJSONError(ValueError):
    """A state value cannot be stored as JSON; the message names the key and the type."""

    def __init__(self, path: str, value: object):
        self.path = path
        self.type_name = type(value).__name__
        super().__init__(
            f"session_state{path} holds a value of type {self.type_name}, which cannot be stored as JSON. "
            "Use lists, dicts, strings, numbers, booleans or None."
        )


class StateLimitError(limits.LimitExceeded, StateNotJSONError):
    """A state over CHAT_MAX_STATE_BYTES or nested deeper than CHAT_MAX_JSON_DEPTH: refused wherever a
    state not JSON is (the run fails and the stored state stays as it was; an edit is a 422)."""

    def __init__(self, exceeded: limits.LimitExceeded):
        self.setting = exceeded.setting
        ValueError.__init__(self, str(exceeded))


def check_patch(patch: list) -> None:
    """Refuse a change that would nest the state deeper than CHAT_MAX_JSON_DEPTH (StateLimitError)."""
    try:
        limits.check_patch(patch)
    except limits.LimitExceeded as exc:
        raise StateLimitError(exc) from None


def _merge(base: Mapping, override: Mapping) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def merge_owned(defaults: Mapping | None, stored: Mapping | None, run_state: Mapping | None,
                overwrite: bool = False) -> dict:
    """The state a run starts from: defaults < stored < run-supplied.

    Defaults fill keys missing from the stored state on every run, so a key added to the defaults
    later reaches existing sessions. With `overwrite`, run-supplied state replaces the stored state;
    a run that supplies none leaves it as it is. The inputs are the caller's own fresh copies: nothing
    is copied, so the result shares their values (none of the inputs is changed).
    """
    base = stored or {}
    if overwrite and run_state:
        base = {}
    return _merge(_merge(defaults or {}, base), run_state or {})


def fills_in(defaults: Mapping, stored: Mapping) -> bool:
    """Whether merging `defaults` under `stored` would add anything (a key missing at any depth)."""
    for key, value in defaults.items():
        if key not in stored:
            return True
        if isinstance(value, Mapping) and isinstance(stored[key], Mapping) and fills_in(value, stored[key]):
            return True
    return False


def has_injected(state: Mapping) -> bool:
    return any(key in state for key in INJECTED_KEYS)


def strip_injected(state: Mapping) -> dict:
    return {key: value for key, value in state.items() if key not in INJECTED_KEYS}


def to_json(state: Mapping) -> dict:
    """A JSON-safe deep copy of `state`; datetimes, dates, Decimals and UUIDs become strings.

    Anything else that JSON cannot hold raises StateNotJSONError naming where it sits.
    """
    return json.loads(dumps(state))


def dumps(state: Mapping) -> str:
    """`state` as JSON text, converted and checked as `to_json` does (the form a run keeps it in).

    A NUL character or a lone surrogate in a string becomes U+FFFD (see storable.py). A state over
    CHAT_MAX_STATE_BYTES, or one too deep to encode safely, raises StateLimitError (limits.py)."""
    try:
        return _checked_size(_dumps(state))
    except limits.LimitExceeded as exc:
        raise StateLimitError(exc) from None


def _checked_size(text: str) -> str:
    limits.check_state_size(text)
    return text


def _dumps(state: Mapping) -> str:
    try:  # orjson: much faster than the json module at encoding a large state
        text = orjson.dumps(state, default=_json_default, option=_ORJSON_OPTIONS)
    except TypeError:  # something orjson will not encode (a non-str key, a huge int, a lone surrogate)
        # or more than 254 levels, which the json module's recursive encoder may not survive.
        limits.check_tree(state, "The session state")
    else:
        # orjson writes NaN and infinities as null, where we refuse them: any "null" sends the
        # state through the strict json module (a None in the state, or the word in a string, costs time only).
        if b"null" not in text:
            return without_escaped_nul(text.decode())  # orjson refuses lone surrogates: NUL is all there is
    return replace_unstorable_json(_json_module_dumps(state))


def _json_module_dumps(state: Mapping) -> str:
    # The json module writes characters raw too (ensure_ascii=False), as orjson does: no escapes to undo.
    try:  # the json module's C encoder
        return json.dumps(state, default=_json_default, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        # The slow walk finds the offending value and names where it sits (or converts what the
        # fast path could not, such as a Mapping that is not a dict holding a datetime).
        return json.dumps(_to_json(state, ""), allow_nan=False, ensure_ascii=False)


# Datetimes and dataclasses reach _json_default, so both encoders treat them alike.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _json_default(value):
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, enum.Enum):  # stored as its value (orjson does this by itself)
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)


def _to_json(value, path):
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StateNotJSONError(path, value)
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise StateNotJSONError(f"{path}[{key!r}] (key)", key)
            out[str(key)] = _to_json(item, f"{path}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_to_json(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, enum.Enum):
        return _to_json(value.value, path)
    raise StateNotJSONError(path, value)


def diff(before: Mapping, after: Mapping) -> tuple[list, list]:
    """(patch, inverse): RFC 6902 JSON Patches from `before` to `after` and back.

    Only add, remove and replace operations, descending into dicts and lists. Unchanged subtrees
    are recognised by C-level comparisons, and a list that only grew or shrank at its end (the
    usual shopping-list edit) is compared in one slice, so the cost follows the size of the change
    rather than the size of the state. Written here rather than taken from jsonpatch (which applies the
    patches): its `make_patch` misses a type change inside a list (5 to 5.0, 1 to True) and some of its
    patches for list edits do not apply (tests/engine/test_state.py's random round trips find both).
    """
    patch: list = []
    undo: list = []
    _diff(before, after, "", patch, undo, copy.deepcopy)
    undo.reverse()  # each undo step applies to the state its forward step produced
    return patch, undo


def diff_onto(snapshot: dict, live: Mapping) -> tuple[list, list] | None:
    """`diff(snapshot, live)` without encoding or parsing `live`, and `snapshot` brought up to date.

    `snapshot` is a parsed JSON tree that belongs to the caller; `live` is the state as tools left
    it. When the changed parts of `live` hold only JSON's own types (str, int, float, bool, None,
    dicts with str keys, lists), the patch is made from `live` directly and applied to `snapshot`,
    so the cost follows the change. Otherwise (a tuple, a datetime, an int key, a string with a NUL or
    a lone surrogate: values whose JSON form differs from themselves, so they would look changed again
    next time) nothing is touched and None is returned: diff `snapshot` against `live`'s parsed JSON.
    """
    patch: list = []
    undo: list = []
    try:
        _diff(snapshot, live, "", patch, undo, _native_copy)
    except _NotNative:
        return None
    undo.reverse()
    _apply_native(snapshot, patch)
    return patch, undo


def _apply_native(tree: dict, patch: list) -> None:
    """Apply a patch made by `_diff` (add, remove and replace below the root, values of JSON's own types)
    to `tree` in place, each value copied so that `tree` shares no container with the patch."""
    for op in patch:
        parts = [part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]]
        parent = tree
        for part in parts[:-1]:
            parent = parent[int(part)] if type(parent) is list else parent[part]
        key, name = parts[-1], op["op"]
        if type(parent) is list:
            key = int(key)
            if name == "add":
                parent.insert(key, copy_tree(op["value"]))
                continue
        if name == "remove":
            del parent[key]
        else:
            parent[key] = copy_tree(op["value"])


def copy_tree(tree):
    """A copy of a tree of JSON's own types (parsed JSON) that shares none of its containers.

    Cheaper than parsing the text again: a long list of strings is checked and copied in C, other
    large containers go through orjson, and the leaves (immutable) are shared.
    """
    kind = type(tree)
    if kind is list:
        if len(tree) > _LARGE:
            try:
                "".join(tree)  # raises unless every item is a str
            except TypeError:
                return orjson.loads(orjson.dumps(tree))
            return tree[:]
        return [copy_tree(item) if type(item) in _CONTAINERS else item for item in tree]
    if kind is dict:
        if len(tree) > _LARGE:
            return orjson.loads(orjson.dumps(tree))
        return {key: copy_tree(item) if type(item) in _CONTAINERS else item for key, item in tree.items()}
    return tree


class _NotNative(Exception):
    """A value that is not JSON's own type, met by `_native_copy`."""


def _native_copy(value):
    """A copy of a value made only of JSON's own types; raises _NotNative on anything else."""
    kind = type(value)
    if kind is str:
        if not is_storable(value):  # NUL or a lone surrogate, stored as U+FFFD: its JSON form differs
            raise _NotNative
        return value
    if kind is bool or kind is int or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _NotNative
        return value
    if isinstance(value, dict):
        if not all(type(key) is str and is_storable(key) for key in value):
            raise _NotNative
        return {key: _native_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_native_copy(item) for item in value]
    raise _NotNative


def _pointer(path: str, key) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _diff(before, after, path: str, patch: list, undo: list, copy_after) -> None:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in before:
            if key not in after:
                patch.append({"op": "remove", "path": _pointer(path, key)})
                undo.append({"op": "add", "path": _pointer(path, key), "value": copy.deepcopy(before[key])})
        for key, value in after.items():
            if key not in before:
                if copy_after is _native_copy and (type(key) is not str or not is_storable(key)):
                    raise _NotNative
                patch.append({"op": "add", "path": _pointer(path, key), "value": copy_after(value)})
                undo.append({"op": "remove", "path": _pointer(path, key)})
            elif _large_lists(before[key], value) or not _equal(before[key], value):
                _diff(before[key], value, _pointer(path, key), patch, undo, copy_after)  # compares as it goes
    elif isinstance(before, list) and isinstance(after, list):
        _diff_lists(before, after, path, patch, undo, copy_after)
    elif not _equal(before, after):
        patch.append({"op": "replace", "path": path, "value": copy_after(after)})
        undo.append({"op": "replace", "path": path, "value": copy.deepcopy(before)})


def _large_lists(before, after) -> bool:
    """Two large lists: `_diff_lists` compares them as it goes (all at once when only the end
    changed), so comparing them whole first would double the work."""
    return type(before) is list and type(after) is list and len(before) > _LARGE


def _diff_lists(before: list, after: list, path: str, patch: list, undo: list, copy_after) -> None:
    old, new = len(before), len(after)
    shared = min(old, new)
    if _equal(before if shared == old else before[:shared], after if shared == new else after[:shared]):
        start = shared  # only the end changed: one slice comparison
    else:
        start = 0
        while start < shared and _equal(before[start], after[start]):
            start += 1
    # Items removed or added in the middle shift the rest: find the unchanged tail as well.
    end = 0
    while end < shared - start and _equal(before[old - 1 - end], after[new - 1 - end]):
        end += 1
    # The changed middle: before[start:old-end] became after[start:new-end]. Diff it pairwise, then
    # remove what is left over (last first) or add what is new.
    changed_old, changed_new = old - end - start, new - end - start
    for index in range(start, start + min(changed_old, changed_new)):
        _diff(before[index], after[index], _pointer(path, index), patch, undo, copy_after)
    for index in range(start + changed_old - 1, start + changed_new - 1, -1):
        patch.append({"op": "remove", "path": _pointer(path, index)})
        undo.append({"op": "add", "path": _pointer(path, index), "value": copy.deepcopy(before[index])})
    for index in range(start + changed_old, start + changed_new):
        patch.append({"op": "add", "path": _pointer(path, index), "value": copy_after(after[index])})
        undo.append({"op": "remove", "path": _pointer(path, index)})


_CONTAINERS = (dict, list)


def _equal(a, b) -> bool:
    """Equal as JSON: Python's == (in C), then the types, since 1 == 1.0 == True in Python only.

    Large containers are checked in C too: a list of strings by joining it (equal to strings, the
    other side's items are strings as well), anything else as orjson text.
    """
    if type(a) is not type(b):
        return False
    if type(a) in _CONTAINERS and len(a) > _LARGE:
        if type(a) is list:
            try:
                "".join(a)  # raises unless every item is a str
            except TypeError:
                pass
            else:
                return a == b
        try:  # datetimes raise here too (passed through), rather than compare in orjson's own format
            return orjson.dumps(a, option=_ORJSON_OPTIONS) == orjson.dumps(b, option=_ORJSON_OPTIONS)
        except TypeError:  # a datetime or an int key among the tools' values: compare as below
            pass
    return a == b and _same_types(a, b)


_LARGE = 32


def _same_types(a, b) -> bool:
    """For values already known to be ==: whether every value inside has the same type on both sides."""
    if isinstance(a, dict):
        return all(type(value) is type(b[key]) and (not isinstance(value, _CONTAINERS) or _same_types(value, b[key]))
                   for key, value in a.items())
    if isinstance(a, list):
        kinds = set(map(type, a))  # all in C: no Python per item
        if kinds <= _EQUAL_ONLY_TO_THEMSELVES:  # b's items equal these, so they are of the same types
            return True
        if not all(map(operator.is_, map(type, a), map(type, b))):
            return False
        if kinds <= _SCALARS:
            return True
        return all(_same_types(x, y) for x, y in zip(a, b, strict=True) if isinstance(x, _CONTAINERS))
    return True


# A str equals only a str and None only None; 1 == 1.0 == True is where types can differ while equal.
_EQUAL_ONLY_TO_THEMSELVES = frozenset({str, type(None)})
_SCALARS = _EQUAL_ONLY_TO_THEMSELVES | {int, float, bool}


def apply_patch(state: Mapping, patch: list) -> dict:
    return jsonpatch.apply_patch(state, patch)


def changed_keys(patch: list) -> list[str]:
    """The top-level keys a patch touches, in order of first appearance."""
    keys = []
    for op in patch:
        for pointer in (op.get("path"), op.get("from")):
            if pointer:
                key = pointer.split("/", 2)[1].replace("~1", "/").replace("~0", "~")
                if key not in keys:
                    keys.append(key)
    return keys


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render(text: str, *sources: Mapping) -> str:
    """Resolve `{key}` placeholders from the first source that has the key.

    Top-level keys only; missing keys stay verbatim; non-strings render with str(); JSON braces
    and format specs are left alone. Only developer-authored text goes through here, never user input.
    """
    if "{" not in text:
        return text

    def substitute(match: re.Match) -> str:
        key = match.group(1)
        for source in sources:
            if source and key in source:
                value = source[key]
                return value if isinstance(value, str) else str(value)
        return match.group(0)

    return _PLACEHOLDER.sub(substitute, text)


@dataclass
class RunStartState:
    """The state a run starts from, and how it got there from the stored state."""

    state: dict  # merged, without injected keys: a fresh copy the run may change
    text: str  # `state` as JSON text
    changes: list = field(default_factory=list)  # [(patch, inverse, source)]: "defaults", then "run_input"
    error: str = ""  # the defaults or the run's state are not JSON: the run fails with this


def merge_for_run(defaults: Mapping | None, stored_text: str, run_state: Mapping | None,
                  overwrite: bool = False) -> RunStartState:
    """defaults < stored < run-supplied, each step recorded as its own change.

    Every input is a fresh copy (parsed from JSON text, or converted by to_json), so nothing is
    deep-copied here and the stored state, kept for a failed run, is never the working one.
    """
    try:
        if run_state:
            limits.check_tree(run_state, "The session_state passed to the run")
        defaults = to_json(defaults) if defaults else {}
        run_state = to_json(run_state) if run_state else None
    except (StateNotJSONError, limits.LimitExceeded) as exc:
        return RunStartState(json.loads(stored_text), stored_text, error=str(exc))
    working = json.loads(stored_text)
    if not run_state and not fills_in(defaults, working) and not has_injected(working):
        # The usual run: nothing to merge, so nothing to compare (which costs as much as the state).
        return RunStartState(working, stored_text)
    stored = json.loads(stored_text)  # `working` is merged into below; this copy stays as it was
    with_defaults = merge_owned(defaults, working, None)
    merged = strip_injected(merge_owned(defaults, working, run_state, overwrite=overwrite))
    changes = []
    for before, after, source in ((stored, with_defaults, "defaults"), (with_defaults, merged, "run_input")):
        patch, inverse = diff(before, after)
        if patch:
            changes.append((patch, inverse, source))
    try:
        # Unchanged, the stored text serves as is (no need to encode a large state again).
        text = dumps(merged) if changes else stored_text
        for patch, _inverse, _source in changes:
            check_patch(patch)
    except StateLimitError as exc:
        return RunStartState(stored, stored_text, error=str(exc))
    return RunStartState(merged, text, changes)
