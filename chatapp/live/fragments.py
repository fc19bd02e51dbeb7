"""HTML for a live run: its events drawn from small view objects made from them, and runs drawn from the
database (a finished run, a run another process is streaming, runs a page has not seen). Every piece comes
from the page's own templates (chatapp/rendering.py), so a live page and a reloaded one show the same markup.

The functions that read the database say so: call them on a database thread (chatapp/dbthreads.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sessions_core.events import StepStartedEvent, TeamRunStartedEvent, WorkflowStartedEvent
from sessions_core.models import ChatSession, Run, RunStatus

from .. import memories, rendering
from ..markdown_stream import ReplyStream

QUEUED_STATUS = "Your message is queued; it will run after the current reply."
RUNNING_STATUS = "Generating a reply…"
STATUS_NOTES = {
    RunStatus.COMPLETED: ("Reply complete.", "info"),
    RunStatus.CANCELLED: ("Stopped. The partial reply was kept.", "info"),
    RunStatus.ERROR: ("The reply failed. You can retry it.", "error"),
    RunStatus.INTERRUPTED: ("The reply was interrupted.", "error"),
    RunStatus.PAUSED: ("The reply waits for your answer.", "info"),
}
INTERRUPTED_NOTE = STATUS_NOTES[RunStatus.INTERRUPTED]


# --- view objects from events ---------------------------------------------------------------------


@dataclass(frozen=True)
class StreamedRun:
    """A run, a workflow's step or a team member's run as its start event describes it, with its text so
    far: what _run.html and _step.html read of a run. It is no stored row (`pk` None), so the actions
    under a finished reply are not drawn; its metrics come with its end."""

    run_id: str
    kind: str = "agent"
    input: str = ""
    model_id: str = ""
    component_id: str = ""
    step_name: str = ""
    content: str = ""
    status: str = RunStatus.RUNNING
    error: str = ""
    pk = None
    metrics = None


def _kind(event) -> str:
    if isinstance(event, WorkflowStartedEvent):
        return "workflow"
    if isinstance(event, TeamRunStartedEvent):
        return "team"
    return "agent"


def started_run(event) -> StreamedRun:
    """A run from its start event (RunStarted, TeamRunStarted, WorkflowStarted), which carries its input."""
    return StreamedRun(run_id=event.run_id, kind=_kind(event), input=event.input,
                       model_id=getattr(event, "model", ""), component_id=event.agent_id, step_name=event.step_name)


def continued_run(event, input: str) -> StreamedRun:
    """A paused run that goes on (from RunContinued, TeamRunContinued or StepContinued), its input as stored."""
    kind = {"TeamRunContinued": "team", "StepContinued": "workflow"}.get(str(event.event), "agent")
    return StreamedRun(run_id=event.run_id, kind=kind, input=input, component_id=event.agent_id)


def started_step(event) -> tuple[StreamedRun, bool]:
    """A step's run (from StepStarted) or a team member's (from its RunStarted); whether it is a member."""
    if isinstance(event, StepStartedEvent):
        return StreamedRun(run_id=event.run_id, kind=event.executor_type or "agent", step_name=event.step_name,
                           component_id=event.executor_id), False
    return started_run(event), True


def tool_call(event, started: bool) -> rendering.ToolCallView:
    """A tool row from ToolCallStarted (running) or ToolCallCompleted (with its result)."""
    tool = event.tool
    return rendering.ToolCallView(
        tool.tool_call_id, tool.tool_name, json.dumps(tool.tool_args, indent=2, ensure_ascii=False),
        result=None if started else (tool.result or ""), error=tool.tool_call_error,
    )


# --- events as HTML ------------------------------------------------------------------------------------


def started_html(run: StreamedRun) -> str:
    """A run that has just started, appended to the transcript (no query: its steps come as events)."""
    return _placed(rendering.RunView(run, run.input), append=True)


def step_started_html(event) -> str:
    """A step's or member's row, appended to its parent's steps."""
    run, member = started_step(event)
    html = rendering.render_step_view(rendering.StepView(run, member=member))
    return rendering.render_oob(html, f"beforeend:#steps-{event.parent_run_id}")


def step_done_html(run_id: str, member: bool) -> str:
    """A finished step's or member's row as stored, replacing the live one. Reads the database."""
    return rendering.render_step(Run.objects.get(run_id=run_id), oob="true", member=member)


def tool_html(run_id: str, call: rendering.ToolCallView) -> str:
    """A tool row: appended to the run's while it runs, replacing itself once it has its result."""
    if call.pending:
        return rendering.render_oob(rendering.render_tool_call(run_id, call), f"beforeend:#tools-{run_id}")
    return rendering.render_tool_call(run_id, call, oob="true")


def state_html(session: ChatSession, changed_keys: list[str], pending_changes: list[dict]) -> str:
    """The panel mid-run: the reply's state and changes, without the editor (an edit of a state the run
    has not stored yet would have the run's changes applied a second time when it finishes). Reads the
    database (the stored timeline)."""
    return rendering.render_state_panel(session, changed_keys, in_flight=True, pending_changes=pending_changes,
                                        oob="true")


def streamed_html(run: StreamedRun, tool_calls: list[rendering.ToolCallView], append: bool = False) -> str:
    """A run this process is streaming, with its text and tool calls so far, replacing its fragment (or
    appended when it is new to the page). Reads the database: a workflow's or team's steps so far are
    stored rows."""
    steps = []
    if run.kind in ("workflow", "team"):
        children = Run.objects.filter(parent_run__run_id=run.run_id).order_by("pk")
        steps = [rendering.step_view(child, member=run.kind == "team") for child in children]
    return _placed(rendering.RunView(run, run.input, tool_calls, steps), append)


def _placed(view: rendering.RunView, append: bool) -> str:
    """A run's fragment replacing the one on the page, or appended to the transcript when new to the page."""
    if append:
        return rendering.render_oob(rendering.render_run_view(view), "beforeend:#transcript")
    return rendering.render_run_view(view, oob="true")


# --- runs from the database ------------------------------------------------------------------------------


def finished_html(run_id: str, session: ChatSession) -> tuple[str, str, bool]:
    """A finished run as stored (its final form, replacing the live one), with the memories it was shown
    beside the state panel; its status, and whether the session has a run that waits for the user (this
    one, or an earlier one still waiting). Reads the database."""
    run = rendering.stored_run(run_id=run_id, session_id=session.pk)
    memories.attach([run], session.owner_id)
    shown = memories.render_context_memories(memories.context_memories_of_run(session, run), oob="true")
    return rendering.render_run(run, oob="true") + shown, run.status, run.session_waiting


def completed_elements(text: str) -> int:
    """How many of the elements of `text`'s reply are completed blocks (those a token batch may keep)."""
    stream = ReplyStream()
    stream.feed(text)
    return stream.completed


def stored_reply(session_pk: int, run_id: str, append: bool = False) -> tuple[str, int | None] | None:
    """A run of the session as stored, replacing its fragment on the page (or appended, new to it): while it
    runs, with the text the engine has checkpointed, and how many elements of that text are completed
    blocks; once it has ended, its final form (and None). None if it is not the session's. Reads the
    database."""
    run = Run.objects.annotate(**rendering.BRANCHES).filter(session_id=session_pk, run_id=run_id).first()
    if run is None:
        return None
    rendering.place_among_siblings([run])
    elements = completed_elements(run.content) if run.status == RunStatus.RUNNING else None
    return _placed(rendering.run_view(run), append), elements


def missed(session_pk: int, last_run: str | None, running: str, skip: str) -> tuple[str, bool]:
    """Runs a page has not seen: newer than `last_run` (None: the page did not say), and the final form
    of runs it shows as running. Also whether the run `skip` (in flight: the caller draws it) is new to
    the page. Reads the database."""
    runs = Run.objects.begun().filter(session_id=session_pk, parent_run__isnull=True)
    parts, skip_is_new = [], False
    if last_run is not None:
        anchor = runs.filter(run_id=last_run).values_list("pk", flat=True).first() if last_run else 0
        if anchor is not None:
            newer = runs.filter(pk__gt=anchor, abandoned=False).annotate(**rendering.BRANCHES)  # the current branch
            newer = list(newer.order_by("-pk")[: rendering.TRANSCRIPT_RUNS])[::-1]
            rendering.place_among_siblings(newer)
            skip_is_new = any(run.run_id == skip for run in newer)
            shown = [rendering.render_run(run) for run in newer if run.run_id != skip]
            if shown:
                parts.append(rendering.render_oob(shown, "beforeend:#transcript"))
    for run_id in filter(None, running.split(",")):
        if run_id != skip:
            run = runs.filter(run_id=run_id).exclude(status=RunStatus.RUNNING).first()
            if run is not None:
                parts.append(rendering.render_run(run, oob="true"))
    return "".join(parts), skip_is_new


def branch_html(session_pk: int, owner_pk: int | None) -> str:
    """The transcript of the session's current branch and its state panel, replacing what the tabs show.
    Reads the database."""
    session = ChatSession.objects.for_user(owner_pk).get(pk=session_pk)
    return rendering.render_transcript(session) + rendering.render_state_panel(session, oob="true")


def state_panel_html(session_pk: int, owner_pk: int | None) -> str:
    """The state panel as stored. Reads the database."""
    return rendering.render_state_panel(ChatSession.objects.for_user(owner_pk).get(pk=session_pk), oob="true")

