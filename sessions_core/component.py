"""What Agent, Team and Workflow share: run entry points with Agno's signatures, and the accessors.

`run`/`arun`/`print_response`/`aprint_response` check their keyword arguments (a typo such as
`sesion_id=` is a TypeError, not a run in the default session), resolve the session id (given, the
component's own, or a new one that sticks to the component, as in Agno), build the run's config and
drive the run loop. With `stream=True` and no `stream_events` only content events reach the caller
(and a failure or a stop, which are never silent); `yield_run_output=True` ends a stream with the
run's output.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any, ClassVar

from .accessors import SessionAccessors
from .user_memories.accessors import MemoryAccessors
from .bridge import call_sync, iterate_sync, run_sync
from .config import RunConfig
from .events import RunEvent
from .models import RunStatus
from .owners import validate_session_id
from .run import lifecycle, registry
from .steps import content_text

# With stream=True and stream_events=False the caller gets the run's text as it is written and, from the
# run itself, how it ended if badly (see `_content_only`).
_CONTENT = frozenset({RunEvent.run_content, RunEvent.team_run_content})
_ERRORS = frozenset({RunEvent.run_error, RunEvent.team_run_error, RunEvent.workflow_error})
_ENDED_BADLY = _ERRORS | {RunEvent.run_cancelled, RunEvent.team_run_cancelled, RunEvent.workflow_cancelled}
# A run that waits for a person says so, and says when it goes on, to every stream.
_WAITING = frozenset({RunEvent.run_paused, RunEvent.run_continued, RunEvent.team_run_paused,
                      RunEvent.team_run_continued, RunEvent.step_paused, RunEvent.step_continued})


class Component(SessionAccessors, MemoryAccessors):
    """A thing a user runs turns against in a session: it makes RunConfigs and run loops."""

    kind: ClassVar[str] = "agent"
    # Call options that adjust the config for one run: {keyword: config field}.
    run_options: ClassVar[dict[str, str]] = {}

    id: str
    name: str | None
    session_id: str | None
    user_id: Any
    db: Any
    stream: bool | None
    stream_events: bool | None

    @property
    def db_alias(self) -> str:
        return getattr(self.db, "alias", self.db) or "default"

    # -- to be provided ---------------------------------------------------------------------------

    def base_config(self) -> RunConfig:
        raise NotImplementedError

    def _make_loop(self, config: RunConfig, input, *, session_id: str, user, session_state, run_id, branch=None):
        raise NotImplementedError

    # -- runs -------------------------------------------------------------------------------------

    def _check_options(self, method: str, options: dict) -> None:
        unknown = sorted(set(options) - set(self.run_options))
        if unknown:
            names = ", ".join(repr(name) for name in unknown)
            plural = "s" if len(unknown) > 1 else ""
            raise TypeError(f"{type(self).__name__}.{method}() got unexpected keyword argument{plural} {names}")

    def _resolve_session_id(self, session_id) -> str:
        if session_id:
            return validate_session_id(session_id)
        if self.session_id:
            return validate_session_id(self.session_id)
        # Agno: a generated id sticks to the component, so the next call continues the same session.
        self.session_id = str(uuid.uuid4())
        return self.session_id

    def run_config(self, stream_events: bool, options: dict) -> RunConfig:
        """The base config with this call's options."""
        base = self.base_config()
        changes = {"stream_events": stream_events}
        for keyword, value in options.items():
            if value is None:
                continue
            name = self.run_options[keyword]
            if name == "dependencies":
                value = {**base.dependencies, **value}
            elif name == "metadata":
                value = {**value, **base.metadata}  # Agno: the component's metadata wins over the call's
            changes[name] = value
        return replace(base, **changes)

    def _loop(self, input, session_id, user_id, session_state, run_id, stream_events, options, branch=None):
        session_id = self._resolve_session_id(session_id)
        user = user_id if user_id not in (None, "") else self.user_id
        config = self.run_config(stream_events, options)
        return self._make_loop(config, input, session_id=session_id, user=user, session_state=session_state,
                               run_id=run_id, branch=branch)

    def _start(self, input, branch, *, session_id, user_id, session_state, stream, stream_events, run_id,
               yield_run_output, options):
        """The one way a run is started: await the result for the output, or iterate it (stream=True)."""
        stream, stream_events = self._streaming(stream, stream_events)
        loop = self._loop(input, session_id, user_id, session_state, run_id, stream_events, options, branch)
        return self._drive(loop, stream, stream_events, yield_run_output)

    def _continue(self, run_response, run_id, answers, session_id, user_id, stream, stream_events,
                  yield_run_output, options):
        """Continue a paused run (run/pause.py) with the answers on `run_response` and/or `answers`. The
        caller is `user_id` (else the component's), never the output's: another user's run is refused."""
        from .run.pause import ContinuedRun  # (pause.py builds on the run loop, which builds on this module)

        answers = list(answers or [])
        if run_response is not None:
            run_id, session_id = run_response.run_id, run_response.session_id
            answers = list(run_response.requirements or []) + answers
        elif run_id is None:
            raise ValueError("Either run_response or run_id must be provided.")
        elif not (session_id or self.session_id):
            raise ValueError("Session ID is required to continue a run from a run_id.")
        stream, stream_events = self._streaming(stream, stream_events)
        user = user_id if user_id not in (None, "") else self.user_id
        loop = ContinuedRun(self.run_config(stream_events, options), run_id=str(run_id), answers=answers,
                            session_id=validate_session_id(session_id or self.session_id), user=user)
        return self._drive(loop, stream, stream_events, yield_run_output)

    def _streaming(self, stream, stream_events) -> tuple[bool, bool]:
        """A call's stream and stream_events, the component's where not given."""
        stream = self.stream if stream is None else stream
        return bool(stream), bool(stream and (self.stream_events if stream_events is None else stream_events))

    def _drive(self, loop, stream: bool, stream_events: bool, yield_run_output: bool):
        if stream:
            return self._stream(loop, stream_events, yield_run_output)
        return self._complete(loop)

    def _sync(self, start, stream: bool | None):
        """A sync adapter of `start` (a callable starting the async run with the given stream flag)."""
        if self.stream if stream is None else stream:
            return iterate_sync(lambda: start(True))
        return run_sync(lambda: start(False))

    def run(self, input=None, *, session_id: str | None = None, user_id=None, session_state: dict | None = None,
            stream: bool | None = None, stream_events: bool | None = None, run_id: str | None = None,
            yield_run_output: bool = False, **options):
        """Run one turn. Returns the run's output, or with stream=True an iterator of events."""
        self._check_options("run", options)
        return self._sync(lambda streaming: self.arun(
            input, session_id=session_id, user_id=user_id, session_state=session_state, stream=streaming,
            stream_events=stream_events, run_id=run_id, yield_run_output=yield_run_output, **options), stream)

    def arun(self, input=None, *, session_id: str | None = None, user_id=None, session_state: dict | None = None,
             stream: bool | None = None, stream_events: bool | None = None, run_id: str | None = None,
             yield_run_output: bool = False, **options):
        """Async twin of `run`: await it for the output, or iterate it (stream=True) for events."""
        self._check_options("arun", options)
        return self._start(input, None, session_id=session_id, user_id=user_id, session_state=session_state,
                           stream=stream, stream_events=stream_events, run_id=run_id,
                           yield_run_output=yield_run_output, options=options)

    # -- branches (branches.py) ---------------------------------------------------------------------

    def regenerate(self, run_id: str | None = None, *, session_id: str | None = None, user_id=None,
                   stream: bool | None = None, stream_events: bool | None = None, yield_run_output: bool = False,
                   **options):
        """Run the input of `run_id` (default: the last run of the current branch) again, as a sibling
        branch that starts from the state as of that run's start. Returns its output (or its events)."""
        self._check_options("regenerate", options)
        return self._sync(lambda streaming: self.aregenerate(
            run_id, session_id=session_id, user_id=user_id, stream=streaming, stream_events=stream_events,
            yield_run_output=yield_run_output, **options), stream)

    def aregenerate(self, run_id: str | None = None, *, session_id: str | None = None, user_id=None,
                    stream: bool | None = None, stream_events: bool | None = None, yield_run_output: bool = False,
                    **options):
        self._check_options("aregenerate", options)
        return self._start(None, (run_id, "regenerate"), session_id=session_id, user_id=user_id, session_state=None,
                           stream=stream, stream_events=stream_events, run_id=None,
                           yield_run_output=yield_run_output, options=options)

    def edit_and_rerun(self, run_id: str, input, *, session_id: str | None = None, user_id=None,
                       stream: bool | None = None, stream_events: bool | None = None, yield_run_output: bool = False,
                       **options):
        """Run `input` instead of `run_id`'s, as a sibling branch from the state as of that run's start."""
        self._check_options("edit_and_rerun", options)
        return self._sync(lambda streaming: self.aedit_and_rerun(
            run_id, input, session_id=session_id, user_id=user_id, stream=streaming, stream_events=stream_events,
            yield_run_output=yield_run_output, **options), stream)

    def aedit_and_rerun(self, run_id: str, input, *, session_id: str | None = None, user_id=None,
                        stream: bool | None = None, stream_events: bool | None = None, yield_run_output: bool = False,
                        **options):
        self._check_options("aedit_and_rerun", options)
        if not run_id:
            raise ValueError("edit_and_rerun needs the id of the run whose input is edited")
        return self._start(input, (run_id, "edit"), session_id=session_id, user_id=user_id, session_state=None,
                           stream=stream, stream_events=stream_events, run_id=None,
                           yield_run_output=yield_run_output, options=options)

    @staticmethod
    async def _stream(loop, stream_events: bool, yield_run_output: bool) -> AsyncIterator:
        async with aclosing(loop.events()) as events:
            async for event in events:
                if stream_events or _content_only(loop, event):
                    yield event
        if yield_run_output:
            yield loop.output

    @staticmethod
    async def _complete(loop):
        async with aclosing(loop.events()) as events:
            async for _ in events:
                pass
        return loop.output

    # Agno's display options of print_response: accepted, the output is plain text either way.
    DISPLAY_OPTIONS = ("markdown", "show_message", "show_reasoning", "show_full_reasoning", "console")

    def print_response(self, input=None, *, stream: bool | None = None, **kwargs) -> None:
        kwargs = {key: value for key, value in kwargs.items() if key not in self.DISPLAY_OPTIONS}
        if stream or (stream is None and self.stream):
            printer = _Printer()
            for event in self.run(input, stream=True, **self._printed_events(kwargs)):
                printer.event(event)
            printer.end()
        else:
            _print_output(self.run(input, **kwargs))

    async def aprint_response(self, input=None, *, stream: bool | None = None, **kwargs) -> None:
        kwargs = {key: value for key, value in kwargs.items() if key not in self.DISPLAY_OPTIONS}
        if stream or (stream is None and self.stream):
            printer = _Printer()
            async for event in self.arun(input, stream=True, **self._printed_events(kwargs)):
                printer.event(event)
            printer.end()
        else:
            _print_output(await self.arun(input, **kwargs))

    def _printed_events(self, kwargs: dict) -> dict:
        """The run's keywords for a streamed print_response: a workflow's steps' completions are asked for
        too, so that a step whose text was not streamed (a function's) is printed as it ends."""
        if self.kind == "workflow":
            return {"stream_events": True, **kwargs}
        return kwargs

    @staticmethod
    def cancel_run(run_id: str, db: str | None = None) -> bool:
        """Stop a run, in any process: a queued or paused one ends cancelled at once, a running one stops
        at once in this process or within about a second in another; one that has not started yet is
        stopped when it starts. True if the run was open (queued, running or paused)."""
        return run_sync(lambda: Component.acancel_run(run_id, db))

    @staticmethod
    async def acancel_run(run_id: str, db: str | None = None) -> bool:
        local = registry.request_cancel(run_id)  # a run of this process is interrupted before the database is asked
        return await call_sync(lifecycle.cancel_stored, run_id, getattr(db, "alias", db) or "default") or local


def _content_only(loop, event) -> bool:
    """What a stream without events (stream=True, stream_events=False) passes on: text as it is written
    (a workflow's is its steps'; a team's is its own, since its members' work reaches it as the results
    it reports) and the run's own error or cancellation (a step's or member's is the run's to report)."""
    kind = event.event
    if kind in _CONTENT:
        return loop.config.kind != "team" or event.run_id == loop.run_id
    return (kind in _ENDED_BADLY or kind in _WAITING) and event.run_id == loop.run_id


class _Printer:
    """A streamed print_response: text as it comes, each run's on a line of its own, a workflow step's
    text that was not streamed (a function step's) when the step completes, and errors."""

    def __init__(self):
        self.run_id = None  # whose text the line holds
        self.streamed: set[str] = set()  # runs whose text was printed as it came

    def event(self, event) -> None:
        kind = getattr(event, "event", None)
        if kind in _CONTENT and event.content:
            self._line_for(event.run_id)
            self.streamed.add(event.run_id)
            print(event.content, end="", flush=True)
        elif kind == RunEvent.step_completed and event.run_id not in self.streamed and event.content not in (None, ""):
            self._line_for(event.run_id)
            print(content_text(event.content), end="", flush=True)
        elif kind in _ERRORS:
            print(f"\n[error] {event.content}")

    def _line_for(self, run_id: str) -> None:
        if self.run_id is not None and run_id != self.run_id:
            print()
        self.run_id = run_id

    def end(self) -> None:
        print()


def _print_output(output) -> None:
    print(output.content if output.status != RunStatus.ERROR else f"[error] {output.error}")
