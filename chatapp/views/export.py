"""Downloads: one session as Markdown or JSON (streamed here), or all of a user's chats as JSON; and such a
JSON file uploaded back as new chats. Exporting and importing all of them is a transfer done by a process
of its own (chatapp/transfers.py), with a page that shows its progress and then its outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from itertools import islice

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods

from sessions_core import export
from sessions_core.models import ChatSession

from .. import transfers
from ..assistants import assistant_name
from ..models import Transfer
from ..ratelimits import IMPORTS, by_user, limit_posts
from .common import HtmxHttpRequest, owned_session


STREAM_PARTS = 64  # parts (a run each, in JSON) read from the database per trip to Django's sync thread
# The share of the process's time a download may take: after each trip it waits so that its work is at
# most this share of the time since. A session of many runs is work for seconds of one core, and other
# users' requests in the same process would wait behind it for the interpreter's lock.
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


def _download(parts: AsyncIterator, content_type: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(parts, content_type=content_type)
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
    return _download(_streamed(parts), "text/markdown; charset=utf-8", _filename(session, "md"))


@login_required
@require_GET
def session_export_json(request: HttpRequest, session_id: str) -> StreamingHttpResponse:
    session = owned_session(request, session_id)
    return _download(_streamed(export.export_json(session)), "application/json", _filename(session, "json"))


@login_required
@require_http_methods(["GET", "POST"])
def export_all(request: HttpRequest) -> HttpResponse:
    """Every chat of the user that is not in the trash, newest activity first, then the user's memories, as
    one JSON file: a POST starts writing it (chatapp/transfers.py) and opens its page, where it is
    downloaded when done; the GET page starts one, or shows the last. A new export replaces the user's last."""
    exports = Transfer.objects.for_user(request.user).filter(kind=Transfer.Kind.EXPORT).order_by("-created_at")
    if request.method == "POST":
        transfers.recover(exports)
        running = exports.exclude(status__in=FINISHED).first()
        if running is not None:
            return redirect("chat:transfer", running.transfer_id)
        transfers.discard(exports)
        transfer = Transfer.objects.create(owner=request.user, kind=Transfer.Kind.EXPORT)
        transaction.on_commit(lambda: transfers.start(transfer))
        return redirect("chat:transfer", transfer.transfer_id)
    return render(request, "chatapp/export.html", {"transfer": exports.first()})


FINISHED = (Transfer.Status.DONE, Transfer.Status.FAILED)


@login_required
@require_http_methods(["GET", "POST"])
@limit_posts((IMPORTS, by_user))
def import_chats(request: HttpRequest) -> HttpResponse:
    """A JSON file this app exported (one chat or all of them) becomes new chats of the user: stored here,
    then read, checked and written by a process of its own (chatapp/transfers.py), whose page the POST
    opens: all of the file or, with a message saying why, none of it."""
    imports = Transfer.objects.for_user(request.user).filter(kind=Transfer.Kind.IMPORT).order_by("-created_at")
    if request.method == "POST":
        transfers.recover(imports)
    running = imports.exclude(status__in=FINISHED).first()
    error = ""
    if request.method == "POST":
        upload = request.FILES.get("file")
        limit = settings.CHAT_IMPORT_MAX_BYTES
        if upload is None:
            error = "Choose a file to import."
        elif upload.size > limit:
            error = f"The file is {upload.size:,} bytes; the limit is {limit:,} (CHAT_IMPORT_MAX_BYTES)."
        elif running is not None:
            error = "An import of yours is still running: wait until it is done."
        else:
            transfer = Transfer.objects.create(owner=request.user, kind=Transfer.Kind.IMPORT)
            with transfers.upload_path(transfer).open("wb") as file:
                for chunk in upload.chunks():
                    file.write(chunk)
            transaction.on_commit(lambda: transfers.start(transfer))
            return redirect("chat:transfer", transfer.transfer_id)
    # A missing file is a bad request; a file refused for its size (or while another runs) is a 422.
    status = (422 if request.FILES.get("file") else 400) if error else 200
    return render(request, "chatapp/import.html", {"error": error, "running": running}, status=status)


@login_required
@require_GET
def transfer(request: HtmxHttpRequest, transfer_id: str) -> HttpResponse:
    """An import's or export's progress ("Importing 3,200 of 10,000 chats"), then how it went; the htmx
    request its page repeats while it runs gets the status fragment alone."""
    transfer = get_object_or_404(Transfer.objects.for_user(request.user), transfer_id=transfer_id)
    template = "chatapp/_transfer_status.html" if request.htmx else "chatapp/transfer.html"
    return render(request, template, {"transfer": transfer})


@login_required
@require_GET
def transfer_download(request: HttpRequest, transfer_id: str) -> StreamingHttpResponse:
    """A finished export's file."""
    transfer = get_object_or_404(Transfer.objects.for_user(request.user), kind=Transfer.Kind.EXPORT,
                                 status=Transfer.Status.DONE, transfer_id=transfer_id)
    path = transfers.export_path(transfer)
    if not path.exists():
        raise Http404("This export's file is gone.")
    response = _download(_file_parts(path), "application/json", transfer.filename)
    response["Content-Length"] = str(path.stat().st_size)
    return response


async def _file_parts(path) -> AsyncIterator[bytes]:
    """A file a part at a time, each read on a thread (under ASGI a sync iterator would be read whole first)."""
    with path.open("rb") as file:
        while part := await asyncio.to_thread(file.read, FILE_PART_BYTES):
            yield part


FILE_PART_BYTES = 1 << 20
