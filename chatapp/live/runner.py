"""A run of the web chat: a message handed to the engine, and its events pumped to the session's group as
HTML for every tab of the session. One task per run, outliving the socket that asked for it:

    RunQueued        the message shown waiting in #queue (another run holds the session)
    RunStarted       the run's fragment appended to #transcript (its queued note removed)
    RunContent       the reply so far as sanitized markdown, in numbered batches (`chat.tokens`, below)
    ToolCall*        a tool row appended to #tools-<run_id>, then replaced with its result
    StepStarted      a step's row (a team member's, from its RunStarted) appended to #steps-<parent run id>,
                     redrawn as stored when the step ends
    StateChanged     the state panel re-rendered with the new state, mid-run
    RunCompleted /   the run re-rendered once from the database (`chat.run_done` {run_id, html}) replacing
    RunError / ...   #run-<run_id>; the sidebar row to the user's group; a title in the background
    SessionSummary   the summary in the state panel
    MemoryUpdate     the reply's memory line ("Remembered: ...", with its undo), once the memory work is done

Token batches (streaming.py) go out at most every CHAT_STREAM_BATCH_SECONDS, the first text at once.
While it runs, the process keeps it in memory (`streaming.LiveRun`), for its sockets that are behind
(follower.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from datetime import timedelta

from asgiref.sync import sync_to_async
from channels.db import aclose_old_connections
from django.conf import settings
from django.utils import timezone

from sessions_core.component import Component
from sessions_core.errors import QueuedRunTakenError, RunNotContinuableError, UnresolvedRequirementsError
from sessions_core.events import RunContinuedEvent, RunEvent
from sessions_core.models import ChatSession, NameSource, RunStatus
from sessions_core.run.lifecycle import LEASE_SECONDS
from sessions_core.tools import DELEGATE_TOOL

from .. import assistants, dbthreads, memories, rendering, state_view, titles
from ..broadcast import abroadcast_to_session, asend_to_session, push_row
from . import fragments, leases
from .streaming import LiveRun, done_streaming, streaming

logger = logging.getLogger("chatapp.live")

@dataclass
class Prompt:
    """A message for a run: its text, who sent it, what it makes of an earlier run, and whether Stop was
    pressed before its run started (the run is then cancelled as it starts)."""

    text: str
    user: object
    branch: tuple[str, str] | None = None  # (run id, "regenerate" | "edit"): a new version of that run
    session: ChatSession | None = None  # the row as the socket read it just now (a message that runs at once)
    fallback_title: str = ""  # the unnamed session's name from this message, stored with the run's end
    cancelled: bool = False
    run_id: str = ""  # its run's (given to the engine for a new message; a new version's, once it started)
    take_over: bool = False  # a queued run whose process stopped, taken over (queue.take_over_unclaimed)
    answers: list | None = None  # a paused run's answered requirements: the run `run_id` continues (answers.py)
    stored: asyncio.Event = field(default_factory=asyncio.Event)  # its run is stored (queued or started), or over




_not_started: dict[int, list[Prompt]] = {}  # session pk -> messages of this process whose run has not started
_tasks: set[asyncio.Task] = set()
def tasks() -> Iterable[asyncio.Task]:
    return tuple(_tasks)


def name_new_chat(session: ChatSession, item: Prompt) -> None:
    """An unnamed session is named after its first message: in the sidebar row pushed as its run starts,
    stored with the run's end (titles.store_fallback_title)."""
    if not session.name and (title := titles.fallback_title(item.text)):
        session.name, session.name_source, item.fallback_title = title, NameSource.FALLBACK, title


def start(session_pk: int, owner_pk: int | None, item: Prompt) -> asyncio.Task:
    """Run `item` on the session in a task of its own; the task ends when the run's final form is sent."""
    _not_started.setdefault(session_pk, []).append(item)
    task = asyncio.create_task(_run(session_pk, owner_pk, item), name=f"chat-run-{session_pk}")
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    task.add_done_callback(lambda _: _started_or_gone(session_pk, item))
    return task


def _started_or_gone(session_pk: int, item: Prompt) -> None:
    item.stored.set()
    waiting = _not_started.get(session_pk, [])
    if item in waiting:
        waiting.remove(item)
    if not waiting:
        _not_started.pop(session_pk, None)


def waiting_run_ids(session_pk: int) -> tuple[str, ...]:
    """The run ids of this process's messages on the session whose run has not started."""
    return tuple(item.run_id for item in _not_started.get(session_pk, ()) if item.run_id)


async def stop_before_start(session_pk: int) -> bool:
    """Stop pressed with no run shown: the oldest message of this process whose run has not started is
    cancelled (by the engine, which holds it queued or starts it cancelled)."""
    waiting = _not_started.get(session_pk)
    if not waiting:
        return False
    item = waiting[0]
    item.cancelled = True
    if item.run_id:
        await Component.acancel_run(item.run_id)
    return True


async def report_failure(session_pk: int) -> None:
    await abroadcast_to_session(session_pk, rendering.render_status("The reply failed unexpectedly.", "error"))


# What each engine event means to a live run, whichever kind of component runs it (agent, team, workflow).
_ROLES = {
    RunEvent.run_queued: "queued",
    **dict.fromkeys((RunEvent.run_started, RunEvent.team_run_started, RunEvent.workflow_started), "started"),
    **dict.fromkeys((RunEvent.run_content, RunEvent.team_run_content), "content"),
    **dict.fromkeys((RunEvent.tool_call_started, RunEvent.tool_call_completed, RunEvent.team_tool_call_started,
                     RunEvent.team_tool_call_completed), "tool"),
    RunEvent.state_changed: "state",
    **dict.fromkeys((RunEvent.run_cancelled, RunEvent.team_run_cancelled, RunEvent.workflow_cancelled), "cancelled"),
    **dict.fromkeys((RunEvent.run_completed, RunEvent.run_error, RunEvent.team_run_completed, RunEvent.team_run_error,
                     RunEvent.workflow_completed, RunEvent.workflow_error), "done"),
    RunEvent.session_summary_completed: "summary",
    RunEvent.memory_update_completed: "memory",
    RunEvent.step_started: "step",
    # A run that waits for a person ends its stream so (drawn as stored: its cards); it goes on as it started.
    **dict.fromkeys((RunEvent.run_paused, RunEvent.team_run_paused, RunEvent.step_paused), "done"),
    **dict.fromkeys((RunEvent.run_continued, RunEvent.team_run_continued, RunEvent.step_continued), "started"),
}
_TOOL_STARTED = (RunEvent.tool_call_started, RunEvent.team_tool_call_started)


def event_role(event) -> str | None:
    return _ROLES.get(event.event)


class _End:
    """Marks the end of a run's event stream."""


@dataclass
class _Refused:
    """The engine refused to continue a paused run (nothing changed): why."""

    reason: str


_FLUSH = object()  # queued by the batch timer: send the text gathered so far


async def _current(session_pk: int, owner_pk: int | None, item: Prompt) -> ChatSession | None:
    """The session's row as it is now (None if it is gone), named after the message if it has no name."""
    await aclose_old_connections()  # a long-lived server: drop connections that went stale while idle
    session = await ChatSession.objects.for_user(owner_pk).filter(pk=session_pk).afirst()
    if session is not None and item.fallback_title and not session.name:
        session.name, session.name_source = item.fallback_title, NameSource.FALLBACK
    return session


async def _run(session_pk: int, owner_pk: int | None, item: Prompt) -> None:
    try:
        # Read by the socket a moment ago; else (the session is busy, or the message was adopted) now.
        session = item.session or await _current(session_pk, owner_pk, item)
        if session is None:
            return
        try:
            agent = assistants.get_assistant(session.component_id)
        except KeyError:
            await abroadcast_to_session(session_pk, rendering.render_status(
                f"This session's assistant ({session.component_id}) is not available.", "error"))
            return
        if leases.may_have_abandoned(session):  # a run left by a process that stopped: shown as interrupted
            settled = await leases.settle_abandoned(session_pk)
            await abroadcast_to_session(session_pk, settled + rendering.render_status("Waiting for the reply…"))
        await _pump(session, item, agent)
    except Exception:
        logger.exception("Run for session %s failed", session_pk)
        await report_failure(session_pk)


async def _read(agent, session: ChatSession, item: Prompt, events: asyncio.Queue) -> None:
    """The engine's stream, read by a task of its own: the pump waits on the queue (and the batch timer)
    without ever interrupting a read."""
    options = dict(session_id=session.session_id, user_id=item.user, stream=True, stream_events=True)
    if item.answers is not None:
        stream = agent.acontinue_run(run_id=item.run_id, requirements=item.answers, **options)
    elif item.take_over:
        stream = agent.arun(None, run_id=item.run_id, **options)
    elif item.branch is None:
        stream = agent.arun(item.text, run_id=item.run_id, **options)
    elif item.branch[1] == "edit":
        stream = agent.aedit_and_rerun(item.branch[0], item.text, **options)
    else:
        stream = agent.aregenerate(item.branch[0], **options)
    try:
        async with aclosing(stream):
            async for event in stream:
                if event_role(event) == "started" and not event.parent_run_id and item.cancelled:
                    # Stopped before it started: the engine is paused at this event, before any model
                    # call, and sees the stop as soon as it resumes.
                    await Component.acancel_run(event.run_id)
                events.put_nowait(event)
    except QueuedRunTakenError:  # another process took this queued run over a moment before: it runs there
        pass
    except (RunNotContinuableError, UnresolvedRequirementsError) as exc:  # answered in another tab, or stopped
        events.put_nowait(_Refused(str(exc)))
    except Exception as exc:  # noqa: BLE001 - handed to the pump, which raises it
        events.put_nowait(exc)
    finally:
        events.put_nowait(_End())


async def _pump(session: ChatSession, item: Prompt, agent) -> None:
    pk, owner_pk = session.pk, session.owner_id
    events: asyncio.Queue = asyncio.Queue()
    reader = asyncio.create_task(_read(agent, session, item, events), name=f"chat-run-events-{pk}")
    batch = settings.CHAT_STREAM_BATCH_SECONDS
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None  # puts _FLUSH in the queue when the batch is due
    live: LiveRun | None = None
    done = queued = False
    try:
        while True:
            event = await events.get()
            if event is _FLUSH:
                timer = None
                await _flush(pk, live)
                continue
            if isinstance(event, _End):
                break
            if isinstance(event, Exception):
                raise event
            if isinstance(event, _Refused):  # the cards show the run as it is stored now
                html = await dbthreads.run(fragments.stored_reply, pk, item.run_id)
                await abroadcast_to_session(pk, (html[0] if html else "")
                                            + rendering.render_status(event.reason, "error"))
                continue
            kind = event_role(event)
            if live is not None and event.run_id != live.run_id and kind != "state":
                await _step_event(pk, live, kind, event)  # a workflow's step, a team's member
            elif kind == "queued":
                item.stored.set()
                session, queued = None, True  # the row is read as it is when the run starts
                note = rendering.render_oob(rendering.render_queued(event), "beforeend:#queue")
                await abroadcast_to_session(pk, note + rendering.render_status(fragments.QUEUED_STATUS))
            elif kind == "started" and item.answers is not None:  # a paused run goes on, in place
                if session is None:
                    session = await _current(pk, owner_pk, item)
                    if session is None:
                        return
                live = LiveRun(fragments.continued_run(event, item.text))
                await _started(session, item, live, queued, continued=True)
            elif kind == "started":
                if session is None:
                    session = await _current(pk, owner_pk, item)
                    if session is None:
                        return
                live = LiveRun(fragments.started_run(event))
                await _started(session, item, live, queued)
            elif kind == "cancelled" and live is None and queued:  # stopped while it waited: it never began
                await abroadcast_to_session(pk, rendering.render_delete("li", f"queued-{event.run_id}")
                                            + rendering.render_status("Queued message removed."))
            elif live is None:
                continue
            elif kind == "content":
                live.add(event.content or "")
                wait = live.flush_wait(batch, time.monotonic())
                if wait <= 0 and events.empty():
                    await _flush(pk, live)  # the first text goes at once; later text at most every batch
                elif timer is None:  # (text already waiting in the queue joins this batch)
                    timer = loop.call_later(max(wait, 0), events.put_nowait, _FLUSH)
            elif kind == "tool":
                if event.tool.tool_name != DELEGATE_TOOL:  # a delegation is shown as the member's row
                    await _flush(pk, live)
                    call = fragments.tool_call(event, started=event.event in _TOOL_STARTED)
                    live.tool_calls[call.call_id] = call
                    await abroadcast_to_session(pk, fragments.tool_html(live.run_id, call))
            elif kind == "state":
                await _flush(pk, live)
                live.changed_keys = sorted(set(live.changed_keys) | set(event.changed_keys))
                live.pending_changes.insert(0, state_view.describe_pending_change(event))
                session.session_state, session.state_version = event.session_state, event.state_version
                live.state = (event.session_state, event.state_version)
                await abroadcast_to_session(pk, await sync_to_async(fragments.state_html)(
                    session, live.changed_keys, live.pending_changes))
            elif kind == "cancelled":
                await _flush(pk, live)
            elif kind == "done":
                await _flush(pk, live)
                await _finished(session, item, live)
                done = True
            elif kind == "memory":
                # The memory work ends after the reply: its line ("Remembered: ...") replaces the empty one.
                if event.memories or event.deleted or event.error:
                    await abroadcast_to_session(pk, await dbthreads.run(
                        memories.stored_run_memories, event.run_id, pk, session.owner_id))
            elif kind == "summary":
                # The summary is made after the reply is complete; the panel shows it when it lands: a
                # newer one replaces the one shown, and a first one (which may bring the panel itself
                # into view, for an assistant without state) redraws the panel as stored.
                if session.summary and event.session_summary:
                    await abroadcast_to_session(pk, rendering.render_session_summary(event.session_summary))
                else:
                    panel = await sync_to_async(fragments.state_panel_html)(pk, session.owner_id)
                    await abroadcast_to_session(pk, panel)
                session.summary = event.session_summary or session.summary
        if live is not None and not done:  # the stream ended without a final event: show what is stored
            done = True
            await _finished(session, item, live)
    except Exception:
        if live is not None and not done:  # never leave a run shown as running
            with suppress(Exception):
                await _finished(session, item, live)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if not reader.done():
            reader.cancel()
        with suppress(asyncio.CancelledError):
            await reader
        if live is not None:
            done_streaming(pk, live)


async def _step_event(session_pk: int, live: LiveRun, kind: str | None, event) -> None:
    """A step's or member's event: its row appears (open) when it starts, its words and tool calls show in it
    as they come (words at most every CHAT_STREAM_BATCH_SECONDS), and it is redrawn as stored when it ends
    (its text and tool calls with it), in every tab alike."""
    if isinstance(event, RunContinuedEvent):  # a paused step or member goes on: its row is on the page already
        live.steps[event.run_id] = not (event.parent_run_id == live.run_id and live.run.kind == "workflow")
    elif kind == "step" or (kind == "started" and event.run_id not in live.steps):
        live.steps[event.run_id] = kind == "started"  # a member's run has no StepStarted before it
        await abroadcast_to_session(session_pk, fragments.step_started_html(event))
    elif kind == "content" and event.run_id in live.steps:
        text = live.step_text[event.run_id] = live.step_text.get(event.run_id, "") + (event.content or "")
        now = time.monotonic()
        if now - live.step_sent.get(event.run_id, 0.0) >= settings.CHAT_STREAM_BATCH_SECONDS:
            live.step_sent[event.run_id] = now
            await abroadcast_to_session(session_pk, rendering.render_step_content(event.run_id, text))
    elif kind == "tool" and event.run_id in live.steps and event.tool.tool_name != DELEGATE_TOOL:
        call = fragments.tool_call(event, started=event.event in _TOOL_STARTED)
        await abroadcast_to_session(session_pk, fragments.tool_html(event.run_id, call))
    elif kind == "done" and event.run_id in live.steps:
        member = live.steps[event.run_id]
        await abroadcast_to_session(session_pk, await sync_to_async(fragments.step_done_html)(event.run_id, member))


async def _started(session: ChatSession, item: Prompt, live: LiveRun, queued: bool, continued: bool = False) -> None:
    item.stored.set()
    _started_or_gone(session.pk, item)
    # Drawn from the event (no query) while the engine goes on to the model: no database read and no
    # trip through the thread the engine's queries use. A new version redraws the transcript instead.
    pk = session.pk
    streaming(pk, live)
    item.run_id = live.run_id
    if item.cancelled:  # Stop was pressed after the reader passed this event on
        await Component.acancel_run(live.run_id)
    if item.branch is not None:
        html = await sync_to_async(fragments.branch_html)(pk, session.owner_id)
    elif continued:  # its fragment as stored (the answered cards, the calls so far), replaced in place
        html = (await dbthreads.run(fragments.stored_reply, pk, live.run_id) or ("",))[0]
    else:
        html = fragments.started_html(live.run)
    if queued or item.take_over:
        html += rendering.render_delete("li", f"queued-{live.run_id}")
    await abroadcast_to_session(pk, html + rendering.render_status(fragments.RUNNING_STATUS))
    # The sidebar row, running and at the top (with the fallback title of a new chat), as the engine's
    # start has just stored it (its lease, its last activity): beside the reply's first text rather
    # than before it, and always before the row the run's end pushes (_finished waits for it).
    session.last_activity_at = timezone.now()
    session.lease_expires_at = session.last_activity_at + timedelta(seconds=LEASE_SECONDS)
    if continued:
        session.is_waiting = False  # (until its end says otherwise)
    live.row_pushed = asyncio.create_task(push_row(session, to_top=True), name=f"chat-row-{pk}")


async def _flush(session_pk: int, live: LiveRun | None) -> None:
    """Send the reply text not yet sent as one numbered batch."""
    if live is not None and (batch := live.next_batch()) is not None:
        await asend_to_session(session_pk, "chat.tokens", **batch)


def _render_finished(live: LiveRun, session: ChatSession, item: Prompt) -> tuple[str, str]:
    """The finished run from the database, the new chat's fallback title stored, and the state panel as
    stored now if the run changed the state (a failed run's mid-run state changes were not kept, so the
    panel must show the stored state again); a run that changed nothing leaves the panel as it is."""
    html, status, waiting = fragments.finished_html(live.run_id, session)
    session.is_waiting = waiting  # the sidebar row's mark of a chat that waits for the user
    if item.fallback_title:
        titles.store_fallback_title(session, item.fallback_title)
    if live.changed_keys or live.pending_changes:
        stored = ChatSession.objects.for_user(session.owner_id).get(pk=session.pk)
        session.session_state, session.state_version = stored.session_state, stored.state_version
        html += rendering.render_state_panel(stored, live.changed_keys, oob="true")
    return html, status


async def _finished(session: ChatSession, item: Prompt, live: LiveRun) -> None:
    pk = session.pk
    if live.row_pushed is not None:  # the running row goes before the finished one (and renders what it had)
        try:
            await live.row_pushed
        except Exception:  # noqa: BLE001 - a row not pushed is redrawn by the one below
            logger.warning("The sidebar row of session %s was not pushed as its run started", pk, exc_info=True)
    html, status = await dbthreads.run(_render_finished, live, session, item)
    done_streaming(pk, live)
    note, kind = fragments.STATUS_NOTES.get(status, ("Reply finished.", "info"))
    await asend_to_session(pk, "chat.run_done", run_id=live.run_id, html=html + rendering.render_status(note, kind))
    live.announced.set()
    session.lease_expires_at, session.last_activity_at = None, timezone.now()  # as the engine's finish stored it
    if status == RunStatus.COMPLETED and session.name_source in (NameSource.NONE, NameSource.FALLBACK):
        titles.start_title(session, item.user)  # which pushes the row, titled or not, when it is done
    else:
        await push_row(session)
