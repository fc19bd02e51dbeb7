"""Branches in headless Chromium: regenerate, the 2/3 arrows with the state panel following, edit and
rerun, a reload and a second tab."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import log_in
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text, ToolCalls

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def adds(body):
    messages = body["messages"]
    if "at most five words" in (messages[0].get("content") or ""):
        return Text("Shopping")
    if messages[-1]["role"] == "tool":
        return Text(f"ok: {messages[-1]['content']}")
    return ToolCalls([("add_item", {"item": messages[-1]["content"].split()[-1]})])


def open_chat(page, server, session):
    page.goto(f"{server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)


def send(page, text: str):
    page.locator("#composer-text").fill(text)
    page.locator("#composer-text").press("Enter")


def test_regenerate_switch_back_edit_and_rerun_with_the_state_following(page, context, daphne_server, llm_server,
                                                                      screenshots):
    llm_server.responder = adds
    alice = make_user("alice", "pw-alice-123")
    session = make_session(alice, component_id="shopping")
    log_in(context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    other = context.new_page()  # a second tab on the same chat
    open_chat(other, daphne_server, session)

    send(page, "add milk")
    expect(page.locator("#transcript .run[data-status='completed']")).to_have_count(1)
    send(page, "add eggs")
    expect(page.locator("#transcript .run[data-status='completed']")).to_have_count(2)
    state = page.locator("#state-panel .state-tree")
    expect(state).to_contain_text("eggs")

    last = page.locator("#transcript .run").last
    last.locator(".regenerate").click()
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("2/2")
    expect(page.locator("#transcript .run")).to_have_count(2)
    expect(other.locator("#transcript .run").last.locator(".branch-number")).to_have_text("2/2")

    page.locator("#transcript .run").last.locator(".edit-run").click()
    box = page.locator("#transcript .run").last.locator(".edit-form textarea")
    expect(box).to_have_value("add eggs")
    box.fill("add bread")
    box.press("Enter")
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("3/3")
    expect(page.locator("#transcript .run").last.locator(".message-text")).to_have_text("add bread")
    expect(state).to_contain_text("bread")
    expect(state).not_to_contain_text("eggs")
    page.screenshot(path=str(screenshots / "branches-edited.png"))

    page.locator("#transcript .run").last.get_by_role("button", name="Previous version").click()
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("2/3")
    expect(page.locator("#state-panel .state-tree")).to_contain_text("eggs")  # the state follows the branch
    expect(page.locator("#state-panel .state-tree")).not_to_contain_text("bread")
    expect(other.locator("#transcript .run").last.locator(".message-text")).to_have_text("add eggs")
    expect(other.locator("#state-panel .state-tree")).to_contain_text("eggs")

    page.reload()
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("2/3")
    expect(page.locator("#transcript .run").last.locator(".message-text")).to_have_text("add eggs")

    # The keyboard: Up in an empty composer edits the last message (Esc cancels), Alt+R regenerates.
    page.locator("#composer-text").focus()
    page.keyboard.press("ArrowUp")
    editing = page.locator("#transcript .run").last.locator(".edit-form")
    expect(editing).to_be_visible()
    expect(editing.locator("textarea")).to_be_focused()
    page.keyboard.press("Escape")
    expect(editing).to_be_hidden()
    page.locator("#composer-text").focus()
    page.keyboard.press("Alt+r")
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("4/4")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")

    # Fork from the first reply: a new chat with that exchange and the state as of it.
    page.locator("#transcript .run").first.locator(".fork").click()
    expect(page).not_to_have_url(f"{daphne_server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#transcript .run")).to_have_count(1)
    expect(page.locator("#transcript .run .message-text")).to_have_text("add milk")
    expect(page.locator("#state-panel .state-tree")).to_contain_text("milk")
    expect(page.locator("#state-panel .state-tree")).not_to_contain_text("eggs")


def test_the_editor_takes_the_messages_place_and_the_version_arrows_are_easy_targets(page, context, daphne_server,
                                                                                    llm_server):
    llm_server.responder = adds
    alice = make_user("alice", "pw-alice-123")
    session = make_session(alice, component_id="shopping")
    log_in(context, daphne_server.url, alice)
    page.set_viewport_size({"width": 1400, "height": 900})
    open_chat(page, daphne_server, session)
    send(page, "add milk")
    long = "please remember that we are out of many things this week and " * 6 + "add eggs"
    send(page, long)
    expect(page.locator("#transcript .run[data-status='completed']")).to_have_count(2)

    for run in page.locator("#transcript .run").all():  # Edit is under the bubble, short message or long
        bubble, edit = run.locator(".message-text").bounding_box(), run.locator(".edit-run").bounding_box()
        assert edit["y"] >= bubble["y"] + bubble["height"] and edit["x"] == pytest.approx(bubble["x"], abs=1)

    last = page.locator("#transcript .run").last
    last.locator(".edit-run").click()
    form = last.locator(".edit-form")
    expect(form.locator("textarea")).to_be_focused()
    expect(last.locator(".message-text")).to_be_hidden()  # the text is in the editor, not twice on the page
    expect(last.locator(".edit-run")).to_be_hidden()
    save, cancel = form.get_by_role("button", name="Save & rerun").bounding_box(), form.get_by_role(
        "button", name="Cancel").bounding_box()
    width = form.bounding_box()["width"]
    assert save["y"] == pytest.approx(cancel["y"], abs=1) and save["width"] + cancel["width"] < width / 2
    page.keyboard.press("Escape")
    expect(last.locator(".message-text")).to_be_visible()
    expect(last.locator(".edit-run")).to_be_focused()

    last.locator(".regenerate").click()
    expect(page.locator("#transcript .run").last.locator(".branch-number").last).to_have_text("2/2")
    for arrow in page.locator("#transcript .run").last.locator(".branch-switch").all():
        box = arrow.bounding_box()
        assert box["width"] >= 32 and box["height"] >= 32
