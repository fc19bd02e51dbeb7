"""Downloads: one session as Markdown or JSON, or all of a user's chats as JSON (sessions_core.export)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from itertools import islice

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET

from sessions_core import export
from sessions_core.models import ChatSession

from ..assistants import assistant_name
from .common import owned_session


STREAM_PARTS = 64  # parts (a run each, in JSON) read from the database per trip to Django's sync thread


async def _streamed(parts: Iterator[str]) -> AsyncIterator[str]:
    """A generator that reads the database, served under ASGI a batch at a time: given as it is,
    Django would read it all into memory first (it consumes a sync iterator with list())."""
    take = sync_to_async(lambda: list(islice(parts, STREAM_PARTS)))
    while batch := await take():
        yield "".join(batch)


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
    """Every chat of the user that is not in the trash, newest activity first."""
    now = timezone.now()
    sessions = ChatSession.objects.for_user(request.user).alive().order_by("-last_activity_at", "-id")
    parts = export.export_all_json(sessions.iterator(chunk_size=100), request.user.get_username(), now)
    return _download(parts, "application/json", f"chats-{slugify(request.user.get_username())}-{now:%Y%m%d}.json")
