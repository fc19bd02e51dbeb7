"""Session titles: the fallback title from the first message, and titles the model writes in the background.

A generated title is a job of its own (an asyncio task kept here until it finishes, `jobs`): the run
that asked for it, the socket or the view return at once, and every tab of the owner sees the new
sidebar row when the title arrives (`push_session_row`).
"""

from __future__ import annotations

import asyncio
import logging
import re

from django.conf import settings

from sessions_core.errors import SessionNotFoundError, SessionOwnershipError
from sessions_core.llm import default_model
from sessions_core.models import ChatSession, NameSource
from sessions_core.run import background

from . import assistants
from .broadcast import push_session_row

logger = logging.getLogger("chatapp.titles")

FALLBACK_TITLE_CHARS = 40
jobs: set[asyncio.Task] = set()  # title jobs: kept referenced until they finish


def fallback_title(text: str, limit: int = FALLBACK_TITLE_CHARS) -> str:
    """The first message as a title: whitespace collapsed, cut at a word near `limit` characters."""
    words = " ".join(text.split())
    if len(words) <= limit:
        return words
    cut = words[: limit + 1]
    cut = cut.rsplit(" ", 1)[0] if " " in cut[limit // 2 :] else words[:limit]
    return cut.rstrip(" ,.;:-") + "…"


FORK_MARK = re.compile(r" \(fork(?: (\d+))?\)$")


def fork_title(session: ChatSession) -> str:
    """A new fork's title: its original's, marked and numbered past the user's other forks of that title
    ("Groceries (fork)", "Groceries (fork 2)"; a fork of a fork is numbered among them), so a fork is never
    taken for its original or for another fork."""
    base = FORK_MARK.sub("", session.name) or "New chat"
    taken = (ChatSession.objects.for_user(session.owner_id).exclude(pk=session.pk)
             .filter(name__startswith=base + " (fork").values_list("name", flat=True))
    numbers = [int(match.group(1) or 1) for name in taken if (match := FORK_MARK.search(name))
               and name[:match.start()] == base]
    number = max(numbers, default=0) + 1
    mark = " (fork)" if number == 1 else f" (fork {number})"
    return base[: 200 - len(mark)] + mark


def store_fallback_title(session: ChatSession, title: str) -> bool:
    """Name a still unnamed session `title` (its first message's fallback_title); True if it was named.
    The web shows it from the first message on and stores it with that message's run's end, off the path
    to the first token."""
    return bool(ChatSession.objects.for_user(session.owner_id).filter(pk=session.pk, name="").update(
        name=title, name_source=NameSource.FALLBACK))


async def generate_title(session: ChatSession, user, attempts: int | None = None) -> bool:
    """Name the session with the model; pushes the row. Never replaces a user title.

    Retried with back-off when it fails; the title write does not touch last_activity_at, so the
    session keeps its place in the sidebar.
    """
    attempts = attempts or settings.CHAT_TITLE_ATTEMPTS
    try:
        agent = assistants.get_assistant(session.component_id)
    except KeyError:
        return False
    delay = settings.CHAT_TITLE_RETRY_SECONDS
    for attempt in range(attempts):
        try:
            named = await agent.aset_session_name(session_id=session.session_id, autogenerate=True, user_id=user,
                                                  model=_title_model(agent))
        except (SessionNotFoundError, SessionOwnershipError):
            return False
        except Exception:
            logger.warning("Title for session %s failed (attempt %d)", session.session_id, attempt + 1, exc_info=True)
        else:
            if named.name_source != NameSource.FALLBACK:  # fallback: the model failed every time; try again
                break
            logger.warning("Title for session %s: the model failed (attempt %d)", session.session_id, attempt + 1)
        if attempt + 1 == attempts:
            return False
        await asyncio.sleep(delay)
        delay *= 2
    await push_session_row(session.pk, session.owner_id)
    return True


def _title_model(component):
    """A workflow has no model of its own: its sessions are titled by the app's model, like any other."""
    return default_model() if component.kind == "workflow" else None


async def regenerate_title(session: ChatSession, user) -> bool:
    """The "Regenerate title" action: the user asked, so a title they typed may be replaced too."""
    await ChatSession.objects.for_user(session.owner_id).filter(pk=session.pk, name_source=NameSource.USER).aupdate(
        name_source=NameSource.AUTO
    )
    return await generate_title(session, user)


_by_session: dict[int, asyncio.Task] = {}  # the title job of each session that has one running


def _start(job, session: ChatSession) -> asyncio.Task:
    """Run `job` unless the session has a title job running already (then that one; `job` is dropped)."""
    running = _by_session.get(session.pk)
    if running is not None and not running.done():
        job.close()
        return running
    task = _by_session[session.pk] = asyncio.create_task(job, name=f"chat-title-{session.pk}")
    jobs.add(task)
    task.add_done_callback(jobs.discard)
    task.add_done_callback(lambda done: _by_session.pop(session.pk, None) if _by_session.get(session.pk) is done
                           else None)
    return task


async def _title_after_run(session: ChatSession, user) -> bool:
    titled = False
    try:
        async with background.turn():  # after the first words of every reply in flight
            titled = await generate_title(session, user)  # which pushes the titled row
    finally:
        if not titled:  # the run's end left the row showing it running: redrawn once, untitled
            await push_session_row(session.pk, session.owner_id)
    return titled


def start_title(session: ChatSession, user) -> asyncio.Task:
    """`generate_title` in the background (after a session's completed reply; the run's end leaves the
    sidebar row to it)."""
    return _start(_title_after_run(session, user), session)


def start_regenerate_title(session: ChatSession, user) -> asyncio.Task:
    """`regenerate_title` in the background, so the socket stays free for Stop and the view returns at once."""
    return _start(regenerate_title(session, user), session)
