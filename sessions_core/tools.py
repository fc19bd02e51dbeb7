"""Tools: plain Python functions (sync or async) offered to the model, and the hook chain around them.

A tool's JSON schema comes from its signature, type hints and docstring. Parameters named
`run_context`, `agent` or `team` are injected by the run and hidden from the schema.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from asgiref.sync import async_to_sync

from . import limits
from .bridge import call_sync
from .requirements import UserInputField
from .storable import replace_unstorable

logger = logging.getLogger("sessions_core")

INJECTED_PARAMS = ("run_context", "agent", "team")
DELEGATE_TOOL = "delegate_task_to_member"  # a Team's tool that hands a task to a member (team.py)


@dataclass
class RunContext:
    """What tools and hooks see of the run. `session_state` is the live, mutable state."""

    run_id: str
    session_id: str
    user_id: str | None = None
    session_state: dict = field(default_factory=dict)
    dependencies: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


class ToolError(Exception):
    """Raise from a tool to report a failure to the model without failing the run."""


@dataclass
class Function:
    name: str
    description: str
    parameters: dict
    entrypoint: Callable
    injected: tuple[str, ...] = ()
    # A tool that is a run of its own (a team's delegation to a member): an async generator function of
    # (the calling run, the arguments) yielding that run's events, then the tool's result.
    child_runner: Callable | None = None
    # A tool that waits for a person (requirements.py): at most one of the three. `user_input_fields` are
    # left out of what the model is offered; `user_input_schema` lists every argument the user may set.
    requires_confirmation: bool = False
    requires_user_input: bool = False
    user_input_fields: list[str] | None = None
    user_input_schema: list[UserInputField] | None = None
    external_execution: bool = False
    external_execution_silent: bool = False

    @property
    def needs_person(self) -> bool:
        """A call of it pauses the run until a person answers."""
        return self.requires_confirmation or self.requires_user_input or self.external_execution

    @classmethod
    def from_callable(cls, fn: Callable, name: str | None = None, description: str | None = None,
                      **person) -> Function:
        """The tool of `fn`; `person` holds the `tool` decorator's options for a tool that waits for a person."""
        if isinstance(fn, Function):
            return fn
        person = _person_options(person)
        asked = set(person.get("user_input_fields") or ())
        doc_description, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
        fields, injected, schema_fields = {}, [], []
        for param in signature.parameters.values():
            if param.name in INJECTED_PARAMS:
                injected.append(param.name)
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(param.name, Any)
            schema_fields.append(UserInputField(param.name, annotation, param_docs.get(param.name)))
            if param.name in asked:  # the user gives it: the model is not asked for it
                continue
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, pydantic.Field(default, description=param_docs.get(param.name)))
        unknown = sorted(asked - {item.name for item in schema_fields})
        if unknown:
            raise ValueError(f"user_input_fields names no argument of {fn.__name__}: {', '.join(unknown)}")
        schema = pydantic.create_model(f"{fn.__name__}_args", **fields).model_json_schema()
        if person.get("requires_user_input"):
            person["user_input_schema"] = schema_fields
        return cls(
            name=name or fn.__name__,
            description=description or doc_description,
            parameters=_clean_schema(schema),
            entrypoint=fn,
            injected=tuple(injected),
            **person,
        )

    def waiting_for(self, **person) -> Function:
        """This tool, waiting for a person as `person` says (a Toolkit's `*_tools` lists)."""
        merged = {key: getattr(self, key) for key in PERSON_OPTIONS}
        merged.update({key: value for key, value in person.items() if value})
        return Function.from_callable(self.entrypoint, name=self.name, description=self.description, **merged)

    def to_openai(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


PERSON_OPTIONS = ("requires_confirmation", "requires_user_input", "user_input_fields", "external_execution",
                  "external_execution_silent")
TOOL_OPTIONS = frozenset({"name", "description", *PERSON_OPTIONS})


def _person_options(options: dict) -> dict:
    """The `tool` options of a tool that waits for a person, checked as Agno checks them: at most one
    of the three kinds; input fields imply `requires_user_input`."""
    options = {key: value for key, value in options.items() if value not in (None, False)}
    if options.get("user_input_fields"):
        options["requires_user_input"] = True
    if sum(bool(options.get(key)) for key in ("requires_user_input", "requires_confirmation",
                                               "external_execution")) > 1:
        raise ValueError("Only one of 'requires_user_input', 'requires_confirmation', or 'external_execution' "
                         "can be set to True at the same time.")
    if "user_input_fields" in options:
        options["user_input_fields"] = list(options["user_input_fields"])
    return options


def tool(*args, **options):
    """Decorator making a function a tool: `@tool`, or `@tool(name=..., description=...,
    requires_confirmation=..., requires_user_input=..., user_input_fields=[...], external_execution=...)`."""
    unknown = sorted(set(options) - TOOL_OPTIONS)
    if unknown:
        raise ValueError(f"Invalid tool configuration arguments: {unknown}. "
                         f"Valid arguments are: {sorted(TOOL_OPTIONS)}")
    _person_options({key: value for key, value in options.items() if key in PERSON_OPTIONS})

    def wrap(fn: Callable) -> Function:
        return Function.from_callable(fn, **options)

    if args:
        if len(args) != 1 or not callable(args[0]) or options:
            raise TypeError("tool() takes keyword arguments only (or is used bare, as @tool)")
        return wrap(args[0])
    return wrap


class Toolkit:
    """A named group of tools; subclasses may pass bound methods as `tools`. The `*_tools` lists name
    tools that wait for a person (as `@tool(requires_confirmation=True)` etc. would)."""

    def __init__(self, name: str = "toolkit", tools: list[Callable] | None = None, *,
                 requires_confirmation_tools: list[str] | None = None,
                 requires_user_input_tools: list[str] | None = None,
                 external_execution_required_tools: list[str] | None = None):
        self.name = name
        self.tools = list(tools or [])
        self.requires_confirmation_tools = list(requires_confirmation_tools or [])
        self.requires_user_input_tools = list(requires_user_input_tools or [])
        self.external_execution_required_tools = list(external_execution_required_tools or [])
        lists = (self.requires_confirmation_tools, self.requires_user_input_tools,
                 self.external_execution_required_tools)
        twice = sorted(name for name in set().union(*lists) if sum(name in names for names in lists) > 1)
        if twice:
            raise ValueError(f"A tool waits for one kind of answer only: {', '.join(twice)} is in two lists.")

    def register(self, fn: Callable, name: str | None = None) -> None:
        """Add a tool (Agno's Toolkit.register)."""
        self.tools.append(Function.from_callable(fn, name=name) if name else fn)

    def functions(self) -> list[Function]:
        functions = [Function.from_callable(fn) for fn in self.tools]
        flags = {"requires_confirmation": self.requires_confirmation_tools,
                 "requires_user_input": self.requires_user_input_tools,
                 "external_execution": self.external_execution_required_tools}
        names = {function.name for function in functions}
        for flag, listed in flags.items():
            missing = [name for name in listed if name not in names]
            if missing:
                logger.warning("%s: tool(s) not present in the toolkit %r: %s", flag, self.name, ", ".join(missing))
        return [function.waiting_for(**{flag: True for flag, listed in flags.items() if function.name in listed})
                if any(function.name in listed for listed in flags.values()) else function
                for function in functions]


def collect_functions(tools) -> dict[str, Function]:
    functions: dict[str, Function] = {}
    for item in tools or []:
        for function in item.functions() if isinstance(item, Toolkit) else [Function.from_callable(item)]:
            if function.name in functions:
                raise ValueError(f"Two tools are named {function.name!r}.")
            functions[function.name] = function
    return functions


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$", re.IGNORECASE)
_SECTION_HEADER = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?)\s*:\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring."""
    description, params, current, section = [], {}, None, "description"
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            section = "args"
        elif _SECTION_HEADER.match(line):
            section = "other"
        elif section == "description":
            description.append(line)
        elif section == "args":
            match = _ARG_LINE.match(line)
            if match:
                current = match.group(1)
                params[current] = match.group(3).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return "\n".join(description).strip(), params


def _clean_schema(schema: dict) -> dict:
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
        if prop.get("description") is None:
            prop.pop("description", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


# Names a hook may declare, and what each receives.
_HOOK_ALIASES = {
    "name": "name", "function_name": "name",
    "function": "next", "func": "next", "function_call": "next",
    "args": "args", "arguments": "args",
    "run_context": "run_context", "agent": "agent", "team": "team",
}


async def call_tool(function: Function, args: dict, run_context: RunContext, agent, hooks: list[Callable]) -> Any:
    """Call `function` through `hooks` (the first is outermost). A hook that does not call its
    `function_call` short-circuits the tool; whatever it returns is the result. Keyword arguments a
    hook passes on replace the arguments (Agno ignores them; we honour them)."""
    is_team = getattr(agent, "kind", None) == "team"  # a team's own tools get it as `team`
    injected = {"run_context": run_context, "agent": None if is_team else agent, "team": agent if is_team else None}

    def tool_kwargs(call_args: dict) -> dict:
        kwargs = {key: value for key, value in call_args.items() if key not in INJECTED_PARAMS}
        kwargs.update({name: injected[name] for name in function.injected})
        return kwargs

    def level(index: int) -> tuple[Callable, bool]:
        """The callable at depth `index` of the chain and whether it is async."""
        if index == len(hooks):
            fn = function.entrypoint
            if inspect.iscoroutinefunction(fn):
                return (lambda call_args: fn(**tool_kwargs(call_args))), True
            return (lambda call_args: fn(**tool_kwargs(call_args))), False
        hook = hooks[index]
        accepted = inspect.signature(hook).parameters
        is_async = inspect.iscoroutinefunction(hook)
        inner, inner_async = level(index + 1)

        def make_next(call_args: dict) -> Callable:
            def bound_args(kwargs: dict) -> dict:
                return kwargs if kwargs else call_args

            if is_async:
                async def next_async(**kwargs):
                    result = inner(bound_args(kwargs))
                    return await result if inner_async else result
                if not inner_async:
                    async def next_async(**kwargs):  # noqa: F811 - sync inner runs in a worker thread
                        return await call_sync(inner, bound_args(kwargs))
                return next_async

            def next_sync(**kwargs):
                if inner_async:
                    async def call_inner():  # a coroutine function, as async_to_sync expects
                        return await inner(bound_args(kwargs))
                    return async_to_sync(call_inner)()
                return inner(bound_args(kwargs))
            return next_sync

        def call(call_args: dict):
            values = {"name": function.name, "next": make_next(call_args), "args": call_args, **injected}
            return hook(**{param: values[_HOOK_ALIASES[param]] for param in accepted if param in _HOOK_ALIASES})

        return call, is_async

    outer, outer_async = level(0)
    if outer_async:
        return await outer(args)
    return await call_sync(outer, args)


def result_text(result: Any) -> str:
    """What the model reads back from a tool (and what is stored). A result nested deeper than
    CHAT_MAX_JSON_DEPTH or over CHAT_MAX_JSON_BYTES raises limits.LimitExceeded."""
    if not isinstance(result, str):
        limits.check_tree(result, "The tool's result")  # before the (recursive) encoder walks it
    text = _result_text(result)
    limits.check_size(text, "The tool's result")
    return replace_unstorable(text)


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, pydantic.BaseModel):
        return result.model_dump_json()
    if result is None:
        return ""
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def timed() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: round(time.perf_counter() - start, 6)
