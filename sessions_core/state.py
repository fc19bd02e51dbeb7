"""Pure functions on session state: merge, JSON validation, diffs and placeholder templating."""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import math
import operator
import re
import uuid
from collections.abc import Mapping

import jsonpatch

# Visible to tools, hooks, templates and the state block during a run; never persisted or returned.
INJECTED_KEYS = ("current_user_id", "current_session_id", "current_run_id")


class StateNotJSONError(ValueError):
    """A state value cannot be stored as JSON; the message names the key and the type."""

    def __init__(self, path: str, value: object):
        self.path = path
        self.type_name = type(value).__name__
        super().__init__(
            f"session_state{path} holds a value of type {self.type_name}, which cannot be stored as JSON. "
            "Use lists, dicts, strings, numbers, booleans or None."
        )


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """A new dict: `override` wins key by key; dicts on both sides merge recursively, anything else is replaced."""
    return copy.deepcopy(_merge(base, override))


def _merge(base: Mapping, override: Mapping) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def merge_state(defaults: Mapping | None, stored: Mapping | None, run_state: Mapping | None,
                overwrite: bool = False) -> dict:
    """The state a run starts from: defaults < stored < run-supplied.

    Defaults fill keys missing from the stored state on every run, so a key added to the defaults
    later reaches existing sessions. With `overwrite`, run-supplied state replaces the stored state;
    a run that supplies none leaves it as it is.
    """
    return copy.deepcopy(merge_owned(defaults, stored, run_state, overwrite))


def merge_owned(defaults: Mapping | None, stored: Mapping | None, run_state: Mapping | None,
                overwrite: bool = False) -> dict:
    """`merge_state` for inputs that are the caller's own fresh copies: nothing is copied, so the
    result shares their values."""
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
    """`state` as JSON text, converted and checked as `to_json` does (the form a run keeps it in)."""
    try:  # the C encoder: fast
        return json.dumps(state, default=_json_default, allow_nan=False)
    except (TypeError, ValueError):
        # The slow walk finds the offending value and names where it sits (or converts what the
        # fast path could not, such as a Mapping that is not a dict holding a datetime).
        return json.dumps(_to_json(state, ""), allow_nan=False)


def _json_default(value):
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
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
    raise StateNotJSONError(path, value)


def diff(before: Mapping, after: Mapping) -> tuple[list, list]:
    """(patch, inverse): RFC 6902 JSON Patches from `before` to `after` and back.

    Only add, remove and replace operations, descending into dicts and lists. Unchanged subtrees
    are recognised by C-level comparisons, and a list that only grew or shrank at its end (the
    usual shopping-list edit) is compared in one slice, so the cost follows the size of the change
    rather than the size of the state (jsonpatch.make_patch walks everything in Python).
    """
    patch: list = []
    undo: list = []
    _diff(before, after, "", patch, undo)
    undo.reverse()  # each undo step applies to the state its forward step produced
    return patch, undo


def _pointer(path: str, key) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _diff(before, after, path: str, patch: list, undo: list) -> None:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in before:
            if key not in after:
                patch.append({"op": "remove", "path": _pointer(path, key)})
                undo.append({"op": "add", "path": _pointer(path, key), "value": copy.deepcopy(before[key])})
        for key, value in after.items():
            if key not in before:
                patch.append({"op": "add", "path": _pointer(path, key), "value": copy.deepcopy(value)})
                undo.append({"op": "remove", "path": _pointer(path, key)})
            elif not _equal(before[key], value):
                _diff(before[key], value, _pointer(path, key), patch, undo)
    elif isinstance(before, list) and isinstance(after, list):
        _diff_lists(before, after, path, patch, undo)
    elif not _equal(before, after):
        patch.append({"op": "replace", "path": path, "value": copy.deepcopy(after)})
        undo.append({"op": "replace", "path": path, "value": copy.deepcopy(before)})


def _diff_lists(before: list, after: list, path: str, patch: list, undo: list) -> None:
    old, new = len(before), len(after)
    shared = min(old, new)
    if _equal(before[:shared], after[:shared]):
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
        _diff(before[index], after[index], _pointer(path, index), patch, undo)
    for index in range(start + changed_old - 1, start + changed_new - 1, -1):
        patch.append({"op": "remove", "path": _pointer(path, index)})
        undo.append({"op": "add", "path": _pointer(path, index), "value": copy.deepcopy(before[index])})
    for index in range(start + changed_old, start + changed_new):
        patch.append({"op": "add", "path": _pointer(path, index), "value": copy.deepcopy(after[index])})
        undo.append({"op": "remove", "path": _pointer(path, index)})


_CONTAINERS = (dict, list)


def _equal(a, b) -> bool:
    """Equal as JSON: Python's == (in C), then the types, since 1 == 1.0 == True in Python only."""
    return type(a) is type(b) and a == b and _same_types(a, b)


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
                key = jsonpatch.JsonPointer(pointer).parts[0]
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
