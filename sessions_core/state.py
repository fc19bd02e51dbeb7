"""Pure functions on session state: merge, JSON validation, diffs and placeholder templating."""

from __future__ import annotations

import copy
import datetime
import decimal
import json
import math
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


def merge_state(defaults: Mapping | None, stored: Mapping | None, run_state: Mapping | None, overwrite: bool = False) -> dict:
    """The state a run starts from: defaults < stored < run-supplied.

    Defaults fill keys missing from the stored state on every run, so a key added to the defaults
    later reaches existing sessions. With `overwrite`, run-supplied state replaces the stored state;
    a run that supplies none leaves it as it is.
    """
    base = stored or {}
    if overwrite and run_state:
        base = {}
    return copy.deepcopy(_merge(_merge(defaults or {}, base), run_state or {}))


def strip_injected(state: Mapping) -> dict:
    return {key: value for key, value in state.items() if key not in INJECTED_KEYS}


def to_json(state: Mapping) -> dict:
    """A JSON-safe deep copy of `state`; datetimes, dates, Decimals and UUIDs become strings.

    Anything else that JSON cannot hold raises StateNotJSONError naming where it sits.
    """
    try:  # the C encoder and decoder: fast, and a fresh deep copy
        return json.loads(json.dumps(state, default=_json_default, allow_nan=False))
    except (TypeError, ValueError):
        return _to_json(state, "")  # the slow walk finds the offending value and names where it sits


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
    """(patch, inverse): RFC 6902 JSON Patches from `before` to `after` and back."""
    return (jsonpatch.make_patch(before, after).patch, jsonpatch.make_patch(after, before).patch)


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
