"""A reply streams as markdown in Chromium: headings, emphasis and code blocks appear while it is written
(never raw ** or ##), and the live reply is, element for element, the finished one."""

from __future__ import annotations

import re
import threading

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import log_in
from tests.e2e.test_chat_browser import last_run, open_chat, send
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text, _words

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)

REPLY = """## Plan for the week

First **the shopping**, then *the cooking*:

- buy milk
- buy eggs

| day | dish |
|-----|------|
| Mon | soup |

```python
def cook(dish):
    return f"cooked {dish}"
```

That is all."""


def test_a_reply_is_markdown_while_it_streams_and_the_same_when_it_ends(page, daphne_server, llm_server,
                                                                        screenshots):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Markdown", name_source="user")
    middle, end = threading.Event(), threading.Event()
    inside_fence = next(i for i, word in enumerate(_words(REPLY)) if word.startswith("return"))
    llm_server.add(Text(REPLY, wait_event=middle, hold_after=inside_fence, end_event=end))
    log_in(page.context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)
    send(page, "plan my week")

    # Mid-stream, held inside the code block (its fence still open): already rendered, never raw.
    run, reply = last_run(page), last_run(page).locator(".reply")
    expect(reply.locator("pre code")).to_contain_text("def cook(dish):")
    expect(run).to_have_attribute("data-status", "running")
    expect(reply.locator("h2")).to_have_text("Plan for the week")
    expect(reply.locator("strong")).to_have_text("the shopping")
    expect(reply.locator("li")).to_have_text(["buy milk", "buy eggs"])
    expect(reply.locator("td").first).to_have_text("Mon")
    expect(reply.locator(".codeblock .code-lang")).to_have_text("python")
    assert not re.search(r"\*\*|##|```|\|---", reply.inner_text())
    page.screenshot(path=str(screenshots / "streaming-markdown.png"))

    # Everything written, the reply still running: the live HTML...
    middle.set()
    expect(reply.locator("p").last).to_have_text("That is all.")
    expect(run).to_have_attribute("data-status", "running")
    live_html = reply.inner_html()
    # ...is the finished reply's.
    end.set()
    expect(last_run(page)).to_have_attribute("data-status", "completed")
    assert last_run(page).locator(".reply").inner_html() == live_html
    assert "<strong>the shopping</strong>" in live_html and '<span class="k">return</span>' in live_html


def test_a_tab_on_another_server_process_streams_the_same_markdown(context, daphne_pair, llm_server):
    first, second = daphne_pair
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Two processes", name_source="user")
    middle, end = threading.Event(), threading.Event()
    llm_server.add(Text(REPLY, wait_event=middle, hold_after=3, end_event=end))
    log_in(context, first.url, alice)  # cookies ignore the port: one login serves both servers
    here, there = context.new_page(), context.new_page()
    open_chat(here, first, session)
    open_chat(there, second, session)  # before the reply starts: it follows the batches of the other process
    send(here, "plan my week")
    expect(last_run(there).locator(".reply h2")).to_have_text(re.compile(r"^Plan"))
    middle.set()
    for page in (here, there):
        expect(last_run(page).locator(".reply p").last).to_have_text("That is all.")
        expect(last_run(page)).to_have_attribute("data-status", "running")
    live_html = last_run(here).locator(".reply").inner_html()
    assert last_run(there).locator(".reply").inner_html() == live_html
    end.set()
    for page in (here, there):
        expect(last_run(page)).to_have_attribute("data-status", "completed")
        assert last_run(page).locator(".reply").inner_html() == live_html
