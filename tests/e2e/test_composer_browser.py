"""The composer in Chromium (issue 42): it grows with what is typed, counts the characters near the limit,
and never loses a message the limit refuses."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from sessions_core.models import Run
from tests.e2e.conftest import log_in
from tests.e2e.test_ux_browser import open_chat
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)

LIMIT = 20_000  # CHAT_MAX_MESSAGE_CHARS of the test server (the default)


def lines(count: int) -> str:
    return "\n".join(f"line {number}" for number in range(1, count + 1))


def test_the_composer_grows_with_the_text_up_to_a_height_then_scrolls(page, daphne_server, llm_server):
    page.set_viewport_size({"width": 1400, "height": 900})  # the max height is 40 % of it (360 px)
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Long messages", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    box = page.locator("#composer-text")
    empty = box.evaluate("box => box.offsetHeight")

    box.fill(lines(12))  # every line shown, none scrolled out of sight
    page.wait_for_function("""() => {
        const box = document.getElementById('composer-text');
        return box.offsetHeight > 200 && box.scrollHeight <= box.clientHeight;
    }""")
    box.fill(lines(80))  # then it stops at its max height and scrolls
    page.wait_for_function("""() => {
        const box = document.getElementById('composer-text');
        return box.scrollHeight > box.clientHeight
            && box.offsetHeight === parseFloat(getComputedStyle(box).maxHeight);
    }""")
    assert box.evaluate("box => box.offsetHeight") <= 900 * 0.4

    llm_server.add(Text("Read them all."))
    box.press("Enter")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")
    expect(box).to_have_value("")
    page.wait_for_function(f"() => document.getElementById('composer-text').offsetHeight === {empty}")


def test_a_message_over_the_limit_stays_in_the_box_with_a_count_near_the_limit(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Limits", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    box, count = page.locator("#composer-text"), page.locator("#composer-count")

    box.fill("x" * 17_000)
    expect(count).to_be_hidden()  # far from the limit: no count
    box.fill("😀" * 18_500)  # characters, as the server counts them (JavaScript's length is twice that)
    expect(count).to_have_text("1,500 characters left")
    expect(page.locator("#composer-count-said")).to_have_text("1,500 characters left")  # polite, once typing pauses
    expect(page.locator("#composer-count-said")).to_have_attribute("aria-live", "polite")

    text = "x" * (LIMIT + 50)
    box.fill(text)
    expect(count).to_have_text("50 characters over the limit of 20,000")
    expect(count).to_have_class("composer-count over")
    box.press("Enter")
    expect(page.locator("#run-status")).to_have_text("The message is 20,050 characters long; the limit is 20,000.")
    expect(box).to_have_value(text)  # kept, to be shortened
    expect(box).to_be_focused()
    page.get_by_role("button", name="Send").click()
    expect(box).to_have_value(text)
    page.reload()  # still the draft
    expect(box).to_have_value(text)
    assert not Run.objects.exists()
