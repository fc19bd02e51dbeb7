"""Push HTML to every socket of a user or of a session through the channel layer.

The consumer forwards `chat.html` payloads to the browser as they are (htmx out-of-band swaps), so
what a view or a run task sends here is what every open tab swaps in. Views are sync and use
`broadcast_to_user` / `broadcast_to_session`; async code (the run tasks) uses the `a…` twins.
"""

import re
from html import escape

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def session_group(session_pk: int) -> str:
    return f"session.{session_pk}"


def sync_group(session_pk: int) -> str:
    """Joined only by the run task that owns a session's live run (catch-up and stop requests)."""
    return f"session.{session_pk}.sync"


def broadcast_to_user(user_id: int, html: str) -> None:
    async_to_sync(get_channel_layer().group_send)(user_group(user_id), {"type": "chat.html", "html": html})


def broadcast_to_session(session_pk: int, html: str) -> None:
    async_to_sync(get_channel_layer().group_send)(session_group(session_pk), {"type": "chat.html", "html": html})


async def abroadcast_to_user(user_id: int, html: str) -> None:
    await get_channel_layer().group_send(user_group(user_id), {"type": "chat.html", "html": html})


async def abroadcast_to_session(session_pk: int, html: str) -> None:
    await get_channel_layer().group_send(session_group(session_pk), {"type": "chat.html", "html": html})


async def asend_to_session(session_pk: int, event_type: str, **payload) -> None:
    """A typed layer event (`chat.tokens`, `chat.run`, ...) to every socket of a session."""
    await get_channel_layer().group_send(session_group(session_pk), {"type": event_type, **payload})


_FIRST_TAG = re.compile(r"^\s*<([A-Za-z][\w-]*)")


def oob(html: str, swap: str = "true") -> str:
    """`html` with `hx-swap-oob="<swap>"` on its first element (a fragment replacing itself by id)."""
    html = str(html)
    match = _FIRST_TAG.match(html)
    if match is None:
        raise ValueError("oob() needs HTML that starts with an element")
    return f'{html[:match.end()]} hx-swap-oob="{escape(swap)}"{html[match.end():]}'


def oob_wrap(html: str, swap: str) -> str:
    """`html` inside a wrapper whose children are swapped in, e.g. swap="beforeend:#transcript"."""
    return f'<div hx-swap-oob="{escape(swap)}">{html}</div>'
