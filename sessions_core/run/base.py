"""What every run shares, a root run (`root.RootRun`: it holds the session's lease) and a run inside it
(`child.ChildRun`: a workflow's step, a team's member): its output, its events, how its work is
executed and how it ended.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from pydantic import BaseModel

from .. import limits
from .. import state as state_module
from ..config import RunConfig
from ..errors import Cancelled, Paused, RunFailed
from ..events import RUN_EVENT_CLASSES, BaseRunEvent
from ..history import ChatMessage
from ..model_api import ModelError
from ..models import Role, RunStatus
from ..outputs import OUTPUT_CLASSES, RunOutput
from ..owners import user_label
from ..steps import content_text
from ..storable import replace_unstorable
from .model_loop import ModelLoop

logger = logging.getLogger("sessions_core")


def cancelled_content(run_id: str) -> str:
    """A stopped run's content when it had written nothing (Agno's words)."""
    return f"Run {run_id} was cancelled"


def new_run_id() -> str:
    return str(uuid.uuid4())


class BaseRun(ModelLoop):
    """One run of a component. Iterate `events()`; the outcome ends up in `output`."""

    parent: BaseRun | None = None
    child_class: type[BaseRun]  # the class of the runs inside it (child.ChildRun)
    continued_child_class: type[BaseRun]  # a paused run inside it, continued (pause.ContinuedChild)
    continued = False  # a paused run's continuation (run/pause.py)
    can_pause = False  # whether a call of a tool that waits for a person pauses it (else the model is told no)
    prior_metrics: dict | None = None  # a continued run's metrics before this part of it

    def __init__(self, config: RunConfig, input, *, session_id: str, user, run_id: str | None = None,
                 step_name: str = "", source_prefix: str = ""):
        self.config = config
        self.alias = config.alias
        self.model = config.model
        self.raw_input = input  # as given (a workflow's steps see it unchanged: text, a dict, a model)
        self.input = replace_unstorable(content_text(input))  # text as it is; a dict or a model's output as JSON
        self.session_id = session_id
        self.user_ref = user  # a username, a User or None; resolved to a User when a session is created
        self.user_id = user_label(user)
        self.run_id = str(run_id) if run_id else new_run_id()
        self.step_name = step_name
        self.source_prefix = source_prefix  # "step:<name>/" or "member:<name>/" on the state changes it makes
        self.event_classes = RUN_EVENT_CLASSES.get(config.kind, RUN_EVENT_CLASSES["agent"])
        self.seq = 0
        self.output = OUTPUT_CLASSES.get(config.kind, RunOutput)(
            run_id=self.run_id, session_id=session_id, user_id=self.user_id, agent_id=config.component_id,
            agent_name=config.component_name, input=self.input, model=self.model.id if self.model else "",
            model_provider=self.model.provider if self.model else "",
        )
        self.run_pk = 0  # the run's row, once stored
        self.outcome: tuple[str, str, str] = (RunStatus.COMPLETED, "", "")  # status, error, error type
        self.step_output = None  # a function step's StepOutput
        self.step_input = self.step_context = None  # a workflow step's StepInput and StepContext (steps.py)
        self.additional_data: dict | None = None  # a workflow run's, for its steps
        self.started = 0.0  # perf_counter at the start
        self.checkpoint_due = 0.0
        self.created_at = 0.0  # the run row's created_at, in seconds since the epoch
        self.loop = None
        # Set while the model streams.
        self.reader = None  # the task, while it waits for the model's next chunk
        self.new_messages: list[ChatMessage] = []
        self.content_parts: list[str] = []
        self.current_reply: list[str] = []  # text of the model call in flight
        self.finished = False
        self.saving = None  # the checkpoint's write in flight

    # -- runs inside this run: a workflow's steps, a team's members --------------------------------------

    def child(self, config: RunConfig, input, *, step_name: str, source_prefix: str):
        """A run inside this one (a step, a member): same session, user, state and lease."""
        return self.child_class(config, input, parent=self, step_name=step_name,
                        source_prefix=self.source_prefix + source_prefix)

    def continued_child(self, config: RunConfig, run_id: str, answers: list, *, step_name: str, source_prefix: str):
        """A paused run inside this one (a step's, a member's), continued with `answers` (run/pause.py)."""
        return self.continued_child_class(config, parent=self, run_id=run_id, answers=answers, step_name=step_name,
                              source_prefix=self.source_prefix + source_prefix)

    # -- events ------------------------------------------------------------------------------------------

    def _event(self, cls, **kwargs) -> BaseRunEvent:
        self.seq += 1
        return cls(run_id=self.run_id, session_id=self.session_id, agent_id=self.config.component_id,
                   agent_name=self.config.component_name, seq=self.seq,
                   parent_run_id=self.parent.run_id if self.parent is not None else "",
                   **{"step_name": self.step_name, **kwargs})

    def event(self, name: str, **kwargs) -> BaseRunEvent:
        """One of this run's own events by role ("started", "content", "completed", ...), named for its kind."""
        return self._event(self.event_classes[name], **kwargs)

    def started_event(self) -> BaseRunEvent:
        return self.event("started", model=self.model.id if self.model else "",
                          model_provider=self.model.provider if self.model else "", input=self.input,
                          created_at=self.created_at)

    # -- the work between start and finish ----------------------------------------------------------------

    async def _execute(self) -> AsyncIterator[BaseRunEvent]:
        """What happens between start and finish (the model loop, or the config's executor: a workflow's
        steps); how it ended goes to `self.outcome`."""
        status, error, error_type = RunStatus.COMPLETED, "", ""
        executor = self.config.executor or type(self)._model_loop
        try:
            if self.state_error:
                status, error, error_type = RunStatus.ERROR, self.state_error, "state_error"
            else:
                async with aclosing(executor(self)) as executed:
                    async for event in executed:
                        yield event
        except state_module.StateNotJSONError as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "state_error"
        except limits.LimitExceeded as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "limit_exceeded"
        except ModelError as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "model_provider_error"
        except RunFailed as exc:
            status, error, error_type = RunStatus.ERROR, str(exc), "run_failed"
        except Cancelled:
            status = RunStatus.CANCELLED
        except Paused:
            status = RunStatus.PAUSED
        except Exception as exc:  # a bug in a hook or in us: the run fails loudly and nothing is lost
            logger.exception("Run %s in session %s failed", self.run_id, self.session_id)
            status, error, error_type = RunStatus.ERROR, f"{type(exc).__name__}: {exc}", "internal_error"
        self.outcome = (status, error, error_type)

    @property
    def state_error(self) -> str:
        """Why the state could not be merged at the start (the run then fails at once), else ""."""
        return ""

    # -- the end -----------------------------------------------------------------------------------------

    def _settle_output(self, status: str, error: str) -> None:
        """The output's status, error and content as the run ends; a reply cut off part-way is kept."""
        out = self.output
        out.status, out.error = status, error
        partial = "".join(self.current_reply)
        if partial:  # the reply of a model call that was stopped or failed part-way
            self.new_messages.append(ChatMessage(role=Role.ASSISTANT, content=partial))
        if status == RunStatus.CANCELLED:
            out.content = "".join(self.content_parts) or cancelled_content(self.run_id)
        elif status == RunStatus.ERROR:
            out.content = error
        if self.started:  # (a run cancelled while it waited its turn never started)
            before = (self.prior_metrics or {}).get("duration", 0)  # a continued run's time before its pause
            out.metrics["duration"] = round(before + time.perf_counter() - self.started, 6)

    def stored_messages(self) -> list[ChatMessage]:
        """The run's new messages as they are stored (tool calls and results left out if so configured)."""
        if self.config.store_tool_messages:
            return self.new_messages
        return [m for m in self.new_messages if m.role != Role.TOOL and not m.tool_calls]

    def outcome_fields(self, error: str) -> dict:
        """The run row's fields as it ends, its status aside."""
        content = self.output.content
        if isinstance(content, BaseModel):
            content = content.model_dump_json()
        fields = {"content": content if isinstance(content, str) else json.dumps(content, default=str),
                  "content_type": self.output.content_type, "error": error, "metrics": self.output.metrics}
        if self.output.requirements:  # every call it waited on, with its answer (requirements.py)
            fields["requirements"] = [requirement.to_dict() for requirement in self.output.requirements]
        return fields

    def _final_events(self, status: str, error_type: str, completed: bool = True) -> list[BaseRunEvent]:
        """How the run ended: its error, or its cancellation and (unless not `completed`) its completion."""
        out = self.output
        if out.status == RunStatus.PAUSED:
            active = out.active_requirements
            waiting = [r.tool_execution.snapshot() for r in active if hasattr(r, "tool_execution")]
            step = {"step_name": active[-1].step_name} if active and hasattr(active[-1], "step_name") else {}
            return [self.event("paused", content=out.content, tools=waiting, requirements=out.requirements, **step)]
        if out.status == RunStatus.ERROR:  # the run's failure, or the database refusing its outcome
            return [self.event("error", content=out.error,
                               error_type=error_type if status == RunStatus.ERROR else "storage_error")]
        events = []
        if status == RunStatus.CANCELLED:
            events.append(self.event("cancelled", reason="Run cancelled", content=out.content or ""))
        if not completed:
            return events
        extra = {"step_results": list(out.step_results)} if hasattr(out, "step_results") else {}
        events.append(self.event(
            "completed", content=out.content, content_type=out.content_type, metrics=out.metrics,
            session_state=out.session_state, state_version=out.state_version, status=out.status, **extra,
        ))
        return events
