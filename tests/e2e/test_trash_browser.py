"""The trash in Chromium (issue 42): a chat in it is wholly read-only, its page is reached from the trash's
titles, and "Empty trash" deletes the user's trashed chats, after a confirmation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from sessions_core.models import ChatSession, RunStatus
from tests.e2e.conftest import log_in
from tests.support.factories import make_run, make_session, make_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def test_a_chat_in_the_trash_opens_from_the_trash_wholly_read_only(page, daphne_server):
    alice = make_user("alice")
    make_session(alice, component_id="general", name="Still here", name_source="user")
    session = make_session(alice, component_id="shopping", name="Old list", name_source="user",
                           session_state={"shopping_list": ["milk"]})
    make_run(session, "add milk", "Added milk.")
    make_run(session, "add eggs", None, status=RunStatus.ERROR)
    ChatSession.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in(page.context, daphne_server.url, alice)

    page.goto(f"{daphne_server.url}/trash/")
    item = page.locator(".trash-item")
    expect(item.locator("time")).to_have_text("deleted just now")
    item.get_by_role("link", name="Old list").click()
    expect(page).to_have_url(f"{daphne_server.url}/s/{session.session_id}/")
    expect(page.locator(".banner")).to_contain_text("in the trash")
    expect(page.locator("#transcript")).to_contain_text("Added milk.")
    transcript = page.locator("#transcript")
    for name in ("Regenerate", "Fork to a new chat", "Retry", "Edit this message and run it again"):
        expect(transcript.get_by_role("button", name=name)).to_have_count(0)
    expect(page.locator("#state-panel")).to_contain_text("milk")
    expect(page.locator("#state-panel")).not_to_contain_text("Edit as JSON")
    expect(page.locator("#state-panel")).to_contain_text("restore it to edit its state")
    send = page.get_by_role("button", name="Send")
    expect(send).to_be_disabled()
    assert float(send.evaluate("button => getComputedStyle(button).opacity")) < 0.6  # and looks it
    expect(page.locator("#composer-text")).to_be_disabled()
    assert sockets == []
    page.get_by_role("link", name="Back to the trash").click()
    expect(page.locator("#trash-heading")).to_have_text("Trash")


def test_empty_trash_asks_first_then_deletes_the_trashed_chats_only(page, daphne_server):
    alice = make_user("alice")
    live = make_session(alice, component_id="general", name="Keep me", name_source="user")
    for name, ago in (("Old one", timedelta(days=2)), ("Newer one", timedelta(minutes=3))):
        trashed = make_session(alice, component_id="general", name=name, name_source="user")
        make_run(trashed, "hello", "Hi.")
        ChatSession.objects.filter(pk=trashed.pk).update(deleted_at=timezone.now() - ago)
    bob = make_user("bob", "pw-bob-123")
    bobs = make_session(bob, component_id="general", name="Bob's", deleted_at=timezone.now())
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/trash/")
    expect(page.locator(".trash-item time")).to_have_text(["deleted 3\xa0minutes ago", "deleted 2\xa0days ago"])

    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.get_by_role("button", name="Empty trash").click()
    expect(page.locator(".trash-item")).to_have_count(2)  # dismissed: nothing deleted
    assert asked == ["Empty the trash? Every chat in it will be deleted for good. This cannot be undone."]
    assert ChatSession.objects.filter(owner=alice).count() == 3

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Empty trash").click()
    expect(page.get_by_role("status")).to_have_text("Deleted 2 chats for good.")
    expect(page.locator(".trash-empty")).to_have_text("The trash is empty.")
    expect(page.get_by_role("button", name="Empty trash")).to_have_count(0)
    assert set(ChatSession.objects.values_list("pk", flat=True)) == {live.pk, bobs.pk}
