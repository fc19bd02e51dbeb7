"""The Content-Security-Policy breaks nothing: every kind of page, a streamed reply with a tool call, the
state panel's editor and the admin, in Chromium, with not one violation reported."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tests.e2e.conftest import log_in
from tests.factories import make_run, make_session
from tests.llm_server import Text, ToolCalls, summary_responder

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
