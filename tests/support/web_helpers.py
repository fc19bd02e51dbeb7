"""Helpers for the web tests: personas, htmx requests, and reading what views broadcast."""

from __future__ import annotations

import re

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import TestCase, override_settings

from tests.support.factories import make_session, make_user

HX = {"HX-Request": "true"}
# Tests log users in many times; the real hasher's million rounds would dominate the run time.
FAST_HASHERS = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])


def item_ids(html: str) -> list[int]:
    """Session pks of the sidebar rows in `html`, in document order."""
    return [int(pk) for pk in re.findall(r'<li id="session-item-(\d+)"', html)]


def headings(html: str) -> list[str]:
    return re.findall(r'<li class="group-label"[^>]*>([^<]+)</li>', html)


class GroupListener:
    """Joins a channel-layer group and hands back what was sent to it (in-memory layer)."""

    def __init__(self, group: str):
        self.layer = get_channel_layer()
        self.channel = async_to_sync(self.layer.new_channel)()
        async_to_sync(self.layer.group_add)(group, self.channel)

    def html(self) -> list[str]:
        """Every `chat.html` payload received so far (the queue is read without waiting)."""
        queue = self.layer.channels.get(self.channel)
        out = []
        while queue is not None and not queue.empty():
            message = queue.get_nowait()[1]
            assert message["type"] == "chat.html"
            out.append(message["html"])
        return out


@FAST_HASHERS
class WebTestCase(TestCase):
    """Alice owns a session; Bob is the other user (the IDOR check)."""

    def setUp(self):
        async_to_sync(get_channel_layer().flush)()
        self.alice = make_user("alice")
        self.bob = make_user("bob", password="pw-bob-123")
        self.session = make_session(owner=self.alice, name="Groceries", component_id="shopping")
        self.client.force_login(self.alice)

    def hx_get(self, url, **extra):
        return self.client.get(url, headers={**HX, **extra.pop("headers", {})}, **extra)

    def hx_post(self, url, data=None, **extra):
        return self.client.post(url, data or {}, headers={**HX, **extra.pop("headers", {})}, **extra)
