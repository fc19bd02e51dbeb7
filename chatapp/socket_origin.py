"""The socket's Origin check: a page of this site, and nothing else, may open a socket.

Channels' `AllowedHostsOriginValidator` compares the Origin's host name with ALLOWED_HOSTS only, so a page
served from another port or scheme of an allowed host (another app on the same machine) could open a
socket with the user's cookie. `SameOriginValidator` also requires the Origin's scheme, host and port to
be the request's own (its Host header, and http for ws, https for wss), as Django's CSRF check requires of
a POST, or one of CSRF_TRUSTED_ORIGINS.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of `scheme://netloc`, or None if it is not one."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.password is not None or port is None:
        return None
    return scheme, parts.hostname, port


def same_origin(scope: dict) -> bool:
    headers = dict(scope.get("headers", ()))
    origin = headers.get(b"origin", b"").decode("latin-1")
    host = headers.get(b"host", b"").decode("latin-1")
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return False
    claimed = _origin(parts.scheme, parts.netloc)
    if claimed is None:
        return False
    own = _origin("https" if scope.get("scheme") in ("wss", "https") else "http", host)
    trusted = {_origin(*trusted.split("://", 1)) for trusted in settings.CSRF_TRUSTED_ORIGINS if "://" in trusted}
    return claimed == own or claimed in trusted


class SameOriginValidator:
    """ASGI middleware: a socket whose Origin is not the site's own is refused (403) before it is accepted."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not same_origin(scope):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
