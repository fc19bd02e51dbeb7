"""The chat in headless Chromium against daphne, the test database and the local model server."""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from sessions_core.models import ChatSession, Run, RunStatus
from tests.e2e.conftest import Daphne, _server_env, log_in
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import stored_text
from tests.support.llm_server import Error, Text, ToolCalls, summary_responder

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)
TRANSFER_TIMEOUT = 60_000

VIEWS = {
    "desktop": {"width": 1280, "height": 800},
    "phone": {"width": 390, "height": 844},
}


def open_chat(page, server, session: ChatSession):
    """Open a session's page and wait until its socket is connected."""
    page.goto(f"{server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)


def send(page, text: str):
    page.locator("#composer-text").fill(text)
    page.locator("#composer-text").press("Enter")


def last_run(page):
    return page.locator("#transcript .run").last


def test_a_shopping_list_reply_streams_and_the_state_panel_updates_live(page, browser, daphne_server, llm_server,
                                                                       screenshots):
    make_user("alice", "pw-alice-123")
    hold = threading.Event()
    llm_server.side_responder = summary_responder  # this test scripts the title itself
    llm_server.add(
        ToolCalls([("add_item", {"item": "milk"}), ("add_item", {"item": "eggs"})]),
        Text("I added **milk** and **eggs** to your shopping list. Anything else?", wait_event=hold),
        Text("Milk and eggs"),
    )
    # Log in through the form: a new chat, where the shopping-list assistant is picked in the header.
    page.goto(f"{daphne_server.url}/accounts/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("pw-alice-123")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/new/$"))
    expect(page.locator("#composer-text")).to_be_focused()
    page.get_by_label("Assistant").select_option("shopping")
    send(page, "add milk and eggs")  # the first message creates the chat; its page runs it
    expect(page).to_have_url(re.compile(r"/s/[^/]+/$"))
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#composer-text")).to_have_value("")
    run = last_run(page)
    # Mid-reply: the first words are in, the tools ran, and the panel already shows both items.
    expect(run).to_have_attribute("data-status", "running")
    expect(run.locator(".reply")).to_have_text(re.compile(r"^I\s*$"))
    expect(run.locator(".tool-call")).to_have_count(2)
    expect(page.locator("#state-panel")).to_contain_text("milk")
    expect(page.locator("#state-panel")).to_contain_text("eggs")
    expect(page.locator("#transcript")).to_have_attribute("aria-busy", "true")
    expect(page.locator("#stop-button")).to_be_visible()
    page.screenshot(path=str(screenshots / "chat-desktop-light-streaming.png"))
    hold.set()
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".reply strong")).to_have_text(["milk", "eggs"])
    expect(run.locator(".run-meta")).to_contain_text("tokens")
    expect(page.locator("#transcript")).to_have_attribute("aria-busy", "false")
    expect(page.locator("#stop-button")).to_be_hidden()
    expect(page.locator("#run-status")).to_have_text("Reply complete.")
    # The generated title reaches the sidebar without a reload.
    expect(page.locator(".session-link[aria-current=page] .session-title")).to_have_text("Milk and eggs")

    session = ChatSession.objects.get(owner__username="alice")
    assert session.session_state["shopping_list"] == ["milk", "eggs"]
    for view, size in VIEWS.items():
        for scheme in ("light", "dark"):
            context = browser.new_context(viewport=size, color_scheme=scheme)
            log_in(context, daphne_server.url, session.owner)
            shot = context.new_page()
            open_chat(shot, daphne_server, session)
            expect(last_run(shot)).to_have_attribute("data-status", "completed")
            shot.screenshot(path=str(screenshots / f"chat-{view}-{scheme}.png"))
            context.close()


def test_a_rename_and_a_new_session_reach_a_second_tab(context, daphne_server):
    alice = make_user("alice")
    groceries = make_session(alice, component_id="general", name="Groceries", name_source="user")
    make_run(groceries, "what should I buy?", "Milk.")
    other = make_session(alice, component_id="general", name="Other chat", name_source="user")
    log_in(context, daphne_server.url, alice)
    first, second = context.new_page(), context.new_page()
    open_chat(first, daphne_server, groceries)
    open_chat(second, daphne_server, other)

    row = f"#session-item-{groceries.pk}"
    first.locator(f"{row} .session-link").dblclick()
    name = first.locator(f"{row} input[name=name]")
    expect(name).to_be_focused()
    name.fill("Weekly groceries")
    name.press("Enter")
    expect(first.locator(f"{row} .session-title")).to_have_text("Weekly groceries")
    expect(second.locator(f"{row} .session-title")).to_have_text("Weekly groceries")  # live, no reload
    first.reload()
    expect(first.locator(f"{row} .session-title")).to_have_text("Weekly groceries")
    expect(first.locator(f"{row} .session-link")).to_have_attribute("aria-current", "page")

    rows = second.locator("#session-list .session-item")
    expect(rows).to_have_count(2)
    first.goto(f"{daphne_server.url}/new/")
    expect(rows).to_have_count(2)  # a new chat is nothing yet
    send(first, "a new chat")
    expect(first).to_have_url(re.compile(r"/s/[^/]+/$"))
    expect(rows).to_have_count(3)  # the new session appeared in the other tab
    # Named first from its message, then by the title job, whose end may come before this check: its
    # title is the one both tabs settle on.
    expect(rows.first.locator(".session-title")).to_have_text("A generated title")
    expect(first.locator(".session-link[aria-current=page] .session-title")).to_have_text("A generated title")


def test_stop_ends_a_long_reply_and_keeps_what_was_written(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Story", name_source="user")
    hold = threading.Event()  # never set: the model writes one word, then nothing more
    llm_server.add(Text("Once upon a time there was a very long story that never ended.", wait_event=hold))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "tell me a long story")
    run = last_run(page)
    expect(run.locator(".reply")).to_contain_text("Once")
    page.locator("#stop-button").click()
    expect(run).to_have_attribute("data-status", "cancelled")
    expect(run.locator(".run-note.stopped")).to_be_visible()
    expect(run.locator(".reply")).to_have_text("Once")
    expect(page.locator("#stop-button")).to_be_hidden()
    expect(page.locator("#composer-text")).to_be_focused()
    assert llm_server.wait_for_disconnects(1, 5)  # the model's stream was closed too
    assert session.runs.get().status == RunStatus.CANCELLED


def test_a_long_reply_is_announced_as_still_being_written(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Slow", name_source="user")
    hold = threading.Event()
    llm_server.add(Text("A reply that takes its time.", wait_event=hold))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    page.locator("#run-status").evaluate("line => line.dataset.stillEvery = '200'")  # 7 s in the app
    send(page, "take your time")
    expect(last_run(page).locator(".reply")).to_contain_text("A")
    expect(page.locator("#run-status")).to_have_text(re.compile(r"^Still writing the reply[.…]$"))
    hold.set()
    expect(last_run(page)).to_have_attribute("data-status", "completed")
    expect(page.locator("#run-status")).to_have_text("Reply complete.")


def test_a_message_sent_during_a_reply_waits_in_the_queue(page, daphne_server, llm_server, screenshots):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Queue", name_source="user")
    hold = threading.Event()
    llm_server.add(Text("The first reply, slowly.", wait_event=hold), Text("The second reply."))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "first message")
    expect(last_run(page).locator(".reply")).to_contain_text("The")
    send(page, "second message")
    queued = page.locator("#queue .queued-item")
    expect(queued).to_have_count(1)
    expect(queued).to_contain_text("second message")
    expect(queued).to_contain_text("Queued: will run after the current reply")
    expect(page.locator("#run-status")).to_have_text("Your message is queued; it will run after the current reply.")
    page.screenshot(path=str(screenshots / "chat-desktop-light-queued.png"))
    hold.set()
    expect(page.locator("#transcript .run[data-status=completed]")).to_have_count(2)
    expect(page.locator("#queue")).to_be_hidden()
    expect(last_run(page).locator(".user-message")).to_contain_text("second message")
    expect(last_run(page).locator(".reply")).to_have_text("The second reply.")


def test_a_state_edit_in_progress_waits_out_a_reply_that_changes_the_state(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Groceries", name_source="user",
                           session_state={"shopping_list": ["bread"]})
    hold = threading.Event()
    llm_server.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Milk is on the list.", wait_event=hold))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    page.get_by_text("Edit as JSON").click()
    page.locator("#state-json").fill('{"shopping_list": ["bread", "jam"]}')

    send(page, "add milk")
    # Mid-reply the panel shows the reply's state, with a note where the editor was.
    expect(page.locator("#state-tree")).to_contain_text("milk")
    expect(page.locator("#state-panel .state-note")).to_be_visible()
    expect(page.locator("#state-edit")).to_have_count(0)
    hold.set()
    expect(last_run(page)).to_have_attribute("data-status", "completed")
    # The editor is back with the text being typed; saving it now is refused as stale, not applied over milk.
    expect(page.locator("#state-json")).to_have_value('{"shopping_list": ["bread", "jam"]}')
    page.get_by_role("button", name="Save state").click()
    expect(page.locator("#state-panel .form-error")).to_contain_text("the state changed since you opened it")
    session.refresh_from_db()
    assert session.session_state["shopping_list"] == ["bread", "milk"]


def test_shift_enter_adds_a_line_and_retry_runs_a_failed_message_again(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Retry", name_source="user")
    llm_server.add(Error(400, "The model refused this request."), Text("Second time lucky."))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    box = page.locator("#composer-text")
    box.fill("line one")
    box.press("Shift+Enter")
    box.press_sequentially("line two")
    expect(box).to_have_value("line one\nline two")  # Shift+Enter added a line and sent nothing
    box.press("Enter")
    failed = last_run(page)
    expect(failed).to_have_attribute("data-status", "error")
    expect(failed.locator(".user-message .message-text")).to_have_text("line one\nline two")
    expect(failed.locator(".run-note.error")).to_contain_text("The model refused this request.")
    failed.get_by_role("button", name="Retry").click()
    expect(page.locator("#transcript .run")).to_have_count(2)
    retried = last_run(page)
    expect(retried).to_have_attribute("data-status", "completed")
    expect(retried.locator(".user-message .message-text")).to_have_text("line one\nline two")
    expect(retried.locator(".reply")).to_have_text("Second time lucky.")


def test_the_transcript_follows_the_reply_unless_the_user_scrolled_up(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Long", name_source="user")
    for number in range(12):
        make_run(session, f"question {number}", "\n\n".join(f"Paragraph {n} of answer {number}." for n in range(4)))
    long_reply = " ".join(f"word{n}" + ("\n" if n % 8 == 7 else "") for n in range(160))
    llm_server.add(Text(long_reply, chunk_delay=0.002))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    at_bottom = "t => t.scrollHeight - t.scrollTop - t.clientHeight < 8"
    transcript = page.locator("#transcript")
    send(page, "a long answer please")
    expect(last_run(page)).to_have_attribute("data-status", "completed")
    assert transcript.evaluate(at_bottom)  # followed the reply to its end

    hold = threading.Event()
    llm_server.add(Text(long_reply, wait_event=hold))
    send(page, "another one")
    expect(last_run(page).locator(".reply")).to_contain_text("word0")
    transcript.evaluate("t => { t.scrollTop = 0; }")  # the user scrolls up to read
    hold.set()
    expect(last_run(page)).to_have_attribute("data-status", "completed")
    assert transcript.evaluate("t => t.scrollTop") == 0  # and is left there


def test_escape_stops_the_reply(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Esc", name_source="user")
    llm_server.add(Text("Counting one two three four five", wait_event=threading.Event()))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "count")
    expect(last_run(page).locator(".reply")).to_contain_text("Counting")
    page.keyboard.press("Escape")
    expect(last_run(page)).to_have_attribute("data-status", "cancelled")


def test_a_reload_in_the_middle_of_a_reply_shows_the_whole_reply(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Greek", name_source="user")
    hold = threading.Event()
    reply = "alpha beta gamma delta epsilon zeta eta theta"
    llm_server.add(Text(reply, wait_event=hold))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "greek letters")
    expect(last_run(page).locator(".reply")).to_contain_text("alpha")
    page.reload()
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    run = last_run(page)
    expect(run).to_have_attribute("data-status", "running")
    expect(run.locator(".reply")).to_have_text(re.compile(r"^alpha\s*$"))  # the text so far, after the reload
    hold.set()
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".reply")).to_have_text(reply)  # the whole reply, not its tail


def test_a_tab_on_another_server_process_catches_up_and_stops_the_run(context, daphne_pair, llm_server):
    first, second = daphne_pair
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Two processes", name_source="user")
    # Three words over more than a second (the engine stores the text so far about once a second), then
    # held; two more once `hold` is set, and held again before the end.
    hold, end = threading.Event(), threading.Event()
    llm_server.add(Text("alpha beta gamma delta epsilon", chunk_delay=0.4, hold_after=3, wait_event=hold,
                        end_event=end))
    log_in(context, first.url, alice)  # cookies ignore the port: one login serves both servers
    here, there = context.new_page(), context.new_page()
    open_chat(here, first, session)
    send(here, "greek letters")
    expect(last_run(here).locator(".reply")).to_have_text(re.compile(r"^alpha beta gamma\s*$"))
    assert stored_text(session.runs.get().run_id).startswith("alpha")

    open_chat(there, second, session)
    run = last_run(there)
    expect(run).to_have_attribute("data-status", "running")
    expect(run.locator(".reply")).to_have_text(re.compile(r"^alpha\b"))  # the text the first process stored
    hold.set()  # the rest reaches this tab from the other process's batches
    expect(run.locator(".reply")).to_have_text(re.compile(r"^alpha beta gamma delta epsilon\s*$"))
    there.locator("#stop-button").click()  # the engine stops the run where it runs
    expect(run).to_have_attribute("data-status", "cancelled")
    expect(last_run(here)).to_have_attribute("data-status", "cancelled")
    assert llm_server.wait_for_disconnects(1, 5)
    end.set()


def test_a_server_crash_mid_reply_shows_it_interrupted_and_loses_no_queued_message(page, django_db_setup, llm_server):
    env = _server_env(OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test", OPENAI_TIMEOUT="10")
    server = Daphne(env)
    restarted = None
    hold = threading.Event()
    try:
        alice = make_user("alice")
        session = make_session(alice, component_id="general", name="Crash", name_source="user")
        llm_server.add(Text("alpha beta gamma", wait_event=hold), Text("Here is the queued answer."))
        log_in(page.context, server.url, alice)
        open_chat(page, server, session)
        send(page, "greek letters")
        expect(last_run(page).locator(".reply")).to_contain_text("alpha")
        run = page.locator(f"#run-{last_run(page).get_attribute('data-run-id')}")  # this one, not the last
        send(page, "and a question that waits")
        expect(page.locator("#queue .queued-item")).to_contain_text("and a question that waits")
        server.kill()
        # The dead process's lease, and its claim on the message waiting behind it, would run out within 30 s;
        # here they are moved to the past instead.
        ChatSession.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        Run.objects.filter(session=session, status=RunStatus.QUEUED).update(
            claimed_until=timezone.now() - timedelta(seconds=1))
        restarted = Daphne(env, port=server.port)  # the same address: the page's socket reconnects to it
        expect(run).to_have_attribute("data-status", "interrupted", timeout=20_000)
        expect(run.locator(".run-note.interrupted")).to_be_visible()
        # The message that was waiting behind it was not lost with the process: it runs now.
        queued = page.locator("#transcript .run").nth(1)
        expect(queued).to_contain_text("and a question that waits")
        expect(queued).to_have_attribute("data-status", "completed")
        expect(queued.locator(".reply")).to_have_text("Here is the queued answer.")
        expect(page.locator("#queue .queued-item")).to_have_count(0)
        expect(page.locator("#stop-button")).to_be_hidden()
        expect(page.locator("#transcript")).to_have_attribute("aria-busy", "false")
        assert [run.status for run in session.runs.order_by("pk")] == [RunStatus.INTERRUPTED, RunStatus.COMPLETED]
    finally:
        hold.set()
        if restarted is not None:
            restarted.stop()
        elif server.process.poll() is None:
            server.stop()


def download_from_row(page, session: ChatSession, item: str):
    """The file the chat's sidebar row menu item `item` downloads (a Playwright Download)."""
    row = page.locator(f"#session-item-{session.pk}")
    row.get_by_role("button", name=f"More actions for {session.name}").click()
    with page.expect_download() as download:
        row.get_by_role("menuitem", name=item).click()
    return download.value


def test_a_chat_downloads_as_markdown_from_its_sidebar_row(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Trip plans", name_source="user")
    make_run(session, "where should we go?", "Somewhere **warm**.")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    download = download_from_row(page, session, "Download as Markdown")
    assert download.suggested_filename == f"trip-plans-{session.session_id[:8]}.md"
    text = open(download.path(), encoding="utf-8").read()
    assert text.startswith("# Trip plans\n") and "where should we go?" in text and "Somewhere **warm**." in text


def test_a_chat_downloads_as_json_from_its_sidebar_row_and_imports_back(page, daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Weekly shop", name_source="user",
                           session_state={"shopping_list": ["milk"]})
    make_run(session, "add milk", "Added milk.")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    download = download_from_row(page, session, "Download as JSON")
    assert download.suggested_filename == f"weekly-shop-{session.session_id[:8]}.json"
    path = download.path()
    document = json.loads(open(path, encoding="utf-8").read())
    assert document["format"] == "sessions_core.session" and document["name"] == "Weekly shop"

    page.get_by_role("link", name="Import").click()
    expect(page.locator(".import-page")).to_contain_text("Download as JSON")  # what the page asks for is offered
    page.get_by_label("File").set_input_files(path)
    page.get_by_role("button", name="Import").click()
    # The import's page, asking how it goes until it is done (a process of its own does it).
    # (a process of its own at a lower priority: on a busy machine it may take a while to start)
    expect(page.locator("#transfer-status")).to_contain_text("Imported 1 chat.", timeout=TRANSFER_TIMEOUT)
    page.get_by_role("link", name="Open the first").click()
    expect(last_run(page)).to_contain_text("Added milk.")
    expect(page.locator(".session-link[aria-current=page] .session-title")).to_have_text("Weekly shop (imported)")
    expect(page.locator("#state-panel")).to_contain_text("milk")


def test_an_exported_chat_imports_through_the_page(page, daphne_server, tmp_path):
    from sessions_core.export import export_json

    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Moving house", name_source="user")
    make_run(session, "what to pack first?", "The kettle.")
    exported = tmp_path / "chat.json"
    exported.write_text("".join(export_json(session)), encoding="utf-8")
    log_in(page.context, daphne_server.url, alice)
    page.goto(f"{daphne_server.url}/")
    page.get_by_role("link", name="Import").click()
    page.get_by_label("File").set_input_files(str(exported))
    page.get_by_role("button", name="Import").click()
    # The import's page, asking how it goes until it is done (a process of its own does it).
    # (a process of its own at a lower priority: on a busy machine it may take a while to start)
    expect(page.locator("#transfer-status")).to_contain_text("Imported 1 chat.", timeout=TRANSFER_TIMEOUT)
    page.get_by_role("link", name="Open the first").click()
    expect(last_run(page)).to_contain_text("The kettle.")
    expect(page.locator(".session-link[aria-current=page] .session-title")).to_have_text("Moving house (imported)")
    assert ChatSession.objects.filter(owner=alice, name__startswith="Moving house").count() == 2


def test_delete_and_undo(page, daphne_server):
    alice = make_user("alice")
    keep = make_session(alice, component_id="general", name="Keep me", name_source="user")
    doomed = make_session(alice, component_id="general", name="Delete me", name_source="user")
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, keep)
    row = page.locator(f"#session-item-{doomed.pk}")
    row.get_by_role("button", name="More actions for Delete me").click()
    row.get_by_role("menuitem", name="Move to trash").click()
    expect(row).to_have_count(0)
    toast = page.locator(f"#toast-{doomed.pk}")
    expect(toast).to_contain_text("Delete me")
    toast.get_by_role("button", name="Undo").click()
    expect(page.locator(f"#session-item-{doomed.pk} .session-title")).to_have_text("Delete me")
    page.reload()
    expect(page.locator(f"#session-item-{doomed.pk}")).to_have_count(1)
    doomed.refresh_from_db()
    assert doomed.deleted_at is None
    # Deleted again and left alone, the toast goes by itself (data-timeout, 8 s; not while pointed at).
    row.get_by_role("button", name="More actions for Delete me").click()
    row.get_by_role("menuitem", name="Move to trash").click()
    expect(toast).to_be_visible()
    page.mouse.move(0, 0)
    expect(toast).to_have_count(0, timeout=15_000)


def test_markup_in_messages_and_replies_shows_as_text_and_never_runs(page, daphne_server, llm_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Safety", name_source="user")
    dialogs, console = [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("console", lambda message: console.append(message.text))
    message = '<script>alert("user")</script> **bold** <img src=x onerror="alert(\'img\')">'
    reply = 'Echo <script>console.log("pwned")</script> and **strong** <img src=x onerror="alert(\'reply\')"> done'
    llm_server.add(Text(reply, chunk_delay=0.01))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, message)
    run = last_run(page)
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".user-message .message-text")).to_have_text(message)
    expect(run.locator(".reply strong")).to_have_text("strong")  # markdown is rendered...
    expect(run.locator(".reply")).to_contain_text('<script>console.log("pwned")</script>')  # ...raw HTML is text
    assert run.locator("script, img, [onerror]").count() == 0
    page.reload()
    expect(last_run(page).locator(".reply")).to_contain_text('<img src=x onerror="alert(\'reply\')">')
    assert dialogs == []
    assert not [line for line in console if "pwned" in line]


def test_the_offline_model_end_to_end(page, offline_daphne_server):
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping")
    log_in(page.context, offline_daphne_server.url, alice)
    open_chat(page, offline_daphne_server, session)
    send(page, "add milk and eggs")
    run = last_run(page)
    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".tool-call")).to_have_count(2)
    expect(page.locator("#state-panel")).to_contain_text("milk")
    expect(page.locator("#state-panel")).to_contain_text("eggs")
    expect(run.locator(".run-meta")).to_contain_text("offline-demo")
    session.refresh_from_db()
    assert session.session_state["shopping_list"] == ["milk", "eggs"]
