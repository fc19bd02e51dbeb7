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


def transfer_of(response):
    """The Transfer whose page a POST (an import, an export) redirected to."""
    from chatapp.models import Transfer

    assert response.status_code == 302, response.status_code
    return Transfer.objects.get(transfer_id=response["Location"].rstrip("/").rsplit("/", 1)[-1])


def finished(started):
    """The Transfer a POST started (its response, or the Transfer), once its process (`manage.py transfer`,
    started by the view) has ended."""
    from chatapp import transfers
    from chatapp.models import Transfer

    transfer = started if isinstance(started, Transfer) else transfer_of(started)
    assert transfers._processes[transfer.pk].wait(timeout=120) == 0
    transfer.refresh_from_db()
    return transfer



def worked(response):
    """The Transfer a POST started, its work done here, as `manage.py transfer --work` does it (a TestCase's
    transaction never commits, so the view starts no process)."""
    from chatapp import transfers

    transfer = transfer_of(response)
    transfers.work(transfer)
    transfer.refresh_from_db()
    return transfer
