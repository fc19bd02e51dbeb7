"""The state panel's readable forms: the state as an HTML tree and each change as readable lines."""

from __future__ import annotations

import json

import jsonpatch
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

MAX_DEPTH = 12  # deeper values are shown as JSON text
VALUE_CHARS = 200  # longest value shown in a timeline line


def _scalar(value) -> SafeString:
    if isinstance(value, str):
        return format_html('<span class="json-string">{}</span>', value)
    if isinstance(value, bool) or value is None:
        return format_html('<span class="json-literal">{}</span>', json.dumps(value))
    if isinstance(value, (int, float)):
        return format_html('<span class="json-number">{}</span>', json.dumps(value))
    return format_html('<code>{}</code>', json.dumps(value, ensure_ascii=False))


def _node(value, depth: int) -> SafeString:
    if depth > MAX_DEPTH and isinstance(value, (dict, list)):
        return format_html("<code>{}</code>", json.dumps(value, ensure_ascii=False))
    if isinstance(value, list):
        if not value:
            return mark_safe('<span class="json-empty">empty list</span>')
        items = format_html_join("", "<li>{}</li>", ((_node(item, depth + 1),) for item in value))
        return format_html('<ol class="state-list" start="0">{}</ol>', items)
    if isinstance(value, dict):
        if not value:
            return mark_safe('<span class="json-empty">empty object</span>')
        noun = "key" if len(value) == 1 else "keys"
        return format_html('<details class="state-object" open><summary>{} {}</summary>{}</details>',
                           len(value), noun, _entries(value, depth + 1, ()))
    return _scalar(value)


def _key(key) -> SafeString:
    """A key that may break after its underscores (preferred_<wbr>delivery_<wbr>window) rather than mid-word
    when the panel is narrower than it."""
    return mark_safe("_<wbr>".join(escape(part) for part in str(key).split("_")))


def _entries(mapping: dict, depth: int, changed) -> SafeString:
    return format_html_join(
        "", '<div class="state-entry{}" data-key="{}"><dt>{}</dt><dd>{}</dd></div>',
        ((" changed" if key in changed else "", key, _key(key), _node(value, depth)) for key, value in mapping.items()),
    )


def tree(state: dict, changed_keys=()) -> SafeString:
    """The state as nested HTML: lists as lists, objects as collapsible <details>, changed keys marked."""
    if not state:
        return mark_safe('<p class="state-empty">The state is empty.</p>')
    return format_html('<dl class="state-tree">{}</dl>', _entries(state, 0, set(changed_keys)))


def readable_path(pointer: str) -> str:
    """'/shopping_list/0' -> 'shopping_list[0]'; '/notes/title' -> 'notes.title'."""
    out = ""
    for part in jsonpatch.JsonPointer(pointer).parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or "(whole state)"


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


_SYMBOLS = {"add": "+", "remove": "−", "replace": "~", "move": "→", "copy": "⧉", "test": "?"}


def describe_op(op: dict, undo: dict | None = None) -> dict:
    """One readable line of a patch; `undo` (the op's inverse) gives a removal the value it removed."""
    kind = op.get("op", "")
    line = {"op": kind, "symbol": _SYMBOLS.get(kind, kind), "path": readable_path(op.get("path", ""))}
    if "value" in op:
        line["value"] = _short(op["value"])
    elif kind == "remove" and undo and undo.get("path") == op.get("path") and "value" in undo:
        line["value"] = _short(undo["value"])
    if "from" in op:
        line["source"] = readable_path(op["from"])
    return line


# Sources that are not a tool's or a step's, in a reader's words (sessions_core names the source of every change).
_SOURCE_WORDS = {
    "manual": "your edit", "admin": "an admin's edit", "agentic": "the assistant", "defaults": "starting values",
    "run_input": "sent with the message", "fork": "forked", "import": "imported", "branch:switch": "version switch",
}


def source_label(source: str) -> str:
    """A change's source as a short label: "member:Status tracker/tool:update_step" is "Status tracker › update_step"
    (the full source is the label's title)."""
    if source in _SOURCE_WORDS:
        return _SOURCE_WORDS[source]
    return " › ".join(_SOURCE_WORDS.get(part, part.partition(":")[2] or part) for part in source.split("/"))


def describe_pending_change(event) -> dict:
    """A timeline entry for a change a run has made but not stored yet (from its StateChangedEvent)."""
    return {
        "version": event.state_version,
        "source": event.source,
        "label": source_label(event.source),
        "run_id": event.run_id,
        "created_at": timezone.now(),
        "ops": [describe_op(op) for op in event.patch],
        "pending": True,
    }


def describe_change(change) -> dict:
    """One timeline entry: version, source, the run it came from, and the diff as readable lines."""
    run = change.run if change.run_id else None
    return {
        "version": change.version,
        "source": change.source,
        "label": source_label(change.source),
        "run_id": run.run_id if run else None,
        "created_at": change.created_at,
        "ops": [describe_op(op, undo) for op, undo in zip(change.patch, _undo_steps(change), strict=True)],
        "restores": change.restores,  # a move back to that version's state (a branch switch): no ops of its own
    }


def _undo_steps(change) -> list:
    """The inverse of each op of the change's patch, in the patch's order (None where they do not pair)."""
    inverse = list(reversed(change.inverse or []))
    return inverse if len(inverse) == len(change.patch) else [None] * len(change.patch)
