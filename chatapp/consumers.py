"""The chat websocket: one socket per open session page, at /ws/sessions/<session_id>/.

Connect
    Anonymous users are closed with 4401. The session is looked up through the same scoped queryset
    as the views (`ChatSession.objects.for_user(user).alive()`); an unknown, deleted or foreign id
    is closed with 4403. The socket joins `session.<pk>` (every tab of this session) and
    `user.<user pk>` (every tab of this user: sidebar rows), then catches up (below).

Inbound frames (JSON objects; htmx's ws-send posts the form fields plus a `HEADERS` object, which is
ignored like any other extra key):

    {"type": "send", "text": "..."}                 run a message (queued if a run is in flight)
    {"type": "stop", "run_id"?: "...", "queued_id"?: "..."}
                                                    stop the run (given or current), or drop a
                                                    queued message
    {"type": "retry", "run_id": "..."}              send that run's input again as a new run
    {"type": "regenerate_title"}                    ask the model for a new title

    `text` is 1 to settings.CHAT_MAX_MESSAGE_CHARS characters after trimming; ids are 1 to 64
    characters. Anything else (invalid JSON, not an object, binary, an unknown type, a missing or
    empty field, text over the limit) is answered with an error in #run-status on this socket
    only; nothing is written and the socket stays open.

Outbound frames are HTML for htmx out-of-band swaps, each top-level element carrying
`hx-swap-oob` or an id:

    <div hx-swap-oob="beforeend:#transcript"><article id="run-…">…</article></div>   a run started
    <div hx-swap-oob="beforeend:#reply-…">escaped text</div>                        streamed text
    <details id="tool-…" hx-swap-oob="true">…</details>                             a tool call row
    <article id="run-…" hx-swap-oob="true">…</article>                              a run re-rendered
                                                                                   (finished, catch-up)
    <section id="state-panel" hx-swap-oob="true">…</section>                         the state panel
    <li id="session-item-…" hx-swap-oob="…">…</li>                                   a sidebar row
    <div hx-swap-oob="beforeend:#queue"><li id="queued-…">…</li></div>               a queued message
    <li id="queued-…" hx-swap-oob="delete"></li>                                    …started or dropped
    <ol id="queue" hx-swap-oob="true">…</ol>                                          the queue (catch-up)
    <div hx-swap-oob="innerHTML:#run-status">…</div>                                 a status line

Catch-up
    If a run of this session is in flight, its fragment with the whole text so far replaces
    `#run-<run_id>` (the page may hold an older checkpoint), and later text batches are cut so
    nothing is shown twice. A run owned by another process is asked for over the
    `session.<pk>.sync` group ({"type": "chat.sync_request", "reply_channel", "session_pk"}; a stop
    travels the same way as {"type": "chat.cancel", "run_id", "session_pk"}), which each process's
    one listener joins for the sessions it is running. Query parameters sent by static/chatapp/live.js on every
    (re)connect add what a dropped connection missed: `last_run` (the newest run the page shows)
    brings newer runs, `running` (runs the page shows as running) brings their final form, and
    `reconnect=1` re-sends the state panel and the queue.

Layer events handled (type -> method): chat.html {html} (forwarded as is), chat.tokens {run_id,
start, text} (escaped here; cut by the catch-up offset), chat.run_done {run_id, html},
chat.sync_reply {run_id, html, text_len} (the answer to this socket's chat.sync_request).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import parse_qs

from channels.db import aclose_old_connections
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model

from sessions_core.models import ChatSession, Run, RunStatus
from sessions_core.storable import storable

from . import live
from .broadcast import session_group, sync_group, user_group

ID_MAX = 64
SYNC_WAIT_SECONDS = 3.0
FRAME_TYPES = ("send", "stop", "retry", "regenerate_title")


class FrameError(ValueError):
    """An inbound frame that is refused; the message is shown to the user."""


@dataclass(frozen=True)
class Frame:
    type: str
    text: str = ""
    run_id: str = ""
    queued_id: str = ""


def _id(data: dict, key: str, required: bool = False) -> str:
    value = data.get(key)
    if value in (None, "") and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise FrameError(f"The {key} is missing.")
    if len(value) > ID_MAX:
        raise FrameError(f"The {key} is too long.")
    return value.strip()


def parse_frame(text_data: str | None, bytes_data: bytes | None = None) -> Frame:
    """Validate one inbound frame; raises FrameError with a message for the user."""
    if text_data is None:
        raise FrameError("Binary frames are not accepted.")
    try:
        data = json.loads(text_data)
    except ValueError:
        raise FrameError("The message could not be read (not JSON).") from None
    if not isinstance(data, dict):
        raise FrameError("The message could not be read (not a JSON object).")
    kind = data.get("type")
    if kind not in FRAME_TYPES:
        raise FrameError("Unknown request type.")
    if kind == "send":
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            raise FrameError("Type a message first.")
        text = storable(text.strip())  # as the engine stores it: NUL and lone surrogates become U+FFFD
        limit = settings.CHAT_MAX_MESSAGE_CHARS
        if len(text) > limit:
            raise FrameError(f"The message is {len(text):,} characters long; the limit is {limit:,}.")
        return Frame("send", text=text)
    if kind == "stop":
        return Frame("stop", run_id=_id(data, "run_id"), queued_id=_id(data, "queued_id"))
    if kind == "retry":
        return Frame("retry", run_id=_id(data, "run_id", required=True))
    return Frame(kind)


class SessionConsumer(AsyncWebsocketConsumer):
    session: ChatSession | None = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        session = await ChatSession.objects.for_user(user).alive().filter(session_id=session_id).afirst()
        if session is None:
            await self.close(code=4403)
            return
        self.user = await get_user_model().objects.aget(pk=user.pk)  # a plain User for the run tasks
        self.session = session
        self.offsets: dict[str, int] = {}  # run id -> characters of its reply this socket has
        self.waiting_sync: str | None = None  # run id whose text another process was asked for
        self.held: list[dict] = []  # chat.tokens received while waiting for that text
        self.watcher: asyncio.Task | None = None  # watches the lease of a run in another process...
        self.watched = ""  # ...this one
        self.joined = [session_group(session.pk), user_group(user.pk)]
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self._catch_up()

    async def disconnect(self, code):
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            watcher.cancel()
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            frame = parse_frame(text_data, bytes_data)
        except FrameError as exc:
            await self.send(text_data=live.status_html(str(exc), "error"))
            return
        await aclose_old_connections()
        session = await ChatSession.objects.for_user(self.user).alive().filter(pk=self.session.pk).afirst()
        if session is None:
            await self.send(text_data=live.status_html("This chat was deleted.", "error"))
            return
        if frame.type == "send":
            await live.submit(session, self.user, frame.text)
        elif frame.type == "retry":
            if await live.retry(session, self.user, frame.run_id) is None:
                await self.send(text_data=live.status_html("That reply cannot be retried.", "error"))
        elif frame.type == "stop":
            if not await live.stop(session, run_id=frame.run_id, queued_id=frame.queued_id):
                await self.send(text_data=live.status_html("Nothing to stop.", "info"))
        elif frame.type == "regenerate_title":
            await self.send(text_data=live.status_html("Generating a new title…"))
            live.start_regenerate_title(session, self.user)

    # -- catch-up ---------------------------------------------------------------------------------

    async def _catch_up(self):
        params = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        first = {key: values[0] for key, values in params.items() if values}
        pk = self.session.pk
        current = live.live_run(pk)
        text = current.text if current else ""  # taken now: later batches carry offsets past it, or are cut
        append = False
        settled = ""
        idle = current is None and not await live.running_elsewhere(self.session)
        if idle:
            # A run whose process stopped (a restart mid-reply) is interrupted now, and the page gets
            # its final form below, with the runs it shows as running or has not seen.
            settled = await live.settle_abandoned(pk)
        if "last_run" in first or "running" in first:
            last_run = first["last_run"][:ID_MAX] if "last_run" in first else None
            running = first.get("running", "")[: ID_MAX * 4]
            html, append = await live.missed_html(pk, last_run, running, skip=current.run_id if current else "")
            if html:
                await self.send(text_data=html)
        if settled:
            await self.send(text_data=live.status_html(*live.INTERRUPTED_NOTE))
        queued = await live.queued(pk)
        if first.get("reconnect") or queued:
            await self.send(text_data=live.queue_html(queued))
        if first.get("reconnect"):
            await self.send(text_data=await live.state_panel_html(self.session))
        # Messages queued in a process that has stopped run now, here (the page sees them start).
        if idle and queued:
            await live.adopt_orphans(self.session)
        if current is not None:
            await self.send(text_data=await live.live_run_html(current, text, append=append))
            self.offsets[current.run_id] = len(text)
        elif not idle:  # current is None here, so a run holds the lease: another process's
            run = await Run.objects.filter(session_id=pk, status=RunStatus.RUNNING).order_by("-pk").afirst()
            if run is not None:
                self.waiting_sync = run.run_id
                await self.channel_layer.group_send(
                    sync_group(pk), {"type": "chat.sync_request", "reply_channel": self.channel_name, "session_pk": pk}
                )
                asyncio.get_running_loop().call_later(SYNC_WAIT_SECONDS, self._give_up_sync, run.run_id)
                self.watched = run.run_id
                self.watcher = asyncio.create_task(self._watch_lease(run.run_id), name=f"chat-lease-watch-{pk}")

    async def _watch_lease(self, run_id: str):
        """A run of another process: should that process stop, show the run as interrupted when its
        lease runs out (a live process renews it every few seconds until the run is stored)."""
        pk = self.session.pk
        while (left := await live.lease_left(self.session)) is not None:
            await asyncio.sleep(left + settings.CHAT_LEASE_GRACE_SECONDS)  # a deadline, not a wait on a condition
        settled = await live.settle_abandoned(pk)
        await live.adopt_orphans(self.session)
        html, _ = await live.missed_html(pk, None, run_id)  # the run's final form, whoever ended it
        if html:
            self.offsets.pop(run_id, None)
            if run_id == self.waiting_sync:
                self.waiting_sync, self.held = None, []
            await self.send(text_data=html + (live.status_html(*live.INTERRUPTED_NOTE) if settled else ""))

    def _give_up_sync(self, run_id: str) -> None:
        # The owning process did not answer (it may have died): show whatever arrives from now on.
        if self.waiting_sync == run_id:
            asyncio.ensure_future(self._release_held())

    async def _release_held(self):
        self.waiting_sync = None
        held, self.held = self.held, []
        for event in held:
            await self.chat_tokens(event)

    # -- layer events -----------------------------------------------------------------------------

    async def chat_html(self, event):
        await self.send(text_data=event["html"])

    async def chat_tokens(self, event):
        run_id, start, text = event["run_id"], event["start"], event["text"]
        if run_id == self.waiting_sync:
            self.held.append(event)
            return
        have = self.offsets.get(run_id)
        if have is not None:
            end = start + len(text)
            if end <= have:
                return  # already shown by the catch-up
            text = text[max(0, have - start):]
            self.offsets[run_id] = end
        await self.send(text_data=live.token_html(run_id, text))

    async def chat_run_done(self, event):
        self.offsets.pop(event["run_id"], None)
        if event["run_id"] == self.watched and self.watcher is not None:
            self.watcher.cancel()  # the run ended in its own process: nothing left to watch for
        if event["run_id"] == self.waiting_sync:
            self.waiting_sync, self.held = None, []
        await self.send(text_data=event["html"])

    async def chat_sync_reply(self, event):
        if event["run_id"] != self.waiting_sync:
            return
        await self.send(text_data=event["html"])
        self.offsets[event["run_id"]] = event["text_len"]
        await self._release_held()
