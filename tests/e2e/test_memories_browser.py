"""User memories in headless Chromium, on the offline model: a fact learnt in one chat is used in a new one,
shown under the reply that learnt it (with its undo) and on the Memories page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from sessions_core.user_memories import store
from tests.e2e.conftest import log_in
from tests.e2e.test_chat_browser import last_run, open_chat, send
from tests.support.factories import make_session, make_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def test_a_memory_learnt_in_one_chat_is_used_in_a_new_one(page, offline_daphne_server, screenshots):
    server = offline_daphne_server
    alice = make_user("alice")
    first = make_session(alice, component_id="general")
    log_in(page.context, server.url, alice)
    open_chat(page, server, first)
    send(page, "My name is Ana and I don't like olives")
    run = last_run(page)
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".reply")).to_contain_text("Nice to meet you, Ana!")
    # The memory work ends after the reply; its line arrives live.
    expect(run.locator(".memory-line")).to_contain_text("Remembered: The user's name is Ana")
    expect(run.locator(".memory-line")).to_contain_text("Remembered: The user does not like olives")

    second = make_session(alice, component_id="shopping")
    open_chat(page, server, second)
    send(page, "What's my name?")
    expect(last_run(page).locator(".reply")).to_have_text("Your name is Ana.")
    send(page, "add milk and olives")
    run = last_run(page)
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".reply")).to_contain_text("I left olives off: you don't like them.")
    expect(page.locator("#state-panel")).to_contain_text("milk")
    expect(page.locator("#state-panel")).not_to_contain_text("olives")
    expect(page.locator("#context-memories")).to_contain_text("The user does not like olives")  # beside the panel
    run.locator(".memories-used summary").click()
    expect(run.locator(".memories-used")).to_contain_text("The user does not like olives")
    page.screenshot(path=str(screenshots / "memories-used.png"))

    # The Memories page, from the sidebar: both memories, each linked to the reply that learnt it.
    page.get_by_role("link", name="Memories", exact=True).first.click()
    expect(page.locator(".memory-item")).to_have_count(2)
    expect(page.locator(".memory-source").first).to_have_attribute("href", f"/s/{first.session_id}/#run-"
                                                                   + store.list_memories(alice, "default")[0].run_id)
    page.screenshot(path=str(screenshots / "memories-page.png"))

    # Undo what the first reply remembered: both memories go.
    open_chat(page, server, first)
    run = last_run(page)
    run.get_by_role("button", name="Undo").click()
    expect(run.locator(".memory-line")).to_contain_text("(undone)")
    assert store.list_memories(alice, "default") == []
