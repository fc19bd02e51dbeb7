"""What a socket asks of a session's runs besides a new message (chatapp/live/queue.py `submit`): retry a
reply, a new version of it (regenerated, or its message edited), show another version, stop (a run, or a
message waiting for its run: both through the engine's `cancel_run`)."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from sessions_core.branches import RunNotFoundError, SessionBusyError
from sessions_core.component import Component
from sessions_core.models import ChatSession, Run, RunStatus

from .. import assistants, rendering
from ..broadcast import abroadcast_to_session, push_session_row
from . import fragments, leases, queue, runner, streaming


async def find_run(session: ChatSession, run_id: str, top_level: bool = True) -> Run | None:
    """One of the session's runs that has begun (a reply, or with `top_level` False any run) and has an input;
    None if there is no such run in this session."""
    runs = Run.objects.begun().filter(session_id=session.pk, run_id=run_id).exclude(input="")
    if top_level:
        runs = runs.filter(parent_run__isnull=True)
    return await runs.only("run_id", "input").afirst()


async def regenerate(session: ChatSession, user, run: Run, text: str | None = None) -> runner.Prompt:
    """A new version of one of the session's replies (`find_run`): its input again (or `text`, edited), from
    the state as of that run's start."""
    branch = (run.run_id, "edit") if text is not None else (run.run_id, "regenerate")
    return await queue.submit(session, user, run.input if text is None else text, branch=branch)


async def retry(session: ChatSession, user, run: Run) -> runner.Prompt:
    """Send a run's input (`find_run`) again as a new run."""
    return await queue.submit(session, user, run.input)


async def switch_branch(session: ChatSession, user, run_id: str) -> bool:
    """Show another version of a reply: the session moves to that branch (its state too), in every tab."""
    try:
        agent = assistants.get_assistant(session.component_id)
        await agent.aset_current_branch(run_id, session_id=session.session_id, user_id=user)
    except (KeyError, RunNotFoundError, SessionBusyError):
        return False
    html = await sync_to_async(fragments.branch_html)(session.pk, session.owner_id)
    await abroadcast_to_session(session.pk, html)
    return True


async def stop(session: ChatSession, run_id: str = "", queued_id: str = "") -> bool:
    """Stop the session's run (the given one, else the one in flight) or drop a waiting message. A run is
    stopped by the engine (`Component.acancel_run`), wherever it runs: at once in this process, at its
    next heartbeat in another. False if there was nothing to stop."""
    if queued_id:
        return await _drop(session, queued_id)
    current = streaming.live_run(session.pk)
    if not run_id and current is None and await runner.stop_before_start(session.pk):
        return True  # no run yet: it is cancelled where it waits, or as it starts
    run_id = run_id or (current.run_id if current else "")
    if current is None and await _stop_waiting(session, run_id):
        return True
    if current is None or current.run_id != run_id:
        running = Run.objects.filter(session_id=session.pk, status=RunStatus.RUNNING)
        if run_id:
            running = running.filter(run_id=run_id)
        run = await running.order_by("-pk").only("run_id").afirst()
        if run is None:
            return False
        run_id = run.run_id
        if not await leases.running_elsewhere(session):  # no process is running it any more: it is over already
            html = await leases.settle_abandoned(session.pk)
            if html:
                await abroadcast_to_session(session.pk, html)
            return bool(html)
    return await Component.acancel_run(run_id)


async def _stop_waiting(session: ChatSession, run_id: str) -> bool:
    """Stop a reply that waits for the user (a paused run: the given one, else the newest, when nothing runs):
    the engine's cancel ends it at once, and every tab shows it stopped."""
    paused = Run.objects.filter(session_id=session.pk, status=RunStatus.PAUSED, parent_run__isnull=True)
    if run_id:
        paused = paused.filter(run_id=run_id)
    elif await Run.objects.filter(session_id=session.pk, status=RunStatus.RUNNING).aexists():
        return False  # Stop means the run in flight
    run = await paused.order_by("-pk").only("run_id").afirst()
    if run is None or not await Component.acancel_run(run.run_id):
        return False
    html = await sync_to_async(fragments.stored_reply)(session.pk, run.run_id)
    await abroadcast_to_session(session.pk, (html[0] if html else "") + rendering.render_status(
        "Stopped. The request is no longer waiting."))
    await push_session_row(session.pk, session.owner_id)  # its waiting mark goes
    return True


async def _drop(session: ChatSession, run_id: str) -> bool:
    """Stop a message waiting for its run (a queued run of this session), wherever it waits."""
    if not await Run.objects.filter(session_id=session.pk, run_id=run_id, status=RunStatus.QUEUED).aexists():
        return False
    stopped = await Component.acancel_run(run_id)
    if stopped:
        await abroadcast_to_session(session.pk, rendering.render_delete("li", f"queued-{run_id}")
                                    + rendering.render_status("Queued message removed."))
    return stopped
