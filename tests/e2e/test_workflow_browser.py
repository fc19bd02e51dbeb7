"""Workflows and teams in headless Chromium (the shopping workflow on the offline model, the team on scripted
replies): steps appear live as they start, the state panel follows, and a reload shows the same transcript."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from sessions_core.models import Run
from tests.e2e.conftest import Daphne, _server_env, log_in
from tests.support.factories import make_session, make_user
from tests.support.llm_server import Text, ToolCalls

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
expect.set_options(timeout=10_000)


@pytest.fixture(scope="module")
def slow_offline_server(django_db_setup):
    """The offline model with a pause between words, so a step is seen while it runs."""
    server = Daphne(_server_env(OFFLINE_MODEL_DELAY="0.12"))
    yield server
    server.stop()


def open_chat(page, server, session):
    page.goto(f"{server.url}/s/{session.session_id}/")
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)


def send(page, text: str):
    page.locator("#composer-text").fill(text)
    page.locator("#composer-text").press("Enter")


def transcript_html(page) -> str:
    """The transcript's runs as markup, without what differs between a live page and a fresh one."""
    html = page.locator("#transcript").inner_html()
    html = re.sub(r'\s(open|aria-busy|style)(="[^"]*")?', "", html)
    html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', 'name="csrfmiddlewaretoken"', html)  # masked anew
    return re.sub(r"\s+", " ", html)


def test_the_shopping_workflow_shows_its_steps_live_and_the_same_after_a_reload(page, context, slow_offline_server,
                                                                                 screenshots):
    alice = make_user("alice", "pw-alice-123")
    session = make_session(alice, component_id="shopping-workflow", kind="workflow")
    log_in(context, slow_offline_server.url, alice)
    open_chat(page, slow_offline_server, session)

    send(page, "add milk, eggs and bread")
    run = page.locator("#transcript .run").last
    # One moment seen whole: the first step's row is there, running, and the next one not yet.
    page.wait_for_function("""() => {
        const steps = [...document.querySelectorAll('#transcript .run:last-of-type .step')];
        return steps.length === 1 && steps[0].dataset.status === 'running'
            && steps[0].querySelector('.step-name').textContent === 'Shopping assistant';
    }""")
    # The running step is open, and its tool calls and words show in it as they come, before it ends.
    page.wait_for_function("""() => {
        const step = document.querySelector('#transcript .run:last-of-type .step');
        return step && step.open && step.dataset.status === 'running'
            && step.querySelector('.tool-name') && step.querySelector('.step-content').textContent.trim() !== '';
    }""")
    page.screenshot(path=str(screenshots / "workflow-step-running.png"))
    expect(page.locator("#state-panel")).to_contain_text("bread")  # the step's tools changed the state

    expect(run).to_have_attribute("data-status", "completed")
    expect(run.locator(".step")).to_have_count(2)
    expect(run.locator(".step .step-name")).to_have_text(["Shopping assistant", "Tally"])
    expect(run.locator(".step[data-status='completed']")).to_have_count(2)
    expect(run.locator(".reply")).to_contain_text("Your list has 3 item(s): milk, eggs, bread.")
    expect(page.locator("#state-panel")).to_contain_text("item_count")
    tally = page.locator("#state-panel .change-source", has_text="Tally › function")  # the timeline names the step
    expect(tally).to_have_attribute("title", "step:Tally/function")
    run.locator(".step").first.locator("> summary").click()
    expect(run.locator(".step").first.locator(".tool-name").first).to_have_text("add_item")
    page.screenshot(path=str(screenshots / "workflow-done.png"))
    live = transcript_html(page)

    page.reload()
    expect(page.locator(".session-area[data-live='open']")).to_have_count(1)
    expect(page.locator("#transcript .run .step")).to_have_count(2)
    assert transcript_html(page) == live


def test_the_project_team_shows_each_delegation_and_the_state(page, context, daphne_server, llm_server):
    alice = make_user("alice", "pw-alice-123")
    session = make_session(alice, component_id="project-team", kind="team")
    said = "add a Deploy step with high priority"
    llm_server.add(ToolCalls([("delegate_task_to_member", {"member_id": "planner", "task": said})]),
                   ToolCalls([("add_step", {"name": "Deploy", "priority": "high"})]),
                   Text("Added step Deploy (high priority).", chunk_delay=0.05),
                   Text("Planner: Added step Deploy (high priority)."))
    log_in(context, daphne_server.url, alice)
    open_chat(page, daphne_server, session)

    send(page, said)
    run = page.locator("#transcript .run").last
    member = run.locator(".step").first
    expect(member.locator(".step-name")).to_have_text("Planner")
    expect(member.locator(".step-kind")).to_have_text("member")
    expect(run).to_have_attribute("data-status", "completed")
    expect(member).to_have_attribute("data-status", "completed")
    expect(run.locator(".reply")).to_contain_text("Planner:")
    expect(page.locator("#state-panel")).to_contain_text("Deploy")
    label = page.locator("#state-panel .change-source", has_text="Planner › add_step").first
    expect(label).to_have_attribute("title", "member:Planner/tool:add_step")
    # However long, a source is one line of the timeline (cut with an ellipsis), never three or four.
    assert label.evaluate("""label => {
        label.textContent = 'Status tracker › update_step_status_with_a_long_name_' + 'x'.repeat(60);
        return label.getBoundingClientRect().height < 1.6 * parseFloat(getComputedStyle(label).lineHeight);
    }""")
    member.locator("> summary").click()
    expect(member.locator(".step-task")).to_contain_text("add a Deploy step with high priority")
    live = transcript_html(page)

    page.reload()
    expect(page.locator("#transcript .run .step")).to_have_count(1)
    assert transcript_html(page) == live


def test_a_replys_footer_shows_what_it_used_a_workflows_summed_over_its_steps(page, context, slow_offline_server):
    alice = make_user("alice", "pw-alice-123")
    workflow = make_session(alice, component_id="shopping-workflow", kind="workflow")
    agent = make_session(alice, component_id="shopping")
    log_in(context, slow_offline_server.url, alice)

    open_chat(page, slow_offline_server, workflow)
    send(page, "add milk and eggs")
    meta = page.locator("#transcript .run").last.locator(".run-meta")
    expect(page.locator("#transcript .run").last).to_have_attribute("data-status", "completed")
    steps = Run.objects.filter(parent_run__isnull=False, session=workflow)
    used = [step.metrics for step in steps if "input_tokens" in step.metrics]
    assert used  # the agent step counted its tokens; the function step has none
    expect(meta.locator(".meta-model")).to_have_text("offline-demo")
    expect(meta.locator(".meta-tokens")).to_have_text(
        f"{sum(m['input_tokens'] for m in used)} in / {sum(m['output_tokens'] for m in used)} out tokens")

    open_chat(page, slow_offline_server, agent)
    send(page, "add bread")
    run = page.locator("#transcript .run").last
    expect(run).to_have_attribute("data-status", "completed")
    first_token = Run.objects.get(session=agent).metrics["time_to_first_token"]
    assert first_token < 1  # the offline model's first word comes at once: milliseconds, not "0.00 s"
    shown = f"{round(first_token * 1000)} ms" if first_token >= 0.0005 else "under 1 ms"
    expect(run.locator(".meta-ttft")).to_have_text(f"first token {shown}")
