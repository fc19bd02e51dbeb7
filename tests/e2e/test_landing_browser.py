"""What a browser shows of the landing and the keyboard (issue 13, "what users expect"): a new chat that
is the chat page and stores nothing until its first message, the sidebar rows' menus, search by keyboard,
the shortcuts and their help, the skip link, the state panel's fold, and a phone's drawers."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sessions_core.models import ChatSession, Run, RunStatus
from tests.e2e.conftest import BASE_DIR, log_in
from tests.e2e.test_ux_browser import open_chat, watch_console
from tests.support.factories import make_run, make_session, make_user
from tests.support.llm_server import Text, ToolCalls

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


def test_a_new_user_lands_in_a_chat_and_its_first_message_creates_it(page, daphne_server, llm_server):
    alice = make_user("alice")
    log_in(page.context, daphne_server.url, alice)
    problems = watch_console(page)
    page.goto(f"{daphne_server.url}/")
    expect(page).to_have_url(re.compile(r"/new/$"))
    expect(page.locator("#sidebar")).to_be_visible()
    expect(page.locator("#composer-text")).to_be_focused()
    expect(page.locator("#session-list .session-item")).to_have_count(0)  # no "New chat" row before a message
    picker = page.get_by_label("Assistant")
    picker.select_option("shopping")
    expect(page.locator("#assistant-description")).to_contain_text("shopping list")
    page.locator("#composer-text").fill("half typed")
    page.reload()  # a draft survives a reload before the chat exists
    expect(page.locator("#composer-text")).to_have_value("half typed")
    assert not ChatSession.objects.exists()

    llm_server.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added **milk**."))
    page.get_by_label("Assistant").select_option("shopping")
    expect(page.locator("#session-area")).to_have_attribute("data-live", "open")  # the landing's own socket
    page.evaluate("window.landed = true")
    page.locator("#composer-text").fill("add milk")
    page.locator("#composer-text").press("Enter")
    expect(page).to_have_url(re.compile(r"/s/[^/]+/$"))
    assert page.evaluate("window.landed") is True  # the landing became the chat's page: no page was loaded
    expect(page.locator("#chat-header .chat-assistant")).to_have_text("Shopping list")
    expect(page.get_by_role("main", name="Conversation")).to_be_visible()
    expect(page.locator("#state-pane")).to_be_visible()
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".user-message")).to_contain_text("add milk")
    expect(run.locator(".tool-call summary")).to_contain_text("add_item · milk")  # the arguments in one line
    expect(run.locator(".reply strong")).to_have_text("milk")
    expect(page.locator("#state-panel")).to_contain_text("milk")
    session = ChatSession.objects.get()
    assert session.component_id == "shopping" and session.session_state == {"shopping_list": ["milk"]}
    assert not Run.objects.filter(status=RunStatus.QUEUED).exists()
    row = page.locator(f"#session-item-{session.pk}")
    expect(row.locator(".session-link")).to_have_attribute("aria-current", "page")
    expect(page.locator("#composer-text")).to_be_focused()
    # Should its socket drop now, it reconnects as the chat's socket.
    socket_url = page.evaluate("htmx.createWebSocket('/ws/new/').url")
    assert f"/ws/sessions/{session.session_id}/?" in socket_url and "reconnect=1" in socket_url
    page.goto(f"{daphne_server.url}/new/")
    expect(page.locator("#composer-text")).to_have_value("")  # the sent draft is gone
    assert problems == []


def test_readmes_first_example_works_in_a_new_users_first_chat(page, offline_daphne_server):
    """README's own words, typed as a newcomer would: the assistant a first chat starts on has the list tools."""
    readme = " ".join((BASE_DIR / "README.md").read_text(encoding="utf-8").split())
    example = re.search(r'A first chat starts on the (.+?) assistant: type "([^"]+)"', readme)
    assert example, "README no longer gives its first example as the tests expect"
    assistant, words = example.groups()
    log_in(page.context, offline_daphne_server.url, make_user("newcomer"))
    page.goto(f"{offline_daphne_server.url}/")
    expect(page.get_by_label("Assistant").locator("option:checked")).to_have_text(assistant)
    page.locator("#composer-text").fill(words)
    page.locator("#composer-text").press("Enter")
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".tool-call")).not_to_have_count(0)
    for item in ("milk", "eggs", "bread"):
        expect(page.locator("#state-tree")).to_contain_text(item)
    expect(run.locator(".reply")).not_to_contain_text("can't really think")
    assert ChatSession.objects.get().session_state["shopping_list"] == ["milk", "eggs", "bread"]


def test_a_refused_first_message_stays_in_the_box(page, daphne_server):
    alice = make_user("alice")
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/new/")
    page.locator("#composer-text").fill("x" * 40_001)  # over CHAT_MAX_MESSAGE_CHARS
    page.locator("#composer-text").press("Enter")
    expect(page.locator("#run-status")).to_contain_text("the limit is")
    expect(page.locator("#composer-text")).to_have_value("x" * 40_001)
    assert not ChatSession.objects.exists()


def test_a_rows_menu_works_by_keyboard_and_survives_its_swap(page, daphne_server):
    alice = make_user("alice")
    other = make_session(alice, component_id="general", name="Other", name_source="user")
    session = make_session(alice, component_id="general", name="Groceries", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, other)
    row = page.locator(f"#session-item-{session.pk}")
    button = row.get_by_role("button", name="More actions for Groceries")
    menu = row.get_by_role("menu")
    button.focus()
    page.keyboard.press("Enter")
    expect(button).to_have_attribute("aria-expanded", "true")
    expect(menu.get_by_role("menuitem", name="Rename")).to_be_focused()
    page.keyboard.press("ArrowUp")  # wraps to the last
    expect(menu.get_by_role("menuitem", name="Move to trash")).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(button).to_be_focused()
    expect(button).to_have_attribute("aria-expanded", "false")
    expect(page.locator("#stop-button")).to_be_hidden()

    page.keyboard.press("ArrowDown")  # opens it too
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    expect(menu.get_by_role("menuitem", name="Pin")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#session-list .is-pinned")).to_have_count(1)
    expect(row.get_by_role("button", name="More actions for Groceries")).to_be_focused()  # after the list's swap
    row.get_by_role("button", name="More actions for Groceries").click()
    expect(row.get_by_role("menuitem", name="Unpin")).to_be_visible()
    page.mouse.click(700, 400)  # a click elsewhere closes it
    expect(row.get_by_role("menu")).to_be_hidden()

    row.get_by_role("button", name="More actions for Groceries").click()
    row.get_by_role("menuitem", name="Rename").click()
    expect(row.locator("input[name=name]")).to_be_focused()
    row.locator("input[name=name]").fill("Weekly shop")
    row.locator("input[name=name]").press("Enter")
    expect(row.locator(".session-title")).to_have_text("Weekly shop")
    expect(row.locator(".session-link")).to_be_focused()  # the keyboard's place kept, not the page's top
    session.refresh_from_db()
    assert session.name == "Weekly shop" and session.pinned_at is not None

    # A row pushed from another tab brings its own menu.
    second = page.context.new_page()
    open_chat(second, daphne_server, other)
    second.locator(f"#session-item-{session.pk} .session-link").dblclick()
    second.locator(f"#session-item-{session.pk} input[name=name]").fill("Shop")
    second.locator(f"#session-item-{session.pk} input[name=name]").press("Enter")
    expect(row.locator(".session-title")).to_have_text("Shop")
    row.get_by_role("button", name="More actions for Shop").click()
    expect(row.get_by_role("menu", name="Shop").get_by_role("menuitem")).to_have_count(6)
    page.keyboard.press("Escape")
    expect(row.get_by_role("button", name="More actions for Shop")).to_be_focused()


def test_search_by_keyboard_and_esc_closes_it(page, daphne_server):
    alice = make_user("alice")
    here = make_session(alice, component_id="general", name="Here", name_source="user")
    first = make_session(alice, component_id="general", name="Paris trip", name_source="user")
    second = make_session(alice, component_id="general", name="Paris food", name_source="user")
    for session in (here, first, second):
        make_run(session, "hello", "Hi.")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, here)
    page.keyboard.press("Control+k")
    search = page.locator("#session-filter")
    expect(search).to_be_focused()
    # An arrow pressed the moment the hits arrive, before htmx has settled them, goes to the first hit:
    # pressed from the swap's own event, the one moment a key press from here cannot be timed to hit.
    page.evaluate("""() => document.addEventListener('htmx:afterSwap', function arrow() {
        if (!document.querySelector('#session-filter-results .search-hit a')) return;
        document.removeEventListener('htmx:afterSwap', arrow);
        document.activeElement.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowDown', bubbles: true}));
    })""")
    search.fill("paris")
    hits = page.locator("#session-filter-results .search-hit a")
    expect(hits).to_have_count(2)
    expect(hits.nth(0)).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(hits.nth(1)).to_be_focused()
    # A later answer replaces the whole box while a hit has the focus: the same hit has it after the swap.
    page.evaluate("""() => {
        document.querySelectorAll('#session-filter-results .search-hit a').forEach(a => a.dataset.old = '1');
        htmx.trigger('#session-filter', 'search');
    }""")
    expect(page.locator("#session-filter-results .search-hit a[data-old]")).to_have_count(0)
    expect(hits).to_have_count(2)
    expect(hits.nth(1)).to_be_focused()
    page.keyboard.press("ArrowDown")  # stays on the last
    expect(hits.nth(1)).to_be_focused()
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")
    expect(search).to_be_focused()
    page.keyboard.press("Escape")
    expect(search).to_have_value("")
    expect(page.locator("#session-filter-results .search-hit")).to_have_count(0)
    expect(page.locator(f"#session-item-{first.pk}")).to_be_visible()  # the list is back
    search.fill("paris")
    expect(hits).to_have_count(2)
    page.keyboard.press("ArrowDown")
    opened = hits.nth(0).get_attribute("href")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(re.escape(opened) + "$"))
    assert {first.session_id, second.session_id} & {opened.strip("/").split("/")[-1]}


def test_the_shortcuts_help_and_the_shortcuts(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Chat", name_source="user")
    make_run(session, "hi", "Hello.")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    expect(page.locator("#composer-text")).to_be_focused()
    page.keyboard.type("?")  # typing: a question mark in the message, not the help
    expect(page.locator("#composer-text")).to_have_value("?")
    expect(page.locator("#shortcuts")).to_be_hidden()
    page.keyboard.press("Control+/")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    for what in ("New chat", "Search chats", "Stop the reply", "Focus the message box"):
        expect(dialog).to_contain_text(what)
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.locator("#chat-title").click()  # not typing now
    page.keyboard.press("?")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()
    page.keyboard.press("Shift+Escape")
    expect(page.locator("#composer-text")).to_be_focused()
    # The skip link is the first stop of the keyboard, shows when focused and goes to the message box.
    skip = page.get_by_role("link", name="Skip to the message box")
    assert page.evaluate("document.querySelector('a[href], button, input, select, textarea').className") == "skip-link"
    expect(skip).not_to_be_in_viewport()
    skip.focus()
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    expect(page.locator("#composer-text")).to_be_focused()
    page.keyboard.press("Alt+n")
    expect(page).to_have_url(re.compile(r"/new/$"))
    assert ChatSession.objects.count() == 1


def test_the_state_panel_folds_on_a_desktop_and_shows_a_summary_without_state(page, daphne_server):
    alice = make_user("alice")
    shopping = make_session(alice, component_id="shopping", name="List", name_source="user",
                            session_state={"shopping_list": ["tea"]})
    general = make_session(alice, component_id="general", name="Talk", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    page.set_viewport_size({"width": 1280, "height": 800})
    open_chat(page, daphne_server, shopping)
    pane = page.locator("#state-pane")
    fold = page.locator(".state-collapse")
    expect(pane).to_be_visible()
    width = page.locator("#main").bounding_box()["width"]
    fold.click()
    expect(pane).to_be_hidden()
    expect(fold).to_have_attribute("aria-expanded", "false")
    assert page.locator("#main").bounding_box()["width"] > width + 200  # the chat takes the room
    page.reload()
    expect(page.locator("#state-pane")).to_be_hidden()  # remembered
    page.locator(".state-collapse").click()
    expect(page.locator("#state-pane")).to_be_visible()
    open_chat(page, daphne_server, general)
    expect(page.locator("#state-panel")).to_have_attribute("data-panel", "summary")  # no state: its summary
    expect(page.locator("#state-version")).to_have_count(0)


def test_a_phones_drawers_close_on_the_backdrop_and_esc(browser, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="A rather long chat title for a phone",
                           name_source="user", session_state={"preferred_delivery_time_window": "evenings"})
    context = browser.new_context(viewport={"width": 390, "height": 844})
    log_in(context, daphne_server.url, alice)
    page = context.new_page()
    open_chat(page, daphne_server, session)
    expect(page.locator("#topbar-title")).to_have_text("A rather long chat title for a phone")
    expect(page.locator("#composer-text")).not_to_be_focused()  # no keyboard popping up over the chat
    backdrop = page.locator("#backdrop")
    expect(backdrop).to_be_hidden()
    page.get_by_role("button", name="Show state").click()
    expect(page.locator("#state-pane")).to_be_visible()
    expect(backdrop).to_be_visible()
    value = page.locator('.state-entry[data-key="preferred_delivery_time_window"] dt')
    assert value.bounding_box()["width"] < 390  # the long key fits the drawer
    backdrop.click(position={"x": 20, "y": 400})
    expect(page.locator("#state-pane")).to_be_hidden()
    expect(backdrop).to_be_hidden()
    toggle = page.get_by_role("button", name="Show chats")
    toggle.click()
    expect(page.locator("#sidebar")).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    row = page.locator(f"#session-item-{session.pk}")
    expect(row.get_by_role("button", name=re.compile("More actions"))).to_be_visible()  # no hover on a phone
    title = row.locator(".session-title")
    assert title.bounding_box()["width"] > 200  # the title has the row, not five icons
    footer = page.locator(".sidebar-user")
    expect(footer.get_by_role("button", name="Log out")).to_be_in_viewport()
    page.keyboard.press("Escape")
    expect(page.locator("#sidebar")).to_be_hidden()
    expect(toggle).to_be_focused()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    context.close()


def test_deleting_the_last_chat_lands_in_a_new_chat_with_the_undo_and_the_typed_text(page, daphne_server):
    alice = make_user("alice")
    only = make_session(alice, component_id="general", name="Only chat", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, only)
    page.locator("#composer-text").fill("not sent yet")
    row = page.locator(f"#session-item-{only.pk}")
    row.get_by_role("button", name="More actions for Only chat").click()
    row.get_by_role("menuitem", name="Move to trash").click()
    expect(page).to_have_url(re.compile(r"/new/$"))  # ?deleted= has done its job
    expect(page.locator(f"#toast-{only.pk}")).to_contain_text("Only chat")
    expect(page.locator("#composer-text")).to_have_value("not sent yet")
    page.locator(f"#toast-{only.pk}").get_by_role("button", name="Undo").click()
    expect(page.locator(f"#session-item-{only.pk}")).to_have_count(1)
    only.refresh_from_db()
    assert only.deleted_at is None


def test_the_chats_width_stays_put_when_the_first_reply_and_its_summary_arrive(page, daphne_server, llm_server):
    from tests.support.llm_server import Text

    llm_server.add(Text("Hello there!"))
    alice = make_user("alice")
    general = make_session(alice, component_id="general", name="Talk", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    page.set_viewport_size({"width": 1400, "height": 900})
    open_chat(page, daphne_server, general)
    before = page.locator("#main").bounding_box()
    page.locator("#composer-text").fill("hello")
    page.locator("#composer-text").press("Enter")
    expect(page.locator("#transcript .run[data-status='completed']")).to_have_count(1)
    expect(page.locator("#session-summary")).to_have_count(1)  # the first summary has landed
    after = page.locator("#main").bounding_box()
    assert (after["x"], after["width"]) == (before["x"], before["width"])
    expect(page.locator("#state-version")).to_have_count(0)


def test_the_chat_list_is_one_tab_stop_with_arrow_keys_inside(page, daphne_server):
    alice = make_user("alice")
    sessions = [make_session(alice, component_id="general", name=f"Chat {n}", name_source="user") for n in range(6)]
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, sessions[2])
    links = page.locator(".session-nav .session-link")
    expect(links).to_have_count(6)
    page.locator("#session-filter").focus()
    page.keyboard.press("Tab")
    current = page.locator(f"#session-item-{sessions[2].pk} .session-link")
    expect(current).to_be_focused()  # the open chat's row, in one press
    page.keyboard.press("Tab")
    expect(page.locator(".trash-link")).to_be_focused()  # and one more leaves the list: 6 rows, 1 stop
    page.keyboard.press("Shift+Tab")
    expect(current).to_be_focused()

    page.keyboard.press("ArrowDown")
    below = page.locator(f"#session-item-{sessions[1].pk} .session-link")  # newest first
    expect(below).to_be_focused()
    page.keyboard.press("Home")
    expect(links.first).to_be_focused()
    page.keyboard.press("End")
    expect(links.last).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(page.locator(f"#session-item-{sessions[0].pk} .row-menu-button")).to_be_focused()
    page.keyboard.press("ArrowLeft")
    expect(links.last).to_be_focused()
    page.keyboard.press("Shift+F10")
    expect(page.locator(f"#session-item-{sessions[0].pk}").get_by_role("menuitem", name="Rename")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator(f"#session-item-{sessions[0].pk} .row-menu-button")).to_be_focused()
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("Tab")  # the list is left from where the keyboard was, and found there again
    expect(page.locator(".trash-link")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(links.last).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{daphne_server.url}/s/{sessions[0].session_id}/")
