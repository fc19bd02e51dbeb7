"""Every URL of the chat, as another user, as an anonymous visitor and without the CSRF token: another
user's session is a 404 and stays as it was, a visitor is sent to log in, a POST without the token is
refused and writes nothing, and a GET writes nothing at all."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, reverse
from django.utils import timezone

from chatapp import urls as chat_urls
from sessions_core.models import ChatSession, Run, RunStatus
from tests.support.factories import make_run, make_session, make_user
from tests.support.web_helpers import HX


@pytest.fixture(autouse=True)
def _fast_hashers(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# Every URL that names a session: (method, url name, POST data or GET query).
SESSION_URLS = [
    ("get", "chat:session", {}),
    ("get", "chat:transcript_hx", {"before": "999999"}),
    ("post", "chat:session_version", {"run_id": "x"}),
    ("post", "chat:session_rename_hx", {"name": "Mine now"}),
    ("post", "chat:session_pin_hx", {"pinned": "1"}),
    ("post", "chat:session_delete_hx", {}),
    ("post", "chat:session_restore_hx", {}),
    ("post", "chat:session_destroy_hx", {}),
    ("post", "chat:session_retitle_hx", {}),
    ("get", "chat:state_panel_hx", {}),
    ("post", "chat:state_edit_hx", {"state": '{"taken": true}', "version": "0"}),
    ("get", "chat:state_version_hx", {}),
    ("get", "chat:session_export_markdown", {}),
    ("get", "chat:session_export_json", {}),
]


OTHER_URLS = [
    ("get", "chat:index", {}),
    ("get", "chat:new", {}),
    ("post", "chat:new", {"assistant": "general", "text": "hello"}),
    ("get", "chat:trash", {}),
    ("post", "chat:trash_empty_hx", {"upto": "2100-01-01T00:00:00+00:00"}),
    ("get", "chat:export_all", {}),
    ("get", "chat:import", {}),
    ("get", "chat:session_list_hx", {}),
    ("get", "chat:search_hx", {"q": "x"}),
]


def session_url(name: str, session: ChatSession) -> str:
    args = [session.session_id, 0] if name == "chat:state_version_hx" else [session.session_id]
    return reverse(name, args=args)


def test_every_session_url_is_in_the_ownership_list():
    """A new session URL must be added to SESSION_URLS, so the 404/CSRF/login checks cover it."""
    named = {f"chat:{p.name}" for p in chat_urls.chat_patterns
             if isinstance(p, URLPattern) and "session_id" in p.pattern.regex.pattern}
    assert named == {name for _, name, _ in SESSION_URLS}


@pytest.fixture
def alice_bob(db):
    alice, bob = make_user("alice"), make_user("bob", password="pw-bob-123")
    bobs = make_session(owner=bob, name="Bob's secret", session_state={"secret": 1}, state_version=0)
    make_run(bobs, user_text="private", reply="private reply")
    return alice, bob, bobs


@pytest.mark.parametrize(("method", "name", "data"), SESSION_URLS)
@pytest.mark.parametrize("htmx", [False, True])
def test_another_users_session_is_a_404_and_untouched(client, alice_bob, method, name, data, htmx):
    alice, bob, bobs = alice_bob
    if name in ("chat:session_restore_hx", "chat:session_destroy_hx"):
        ChatSession.objects.filter(pk=bobs.pk).update(deleted_at=timezone.now())
    client.force_login(alice)
    response = getattr(client, method)(session_url(name, bobs), data, headers=HX if htmx else {})
    assert response.status_code == 404
    bobs_now = ChatSession.objects.get(pk=bobs.pk)
    assert (bobs_now.name, bobs_now.name_source, bobs_now.pinned_at) == ("Bob's secret", "", None)
    assert bobs_now.session_state == {"secret": 1} and bobs_now.state_version == 0
    assert b"private" not in response.content


async def read_stream(response) -> bytes:
    return b"".join([part async for part in response.streaming_content])


GET_URLS = [(name, data) for method, name, data in SESSION_URLS + OTHER_URLS if method == "get"]
WRITES = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
FTS5_INDEX = re.compile(r"\bsessions_core_message_fts(_mark)?\b")


@pytest.mark.parametrize(("name", "data"), GET_URLS)
def test_a_get_writes_nothing(client, db, name, data):
    """A GET reads: a page over a run whose process stopped shows it interrupted without storing it, and
    `?run=` on another version offers it without switching. The one write allowed is SQLite's search
    index catching up with new messages (derived data, sessions_core.search.fts5)."""
    alice = make_user("alice")
    session = make_session(owner=alice, name="Groceries", session_state={"list": ["milk"]}, state_version=0)
    earlier = make_run(session, user_text="add milk", reply="Added milk.")
    make_run(session, user_text="add eggs", reply=None, status=RunStatus.RUNNING)  # its process stopped
    client.force_login(alice)
    url = session_url(name, session) if any(name == n for _, n, _ in SESSION_URLS) else reverse(name)
    query = {"run": earlier.run_id} if name == "chat:session" else data
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, query)
        if response.streaming:  # an export: its queries run as it is read
            async_to_sync(read_stream)(response)
    assert response.status_code in (200, 302)
    writes = [q["sql"] for q in queries if WRITES.match(q["sql"]) and not FTS5_INDEX.search(q["sql"])]
    assert writes == []
    assert Run.objects.filter(session=session, status=RunStatus.RUNNING).count() == 1


@pytest.mark.parametrize(("method", "name", "data"), SESSION_URLS + OTHER_URLS)
def test_anonymous_users_are_sent_to_log_in(client, alice_bob, method, name, data):
    _, _, bobs = alice_bob
    url = session_url(name, bobs) if (method, name, data) in SESSION_URLS else reverse(name)
    response = getattr(client, method)(url, data)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")
    assert ChatSession.objects.get(pk=bobs.pk).name == "Bob's secret"


POST_URLS = [(name, data) for method, name, data in SESSION_URLS if method == "post"]


OTHER_POST_URLS = [(name, data) for method, name, data in OTHER_URLS if method == "post"]


@pytest.mark.parametrize(("name", "data"), POST_URLS + OTHER_POST_URLS)
def test_every_post_needs_the_csrf_token(db, name, data):
    alice = make_user("alice")
    session = make_session(owner=alice, name="Mine", deleted_at=timezone.now() if name.endswith("destroy_hx") else None)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    url = reverse(name) if (name, data) in OTHER_POST_URLS else session_url(name, session)
    before = ChatSession.objects.count()
    assert client.post(url, data, headers=HX).status_code == 403
    assert ChatSession.objects.count() == before
    assert ChatSession.objects.get(pk=session.pk).name == "Mine"
    # The page hands out the token; htmx sends it back in the header set on <body>.
    page = client.get(reverse("chat:session", args=[session.session_id]) if name != "chat:new" else reverse("chat:new"))
    token = page.cookies["csrftoken"].value
    assert 'hx-headers=\'{"X-CSRFToken": "' in page.content.decode()
    assert client.post(url, data, headers={**HX, "X-CSRFToken": token}).status_code != 403


@pytest.mark.parametrize("url_name", ["logout", "signup", "login"])
def test_account_posts_need_the_csrf_token(db, url_name):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("alice"))
    assert client.post(reverse(url_name), {"username": "x", "password": "y"}).status_code == 403
