"""Push HTML to every socket of a user or of a session through the channel layer.

The consumer forwards `chat.html` payloads to the browser as they are (htmx out-of-band swaps), so
what a view or a run task sends here is what every open tab swaps in. Sync views use
`broadcast_to_user` / `broadcast_to_session`; async code (the run tasks, titles) uses
`abroadcast_to_user`, `abroadcast_to_session`, `asend_to_session` (a typed event), `push_session_row` (as
stored) and `push_row` (as in hand).
"""

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from sessions_core.models import ChatSession

from . import rendering


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def session_group(session_pk: int) -> str:
    return f"session.{session_pk}"


def broadcast_to_user(user_id: int, html: str) -> None:
    async_to_sync(get_channel_layer().group_send)(user_group(user_id), {"type": "chat.html", "html": html})


def broadcast_to_session(session_pk: int, html: str) -> None:
    async_to_sync(get_channel_layer().group_send)(session_group(session_pk), {"type": "chat.html", "html": html})


async def abroadcast_to_user(user_id: int, html: str) -> None:
    await get_channel_layer().group_send(user_group(user_id), {"type": "chat.html", "html": html})


async def abroadcast_to_session(session_pk: int, html: str) -> None:
    await asend_to_session(session_pk, "chat.html", html=html)


async def asend_to_session(session_pk: int, event_type: str, **payload) -> None:
    """A typed layer event (`chat.tokens`, `chat.run`, ...) to every socket of a session."""
    await get_channel_layer().group_send(session_group(session_pk), {"type": event_type, **payload})


def _row_html(session: ChatSession, to_top: bool) -> str:
    """The session's sidebar row, replaced in place or moved to the top of its group."""
    if to_top:
        return rendering.render_session_item_to_top(session)
    return rendering.render_session_item(session, oob="true")


def session_row_html(session_pk: int, owner_pk: int | None, to_top: bool = False) -> str:
    """The session's sidebar row as stored. Reads the database."""
    return _row_html(ChatSession.objects.for_user(owner_pk).for_sidebar().get(pk=session_pk), to_top)


async def push_session_row(session_pk: int, owner_pk: int | None, to_top: bool = False) -> None:
    """The session's sidebar row, re-rendered as stored, to every tab of its owner."""
    if owner_pk is not None:
        await abroadcast_to_user(owner_pk, await sync_to_async(session_row_html)(session_pk, owner_pk, to_top))


async def push_row(session: ChatSession, to_top: bool = False) -> None:
    """The sidebar row of `session` as it is in hand (a run task keeps it as its run stores it), to every
    tab of its owner: rendered here, without a query or a trip to the database thread."""
    if session.owner_id is not None:
        await abroadcast_to_user(session.owner_id, _row_html(session, to_top))
