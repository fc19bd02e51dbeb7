"""Downloads: one session as Markdown or JSON, or all of a user's chats as JSON; and such a JSON file
uploaded back as new chats (sessions_core.export)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from itertools import islice

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods

from sessions_core import export
from sessions_core.models import ChatSession

from ..assistants import assistant_name
from ..ratelimits import IMPORTS, by_user, limit_posts
from .common import owned_session


STREAM_PARTS = 64  # parts (a run each, in JSON) read from the database per trip to Django's sync thread
# The share of the process's time a download may take: after each trip it waits so that its work is at
# most this share of the time since. A download of 20,000 chats is work for seconds of one core, and
# other users' requests in the same process would wait behind it for the interpreter's lock.
DOWNLOAD_SHARE = 0.5


async def _streamed(parts: Iterator[str]) -> AsyncIterator[str]:
    """A generator that reads the database, served under ASGI a batch at a time: given as it is,
    Django would read it all into memory first (it consumes a sync iterator with list())."""
    take = sync_to_async(lambda: list(islice(parts, STREAM_PARTS)))
    while True:
        began = time.monotonic()
        batch = await take()
        work = time.monotonic() - began
        if not batch:
            return
        yield "".join(batch)
        await asyncio.sleep(work * (1 - DOWNLOAD_SHARE) / DOWNLOAD_SHARE)


def _download(parts: Iterator[str], content_type: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(_streamed(parts), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "private, no-store"  # a user's conversations: no shared cache keeps them
    return response


def _filename(session: ChatSession, extension: str) -> str:
    return f"{slugify(session.name)[:60] or 'chat'}-{session.session_id[:8]}.{extension}"


@login_required
@require_GET
def session_export_markdown(request: HttpRequest, session_id: str) -> StreamingHttpResponse:
    session = owned_session(request, session_id)
    parts = export.export_markdown(session, assistant_name(session.component_id))
    return _download(parts, "text/markdown; charset=utf-8", _filename(session, "md"))


@login_required
@require_GET
def session_export_json(request: HttpRequest, session_id: str) -> StreamingHttpResponse:
    session = owned_session(request, session_id)
    return _download(export.export_json(session), "application/json", _filename(session, "json"))


@login_required
@require_GET
def export_all(request: HttpRequest) -> StreamingHttpResponse:
    """Every chat of the user that is not in the trash, newest activity first, then the user's memories."""
    now = timezone.now()
    sessions = ChatSession.objects.for_user(request.user).alive().order_by("-last_activity_at", "-id")
    parts = export.export_all_json(sessions, request.user.get_username(), now, user=request.user)
    return _download(parts, "application/json", f"chats-{slugify(request.user.get_username())}-{now:%Y%m%d}.json")


IMPORTED = " (imported)"


def _mark_imported(sessions: list[export.ImportedSession]) -> None:
    """An imported chat says so in its title, so it is never taken for its original (in the sidebar, in
    search, in the tab's title)."""
    for session in sessions:
        name = " ".join(session.name.split())
        if not name:
            session.name = "Imported chat"
        elif not name.endswith(IMPORTED):
            session.name = name[: 200 - len(IMPORTED)] + IMPORTED


def _over_chat_limits(user, count: int) -> str:
    """Why `count` more chats for `user` are too many (CHAT_IMPORT_MAX_CHATS, CHAT_MAX_CHATS_PER_USER), or ""."""
    per_import, per_user = settings.CHAT_IMPORT_MAX_CHATS, settings.CHAT_MAX_CHATS_PER_USER
    if per_import and count > per_import:
        return (f"This file holds {count:,} chats; an import takes at most {per_import:,} "
                "(CHAT_IMPORT_MAX_CHATS). Split it, or import fewer chats.")
    if per_user:
        have = ChatSession.objects.for_user(user).count()  # the trash's too: they are stored
        if have + count > per_user:
            return (f"You have {have:,} chats and this file holds {count:,}; a user may have at most "
                    f"{per_user:,} (CHAT_MAX_CHATS_PER_USER, the trash counts). Empty the trash or delete some first.")
    return ""


NOT_AN_EXPORT = ("This file is not a chat export from this app. Import takes the JSON file that “Export” "
                 "(or a chat's “Download as JSON”) saved.")


def _refusal_in_words(message: str) -> str:
    """The engine's refusal, where it names a parser's or a validator's internals, in a user's words."""
    if "discriminator" in message or "expected tags" in message or "the document: Input should be a valid dict" in message:
        return NOT_AN_EXPORT
    if "integer string conversion" in message:
        return "This file holds a number too long to read (more than 4,300 digits): it is not a chat export."
    if message.startswith("Not a JSON file"):
        return "This file is not JSON, so it is not a chat export from this app."
    return message


@login_required
@require_http_methods(["GET", "POST"])
@limit_posts((IMPORTS, by_user))
def import_chats(request: HttpRequest) -> HttpResponse:
    """A JSON file this app exported (one chat or all of them) becomes new chats of the user: all of the
    file or, with a message saying why, none of it. Its chats count against CHAT_IMPORT_MAX_CHATS and
    CHAT_MAX_CHATS_PER_USER."""
    error = ""
    if request.method == "POST":
        upload = request.FILES.get("file")
        limit = settings.CHAT_IMPORT_MAX_BYTES
        if upload is None:
            error = "Choose a file to import."
        elif upload.size > limit:
            error = f"The file is {upload.size:,} bytes; the limit is {limit:,} (CHAT_IMPORT_MAX_BYTES)."
        else:
            try:
                chats = export.read_import(upload.read())
            except export.ImportRefused as exc:
                error = _refusal_in_words(str(exc))
            else:
                error = _over_chat_limits(request.user, len(chats))
            if not error:
                _mark_imported(chats)
                sessions = export.store_import(chats, request.user)  # in batches: other users' writes go on
                count, remembered = len(sessions), sessions.memories
                memories_note = f" and {remembered} memor{'y' if remembered == 1 else 'ies'}" if remembered else ""
                messages.success(request, f"Imported {count} chat{'' if count == 1 else 's'}{memories_note}.")
                return redirect("chat:session", sessions[0].session_id) if count else redirect("chat:index")
    # A missing file is a bad request; a file refused for what it holds (or its size) is a 422.
    status = (422 if request.FILES.get("file") else 400) if error else 200
    return render(request, "chatapp/import.html", {"error": error}, status=status)
