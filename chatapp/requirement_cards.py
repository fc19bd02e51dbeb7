"""The cards of a reply that waits for the user (a paused run), and of one that did: a card per requirement
(sessions_core/decisions.py tells each one), with its arguments readable, its input fields typed from
their schema, and once answered the decision as a record. `_run.html` draws them (`_requirements.html`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sessions_core.decisions import Decision, decisions
from sessions_core.models import RunStatus

SHORT_VALUE = 80  # characters: a longer (or nested) argument is shown as a block of JSON


@dataclass(frozen=True)
class Argument:
    name: str
    text: str
    block: bool  # shown as a preformatted block (long, or nested)


@dataclass(frozen=True)
class Card:
    decision: Decision
    step: str = ""  # the workflow step whose agent or team asked (an executor's requirement)
    arguments: list[Argument] = field(default_factory=list)

    def __getattr__(self, name):  # the decision's fields, as the template reads them
        return getattr(self.decision, name)

    @property
    def inputs(self) -> list[dict]:
        """The input fields, each with the form control it takes (`input_type`, `step` for numbers)."""
        return [{**spec, "input_type": field_input_type(spec),
                 "step": {"int": "1", "float": "any"}.get(spec.get("field_type"), "")}
                for spec in self.decision.fields]

    @property
    def input_shown(self) -> list[Argument]:
        return _arguments(self.decision.user_input)


def _text(value) -> tuple[str, bool]:
    if isinstance(value, str):
        return value, len(value) > SHORT_VALUE or "\n" in value
    if isinstance(value, (list, tuple)) and all(isinstance(item, (str, int, float)) for item in value):
        text = ", ".join(map(str, value))
        return text, len(text) > SHORT_VALUE
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=2, ensure_ascii=False), True
    return json.dumps(value), False


def _arguments(values: dict) -> list[Argument]:
    return [Argument(name, *_text(value)) for name, value in (values or {}).items()]


def cards(requirements: list | None) -> list[Card]:
    """A card per requirement of a run; a step whose agent or team asked shows that executor's requirements."""
    shown = []
    for item in decisions(requirements):
        if item.kind == "executor":
            shown += [Card(inner, step=item.title, arguments=_arguments(inner.arguments)) for inner in item.inner]
        else:
            shown.append(Card(item, arguments=_arguments(item.arguments)))
    return shown


def field_input_type(field_spec: dict) -> str:
    kind = field_spec.get("field_type") or "str"
    if kind in ("int", "float"):
        return "number"
    if str(field_spec.get("name", "")).lower().endswith("date"):
        return "date"
    return "text"


def waiting(run) -> bool:
    return getattr(run, "status", "") == RunStatus.PAUSED
