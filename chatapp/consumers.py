"""The chat websocket: one socket per open session page, at /ws/sessions/<session_id>/, and one per new chat's
landing, at /ws/new/.

Connect
    A socket to any other path is closed with 4404 (`NotFoundConsumer`). Anonymous users are closed with 4401. The session is looked up through the same scoped queryset
    as the views (`ChatSession.objects.for_user(user).alive()`); an unknown, deleted or foreign id
    is closed with 4403. The socket joins `session.<pk>` (every tab of this session) and
    `user.<user pk>` (every tab of this user: sidebar rows), then catches up (below).

A new chat's landing (/ws/new/)
    The socket joins `user.<user pk>` only. Its first frame must be a `send` carrying `assistant` (an id of
    chatapp.assistants.ASSISTANTS) as well as `text`: it counts against the same limits as the landing's
    form post (chatapp/new_chats.py), makes the chat with the message queued, joins the chat's group, runs
    the message at once (its start pushes the chat's row to the user's tabs) and sends the chat's header,
    composer and state pane out of band (_chat_started.html; the page takes the chat's URL from the header). From then on the socket is that
    chat's, as if it had connected to /ws/sessions/<session_id>/. Any other frame first is refused.

Inbound frames (JSON objects; htmx's ws-send posts the form fields plus a `HEADERS` object, which is
ignored like any other extra key):

    {"type": "send", "text": "..."}                 run a message (queued if a run is in flight); on a
                                                    landing's socket also "assistant": "..."
    {"type": "stop", "run_id"?: "...", "queued_id"?: "..."}
                                                    stop the run (given or current), or drop a
                                                    queued message
    {"type": "retry", "run_id": "..."}              send that run's input again as a new run
    {"type": "regenerate", "run_id": "..."}         a new version of that reply (a sibling branch)
    {"type": "edit", "run_id": "...", "text": "..."}  that message edited, run again as a sibling branch
    {"type": "branch", "run_id": "..."}             show that version: the session moves to its branch
    {"type": "regenerate_title"}                    ask the model for a new title
    {"type": "answer", "run_id": "...", "answers": [{"id", "approve"?, "note"?, "input"?}, ...]}
                                                    continue that reply, which waits for the user (its
                                                    cards' answers; `answers` may come as JSON text, as
                                                    a ws-send form posts it; chatapp/live/answers.py)

    `text` is 1 to settings.CHAT_MAX_MESSAGE_CHARS characters after trimming; ids are 1 to 64
    characters; a frame is at most CHAT_MAX_JSON_BYTES and nests at most CHAT_MAX_JSON_DEPTH deep
    (sessions_core.limits, checked before it is parsed). Anything else (invalid JSON, not an object,
    binary, an unknown type, a missing or empty field, text over a limit) is answered with an error in
    #run-status on this socket only; nothing is written and the socket stays open. So is a send or a
    retry over the user's rate limits (CHAT_MESSAGES_PER_MINUTE, CHAT_RUNS_IN_FLIGHT; chatapp/ratelimits.py).
    A `send` refused so (its text too long, a rate limit, the chat gone to the trash) also hands its text
    back: the composer's text box comes with it, holding the message again (_composer_text.html).

Outbound frames are HTML for htmx out-of-band swaps, each top-level element carrying
`hx-swap-oob` or an id:

    <div hx-swap-oob="beforeend:#transcript"><article id="run-…">…</article></div>   a run started
    <template data-stream-run="…" data-keep="N">…</template>                        a streamed reply's
                                                                                   frame (live.js: keep
                                                                                   N elements, then this)
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
    If a run of this session is in flight, its fragment replaces `#run-<run_id>` (or is appended when
    new to the page): with the whole text so far when this process runs it, with the text the engine
    has stored when another process does. Later batches are applied on top, in order; those the
    fragment already covers are skipped (chatapp/live/follower.py). Query parameters sent by
    static/chatapp/live.js on every (re)connect add what a dropped connection missed: `last_run` (the
    newest run the page shows) brings newer runs, `running` (runs the page shows as running) brings
    their final form, `shown_name` (the chat's name in the page's sidebar) the chat's row when the stored
    name differs, `panel` (what the state panel was drawn from, `rendering.panel_stamp`) the panel when
    the stored session's differs, and `reconnect=1` re-sends the state panel and the queue.

Layer events handled (type -> method): chat.html {html} (forwarded as is), chat.tokens {run_id, seq,
origin, keep, html, elements} (a numbered batch; chatapp/live/runner.py), chat.run_done {run_id, html},
chat.check_done {run_id} (the socket's note to itself, to find out whether a run's final form came). The
socket's half of the catch-up and of the stream (what it has of each reply, gaps, watching the lease of
a run in another process) is `live.Follower`; this module parses frames and dispatches.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer

from sessions_core import limits
from sessions_core.models import ChatSession

from . import dbthreads, live, new_chats, ratelimits, titles
from .broadcast import session_group, user_group
from .forms import FirstMessageForm, MessageTextError, message_text
from .live import ID_MAX
from .rendering import render_composer_text, render_status

FRAME_TYPES = ("send", "stop", "retry", "regenerate", "edit", "branch", "regenerate_title", "answer")
MAX_ANSWERS = 50  # cards answered by one frame


class FrameError(ValueError):
    """An inbound frame that is refused; the message is shown to the user. `text`: a refused message's
    own text, handed back to the composer rather than lost."""

    def __init__(self, message: str, text: str = ""):
        super().__init__(message)
        self.text = text


@dataclass(frozen=True)
class Frame:
    type: str
    text: str = ""
    run_id: str = ""
    queued_id: str = ""
    answers: tuple = ()
    assistant: str = ""  # a new chat's first message: the assistant picked on the landing


def _id(data: dict, key: str, required: bool = False) -> str:
    value = data.get(key)
    if value in (None, "") and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise FrameError(f"The {key} is missing.")
    if len(value) > ID_MAX:
        raise FrameError(f"The {key} is too long.")
    return value.strip()


def _text(data: dict) -> str:
    try:
        return message_text(data.get("text"))
    except MessageTextError as exc:
        text = data.get("text")
        raise FrameError(str(exc), text if isinstance(text, str) and data.get("type") == "send" else "") from None


def parse_frame(text_data: str | None, bytes_data: bytes | None = None) -> Frame:
    """Validate one inbound frame; raises FrameError with a message for the user."""
    if text_data is None:
        raise FrameError("Binary frames are not accepted.")
    try:  # size and depth before the parser (which recurses) sees it
        limits.check_text(text_data, "The message")
    except limits.LimitExceeded as exc:
        raise FrameError(str(exc)) from None
    try:
        data = json.loads(text_data)
    except (ValueError, RecursionError):  # RecursionError: with CHAT_MAX_JSON_DEPTH off
        raise FrameError("The message could not be read (not JSON).") from None
    if not isinstance(data, dict):
        raise FrameError("The message could not be read (not a JSON object).")
    kind = data.get("type")
    if kind not in FRAME_TYPES:
        raise FrameError("Unknown request type.")
    if kind == "send":
        return Frame(kind, text=_text(data), assistant=_id(data, "assistant"))
    if kind == "edit":
        return Frame(kind, text=_text(data), run_id=_id(data, "run_id", required=True))
    if kind == "stop":
        return Frame("stop", run_id=_id(data, "run_id"), queued_id=_id(data, "queued_id"))
    if kind in ("retry", "regenerate", "branch"):
        return Frame(kind, run_id=_id(data, "run_id", required=True))
    if kind == "answer":
        return Frame(kind, run_id=_id(data, "run_id", required=True), answers=_answers(data.get("answers")))
    return Frame(kind)


def _answers(value) -> tuple:
    """The cards' answers: a list of objects (or that list as JSON text, as a form posts it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise FrameError("The answers could not be read.") from None
    if not isinstance(value, list) or not value or len(value) > MAX_ANSWERS \
            or not all(isinstance(item, dict) for item in value):
        raise FrameError("The answers could not be read.")
    return tuple(value)


def _alive_session(user, **lookup) -> ChatSession | None:
    """The user's session (by pk or session_id) unless it is in the trash."""
    return ChatSession.objects.for_user(user).alive().filter(**lookup).first()


async def _current_session(user, session_pk: int) -> ChatSession | None:
    """The socket's session as stored now (None once in the trash): one query, on the web's own database
    threads (chatapp/dbthreads.py), not behind the runs' engine work."""
    return await dbthreads.run(_alive_session, user, pk=session_pk)


def _handed_back(text: str) -> str:
    """A message the server did not take, back in the composer (whose text the page cleared as it sent it)."""
    return render_composer_text(text) if text.strip() else ""


class NotFoundConsumer(AsyncWebsocketConsumer):
    """A socket to any other path: closed with 4404, as an unknown URL is a 404."""

    async def connect(self):
        await self.close(code=4404)


class SessionConsumer(AsyncWebsocketConsumer):
    session: ChatSession | None = None
    follower: live.Follower | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tasks: set[asyncio.Task] = set()  # a new chat's parts being drawn for this page

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        # A plain User for the run tasks: the one Channels' AuthMiddleware loaded behind its lazy wrapper.
        self.user = getattr(user, "_wrapped", user)
        session_id = self.scope["url_route"]["kwargs"].get("session_id")
        session = None
        if session_id is not None:
            session = await dbthreads.run(_alive_session, self.user, session_id=session_id)  # not behind the engine's queries
            if session is None:
                await self.close(code=4403)
                return
        self.joined = [user_group(user.pk)]
        await self.channel_layer.group_add(self.joined[0], self.channel_name)
        if session is None:  # a new chat's landing: the chat comes with its first message
            await self.accept()
            return
        await self._follow(session)
        await self.accept()
        await self.follower.catch_up(self.scope.get("query_string", b""))

    async def _follow(self, session: ChatSession) -> None:
        """This socket is `session`'s: it joins the group of every tab of the session."""
        self.session = session
        self.follower = live.Follower(session, self.channel_name, self._send_html)
        self.joined.append(session_group(session.pk))
        await self.channel_layer.group_add(self.joined[-1], self.channel_name)

    async def _start_chat(self, frame: Frame) -> None:
        """The landing's first message: the chat is made with it (as the landing's form post makes it), this
        socket becomes the chat's, the message runs at once, and the page is sent the chat's parts."""
        if frame.type != "send":
            await self._send_html(render_status("Send a message first: it starts the chat.", "error"))
            return
        form = FirstMessageForm({"assistant": frame.assistant, "text": frame.text})  # as the landing's form post
        if not form.is_valid():
            error = next(iter(form.errors.values()))[0]
            await self._send_html(render_status(error, "error") + _handed_back(frame.text))
            return
        if refused := await dbthreads.run(new_chats.refusal, self.user):
            await self._send_html(render_status(refused[0], "error") + _handed_back(frame.text))  # nothing made
            return
        session, first = await dbthreads.run(new_chats.start_chat, self.user, frame.assistant, frame.text)
        await self._follow(session)
        live.run_queued(session, self.user, first)
        # The chat's parts, drawn beside the run (its start pushes the chat's row to the user's tabs): this
        # handler returns at once, so the socket forwards the reply's first words (the layer's events wait
        # for the handler before them) while the parts are drawn.
        task = asyncio.create_task(self._send_parts(session), name=f"chat-started-{session.pk}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send_parts(self, session: ChatSession) -> None:
        await self._send_html(await dbthreads.run(new_chats.started_html, session))

    async def disconnect(self, code):
        for task in self.tasks:
            task.cancel()
        if self.follower is not None:
            self.follower.close()
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def _send_html(self, html: str) -> None:
        await self.send(text_data=html)

    # Channels' dispatch closes stale connections of the thread for sync code before every handler, by
    # a hop onto that thread (the one the engine's queries use): before every batch of every streaming
    # reply, to every socket, each hop queued behind every chat's engine work, and each close making
    # that thread's next query take a connection from the pool again. These two events carry HTML and
    # use no connection of that thread (a run drawn anew goes to chatapp/dbthreads.py), so they skip it.
    _NO_DATABASE_EVENTS = frozenset({"chat.tokens", "chat.html"})

    async def dispatch(self, message):
        if message["type"] in self._NO_DATABASE_EVENTS:
            await getattr(self, get_handler_name(message))(message)
        else:
            await super().dispatch(message)

    async def receive(self, text_data=None, bytes_data=None):
        try:
            frame = parse_frame(text_data, bytes_data)
        except FrameError as exc:  # a refused message comes back into the composer (one over the length limit)
            await self._send_html(render_status(str(exc), "error") + _handed_back(exc.text))
            return
        if self.session is None:
            await self._start_chat(frame)
            return
        sent = frame.text if frame.type == "send" else ""  # what comes back into the composer if refused
        session = await _current_session(self.user, self.session.pk)
        if session is None:
            # Moved to the trash (from another tab or process): nothing runs, and a message comes back
            # into the composer rather than being dropped.
            note = render_status("This chat is in the trash: restore it to continue. Your message was not sent.",
                                 "error")
            await self._send_html(note + _handed_back(sent))
            return
        run = None
        if frame.type in ("retry", "regenerate", "edit"):  # a run of this chat, or refused before it counts
            run = await live.find_run(session, frame.run_id, top_level=frame.type != "retry")
            if run is None:
                refusal = "That reply cannot be retried." if frame.type == "retry" else "That message is not in this chat."
                await self._send_html(render_status(refusal, "error"))
                return
        starts_a_run = frame.type in ("send", "retry", "regenerate", "edit", "answer")
        if starts_a_run and (refused := await ratelimits.refuse_message(self.user)):
            await self._send_html(render_status(refused, "error") + _handed_back(sent))  # nothing queued or written
            return
        if frame.type == "send":
            await live.submit(session, self.user, frame.text)
        elif frame.type == "retry":
            await live.retry(session, self.user, run)
        elif frame.type in ("regenerate", "edit"):
            await live.regenerate(session, self.user, run, frame.text if frame.type == "edit" else None)
        elif frame.type == "branch":
            if refused := await ratelimits.refuse(ratelimits.BRANCH_SWITCHES, self.user):
                await self._send_html(render_status(refused[0], "error"))
                return
            if not await live.switch_branch(session, self.user, frame.run_id):
                await self._send_html(render_status("That version cannot be shown now.", "error"))
        elif frame.type == "stop":
            if not await live.stop(session, run_id=frame.run_id, queued_id=frame.queued_id):
                await self._send_html(render_status("Nothing to stop.", "info"))
        elif frame.type == "answer":
            if refused := await live.answer(session, self.user, frame.run_id, list(frame.answers)):
                await self._send_html(render_status(refused, "error"))
        elif frame.type == "regenerate_title":
            if refused := await ratelimits.refuse(ratelimits.TITLES, self.user):
                await self._send_html(render_status(refused[0], "error"))
                return
            await self._send_html(render_status("Generating a new title…"))
            titles.start_regenerate_title(session, self.user)

    # -- layer events -----------------------------------------------------------------------------

    async def chat_html(self, event):
        await self._send_html(event["html"])

    async def chat_tokens(self, event):
        await self.follower.tokens(event)

    async def chat_run_done(self, event):
        await self.follower.run_done(event)

    async def chat_check_done(self, event):
        await self.follower.check_done(event)
