"""The model and tool loop of a run (an agent's, or a team's): stream the model, run the tools it
calls, record what they change in the session state, and stop when asked.

`ModelLoop` is a part of every run class (`run.base.BaseRun`); a stop asked in this process interrupts
the wait for the model's next chunk at once, and the partial reply is checkpointed about once a second
so a reload or another process shows the text so far.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import pydantic
from django.db import DatabaseError

from .. import limits
from .. import prompt
from .. import state as state_module
from ..bridge import call_sync
from ..errors import Cancelled, ChildPaused, Paused
from ..events import BaseRunEvent, StateChangedEvent
from ..history import ChatMessage
from ..model_api import ModelChunk, ModelError
from ..models import Role
from ..requirements import RunRequirement, ToolExecution, paused_content
from ..storable import replace_unstorable, replace_unstorable_tree
from ..tools import call_tool, result_text, timed
from . import background, lifecycle, registry

CHECKPOINT_SECONDS = 1.0  # the partial reply is stored at most this far apart while it streams
# What the model reads for a call past the run's tool_call_limit: Agno's words.
TOOL_CALL_LIMIT_REACHED = "Tool call limit reached. Tool call {name} not executed. Don't try to execute it again."

logger = logging.getLogger("sessions_core")


class ModelLoop:
    """The model loop of a run; the run's other parts (`BaseRun`) provide its config, output and events."""

    async def _model_loop(self) -> AsyncIterator[BaseRunEvent]:
        config = self.config
        functions = config.functions
        tools = [function.to_openai() for function in functions.values()] or None
        wire = [message.to_wire() for message in self.output.messages]
        response_format = prompt.response_format(config)
        stream_events = config.stream_events
        run_context = self.run_context
        # Token counts are what the server reported; a call that reported none (a stopped or failed
        # stream) makes the run's figure unknown: the keys are left out rather than a false 0.
        token_keys = ("input_tokens", "output_tokens", "total_tokens")
        metrics = carried_metrics(self.prior_metrics, token_keys)
        self.output.metrics = metrics
        content_event = self.event_classes["content"]
        # A continued run first gives the model the answered calls' results (run/pause.py).
        async with aclosing(self._answer_calls(functions, run_context, wire, stream_events)) as answered:
            async for event in answered:
                yield event
        max_calls = limits.max_model_calls()  # the hard bound (CHAT_MAX_MODEL_CALLS): the run fails past it
        tool_calls = 0  # calls of the run's tools so far, for its tool_call_limit
        for _ in range(max_calls):
            self.check_cancelled()
            metrics["model_calls"] += 1
            self.current_reply = reply_parts = []
            final = None
            stream = self.model.astream(wire, tools, response_format)
            self.root.active.add(self)  # a stop interrupts its reads (`interrupt`)
            try:
                # Per token: a stop asked meanwhile is heard by the next `_next_chunk`, before any wait.
                answered = False
                while (chunk := await self._next_chunk(stream)) is not None:
                    if not answered:  # work after other replies may go ahead (run/background.py)
                        answered = True
                        background.heard(self.root.run_id)
                    if content := chunk.content:
                        if "time_to_first_token" not in metrics:
                            metrics["time_to_first_token"] = round(time.perf_counter() - self.started, 6)
                        reply_parts.append(content)
                        self.content_parts.append(content)
                        yield self._event(content_event, content=content)
                        if time.perf_counter() >= self.checkpoint_due:
                            self._checkpoint()
                    if chunk.finish_reason is not None or chunk.tool_calls or chunk.usage:
                        final = chunk
            finally:
                self.root.active.discard(self)
                # Closing the stream closes the HTTP response: a stopped run stops the provider too.
                await stream.aclose()
                if final is not None and final.usage and "input_tokens" in metrics:
                    for key in token_keys:
                        metrics[key] += final.usage.get(key, 0) or 0
                else:
                    for key in token_keys:
                        metrics.pop(key, None)
            calls = final.tool_calls if final is not None else []
            reply = "".join(reply_parts)
            self.current_reply = []
            assistant = ChatMessage(role=Role.ASSISTANT, content=reply,
                                    tool_calls=[call.as_dict() for call in calls] or None)
            self.new_messages.append(assistant)
            wire.append(assistant.to_wire())
            if not calls:
                self._set_content(reply)
                return
            waiting = []  # calls of tools that wait for a person, with their arguments
            members = []  # delegation calls whose member run paused, with that run
            for call in calls:
                function = functions.get(call.name)
                if function is not None and function.needs_person and self.can_pause:
                    args, error, _refused = parse_arguments(call)
                    if error is None:
                        waiting.append((call, args, function))
                        continue
                # Agno's tool_call_limit: a call of one of the run's tools past it is not run and the model
                # reads why; the run goes on, so a model that answers then ends it with the calls it made.
                if function is not None:
                    tool_calls += 1
                    if config.tool_call_limit is not None and tool_calls > config.tool_call_limit:
                        self._refuse(call, wire)
                        continue
                try:
                    async for event in self._run_tool(call, functions, run_context, wire, stream_events):
                        yield event
                except ChildPaused as paused:  # a member waits for a person: the team waits with it
                    members.append((call, paused.child))
            if waiting or members:
                self.check_cancelled()  # a stop asked during the other calls wins over the pause
                self._pause(waiting, members)
        raise limits.too_many_model_calls(max_calls)

    def _set_content(self, reply: str) -> None:
        schema = self.config.output_schema
        if schema is None:
            # All the text of the run, as streamed (Agno's content): what was said before a tool call counts too.
            self.output.content = "".join(self.content_parts)
            return
        try:
            self.output.content = schema.model_validate_json(reply)
        except pydantic.ValidationError as exc:
            raise ModelError(f"The model's reply does not match {schema.__name__}: {exc.errors()[0]['msg']}") from exc
        self.output.content_type = schema.__name__

    def _pause(self, waiting: list, members: list = ()) -> None:
        """Raise `Paused` to wait for a person: a requirement per call of `waiting` [(call, args, function)],
        and the open requirements of each paused member run of `members` [(delegation call, member run)],
        named for the member (run/pause.py continues the run)."""
        out = self.output
        out.requirements = out.requirements or []
        for call, args, function in waiting:
            requirement = RunRequirement.for_call(call.id, args, function)
            out.tools.append(requirement.tool_execution)
            out.requirements.append(requirement)
        for call, member in members:
            name = member.config.component_name or member.config.component_id
            out.requirements += [requirement.for_member(member.config.component_id, name, member.run_id, call.id)
                                 for requirement in member.output.active_requirements]
        out.content = paused_content(out.active_requirements)
        raise Paused()

    async def _answer_calls(self, functions, run_context, wire, stream_events) -> AsyncIterator[BaseRunEvent]:
        """A continued run's answered calls, run or reported to the model (run/pause.py); none otherwise."""
        return
        yield

    def _refuse(self, call, wire: list) -> None:
        """A call past the run's tool_call_limit: its result tells the model it was not run. As in Agno it is
        no tool execution of the run (no events, not in `output.tools`); its messages are stored."""
        self.new_messages.append(ChatMessage(role=Role.TOOL, content=TOOL_CALL_LIMIT_REACHED.format(name=call.name),
                                             tool_call_id=call.id, tool_name=call.name, tool_error=True))
        wire.append(self.new_messages[-1].to_wire())

    async def _run_tool(self, call, functions, run_context, wire, stream_events,
                        execution: ToolExecution | None = None) -> AsyncIterator[BaseRunEvent]:
        """Run one call the model made (or, given its `execution`, a call a person answered) and give the
        model its result."""
        answered = execution is not None
        if not answered:
            execution = ToolExecution(tool_call_id=call.id, tool_name=call.name)
            self.output.tools.append(execution)
        function = functions.get(call.name)
        args, error, refused = parse_arguments(call)
        if error is None and function is None:
            error = f"Error: there is no tool named {call.name!r}."
        elif error is None and function.needs_person and not answered:  # a run that cannot pause (a nested step's)
            error = (f"Error: {call.name} waits for a person's answer, which a step inside a workflow's "
                     "Parallel, Condition, Loop, Router or Steps cannot ask for; it was not run.")
        execution.tool_args = args
        if stream_events:
            yield self.event("tool_started", tool=execution.snapshot())
        elapsed = timed()
        tracker = self.tracker
        recorded, state_error = None, None
        if error is None and function.child_runner is not None:
            # A tool that is another run (a team's delegation to a member): its events are this run's too.
            result = ""
            async with aclosing(function.child_runner(self, args)) as child_events:
                async for item in child_events:
                    if isinstance(item, BaseRunEvent):
                        yield item
                    else:
                        result = item
            execution.result = result_text(result)
            execution.tool_call_error = execution.result.startswith("Error:")
        elif error is None:
            async with tracker.lock:  # one state-touching call at a time in the whole run
                tracker.before_touch()
                try:
                    result = await limits.within_tool_timeout(
                        call_tool(function, args, run_context, self.config.tool_owner, list(self.config.tool_hooks)),
                        call.name)
                    execution.result = result_text(result)
                except limits.LimitExceeded as exc:  # a result over a limit fails the run
                    execution.result, execution.tool_call_error, refused = replace_unstorable(f"Error: {exc}"), True, exc
                except Exception as exc:  # a failing (or timed out) tool or hook is reported to the model
                    execution.result = replace_unstorable(f"Error: {type(exc).__name__}: {exc}")
                    execution.tool_call_error = True
                # A tool may rebind run_context.session_state to a new dict: that dict is the state now.
                tracker.working = run_context.session_state
                source = "agentic" if call.name == self.config.agentic_state_tool else f"tool:{call.name}"
                try:
                    recorded = tracker.record(self.source_prefix + source, self)
                except state_module.StateNotJSONError as exc:  # the run fails, once the call is on record
                    state_error = exc
        else:
            execution.result, execution.tool_call_error = error, True
        execution.metrics = {"duration": elapsed()}
        self.tool_result(execution, wire)
        if stream_events:
            yield self.event("tool_completed", tool=execution.snapshot(),
                             content=f"{call.name}() completed in {execution.metrics['duration']:.4f}s.")
        if state_error is not None or refused is not None:
            raise state_error or refused
        if recorded and stream_events:
            yield self.state_changed_event(*recorded)

    def tool_result(self, execution: ToolExecution, wire: list) -> None:
        """The model reads `execution`'s result (a call answered without running it here)."""
        self.new_messages.append(ChatMessage(role=Role.TOOL, content=execution.result,
                                             tool_call_id=execution.tool_call_id, tool_name=execution.tool_name,
                                             tool_error=execution.tool_call_error))
        wire.append(self.new_messages[-1].to_wire())

    def state_changed_event(self, patch: list, state_text: str) -> BaseRunEvent:
        """StateChanged for the change just recorded (the tracker's last)."""
        source = self.tracker.changes[-1][2]
        return self._event(StateChangedEvent, patch=patch, changed_keys=state_module.changed_keys(patch),
                           session_state=json.loads(state_text), source=source, state_version=self.tracker.version)

    async def _next_chunk(self, stream) -> ModelChunk | None:
        """The model's next chunk (None at the end). A stop asked in this process meanwhile interrupts the wait."""
        # A stop that came while the run was busy elsewhere (its caller handling the last event, a checkpoint).
        self.check_cancelled()
        task = self.reader = asyncio.current_task()
        try:
            return await anext(stream)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if self.stop_requested() and task.uncancel() == 0:  # our interrupt, not a real cancel
                raise Cancelled() from None
            raise
        finally:
            self.reader = None

    def interrupt(self) -> None:
        """From any thread: stop waiting for the model now (a stop was requested), here and in every run
        of this run's tree that is streaming (a workflow's steps, a team's members)."""

        def cancel_reads():
            for run in {self, *self.active}:
                if run.reader is not None:
                    run.reader.cancel()

        try:
            self.loop.call_soon_threadsafe(cancel_reads)
        except RuntimeError:  # the loop has closed: the run is over
            pass

    def stop_requested(self) -> bool:
        """A stop was asked of this run or of its root run."""
        return registry.stop_requested(self.run_id) or (
            self.root is not self and registry.stop_requested(self.root.run_id))

    def check_cancelled(self) -> None:
        if self.stop_requested():
            raise Cancelled()

    def _checkpoint(self) -> None:
        """Save the text so far, beside the stream rather than in its way: the model's next chunks are
        read while the write waits its turn on the thread for the engine's queries (behind every other
        run's, under load). One write at a time; a write that comes after the run's end changes nothing
        (it is for a running run only). A stop asked from another process is heard by the root's
        heartbeat, which asks the database every CHECKPOINT_SECONDS."""
        self.checkpoint_due = time.perf_counter() + CHECKPOINT_SECONDS
        if self.saving is None or self.saving.done():
            self.saving = asyncio.ensure_future(self._save_partial("".join(self.content_parts)))

    async def _save_partial(self, partial: str) -> None:
        try:
            await call_sync(lifecycle.checkpoint, self.run_pk, partial, self.alias)
        except DatabaseError as exc:  # the text is kept here and stored at the end; the next checkpoint tries again
            logger.warning("Run %s: a checkpoint could not be stored (%s: %s)", self.run_id, type(exc).__name__, exc)


def parse_arguments(call) -> tuple[dict, str | None, Exception | None]:
    """The arguments of a call, or why they cannot be used: (args, error for the model, a limit refused)."""
    try:
        limits.check_text(call.arguments or "{}", f"The arguments for {call.name}")
        # NUL and lone surrogates (JSON escapes carry both) become U+FFFD before a tool sees them.
        args = replace_unstorable_tree(json.loads(call.arguments or "{}"))
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except limits.LimitExceeded as exc:
        return {}, f"Error: {exc}", exc
    except ValueError as exc:
        return {}, f"Error: the arguments for {call.name} are not a valid JSON object ({exc}).", None
    return args, None, None


def carried_metrics(prior: dict | None, token_keys: tuple[str, ...]) -> dict:
    """A run's metrics as its model loop starts: zero, or a continued run's so far."""
    metrics = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}
    if prior:
        metrics.update({key: prior.get(key, 0) for key in metrics})
        if "time_to_first_token" in prior:
            metrics["time_to_first_token"] = prior["time_to_first_token"]
        if "input_tokens" not in prior:  # unknown before the pause: unknown for the run
            for key in token_keys:
                metrics.pop(key)
    return metrics
