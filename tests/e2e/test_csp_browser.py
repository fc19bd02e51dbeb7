"""The Content-Security-Policy breaks nothing: every kind of page, a streamed reply with a tool call, the
state panel's editor and the admin, in Chromium, with not one violation reported."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.e2e.conftest import log_in
from tests.support.factories import make_run, make_session
from tests.support.llm_server import Text, ToolCalls, summary_responder

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_no_page_breaks_the_policy(context, daphne_server, llm_server):
    llm_server.side_responder = summary_responder
    llm_server.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added **milk** to the list."), Text("Milk"))
    staff = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    session = make_session(staff, component_id="shopping", name="Groceries", name_source="user")
    make_run(session, "hello", "Hi! `code` and **bold**.")
    log_in(context, daphne_server.url, staff)
    page = context.new_page()
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text)
            if "Content Security Policy" in message.text else None)

    page.goto(f"{daphne_server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)  # the scripts ran, the socket is up
    page.locator("#composer-text").fill("add milk")
    page.locator("#composer-text").press("Enter")
    expect(page.locator("#transcript")).to_contain_text("Added milk to the list.")
    expect(page.locator("#state-panel")).to_contain_text("milk")
    for path in ("/new/", "/trash/", "/import/", "/admin/", "/admin/sessions_core/chatsession/",
                 f"/admin/sessions_core/chatsession/{session.pk}/change/",
                 f"/admin/sessions_core/chatsession/{session.pk}/transcript/",
                 "/admin/sessions_core/chatsession/usage/"):
        response = page.goto(f"{daphne_server.url}{path}")
        assert response.status == 200, path
    page.goto(f"{daphne_server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    assert violations == []



def csp_violations(page) -> list[str]:
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text)
            if "Content Security Policy" in message.text else None)
    return violations


def test_an_aligned_table_and_a_resized_editor_updated_from_another_tab_break_nothing(context, daphne_server,
                                                                                       llm_server):
    """A reply's table with aligned columns; the state editor resized by hand (the browser writes its size as
    an inline style) while another tab saves the state: htmx's settle once copied that style across."""
    llm_server.add(Text("| item | qty |\n|:-----|----:|\n| milk | 2 |"))
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    session = make_session(alice, component_id="shopping", name="Groceries", name_source="user",
                           session_state={"shopping_list": ["bread"]})
    log_in(context, daphne_server.url, alice)
    page, other = context.new_page(), context.new_page()
    violations = csp_violations(page)
    for tab in (page, other):
        tab.goto(f"{daphne_server.url}/s/{session.session_id}/")
        expect(tab.locator(".session-area[data-live='open']")).to_have_count(1)
    page.locator("#composer-text").fill("how many?")
    page.locator("#composer-text").press("Enter")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")
    cell = page.locator("#transcript .reply td").last
    expect(cell).to_have_text("2")
    expect(cell).to_have_css("text-align", "right")

    page.get_by_text("Edit as JSON").click()
    page.locator("#state-json").evaluate("box => box.style.height = '300px'")  # as a drag of its corner does
    other.get_by_text("Edit as JSON").click()
    other.locator("#state-json").fill('{"shopping_list": ["bread", "jam"]}')
    other.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-version")).to_have_text("v1")
    assert violations == []


def test_a_days_use_breaks_the_policy_nowhere(context, daphne_server, llm_server):
    """The moments the console once reported inline styles at: a new chat's first reply, a regenerate, a
    switch between versions, an edit run again, a refused (stale) state save."""
    from tests.e2e.test_branch_browser import adds

    llm_server.responder = adds
    alice = get_user_model().objects.create_user("alice", password="pw-alice-123")
    log_in(context, daphne_server.url, alice)
    page = context.new_page()
    violations = csp_violations(page)

    page.goto(f"{daphne_server.url}/new/")
    page.locator("#assistant-picker").select_option("shopping")
    page.locator("#composer-text").fill("add milk")
    page.locator("#composer-text").press("Enter")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#transcript .run[data-status='completed']")).to_have_count(1)
    expect(page.locator("#state-panel .state-tree")).to_contain_text("milk")
    run = page.locator("#transcript .run").last
    run.locator(".regenerate").click()
    expect(run.locator(".branch-number")).to_have_text("2/2")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")
    page.locator("#transcript .run").last.get_by_role("button", name="Previous version").click()
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("1/2")
    page.locator("#transcript .run").last.locator(".edit-run").click()
    box = page.locator("#transcript .run").last.locator(".edit-form textarea")
    box.fill("add bread")
    box.press("Enter")
    expect(page.locator("#transcript .run").last.locator(".branch-number")).to_have_text("3/3")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")

    page.get_by_text("Edit as JSON").click()
    page.locator("#state-json").fill('{"shopping_list": ["tea"]}')
    page.locator("#state-edit input[name=version]").evaluate("input => input.value = '1'")  # stale
    page.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-panel .form-error")).to_have_count(1)
    page.reload()
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    assert violations == []
