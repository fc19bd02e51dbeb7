"""Sidebar search in headless Chromium: Ctrl+K, title hits first, highlighted message hits, a click lands on the run."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import log_in
from tests.support.factories import make_run, make_session, make_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def test_search_finds_titles_then_messages_and_opens_the_matching_run(page, daphne_server):
    alice = make_user("alice")
    recipes = make_session(alice, component_id="general", name="Pasta recipes", name_source="user")
    make_run(recipes, "what sauce goes with penne?", "Arrabbiata is a classic.")
    trip = make_session(alice, component_id="general", name="Weekend trip", name_source="user")
    make_run(trip, "pasta or rice?", "Either.")
    run = make_run(trip, "remind me to buy pasta for the <b>trip</b>", "Noted.")
    bob = make_session(make_user("bob"), component_id="general", name="Bob's pasta", name_source="user")
    make_run(bob, "pasta secrets", "none")
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/s/{recipes.session_id}/")

    page.keyboard.press("Control+k")
    field = page.locator("#session-filter")
    expect(field).to_be_focused()
    field.fill("pasta")
    results = page.locator("#session-filter-results")
    expect(results.locator(".title-hit")).to_have_count(1)
    expect(results.locator(".title-hit .hit-title")).to_have_text("Pasta recipes")
    hit = results.locator(".message-hit", has_text="remind me")
    expect(hit.locator("mark").first).to_have_text(re.compile("pasta", re.I))
    expect(hit.locator(".hit-snippet")).to_contain_text("<b>trip</b>")  # user text shown, not rendered
    expect(results.locator(".message-hit", has_text="Weekend trip")).to_have_count(1)  # its newest match
    expect(hit.locator(".hit-meta")).to_contain_text("1 more match in this chat")
    expect(results).not_to_contain_text("Bob's pasta")
    headings = results.locator(".search-heading h3").all_inner_texts()
    assert [h.lower() for h in headings] == ["chats", "messages"]

    # The results take the list's room: the sidebar's footer stays at the bottom of the window.
    footer = page.locator(".sidebar-bottom").bounding_box()
    assert footer["y"] + footer["height"] == pytest.approx(page.viewport_size["height"], abs=2)

    hit.first.locator("a").click()
    expect(page).to_have_url(re.compile(rf"/s/{trip.session_id}/\?run={run.run_id}#run-{run.run_id}$"))
    expect(page.locator(f"#run-{run.run_id}")).to_be_visible()


def test_a_hit_in_an_old_run_loads_earlier_pages_until_the_run_is_shown(page, daphne_server):
    alice = make_user("alice")
    long_chat = make_session(alice, component_id="general", name="Long chat", name_source="user")
    old = make_run(long_chat, "the zeppelin question", "An old answer.")
    for index in range(120):  # more than two pages of the transcript after it
        make_run(long_chat, f"question {index}", f"answer {index}")
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/s/{long_chat.session_id}/")
    expect(page.locator(f"#run-{old.run_id}")).to_have_count(0)  # not on the first page

    page.locator("#session-filter").fill("zeppelin")
    page.locator("#session-filter-results .message-hit a").first.click()
    linked = page.locator(f"#run-{old.run_id}")
    expect(linked).to_be_visible()
    expect(linked).to_have_class(re.compile(r"\blinked\b"))
    expect(linked).to_be_in_viewport()


def test_a_hit_on_another_version_of_the_chat_is_offered_and_shown_on_request(page, daphne_server):
    from sessions_core.models import ChatSession, Run

    alice = make_user("alice")
    chat = make_session(alice, component_id="general", name="Groceries", name_source="user")
    first = make_run(chat, "add milk", "Added milk.")
    eggs = make_run(chat, "add eggs", "Added eggs.")
    Run.objects.filter(pk=eggs.pk).update(abandoned=True)  # edited and run again: another version
    ChatSession.objects.filter(pk=chat.pk).update(current_leaf=first)
    make_run(chat, "add bread", "Added bread.")
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/s/{chat.session_id}/")

    page.locator("#session-filter").fill("eggs")
    page.locator("#session-filter-results .message-hit a").first.click()
    banner = page.locator(".banner", has_text="is in another version of this chat")
    expect(banner).to_be_visible()
    expect(page.locator("#transcript")).to_contain_text("add bread")  # the page changed nothing
    banner.get_by_role("button", name="Show that version").click()
    expect(page.locator(f"#run-{eggs.run_id}")).to_be_visible()
    expect(page.locator("#transcript")).not_to_contain_text("add bread")
    expect(page.locator(".banner", has_text="another version")).to_have_count(0)
