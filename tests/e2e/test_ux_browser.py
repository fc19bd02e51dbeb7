"""What only a browser sees of the day-of-use bugs (issue 13): the state editor after a save, a chat in
the trash, deleting the open chat, "Load earlier", the tab title, rename on blur, console errors (the
Undo toast's own timeout is in test_chat_browser's test_delete_and_undo)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from sessions_core.models import ChatSession
from tests.e2e.conftest import log_in
from tests.support.factories import make_run, make_session, make_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def open_chat(page, server, session: ChatSession):
    page.goto(f"{server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)


def watch_console(page) -> list[str]:
    """Console errors and failed requests of the page, as they happen."""
    problems: list[str] = []
    page.on("console", lambda message: message.type == "error" and problems.append(message.text))
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("response", lambda response: response.status >= 400 and problems.append(
        f"{response.status} {response.url}"))
    return problems


def test_a_second_save_of_the_state_is_not_refused_as_stale(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Groceries", name_source="user",
                           session_state={"shopping_list": ["bread"]})
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    for version, items in ((1, ["bread", "jam"]), (2, ["bread", "jam", "tea"])):
        page.get_by_text("Edit as JSON").click()
        page.locator("#state-json").fill(json.dumps({"shopping_list": items}))
        page.get_by_role("button", name="Save state").click()
        expect(page.locator("#state-version")).to_have_text(f"v{version}")
        expect(page.locator("#state-edit input[name=version]")).to_have_value(str(version))
        expect(page.locator("#state-panel .form-error")).to_have_count(0)
    session.refresh_from_db()
    assert session.session_state == {"shopping_list": ["bread", "jam", "tea"]}


def test_a_chat_in_the_trash_is_read_only_and_opens_no_socket(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Old chat", name_source="user")
    make_run(session, "hello", "Hi there.")
    ChatSession.objects.filter(pk=session.pk).update(deleted_at=session.created_at)
    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/s/{session.session_id}/")
    expect(page.locator("#composer-text")).to_be_disabled()
    expect(page.locator("#send-button")).to_be_disabled()
    expect(page.locator(".banner")).to_contain_text("in the trash")
    expect(page.locator("#transcript")).to_contain_text("Hi there.")
    page.get_by_role("button", name="Restore to continue").click()
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#composer-text")).to_be_enabled()
    assert len(sockets) == 1  # none while it was in the trash; one once restored


def test_deleting_the_open_chat_goes_to_the_next_and_keeps_the_typed_text(context, daphne_server):
    alice = make_user("alice")
    keep = make_session(alice, component_id="general", name="Keep me", name_source="user")
    doomed = make_session(alice, component_id="general", name="Delete me", name_source="user")
    log_in(context, daphne_server.url, alice)
    here, other = context.new_page(), context.new_page()
    open_chat(here, daphne_server, doomed)
    open_chat(other, daphne_server, doomed)
    other.locator("#composer-text").fill("half a thought")
    here.locator("#composer-text").fill("my unsent message")

    row = here.locator(f"#session-item-{doomed.pk}")
    row.get_by_role("button", name="More actions for Delete me").click()
    row.get_by_role("menuitem", name="Move to trash").click()
    for page in (here, other):  # this tab and the other one both move on, with the Undo toast
        expect(page).to_have_url(re.compile(rf"/s/{keep.session_id}/$"))
        expect(page.locator(f"#toast-{doomed.pk}")).to_contain_text("Delete me")
    expect(here.locator("#composer-text")).to_have_value("my unsent message")
    expect(other.locator("#composer-text")).to_have_value("half a thought")


def test_load_earlier_keeps_the_readers_place(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Long chat", name_source="user")
    runs = [make_run(session, f"question {n}", f"answer {n}") for n in range(60)]
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    first_shown = page.locator(f"#run-{runs[10].run_id}")
    page.locator("#transcript").evaluate("box => { box.scrollTop = 0; }")
    before = first_shown.bounding_box()["y"]
    page.get_by_role("link", name="Load earlier messages").click()
    expect(page.locator(f"#run-{runs[0].run_id}")).to_have_count(1)
    expect(page.locator(f"#run-{runs[9].run_id}")).to_have_count(1)
    page.wait_for_function("() => !document.querySelector('#transcript .load-earlier')")
    assert abs(first_shown.bounding_box()["y"] - before) < 5  # the run read last is where it was


def test_the_tab_title_follows_a_rename_here_and_in_another_tab(context, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Groceries", name_source="user")
    log_in(context, daphne_server.url, alice)
    first, second = context.new_page(), context.new_page()
    open_chat(first, daphne_server, session)
    open_chat(second, daphne_server, session)
    expect(first).to_have_title("Groceries · Sessions chat")
    first.locator(f"#session-item-{session.pk} .session-link").dblclick()
    first.locator(f"#session-item-{session.pk} input[name=name]").fill("Weekly shop")
    first.locator(f"#session-item-{session.pk} input[name=name]").press("Enter")
    for page in (first, second):
        expect(page).to_have_title("Weekly shop · Sessions chat")
        expect(page.locator("#chat-title")).to_have_text("Weekly shop")


def test_normal_use_logs_no_console_errors(context, daphne_server, llm_server):
    from tests.support.llm_server import Text

    alice = make_user("alice")
    alice.is_staff = alice.is_superuser = True
    alice.save()
    other = make_session(alice, component_id="general", name="Other", name_source="user")
    trashed = make_session(alice, component_id="general", name="Trashed", name_source="user")
    ChatSession.objects.filter(pk=trashed.pk).update(deleted_at=trashed.created_at)
    log_in(context, daphne_server.url, alice)
    watcher, actor = context.new_page(), context.new_page()
    problems = watch_console(watcher) + []
    actor_problems = watch_console(actor)
    open_chat(watcher, daphne_server, other)

    llm_server.add(Text("Hello!"))
    actor.goto(f"{daphne_server.url}/new/")
    actor.locator("#composer-text").fill("hi")
    actor.locator("#composer-text").press("Enter")
    expect(actor.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(actor.locator("#transcript .run[data-status=completed]")).to_have_count(1)
    new = ChatSession.objects.exclude(pk__in=[other.pk, trashed.pk]).get()
    expect(watcher.locator(f"#session-item-{new.pk}")).to_have_count(1)  # the other tab got the new chat

    actor.goto(f"{daphne_server.url}/trash/")
    actor.locator(f"#trash-item-{trashed.pk}").get_by_role("button", name="Restore").click()
    expect(actor.locator(f"#trash-item-{trashed.pk}")).to_have_count(0)
    expect(watcher.locator(f"#session-item-{trashed.pk}")).to_have_count(1)

    admin = context.new_page()
    admin_problems = watch_console(admin)
    admin.goto(f"{daphne_server.url}/admin/login/")
    expect(admin.get_by_role("heading", name=re.compile("administration", re.I))).to_be_visible()
    admin.wait_for_load_state("networkidle")
    assert problems == [] and actor_problems == [] and admin_problems == []


def test_clicking_away_from_a_rename_saves_it_or_cancels_it(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Groceries", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    row = page.locator(f"#session-item-{session.pk}")
    row.locator(".session-link").dblclick()
    row.locator("input[name=name]").fill("Weekly shop")
    page.locator("#composer-text").click()  # away
    expect(row.locator(".session-title")).to_have_text("Weekly shop")
    expect(row.locator(".rename-form")).to_be_hidden()
    row.locator(".session-link").dblclick()
    expect(row.locator("input[name=name]")).to_be_focused()
    page.locator("#composer-text").click()  # away, unchanged: cancelled
    expect(row.locator(".rename-form")).to_be_hidden()
    session.refresh_from_db()
    assert session.name == "Weekly shop"


def test_screenshots_of_the_landing_a_chat_long_state_keys_and_a_phone(browser, daphne_server, screenshots):
    alice = make_user("alice")
    state = {"shopping_list": ["milk", "eggs", "a very long item name that goes on and on"],
             "preferred_delivery_time_window": "weekday evenings between six and nine",
             "customer_loyalty_programme_membership_number": 12345678901234,
             "dietary_requirements_of_the_household": {"vegetarian_members": 2, "allergies": ["peanuts", "shellfish"]}}
    session = make_session(alice, component_id="shopping", name="Weekly groceries", name_source="user",
                           session_state=state)
    make_run(session, "what is on my list?", "You have **milk**, **eggs** and one long item.\n\n"
             "```python\nprint('hello')\n```\n\n![a photo of the list](https://example.com/list.png)")
    desktop = browser.new_context(viewport={"width": 1280, "height": 800})
    log_in(desktop, daphne_server.url, alice)
    page = desktop.new_page()
    page.goto(f"{daphne_server.url}/new/")
    expect(page.locator("#composer-text")).to_be_focused()
    page.screenshot(path=str(screenshots / "landing.png"))
    open_chat(page, daphne_server, session)
    page.screenshot(path=str(screenshots / "chat.png"))
    page.locator(f"#session-item-{session.pk} .row-menu-button").click()
    page.screenshot(path=str(screenshots / "chat-row-menu.png"))
    page.keyboard.press("Escape")
    page.keyboard.press("Control+/")
    page.screenshot(path=str(screenshots / "shortcuts.png"))
    page.keyboard.press("Escape")
    value = page.locator('.state-entry[data-key="preferred_delivery_time_window"] dd')
    assert value.bounding_box()["width"] > 150  # not a letter per line
    page.locator("#state-pane").screenshot(path=str(screenshots / "state-panel-long-keys.png"))
    desktop.close()
    phone = browser.new_context(viewport={"width": 390, "height": 844})
    log_in(phone, daphne_server.url, alice)
    page = phone.new_page()
    open_chat(page, daphne_server, session)
    expect(page.locator("#topbar-title")).to_have_text("Weekly groceries")
    page.screenshot(path=str(screenshots / "chat-phone.png"))
    page.locator("[data-toggle=state-pane]").click()
    page.screenshot(path=str(screenshots / "chat-phone-state.png"))
    page.locator("#backdrop").click(position={"x": 10, "y": 300})
    page.locator("[data-toggle=sidebar]").click()
    page.screenshot(path=str(screenshots / "chat-phone-sidebar.png"))
    page.locator(f"#session-item-{session.pk} .row-menu-button").click()
    expect(page.locator(f"#row-menu-{session.pk}")).to_be_in_viewport()
    page.screenshot(path=str(screenshots / "chat-phone-row-menu.png"))
    page.keyboard.press("Escape")
    page.goto(f"{daphne_server.url}/new/")
    page.screenshot(path=str(screenshots / "landing-phone.png"))
    phone.close()


def test_an_open_state_editor_stays_open_when_another_tab_saves(context, daphne_server):
    """Untouched, it shows the new state; with changes of its own, they are kept (and refused as stale)."""
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Groceries", name_source="user",
                           session_state={"shopping_list": ["bread"]})
    log_in(context, daphne_server.url, alice)
    page, other = context.new_page(), context.new_page()
    for tab in (page, other):
        open_chat(tab, daphne_server, session)
        tab.get_by_text("Edit as JSON").click()

    other.locator("#state-json").fill(json.dumps({"shopping_list": ["bread", "jam"]}))
    other.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-version")).to_have_text("v1")
    expect(page.locator("#state-edit")).to_have_attribute("open", "")
    expect(page.locator("#state-json")).to_contain_text("jam")  # the new state, to edit from

    page.locator("#state-json").fill(json.dumps({"shopping_list": ["tea"]}))
    other.get_by_text("Edit as JSON").click()  # closed by its own save
    other.locator("#state-json").fill(json.dumps({"shopping_list": ["bread", "jam", "eggs"]}))
    other.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-version")).to_have_text("v2")
    expect(page.locator("#state-edit")).to_have_attribute("open", "")
    expect(page.locator("#state-json")).to_have_value(json.dumps({"shopping_list": ["tea"]}))
    page.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-panel .form-error")).to_contain_text("changed")
