"""Fragments as strings: sanitized markdown, runs, the transcript slice and the state panel."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from chatapp import rendering
from sessions_core.models import Message, Run, RunStatus
from tests.support.factories import make_run, make_session, make_user

ATTACKS = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "<a href=\"javascript:alert(1)\">x</a>",
    "![x](javascript:alert(1))",
    "<svg onload=alert(1)>",
    "<iframe src=\"https://evil.example\"></iframe>",
    "```html\n</code></pre><script>alert(1)</script>\n```",
    "<div style=\"background:url(javascript:alert(1))\">x</div>",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
]


class Elements(HTMLParser):
    """Every element and attribute in a fragment, as a browser would parse it."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def assert_harmless(html: str) -> None:
    for tag, attrs in Elements(html).tags:
        assert tag not in {"script", "iframe", "svg", "img", "object", "embed", "style"}, tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            assert name != "style" or "url" not in (value or ""), (tag, value)
            if name in ("href", "src"):
                assert (value or "").split(":")[0].lower() in ("http", "https", "mailto") or ":" not in value, value


@pytest.mark.parametrize("attack", ATTACKS)
def test_model_output_cannot_carry_active_content(attack):
    assert_harmless(rendering.render_markdown(f"Hello\n\n{attack}\n\nbye"))


def test_raw_html_is_shown_as_text():
    html = rendering.render_markdown("<script>alert(1)</script> and <b>bold</b>")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


def test_markdown_renders_links_tables_and_emphasis():
    html = rendering.render_markdown("**bold** [site](https://example.com)\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert "<strong>bold</strong>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">site</a>' in html
    assert "<table>" in html and "<td>1</td>" in html


def test_a_tables_alignment_is_a_class_never_a_style_attribute():
    """The Content-Security-Policy refuses style attributes; a class of the three alignments says the same."""
    html = rendering.render_markdown("| a | b | c |\n|:-|-:|:-:|\n| 1 | 2 | 3 |")
    assert '<th class="align-left">a</th>' in html and '<td class="align-right">2</td>' in html
    assert '<td class="align-center">3</td>' in html and "style" not in html


def test_code_blocks_are_highlighted_with_a_copy_button():
    html = rendering.render_markdown("```python\ndef f():\n    return '<b>'\n```")
    assert '<button type="button" class="copy-code">Copy</button>' in html
    assert '<span class="code-lang">python</span>' in html
    assert '<span class="k">def</span>' in html
    assert "&lt;b&gt;" in html and "<b>" not in html


def test_a_code_block_is_valid_html_with_its_language_label():
    html = rendering.render_markdown("```python\nx = 1\n```\n\nAfter.")
    assert html.count("<pre") == 1 and html.count("<code") == 1
    assert "<pre><code><div" not in html and html.startswith('<div class="codeblock">')
    assert "<p>After.</p>" in html


def test_prose_after_a_fence_is_not_a_language_label():
    html = rendering.render_markdown("```Here is the code you asked for\nx = 1\n```")
    assert "code-lang" not in html
    html = rendering.render_markdown("```python title=app.py\nx = 1\n```")
    assert '<span class="code-lang">python</span>' in html


def test_an_image_is_a_link_named_by_its_alt_text_never_loaded():
    html = rendering.render_markdown("See ![a red **bicycle**](https://example.com/bike.png), ![](https://e.com/x.png)"
                                     " and ![x](javascript:alert(1))")
    assert "<img" not in html
    assert ('<a class="image-link" href="https://example.com/bike.png" title="Open the image" '
            'rel="noopener noreferrer nofollow">Image: a red bicycle</a>') in html
    assert "Image: no description</a>" in html and 'href="javascript' not in html


def test_code_in_an_unknown_language_is_escaped_text():
    html = rendering.render_markdown("```nosuchlang\n<script>x</script>\n```")
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert_harmless(html)


class TestRunFragment(TestCase):
    def setUp(self):
        self.session = make_session(owner=make_user("alice"))

    def test_user_text_is_escaped_text_not_markdown(self):
        run = make_run(self.session, user_text="<script>alert(1)</script> **not bold** <img src=x onerror=alert(1)>")
        html = rendering.render_run(run)
        assert "&lt;script&gt;alert(1)&lt;/script&gt; **not bold** &lt;img src=x onerror=alert(1)&gt;" in html
        assert_harmless(html)

    def test_a_finished_reply_is_sanitized_markdown(self):
        run = make_run(self.session, reply="Use **this** <script>alert(1)</script>")
        html = rendering.render_run(run)
        assert "<strong>this</strong>" in html and "&lt;script&gt;" in html
        assert_harmless(html)
        assert f'<article id="run-{run.run_id}" class="run" data-status="completed"' in html
        assert f'<div class="reply" id="reply-{run.run_id}">' in html

    def test_a_running_reply_is_sanitized_markdown_without_a_footer(self):
        run = make_run(self.session, reply=None, status=RunStatus.RUNNING)
        Run.objects.filter(pk=run.pk).update(content="**so far** <script>")
        run.refresh_from_db()
        html = rendering.render_run(run)
        assert (f'<div class="reply streaming" id="reply-{run.run_id}"><p><strong>so far</strong> &lt;script&gt;</p>\n'
                "</div>") in html
        assert "run-meta" not in html

    def test_the_footer_shows_model_tokens_and_timings(self):
        run = make_run(self.session, model_id="gpt-test", metrics={
            "input_tokens": 120, "output_tokens": 34, "time_to_first_token": 0.2345, "duration": 1.5})
        html = rendering.render_run(run)
        for text in ("gpt-test", "120 in / 34 out tokens", ">first token 234 ms<", ">1.50 s<"):
            assert text in html

    def test_a_first_token_under_a_second_is_shown_in_milliseconds_not_as_zero(self):
        for ttft, shown in ((0.0028, "first token 3 ms"), (0.0004, "first token under 1 ms"),
                            (0.999, "first token 999 ms"), (2.5, "first token 2.50 s")):
            run = make_run(self.session, model_id="offline-demo", metrics={
                "input_tokens": 10, "output_tokens": 2, "time_to_first_token": ttft, "duration": ttft + 0.05})
            html = rendering.render_run(run)
            assert f">{shown}<" in html and "0.00 s" not in html, (ttft, html)

    def test_a_workflows_footer_sums_its_steps_models_and_tokens(self):
        workflow = make_run(self.session, kind="workflow", metrics={"duration": 0.4})
        make_run(self.session, parent_run=workflow, kind="agent", step_name="Shopping assistant",
                 model_id="offline-demo", metrics={"input_tokens": 120, "output_tokens": 14, "model_calls": 2,
                                                   "time_to_first_token": 0.01, "duration": 0.2})
        make_run(self.session, parent_run=workflow, kind="function", step_name="Tally", metrics={"duration": 0.001})
        team_step = make_run(self.session, parent_run=workflow, kind="team", step_name="Team", model_id="gpt-test",
                             metrics={"input_tokens": 30, "output_tokens": 5, "model_calls": 1})
        make_run(self.session, parent_run=team_step, kind="agent", step_name="Planner", model_id="offline-demo",
                 metrics={"input_tokens": 7, "output_tokens": 3, "model_calls": 1})
        html = rendering.render_run(Run.objects.get(pk=workflow.pk))
        footer = html[html.index('<footer class="run-meta">'):]
        assert '<span class="meta-model">offline-demo, gpt-test</span>' in footer
        assert re.search(r'<span class="meta-tokens" title="Summed over its steps">157 in / 22 out tokens</span>',
                         footer)
        assert "first token" not in footer and ">400 ms<" in footer

    def test_a_turn_whose_step_tokens_were_never_counted_says_they_are_unknown(self):
        workflow = make_run(self.session, kind="workflow", status=RunStatus.CANCELLED, metrics={"duration": 0.4})
        make_run(self.session, parent_run=workflow, kind="agent", step_name="Counted", model_id="offline-demo",
                 metrics={"input_tokens": 120, "output_tokens": 14, "model_calls": 1})
        make_run(self.session, parent_run=workflow, kind="agent", step_name="Stopped", model_id="offline-demo",
                 status=RunStatus.CANCELLED, metrics={"model_calls": 1})
        footer = rendering.render_run(Run.objects.get(pk=workflow.pk)).split('<footer class="run-meta">')[1]
        assert "tokens unknown" in footer and "120 in" not in footer

    def test_stopped_and_failed_runs_say_so(self):
        stopped = make_run(self.session, reply="half", status=RunStatus.CANCELLED)
        assert "Stopped." in rendering.render_run(stopped)
        silent = make_run(self.session, status=RunStatus.CANCELLED)
        Run.objects.filter(pk=silent.pk).update(content=f"Run {silent.run_id} was cancelled")  # the engine's words
        html = rendering.render_run(Run.objects.get(pk=silent.pk))
        assert "Stopped before any reply was written." in html and "was cancelled" not in html
        failed = make_run(self.session, reply=None, status=RunStatus.ERROR, error="The model is overloaded <b>")
        html = rendering.render_run(failed)
        assert f'<button type="button" class="retry button small" data-run-id="{failed.run_id}">Retry</button>' in html
        assert "The model is overloaded &lt;b&gt;" in html and 'role="alert"' in html

    def test_tool_calls_are_collapsible_rows_with_arguments_and_results(self):
        run = make_run(self.session, user_text="add milk", reply="Added milk.")
        seq = self.session.last_seq
        Message.objects.bulk_create([
            Message(session=self.session, run=run, seq=seq + 1, role="assistant", content="",
                    tool_calls=[{"id": "call_1", "name": "add_item", "arguments": '{"item": "milk"}'},
                                {"id": "call_2", "name": "remove_item", "arguments": '{"item": "<x>"}'}]),
            Message(session=self.session, run=run, seq=seq + 2, role="tool", tool_call_id="call_1",
                    tool_name="add_item", content="Added milk."),
            Message(session=self.session, run=run, seq=seq + 3, role="tool", tool_call_id="call_2",
                    tool_name="remove_item", content="Error: <x> is not on the list.", tool_error=True),
        ])
        html = rendering.render_run(run)
        assert f'<details class="tool-call" id="tool-{run.run_id}-call_1">' in html
        assert '<code class="tool-name">add_item</code>' in html
        assert "{\n  &quot;item&quot;: &quot;milk&quot;\n}" in html  # arguments pretty-printed
        assert "Added milk." in html
        assert f'<details class="tool-call tool-error" id="tool-{run.run_id}-call_2">' in html
        assert "Error: &lt;x&gt; is not on the list." in html
        assert html.index("call_1") < html.index("call_2") < html.index(f'id="reply-{run.run_id}"')

    def test_a_tool_that_answers_with_an_error_shows_failed_not_done(self):
        call = rendering.ToolCallView("call_3", "remove_item", '{"item": "tea"}', result="Error: tea is not on the list.")
        html = rendering.render_tool_call("r1", call)
        assert 'class="tool-call tool-error"' in html
        assert '<span class="tool-status">failed</span>' in html and ">done<" not in html

    def test_a_collapsed_tool_call_shows_its_arguments_in_one_line(self):
        one = rendering.render_tool_call("r1", rendering.ToolCallView("c1", "add_item", '{\n  "item": "milk"\n}'))
        assert '<code class="tool-name">add_item</code><span class="tool-args"> · milk</span>' in one
        many = rendering.ToolCallView("c2", "add_task", '{"name": "<b>call</b>", "priority": "high", "n": 2}')
        assert many.summary == "name=<b>call</b>, priority=high, n=2"
        assert "· name=&lt;b&gt;call&lt;/b&gt;, priority=high, n=2" in rendering.render_tool_call("r1", many)
        assert rendering.ToolCallView("c3", "list_items", "{}").summary == ""
        listed = rendering.ToolCallView("c4", "add_items", '{"items": ["milk", "eggs", 12]}')
        assert listed.summary == "milk, eggs, 12"
        mixed = rendering.ToolCallView("c5", "plan", '{"steps": ["a"], "when": {"day": "mon"}, "ok": true}')
        assert mixed.summary == 'steps=a, when={"day": "mon"}, ok=true'
        assert len(rendering.ToolCallView("c6", "note", '{"text": "%s"}' % ("word " * 40)).summary) == 80  # cut with …

    def test_a_live_tool_call_renders_with_the_same_template(self):
        html = rendering.render_tool_call("r1", rendering.ToolCallView("call_9", "list_items", "{}"))
        assert '<details class="tool-call pending" id="tool-r1-call_9">' in html and "running…" in html


class TestTranscriptRuns(TestCase):
    def setUp(self):
        self.session = make_session(owner=make_user("alice"))

    def test_it_returns_the_last_runs_oldest_first_without_system_messages_or_child_runs(self):
        runs = [make_run(self.session, user_text=f"q{n}") for n in range(5)]
        Message.objects.create(session=self.session, run=runs[0], seq=999, role="system", content="secret prompt")
        Run.objects.create(session=self.session, parent_run=runs[1], input="member step")
        page = rendering.transcript_runs(self.session, limit=3)
        assert [run.pk for run in page] == [r.pk for r in runs[2:]]
        assert page.has_earlier and page.earliest_id == runs[2].pk
        earlier = rendering.transcript_runs(self.session, before=runs[2].pk, limit=3)
        assert [run.pk for run in earlier] == [runs[0].pk, runs[1].pk] and not earlier.has_earlier
        assert all(m.role != "system" for run in earlier for m in run.shown_messages)

    def test_the_number_of_queries_does_not_grow_with_the_runs(self):
        for n in range(30):
            make_run(self.session, user_text=f"q{n}")
        with CaptureQueriesContext(connection) as queries:
            html = "".join(rendering.render_run(run) for run in rendering.transcript_runs(self.session))
        assert html.count('class="run"') == 30
        assert len(queries) == 2  # runs, then their messages


class TestFinishedRun(TestCase):
    def test_the_finished_run_says_in_its_own_read_whether_the_chat_waits_for_the_user(self):
        from chatapp.live import fragments

        session = make_session(owner=make_user("alice"))
        done = make_run(session, user_text="plain")
        Run.objects.create(session=session, parent_run=done, status=RunStatus.PAUSED, input="a step, not a reply")
        assert fragments.finished_html(done.run_id, session)[1:] == (RunStatus.COMPLETED, False)
        paused = make_run(session, user_text="approve this", status=RunStatus.PAUSED)
        assert fragments.finished_html(paused.run_id, session)[1:] == (RunStatus.PAUSED, True)
        later = make_run(session, user_text="meanwhile")  # an earlier reply still waits: the chat is marked
        later.messages.create(session=session, seq=99, role="system", content=(
            "<memories_from_previous_interactions>\n- The user lives in Lyon\n</memories_from_previous_interactions>"))
        with CaptureQueriesContext(connection) as queries:
            html, status, waiting = fragments.finished_html(later.run_id, session)
        assert f'id="run-{later.run_id}"' in html and (status, waiting) == (RunStatus.COMPLETED, True)
        assert "Memories in this reply's context (1)" in html and "<li>The user lives in Lyon</li>" in html
        assert 'id="context-memories" aria-labelledby="context-memories-heading" hx-swap-oob="true"' in html
        # The run (with the memories its model was shown and its chat's waiting mark), its memory changes,
        # its messages, and (the section beside the state panel) whether its owner has memories on.
        assert len(queries) == 4


@pytest.mark.django_db
def test_state_panel_shows_the_session_summary_collapsed_and_escaped():
    from chatapp.rendering import render_state_panel
    from tests.support.factories import make_session, make_user

    session = make_session(make_user("sum"), summary={
        "summary": "Likes <b>bold</b> hikes.", "topics": ["hiking", "food"], "updated_at": "2026-11-29T10:00:00+00:00"})
    html = render_state_panel(session)
    assert '<details class="session-summary" id="session-summary">' in html
    assert "Likes &lt;b&gt;bold&lt;/b&gt; hikes." in html
    assert "Topics: hiking, food" in html
    assert "<details class=\"session-summary\"" not in render_state_panel(make_session(make_user("nosum")))


@pytest.mark.django_db
def test_the_state_panel_reads_the_timeline_only_once_the_state_has_changed(django_assert_num_queries):
    from chatapp.rendering import render_state_panel
    from tests.support.factories import make_session, make_user

    session = make_session(make_user("fresh"))
    with django_assert_num_queries(0):  # version 0: no change was ever recorded
        render_state_panel(session)
    session.apply_state_change({"shopping_list": ["milk"]}, "manual")
    with django_assert_num_queries(1):
        html = render_state_panel(session)
    assert 'class="change-source" title="manual"' in html and 'data-version="1"' in html
