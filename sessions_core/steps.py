"""Workflow steps: Step, Steps, Condition, Router, Parallel and Loop, and what passes between them.

Every primitive's `execute(context, step_input)` is an async generator: it yields the run's events
as they happen and ends by yielding its `StepOutput`. A `Step` runs as a run of its own inside the
workflow run (`BaseRun.child`): an agent or a team through the same run loop as ever, a function
through a loop whose executor calls it. So every step execution is a `Run` row with its own
messages, and every state change it makes names it. Containers (Steps, Condition, Router,
Parallel, Loop) have no row; their events carry the workflow run's id.

Everything that may touch the session state (a tool, an executor, an evaluator, a selector, an end
condition) runs under the run's state lock, one at a time, so parallel branches never lose an update;
model calls are outside the lock and overlap.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from . import events as ev
from .bridge import call_sync
from .config import RunConfig
from .errors import Cancelled, ChildPaused, RunFailed
from .models import RunStatus

ON_ERROR = ("fail", "skip")


class StepFailed(RunFailed):
    """A step failed with on_error="fail": the workflow run ends with this error."""


class WorkflowDefinitionError(ValueError):
    """A workflow's steps are not what the workflow can run (a Router's choice that is not one of them...)."""


@dataclass
class StepOutput:
    """What a step produced (Agno's fields). `steps` holds a container's children's outputs."""

    step_name: str | None = None
    step_id: str | None = None
    step_type: str | None = None  # step, steps, condition, router, parallel, loop
    executor_type: str | None = None  # agent, team, function
    executor_name: str | None = None
    content: Any = None
    step_run_id: str | None = None
    metrics: dict | None = None
    success: bool = True
    error: str | None = None
    stop: bool = False
    steps: list[StepOutput] | None = None

    def to_dict(self) -> dict:
        content = self.content
        if isinstance(content, BaseModel):
            content = content.model_dump(mode="json")
        data = {name: getattr(self, name) for name in (
            "step_name", "step_id", "step_type", "executor_type", "executor_name", "step_run_id", "metrics",
            "success", "error", "stop")}
        data["content"] = content
        data["steps"] = [step.to_dict() for step in self.steps] if self.steps is not None else None
        return data


@dataclass
class StepInput:
    """What a step receives: the workflow's input, what earlier steps produced, and extra data."""

    input: Any = None
    previous_step_content: Any = None
    previous_step_outputs: dict[str, StepOutput] = field(default_factory=dict)
    additional_data: dict | None = None
    workflow_history: list[tuple[str, str]] = field(default_factory=list)  # (input, output) of earlier runs

    def get_step_output(self, step_name: str) -> StepOutput | None:
        """The output of the step of that name, looking inside containers too."""
        for output in reversed(list(self.previous_step_outputs.values())):
            found = _find(output, step_name)
            if found is not None:
                return found
        return None

    def get_step_content(self, step_name: str) -> Any:
        output = self.get_step_output(step_name)
        if output is None:
            return None
        if output.step_type == "parallel" and output.steps:
            return {child.step_name: child.content for child in output.steps}
        return output.content

    def get_all_previous_content(self) -> str:
        parts = [f"=== {name} ===\n{content_text(output.content)}" for name, output in self.previous_step_outputs.items()
                 if output.content not in (None, "")]
        return "\n\n".join(parts)

    def get_last_step_content(self) -> Any:
        if not self.previous_step_outputs:
            return None
        return deepest_content(list(self.previous_step_outputs.values())[-1])

    def get_workflow_history(self, num_runs: int | None = None) -> list[tuple[str, str]]:
        history = self.workflow_history
        return history[-num_runs:] if num_runs else list(history)

    def get_input_as_string(self) -> str:
        return content_text(self.input)


def _find(output: StepOutput, name: str) -> StepOutput | None:
    if output.step_name == name:
        return output
    for child in output.steps or ():
        found = _find(child, name)
        if found is not None:
            return found
    return None


def deepest_content(output: StepOutput) -> Any:
    """What a step passes on: its content; for a container (other than Parallel, whose content is its
    branches' combined), the content of its last child that has one."""
    if output.steps and output.step_type != "parallel":
        for child in reversed(output.steps):
            content = deepest_content(child)
            if content not in (None, ""):
                return content
    return output.content


def content_text(value: Any) -> str:
    """A step's content as text (structured content as JSON)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


# --- what a workflow run gives its steps -------------------------------------------------------------


@dataclass
class StepContext:
    """One workflow run, as its steps see it."""

    loop: Any  # the workflow's run (run.RootRun, or a ChildRun for a nested one)
    stream_executor_events: bool = True
    add_workflow_history: bool = False
    num_history_runs: int = 3
    dependencies: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    add_session_state_to_context: bool | None = None
    concurrent: bool = False  # inside a Parallel: steps start beside one another

    @property
    def streams(self) -> bool:
        """Whether the caller streams events: the steps' and containers' own start and completion are made
        only then (as a run's tool events are); a step's error always, as any run's."""
        return self.loop.config.stream_events

    def event(self, cls, *, run_id: str | None = None, parent_run_id: str | None = None, step_name: str = "",
              **fields) -> ev.BaseRunEvent:
        loop = self.loop
        loop.seq += 1
        return cls(run_id=run_id or loop.run_id, session_id=loop.session_id, agent_id=loop.config.component_id,
                   agent_name=loop.config.component_name, seq=loop.seq,
                   parent_run_id=loop.run_id if parent_run_id is None else parent_run_id, step_name=step_name,
                   **fields)

    def forwarded(self, event: ev.BaseRunEvent) -> bool:
        """Whether a step's own run event reaches the caller: always its state changes, the rest when
        `stream_executor_events` (SPEC item 19)."""
        return self.stream_executor_events or isinstance(event, ev.StateChangedEvent)

    async def touching_state(self, fn: Callable, *args, source: str, run=None):
        """Call `fn` (sync in a worker thread, or async) under the state lock, then record what it changed;
        (result, StateChanged event, or None when nothing changed or the caller does not stream events)."""
        tracker = self.loop.tracker
        async with tracker.lock:
            tracker.before_touch()
            try:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args)
                else:
                    result = await call_sync(fn, *args)
                    if inspect.isawaitable(result):
                        result = await result
            finally:
                tracker.working = self.loop.run_context.session_state
                recorded = tracker.record(source, run)
        changed = self.loop.state_changed_event(*recorded) if recorded and self.streams else None
        return result, changed


@functools.lru_cache(maxsize=512)
def _signature_wants(fn: Callable) -> tuple[bool, bool, bool, str]:
    """(run_context, session_state, the step's input) by `fn`'s signature, and what calling it gives
    ("asyncgen", "coroutine", "generator" or "value"), read once per function."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        parameters = {}
    named = {"run_context", "session_state"} & set(parameters)
    positional = [name for name, p in parameters.items() if name not in named
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = bool(positional) or any(p.kind == p.VAR_POSITIONAL for p in parameters.values())
    kind = ("asyncgen" if inspect.isasyncgenfunction(fn) else "coroutine" if inspect.iscoroutinefunction(fn)
            else "generator" if inspect.isgeneratorfunction(fn) else "value")
    return "run_context" in named, "session_state" in named, first, kind


def _wants(fn: Callable) -> tuple[bool, bool, bool, str]:
    try:
        return _signature_wants(fn)
    except TypeError:  # an unhashable callable: read its signature every time
        return _signature_wants.__wrapped__(fn)


def _call_with_context(fn: Callable, first: Any, run_context) -> Callable[[], Any]:
    """`fn(first)` with `run_context` and/or `session_state` passed where its signature asks for them."""
    wants_context, wants_state, wants_first, kind = _wants(fn)
    kwargs = {}
    if wants_context:
        kwargs["run_context"] = run_context
    if wants_state:
        kwargs["session_state"] = run_context.session_state
    args = (first,) if wants_first else ()

    if kind == "coroutine":
        async def call_async():
            return await fn(*args, **kwargs)
        return call_async
    return lambda: fn(*args, **kwargs)  # an async generator's is iterated by the caller


# --- the primitives ----------------------------------------------------------------------------------


class _Primitive:
    name: str | None
    description: str | None
    step_type = "step"

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        raise NotImplementedError
        yield  # pragma: no cover


def as_step(item) -> _Primitive:
    """A bare Agent, Team or function in `steps` becomes a Step."""
    if isinstance(item, _Primitive):
        return item
    if hasattr(item, "base_config") and getattr(item, "kind", None) == "agent":
        return Step(agent=item)
    if hasattr(item, "base_config") and getattr(item, "kind", None) == "team":
        return Step(team=item)
    if callable(item):
        return Step(executor=item)
    raise WorkflowDefinitionError(f"A workflow step must be a Step, an Agent, a Team or a function, not {item!r}.")


def as_steps(items) -> list[_Primitive]:
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        items = [items]
    return [as_step(item) for item in items]


async def run_sequence(steps: list[_Primitive], context: StepContext, step_input: StepInput,
                       outputs: list[StepOutput]) -> AsyncIterator:
    """Run steps one after the other, each seeing the earlier ones' outputs; appends to `outputs`.
    Stops after a step whose output says stop."""
    previous = dict(step_input.previous_step_outputs)
    content = step_input.previous_step_content
    for step in steps:
        current = StepInput(input=step_input.input, previous_step_content=content,
                            previous_step_outputs=dict(previous), additional_data=step_input.additional_data,
                            workflow_history=step_input.workflow_history)
        output = None
        async with aclosing(step.execute(context, current)) as executed:
            async for item in executed:
                if isinstance(item, StepOutput):
                    output = item
                else:
                    yield item
        outputs.append(output)
        previous[output.step_name or f"step_{len(previous) + 1}"] = output
        content = deepest_content(output)
        if output.stop:
            return


class Step(_Primitive):
    """One unit of work: an agent, a team, or a function (`executor`)."""

    def __init__(self, name: str | None = None, agent=None, team=None, executor: Callable | None = None, *,
                 step_id: str | None = None, description: str | None = None, max_retries: int = 0,
                 on_error: str = "fail", add_workflow_history: bool | None = None,
                 num_history_runs: int | None = None, human_review=None):
        given = [value for value in (agent, team, executor) if value is not None]
        if len(given) != 1:
            raise WorkflowDefinitionError("A Step needs exactly one of agent=, team= or executor=.")
        if on_error not in ON_ERROR:
            raise WorkflowDefinitionError(f"on_error must be one of {', '.join(ON_ERROR)}, not {on_error!r}.")
        if max_retries < 0:
            raise WorkflowDefinitionError(f"max_retries must be 0 or more, not {max_retries}.")
        self.agent, self.team, self.executor = agent, team, executor
        component = agent or team
        self.name = name or (getattr(component, "name", None) if component else getattr(executor, "__name__", None))
        self.name = self.name or "step"
        self.step_id = step_id or str(uuid.uuid4())
        self.description = description
        self.max_retries = max_retries
        self.on_error = on_error
        self.add_workflow_history = add_workflow_history
        self.num_history_runs = num_history_runs
        self.human_review = human_review  # review.HumanReview: a person confirms or fills in before it runs
        self._function_configs: dict[str, RunConfig] = {}  # by database alias

    def __repr__(self) -> str:
        return f"<Step {self.name!r}>"

    @property
    def executor_type(self) -> str:
        return "agent" if self.agent is not None else "team" if self.team is not None else "function"

    @property
    def executor_name(self) -> str:
        component = self.agent or self.team
        if component is not None:
            return component.name or component.id
        return getattr(self.executor, "__name__", "function")

    def _message(self, context: StepContext, step_input: StepInput) -> Any:
        """An agent's or team's input: the last step's content, else the workflow's input (Agno's rule),
        after the workflow's history when asked."""
        message = step_input.input
        if step_input.previous_step_outputs:
            last = deepest_content(list(step_input.previous_step_outputs.values())[-1])
            if last not in (None, ""):
                message = last
        use_history = self.add_workflow_history if self.add_workflow_history is not None else context.add_workflow_history
        if use_history:
            runs = self.num_history_runs or context.num_history_runs  # the step's own, when set, wins
            history = step_input.get_workflow_history(runs)
            if history:
                lines = ["<workflow_history_context>"]
                for number, (said, answered) in enumerate(history, start=1):
                    lines += [f"[Workflow Run-{number}]", f"User input: {said}", f"Workflow output: {answered}", ""]
                lines.append("</workflow_history_context>")
                message = "\n".join(lines) + "\n\n" + content_text(message)
        return message

    def _config(self, context: StepContext, step_input: StepInput) -> tuple[RunConfig, Any]:
        loop = context.loop
        component = self.agent or self.team
        if component is not None:
            config = component.base_config()
            # Its events as a team member's: when the workflow run streams them.
            changes = {"alias": loop.alias, "stream_events": loop.config.stream_events,
                       "dependencies": {**context.dependencies, **config.dependencies},
                       "metadata": {**context.metadata, **config.metadata}}
            if context.add_session_state_to_context is not None:
                changes["add_session_state_to_context"] = context.add_session_state_to_context
            return replace(config, **changes), self._message(context, step_input)
        # A function's config is the same at every execution (its input and context are the loop's).
        config = self._function_configs.get(loop.alias)
        if config is None:
            config = self._function_configs[loop.alias] = RunConfig(
                component_id=self.executor_name, component_name=self.executor_name, kind="function", alias=loop.alias,
                executor=_function_executor(self.executor, self.name), system_message="", stream_events=True)
        return config, content_text(step_input.input)

    async def execute(self, context: StepContext, step_input: StepInput, resume=None,
                      pausable: bool = False) -> AsyncIterator:
        """Run the step (retried as asked). `pausable` (a workflow's top-level step): an agent or team
        whose tool waits for a person pauses the workflow (ChildPaused); `resume` (review.StepRequirement)
        continues the step's paused run with the answers to its executor's requirements."""
        loop, tracker = context.loop, context.loop.tracker
        error, child = "", None
        for attempt in range(self.max_retries + 1):
            loop.check_cancelled()
            config, message = self._config(context, step_input)
            if resume is not None and attempt == 0:
                child = loop.continued_child(config, resume.executor_run_id, resume.executor_requirements,
                                             step_name=self.name, source_prefix=f"step:{self.name}/")
            else:
                child = loop.child(config, message, step_name=self.name, source_prefix=f"step:{self.name}/")
            child.pausable = pausable
            child.step_input, child.step_context = step_input, context  # what a function step's executor reads
            if context.streams and not child.continued:  # (a resumed step's run says StepContinued instead)
                yield context.event(ev.StepStartedEvent, run_id=child.run_id, step_name=self.name,
                                    executor_type=self.executor_type, executor_name=self.executor_name,
                                    executor_id=config.component_id)
            first_change = len(tracker.changes)
            async with aclosing(child.events()) as child_events:
                async for event in child_events:
                    if context.forwarded(event):
                        yield event
            out = child.output
            if out.status == RunStatus.CANCELLED:
                raise Cancelled()
            if out.status == RunStatus.PAUSED:
                raise ChildPaused(child)
            if out.status == RunStatus.COMPLETED:
                # Named for this step; built field by field (quicker than dataclasses.replace, on a path
                # every function step takes) unless the function returned a StepOutput of its own kind.
                made = child.step_output
                named = {"step_name": self.name, "step_id": self.step_id, "step_type": "step",
                         "executor_type": self.executor_type, "executor_name": self.executor_name,
                         "step_run_id": child.run_id, "metrics": out.metrics}
                if made is None:
                    result = StepOutput(content=out.content, **named)
                elif type(made) is StepOutput:
                    result = StepOutput(content=made.content, success=made.success, error=made.error,
                                        stop=made.stop, steps=made.steps, **named)
                else:
                    result = replace(made, **named)
                if context.streams:
                    yield context.event(ev.StepCompletedEvent, run_id=child.run_id, step_name=self.name,
                                        content=result.content, step_output=result)
                yield result
                return
            error = out.error or "the step failed"
            # The failed attempt's own changes are undone before anything else runs (a sibling's stay).
            own = [change for change in tracker.changes[first_change:] if change[3] is child]
            if own:
                async with tracker.lock:
                    recorded = tracker.discard(own, f"step:{self.name}/undone", child)
                if recorded:
                    yield loop.state_changed_event(*recorded)
            if attempt < self.max_retries:
                continue
        message = f"Step '{self.name}' failed: {error}"
        yield context.event(ev.StepErrorEvent, run_id=child.run_id, step_name=self.name, error=message)
        if self.on_error == "fail":
            raise StepFailed(message)
        yield StepOutput(step_name=self.name, step_id=self.step_id, step_type="step", executor_type=self.executor_type,
                         executor_name=self.executor_name, step_run_id=child.run_id, success=False, error=message,
                         content=message)


def _function_executor(fn: Callable, name: str):
    """The executor of a function step's runs: call `fn` with the run's step input under the state
    lock, stream what it yields."""

    async def execute(loop) -> AsyncIterator:
        context: StepContext = loop.step_context
        call = _call_with_context(fn, loop.step_input, loop.run_context)
        kind = _wants(fn)[3]
        tracker = loop.tracker
        result: Any = None
        texts: list[str] = []
        async with tracker.lock:
            tracker.before_touch()
            try:
                if kind == "asyncgen":
                    async for item in call():
                        result = _collect(item, texts, result)
                        if isinstance(item, ev.BaseRunEvent) and context.stream_executor_events:
                            yield item
                elif kind == "generator":
                    generator = await call_sync(call)
                    done = object()
                    while (item := await call_sync(next, generator, done)) is not done:
                        result = _collect(item, texts, result)
                        if isinstance(item, ev.BaseRunEvent) and context.stream_executor_events:
                            yield item
                elif kind == "coroutine":
                    result = await call()
                else:
                    result = await call_sync(call)
            finally:
                # Recorded even when it raised: a failed step's changes are then undone like any other.
                tracker.working = loop.run_context.session_state
                recorded = tracker.record(f"step:{name}/function", loop)
        if recorded and context.streams:
            yield loop.state_changed_event(*recorded)
        if not isinstance(result, StepOutput):
            result = StepOutput(content="".join(texts) if result is None and texts else result)
        loop.step_output = result
        loop.output.content = content_text(result.content) if not isinstance(result.content, str) else result.content
        if not result.success:
            raise RunFailed(result.error or "the function reported a failure")

    return execute


def _collect(item, texts: list[str], result):
    """A generator's items: the last StepOutput is the result; text (and content events) is its content."""
    if isinstance(item, StepOutput):
        return item
    if isinstance(item, ev.RunContentEvent) and isinstance(item.content, str):
        texts.append(item.content)
    elif isinstance(item, str):
        texts.append(item)
    return result


class Steps(_Primitive):
    """A named group of steps run one after the other."""

    step_type = "steps"

    def __init__(self, name: str | None = None, description: str | None = None, steps: list | None = None):
        self.name = name or "steps"
        self.description = description
        self.steps = as_steps(steps)

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        if context.streams:
            yield context.event(ev.StepsExecutionStartedEvent, step_name=self.name, step_type=self.step_type,
                                steps_count=len(self.steps))
        outputs: list[StepOutput] = []
        async with aclosing(run_sequence(self.steps, context, step_input, outputs)) as executed:
            async for item in executed:
                yield item
        if context.streams:
            yield context.event(ev.StepsExecutionCompletedEvent, step_name=self.name, step_type=self.step_type,
                                step_results=outputs)
        yield _container_output(self, outputs)


def _container_output(container: _Primitive, outputs: list[StepOutput], content: Any = None) -> StepOutput:
    last = outputs[-1] if outputs else None
    return StepOutput(
        step_name=container.name, step_type=container.step_type, steps=outputs,
        content=content if content is not None else (deepest_content(last) if last else None),
        success=all(output.success for output in outputs), stop=any(output.stop for output in outputs),
    )


class Condition(_Primitive):
    """Run `steps` when `evaluator` (a bool, or a function of the StepInput) says so, else `else_steps`."""

    step_type = "condition"

    def __init__(self, evaluator: bool | Callable, steps: list | None = None, else_steps: list | None = None,
                 name: str | None = None, description: str | None = None):
        self.evaluator = evaluator
        self.steps = as_steps(steps)
        self.else_steps = as_steps(else_steps)
        self.name = name or "condition"
        self.description = description

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        if isinstance(self.evaluator, bool):
            result = self.evaluator
        else:
            call = _call_with_context(self.evaluator, step_input, context.loop.run_context)
            result, changed = await context.touching_state(call, source=f"condition:{self.name}")
            if changed is not None:
                yield changed
        met = result is True  # a non-bool answer counts as False (Agno warns and does the same)
        if context.streams:
            yield context.event(ev.ConditionExecutionStartedEvent, step_name=self.name, step_type=self.step_type,
                                condition_result=met)
        branch, chosen = ("if", self.steps) if met else (("else", self.else_steps) if self.else_steps else ("", []))
        outputs: list[StepOutput] = []
        async with aclosing(run_sequence(chosen, context, step_input, outputs)) as executed:
            async for item in executed:
                yield item
        if context.streams:
            yield context.event(ev.ConditionExecutionCompletedEvent, step_name=self.name, step_type=self.step_type,
                                condition_result=met, branch=branch, step_results=outputs)
        skipped = None if chosen else f"Condition {self.name} not met - skipped {len(self.steps)} steps"
        yield _container_output(self, outputs, skipped)


class Router(_Primitive):
    """Run the step(s) `selector` picks among `choices`: a step, a list of steps, or step names."""

    step_type = "router"

    def __init__(self, selector: Callable, choices: list, name: str | None = None, description: str | None = None):
        self.selector = selector
        self.choices = as_steps(choices)
        self.name = name or "router"
        self.description = description

    def _resolve(self, picked) -> list[_Primitive]:
        if picked is None:
            return []
        items = picked if isinstance(picked, (list, tuple)) else [picked]
        by_name = {choice.name: choice for choice in self.choices}
        chosen = []
        for item in items:
            if isinstance(item, str):
                if item not in by_name:
                    raise StepFailed(f"Router '{self.name}' chose {item!r}, which is not one of its choices "
                                     f"({', '.join(repr(name) for name in by_name)}).")
                chosen.append(by_name[item])
                continue
            match = next((choice for choice in self.choices if choice is item or getattr(choice, "agent", None) is item
                          or getattr(choice, "team", None) is item or getattr(choice, "executor", None) is item), None)
            if match is None:
                raise StepFailed(f"Router '{self.name}' chose {item!r}, which is not one of its choices.")
            chosen.append(match)
        return chosen

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        call = _call_with_context(self.selector, step_input, context.loop.run_context)
        picked, changed = await context.touching_state(call, source=f"router:{self.name}")
        if changed is not None:
            yield changed
        chosen = self._resolve(picked)
        if context.streams:
            yield context.event(ev.RouterExecutionStartedEvent, step_name=self.name, step_type=self.step_type,
                                selected_steps=[step.name for step in chosen])
        outputs: list[StepOutput] = []
        async with aclosing(run_sequence(chosen, context, step_input, outputs)) as executed:
            async for item in executed:
                yield item
        if context.streams:
            yield context.event(ev.RouterExecutionCompletedEvent, step_name=self.name, step_type=self.step_type,
                                selected_steps=[step.name for step in chosen], step_results=outputs)
        yield _container_output(self, outputs)


class Parallel(_Primitive):
    """Branches run at once: their model calls overlap, their state-touching calls take turns."""

    step_type = "parallel"

    def __init__(self, *steps, name: str | None = None, description: str | None = None):
        self.steps = as_steps(list(steps))
        self.name = name or "parallel"
        self.description = description

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        if context.streams:
            yield context.event(ev.ParallelExecutionStartedEvent, step_name=self.name, step_type=self.step_type,
                                parallel_step_count=len(self.steps))
        queue: asyncio.Queue = asyncio.Queue()
        results: list[StepOutput | None] = [None] * len(self.steps)
        done = object()

        beside = replace(context, concurrent=True)

        async def branch(index: int, step: _Primitive) -> None:
            try:
                async with aclosing(step.execute(beside, step_input)) as executed:
                    async for item in executed:
                        if isinstance(item, StepOutput):
                            results[index] = item
                        else:
                            await queue.put(item)
            except Exception as exc:  # noqa: BLE001 - handed to the workflow's task, which raises it
                await queue.put(_BranchFailed(exc))
            finally:
                await queue.put(done)

        tasks = [asyncio.create_task(branch(index, step)) for index, step in enumerate(self.steps)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, _BranchFailed):
                    raise item.error
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        outputs = [result for result in results if result is not None]
        combined = "\n\n".join(f"## {output.step_name}\n\n{content_text(deepest_content(output))}" for output in outputs)
        if context.streams:
            yield context.event(ev.ParallelExecutionCompletedEvent, step_name=self.name, step_type=self.step_type,
                                step_results=outputs)
        yield _container_output(self, outputs, combined)


@dataclass
class _BranchFailed:
    error: Exception


class Loop(_Primitive):
    """Run `steps` again and again: `max_iterations` times, or until `end_condition(outputs)` is true."""

    step_type = "loop"

    def __init__(self, steps: list | None = None, name: str | None = None, description: str | None = None,
                 max_iterations: int = 3, end_condition: Callable | None = None):
        if max_iterations < 1:
            raise WorkflowDefinitionError(f"max_iterations must be at least 1, not {max_iterations}.")
        self.steps = as_steps(steps)
        self.name = name or "loop"
        self.description = description
        self.max_iterations = max_iterations
        self.end_condition = end_condition

    async def execute(self, context: StepContext, step_input: StepInput) -> AsyncIterator:
        if context.streams:
            yield context.event(ev.LoopExecutionStartedEvent, step_name=self.name, step_type=self.step_type,
                                max_iterations=self.max_iterations)
        all_outputs: list[StepOutput] = []
        current = step_input
        iteration = 0
        while iteration < self.max_iterations:
            iteration += 1
            if context.streams:
                yield context.event(ev.LoopIterationStartedEvent, step_name=self.name, step_type=self.step_type,
                                    iteration=iteration, max_iterations=self.max_iterations)
            outputs: list[StepOutput] = []
            async with aclosing(run_sequence(self.steps, context, current, outputs)) as executed:
                async for item in executed:
                    yield item
            all_outputs.extend(outputs)
            should_continue = not any(output.stop for output in outputs)
            if should_continue and self.end_condition is not None:
                call = _call_with_context(self.end_condition, outputs, context.loop.run_context)
                ended, changed = await context.touching_state(call, source=f"loop:{self.name}")
                if changed is not None:
                    yield changed
                should_continue = ended is not True
            if context.streams:
                yield context.event(ev.LoopIterationCompletedEvent, step_name=self.name, step_type=self.step_type,
                                    iteration=iteration, max_iterations=self.max_iterations,
                                    should_continue=should_continue)
            if not should_continue:
                break
            if outputs:
                previous = {**current.previous_step_outputs, **{o.step_name: o for o in outputs}}
                current = replace(current, previous_step_outputs=previous,
                                  previous_step_content=deepest_content(outputs[-1]))
        if context.streams:
            yield context.event(ev.LoopExecutionCompletedEvent, step_name=self.name, step_type=self.step_type,
                                total_iterations=iteration, step_results=all_outputs)
        yield _container_output(self, all_outputs)
