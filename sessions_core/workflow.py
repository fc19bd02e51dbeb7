"""The Workflow: steps of agents, teams and functions that share one session state, on the one run loop.

A workflow run is a run like an agent's: it takes the session's lease, merges the state
(defaults < stored < run-supplied), and its finish stores the state, every state change and the
statuses at once. What differs is its executor: instead of calling a model it walks its steps
(`steps.py`), each a run of its own inside the workflow run. Its chat history is its runs' input
and final content, which is what `get_chat_history()` and `add_workflow_history_to_steps` read.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from . import state as state_module
from .bridge import call_sync
from .component import Component
from .config import RunConfig
from .history import ChatMessage
from .models import Role, Run, RunStatus
from .run.base import BaseRun
from .run.root import RootRun
from .review import nested_reviews, run_top_level
from .steps import StepContext, StepInput, StepOutput, WorkflowDefinitionError, as_steps, content_text, deepest_content

__all__ = ["Workflow"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class Workflow(Component):
    kind = "workflow"
    run_options = {"additional_data": "additional_data", "dependencies": "dependencies", "metadata": "metadata",
                   "add_session_state_to_context": "add_session_state_to_context"}

    def __init__(
        self,
        name: str | None = None,
        description: str | None = None,
        steps=None,
        *,
        id: str | None = None,
        session_state: dict | None = None,
        overwrite_db_session_state: bool = False,
        session_id: str | None = None,
        user_id: str | None = None,
        db=None,
        cache_session: bool = False,
        add_workflow_history_to_steps: bool = False,
        num_history_runs: int = 3,
        stream: bool | None = None,
        stream_events: bool = False,
        stream_executor_events: bool = True,
        metadata: dict | None = None,
        dependencies: dict | None = None,
        add_session_state_to_context: bool | None = None,
    ):
        self.name = name
        self.description = description
        self.id = id or (_slug(name) if name else "") or "workflow"
        self.steps = as_steps(steps)
        nested = nested_reviews(self.steps)
        if nested:
            raise WorkflowDefinitionError(f"A human_review pauses a workflow only on its top-level steps, not on "
                                          f"{', '.join(map(repr, nested))}.")
        self.session_state = state_module.to_json(session_state or {})
        self.overwrite_db_session_state = overwrite_db_session_state
        self.session_id = session_id
        self.user_id = user_id
        self.db = db
        # Accepted for Agno compatibility: every run reads the session from the database.
        self.cache_session = cache_session
        self.add_workflow_history_to_steps = add_workflow_history_to_steps
        self.num_history_runs = num_history_runs
        self.stream = stream
        self.stream_events = stream_events
        self.stream_executor_events = stream_executor_events
        self.metadata = metadata or {}
        self.dependencies = dependencies or {}
        self.add_session_state_to_context = add_session_state_to_context

    def __repr__(self) -> str:
        return f"<Workflow {self.id}>"

    def base_config(self) -> RunConfig:
        return RunConfig(
            component_id=self.id, component_name=self.name or "", kind=self.kind, alias=self.db_alias,
            system_message="",  # a workflow sends no prompt of its own; its steps do
            session_state=self.session_state, overwrite_db_session_state=self.overwrite_db_session_state,
            dependencies=self.dependencies, metadata=self.metadata, session_metadata=self.metadata,
            add_session_state_to_context=bool(self.add_session_state_to_context),
            executor=self._execute,
        )

    def _loop(self, input, session_id, user_id, session_state, run_id, stream_events, options, branch=None):
        # additional_data is no option of the loop's: it reaches the steps in their StepInput.
        options = dict(options)
        additional_data = options.pop("additional_data", None)
        loop = super()._loop(input, session_id, user_id, session_state, run_id, stream_events, options, branch)
        loop.additional_data = additional_data
        return loop

    def _make_loop(self, config: RunConfig, input, *, session_id, user, session_state, run_id, branch=None) -> RootRun:
        return RootRun(config, input, session_id=session_id, user=user, session_state=session_state, run_id=run_id,
                       branch=branch)

    async def _execute(self, loop: BaseRun) -> AsyncIterator:
        """The workflow run's executor: its steps, in order; the last one's content is the run's."""
        window = self._history_window()
        history = await call_sync(_workflow_history, loop, window) if window else []
        context = StepContext(
            loop=loop, stream_executor_events=self.stream_executor_events,
            add_workflow_history=self.add_workflow_history_to_steps, num_history_runs=self.num_history_runs,
            dependencies=dict(loop.config.dependencies), metadata=dict(loop.config.metadata),
            add_session_state_to_context=self.add_session_state_to_context,
        )
        step_input = StepInput(input=loop.raw_input, additional_data=loop.additional_data,
                               workflow_history=history)
        outputs: list[StepOutput] = []
        # A continued run (run/pause.py) resumes at the step its answered requirement names.
        resume = next((r for r in getattr(loop, "answers", []) if hasattr(r, "step_index")), None)
        async for item in run_top_level(self.steps, context, step_input, outputs, resume):
            yield item
        loop.output.step_results = outputs
        content = deepest_content(outputs[-1]) if outputs else None
        loop.output.content = content
        if content is not None and not isinstance(content, str):
            loop.output.content_type = type(content).__name__
        loop.new_messages.append(ChatMessage(role=Role.ASSISTANT, content=content_text(content)))

    # -- runs that wait for a person (review.py) ---------------------------------------------------

    def continue_run(self, run_response=None, *, run_id: str | None = None, session_id: str | None = None,
                     step_requirements: list | None = None, user_id=None, stream: bool | None = None,
                     stream_events: bool | None = None, yield_run_output: bool = False, **options):
        """Resume a paused workflow run at its paused step: `continue_run(run_response=out)` (its step
        requirements answered) or `continue_run(run_id=..., session_id=..., step_requirements=[...])`."""
        self._check_options("continue_run", options)
        return self._sync(lambda streaming: self.acontinue_run(
            run_response, run_id=run_id, session_id=session_id, step_requirements=step_requirements,
            user_id=user_id, stream=streaming, stream_events=stream_events, yield_run_output=yield_run_output,
            **options), stream)

    def acontinue_run(self, run_response=None, *, run_id: str | None = None, session_id: str | None = None,
                      step_requirements: list | None = None, user_id=None, stream: bool | None = None,
                      stream_events: bool | None = None, yield_run_output: bool = False,
                      requirements: list | None = None, **options):
        """Async twin of `continue_run`: await it for the output, or iterate it (stream=True) for events.
        (`requirements=` is taken too, as an Agent's continue_run names them.)"""
        self._check_options("acontinue_run", options)
        return self._continue(run_response, run_id, [*(step_requirements or []), *(requirements or [])], session_id,
                              user_id, stream, stream_events, yield_run_output, options)

    def _history_window(self) -> int:
        """How many earlier runs any step may be shown (0: none asks): one query reads them all."""
        steps = _all_steps(self.steps)
        asking = [step for step in steps if getattr(step, "add_workflow_history", None)
                  or (self.add_workflow_history_to_steps and getattr(step, "add_workflow_history", None) is None
                      and getattr(step, "executor_type", "function") in ("agent", "team"))]
        return max([step.num_history_runs or self.num_history_runs for step in asking], default=0)

    async def _agenerate_name(self, session_id, user_id) -> tuple[str, bool]:
        """No model call (Agno's rule, SPEC item 22): the description, cut to 40 characters and marked "-"
        when longer, and the session's creation time; or "Workflow Session-<time>". A session that does not
        exist is SessionNotFoundError."""
        session = await call_sync(self._owned, session_id, user_id)
        stamp = session.created_at.strftime("%Y-%m-%d %H:%M")
        if self.description:
            description = self.description[:40] + "-" if len(self.description) > 40 else self.description
            return f"{description} - {stamp}", True
        return f"Workflow Session-{stamp}", True


def _all_steps(steps) -> list:
    found = []
    for step in steps:
        found.append(step)
        for attribute in ("steps", "else_steps", "choices"):
            found += _all_steps(getattr(step, attribute, None) or [])
    return found


def _workflow_history(loop: BaseRun, num_runs: int) -> list[tuple[str, str]]:
    """(input, content) of the session's last `num_runs` completed workflow runs, oldest first: one query."""
    runs = (Run.objects.using(loop.alias)
            .filter(session_id=loop.start.session_pk, parent_run__isnull=True, status=RunStatus.COMPLETED)
            .exclude(pk=loop.run_pk).order_by("-id").values_list("input", "content")[: max(num_runs, 0)])
    return list(reversed(list(runs)))
