"""Replies that wait for the user, in headless Chromium, by keyboard: a card in place of the reply, Alt+A to
it, Approve with Enter, a form refused by the browser until its field is right, a workflow step's review;
the card after a server restart; the answer in a tab of one server process updating a tab of another."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sessions_core.models import ChatSession, Run, RunStatus
from tests.e2e.conftest import Daphne, _server_env, log_in
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text, ToolCalls

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def open_chat(page, server, session: ChatSession):
    page.goto(f"{server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)


def send(page, text: str):
    page.locator("#composer-text").fill(text)
    page.locator("#composer-text").press("Enter")


def waiting_card(page):
    return page.locator('#transcript .requirements.is-waiting .requirement-card[data-outcome="waiting"]').last


def shopping_session(alice) -> ChatSession:
    return make_session(alice, component_id="approvals", name="Groceries", name_source="user",
                        session_state={"shopping_list": ["milk", "eggs"]})


def test_approve_and_a_form_by_keyboard(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = shopping_session(alice)
    llm_server.add(ToolCalls([("remove_item", {"item": "eggs"})]), Text("Removed eggs."),
                   ToolCalls([("schedule_delivery", {})]), Text("Your delivery is booked."))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "remove eggs")

    card = waiting_card(page)
    expect(card).to_be_visible()
    # For a screen reader: a named group, the status line says the reply waits; the tab and the sidebar say so.
    expect(page.get_by_role("group", name=re.compile("remove_item waits for your approval"))).to_be_visible()
    expect(page.locator("#run-status")).to_contain_text("The reply waits for your answer.")
    expect(page).to_have_title(re.compile(r"^\(Waiting\) Groceries"))
    expect(page.locator(f'.session-item[data-session-id="{session.session_id}"] .waiting-mark')).to_have_count(1)
    expect(card.locator(".requirement-args")).to_contain_text("eggs")

    page.keyboard.press("Alt+a")  # to the card: its note field, then Approve
    expect(card.locator('input[name="note"]')).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Approve")).to_be_focused()
    page.keyboard.press("Enter")
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".requirement-outcome")).to_contain_text(re.compile(r"Approved by you at \d\d:\d\d"))
    expect(run.locator(".reply")).to_have_text("Removed eggs.")
    expect(page).to_have_title(re.compile(r"^Groceries"))
    expect(page.locator(f'.session-item[data-session-id="{session.session_id}"] .waiting-mark')).to_have_count(0)
    expect(page.locator("#state-panel")).to_contain_text("Changed: shopping_list")  # the panel, live
    assert ChatSession.objects.get(pk=session.pk).session_state["shopping_list"] == ["milk"]

    # A form: the browser refuses it while its required date is empty; nothing is sent.
    page.locator("#composer-text").focus()
    send(page, "schedule the delivery")
    card = waiting_card(page)
    expect(card.locator('input[name="date"]')).to_be_visible()
    page.keyboard.press("Alt+a")
    date = card.locator('input[name="date"]')
    expect(date).to_be_focused()
    page.keyboard.press("Enter")
    assert date.evaluate("input => input.validity.valueMissing") is True
    expect(card).to_have_attribute("data-outcome", "waiting")
    assert Run.objects.filter(session=session, status=RunStatus.PAUSED).count() == 1
    date.fill("2026-12-24")
    page.keyboard.press("Enter")
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".requirement-outcome")).to_contain_text("Answered by you")
    expect(run.locator(".requirement-input")).to_contain_text("2026-12-24")
    assert ChatSession.objects.get(pk=session.pk).session_state["delivery"] == {"date": "2026-12-24", "items": 1}


def test_a_workflow_steps_review_rejected_with_a_note(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="reviewed-order", name="Order", name_source="user")
    llm_server.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "add milk")
    card = waiting_card(page)
    expect(card).to_contain_text("Step “Place order” waits for your review")
    expect(card).to_contain_text("Place the order for the items on the list?")
    page.keyboard.press("Alt+a")
    page.keyboard.type("not today")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Reject")).to_be_focused()
    page.keyboard.press("Enter")
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".requirement-outcome")).to_contain_text(re.compile(r"Rejected by you at \d\d:\d\d: not today"))
    assert "orders" not in ChatSession.objects.get(pk=session.pk).session_state  # the step was skipped


def test_the_card_survives_a_server_restart(page, django_db_setup, llm_server):
    env = _server_env(OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test", OPENAI_TIMEOUT="10")
    server = Daphne(env)
    restarted = None
    try:
        alice = make_user("alice")
        session = shopping_session(alice)
        llm_server.add(ToolCalls([("clear_list", {})]), Text("Cleared your list."))
        log_in(page.context, server.url, alice)
        open_chat(page, server, session)
        send(page, "clear the list")
        expect(waiting_card(page)).to_be_visible()
        server.kill()
        restarted = Daphne(env, port=server.port)
        page.reload()
        expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
        card = waiting_card(page)
        expect(card).to_contain_text("clear_list waits for your approval")
        page.keyboard.press("Alt+a")
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        run = page.locator("#transcript .run").last
        expect(run).to_have_attribute("data-status", "completed")
        expect(run.locator(".reply")).to_have_text("Cleared your list.")
        assert ChatSession.objects.get(pk=session.pk).session_state["shopping_list"] == []
    finally:
        if restarted is not None:
            restarted.stop()
        elif server.process.poll() is None:
            server.stop()


def test_an_answer_in_a_tab_of_one_process_updates_a_tab_of_another(context, daphne_pair, llm_server):
    first, second = daphne_pair
    alice = make_user("alice")
    session = shopping_session(alice)
    llm_server.add(ToolCalls([("remove_item", {"item": "milk"})]), Text("Removed milk."))
    log_in(context, first.url, alice)
    here, there = context.new_page(), context.new_page()
    open_chat(here, first, session)
    send(here, "remove milk")
    expect(waiting_card(here)).to_be_visible()
    open_chat(there, second, session)
    card = waiting_card(there)
    expect(card).to_be_visible()
    card.get_by_role("button", name="Approve").focus()
    there.keyboard.press("Enter")  # answered on the second process: the run goes on there
    for page in (here, there):
        run = page.locator("#transcript .run").last
        expect(run).to_have_attribute("data-status", "completed")
        expect(run.locator(".requirement-outcome")).to_contain_text("Approved by you")
        expect(run.locator(".reply")).to_have_text("Removed milk.")
