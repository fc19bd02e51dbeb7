"""Workflows and teams in the web chat: their steps and delegations live over the socket, the same
fragments after a reload, the state panel naming the step, the admin's tree of runs."""

from __future__ import annotations

import json
import re
import threading

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client, TransactionTestCase
from django.urls import reverse

from sessions_core.models import ChatSession, Run, RunStatus
from tests.support.factories import make_session, make_user
from tests.support.live_support import LiveTestMixin, frames_until, run_done, settle, started_run_id
from tests.support.llm_server import Text, ToolCalls

STEP = re.compile(r'<details class="step" id="step-([0-9a-f-]{36})" data-status="(\w+)" data-kind="(\w+)"')


def step_rows(html: str) -> list[str]:
    return re.findall(r'<details class="step".*?</details>', html, re.S)


class WorkflowWebTests(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")

    async def send(self, socket, text: str):
        await socket.send_to(text_data=json.dumps({"type": "send", "text": text, "HEADERS": {"HX-Request": "true"}}))

    async def page(self, session) -> str:
        client = Client()
        await sync_to_async(client.force_login)(self.alice)
        response = await sync_to_async(client.get)(reverse("chat:session", args=[session.session_id]))
        assert response.status_code == 200
        return response.content.decode()

    async def test_a_workflow_turn_shows_its_steps_as_they_start_and_the_same_after_a_reload(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        session = await sync_to_async(make_session)(self.alice, component_id="shopping-workflow", kind="workflow")
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "add milk")
        frames = await frames_until(socket, lambda f: "Reply complete." in f)
        run_id = started_run_id(frames)

        assert f'id="steps-{run_id}"' in next(f for f in frames if f'id="run-{run_id}"' in f)
        appended = [STEP.search(f).groups() for f in frames if f"beforeend:#steps-{run_id}" in f]
        assert [(status, kind) for _, status, kind in appended] == [("running", "agent"), ("running", "function")]
        finished = [STEP.search(f).groups() for f in frames if 'class="step"' in f and 'hx-swap-oob="true"' in f
                    and f"beforeend:#steps-{run_id}" not in f and f'id="run-{run_id}"' not in f]
        assert [status for _, status, _ in finished] == ["completed", "completed"]
        shopper_done = next(f for f in frames if 'class="step"' in f and "Added milk." in f and "add_item" in f)
        assert frames.index(shopper_done) < next(i for i, f in enumerate(frames) if "beforeend" in f and "Tally" in f)
        panels = [f for f in frames if 'id="state-panel"' in f]
        assert "step:Shopping assistant/tool:add_item" in panels[0]  # the timeline names the step
        last = frames[-1]
        assert "Your list has 1 item(s): milk." in last
        await settle()
        await socket.disconnect()

        stored = await Run.objects.aget(run_id=run_id)
        assert stored.kind == "workflow" and stored.status == RunStatus.COMPLETED
        reloaded = await self.page(session)
        live_rows = step_rows(last)
        assert live_rows and live_rows == step_rows(reloaded)  # the same fragments, live and reloaded
        assert [name for name in re.findall(r'<span class="step-name">(.*?)</span>', reloaded)] == [
            "Shopping assistant", "Tally"]

    async def test_a_team_turn_shows_each_delegation_with_its_member_task_and_reply(self):
        def respond(body):
            messages = body["messages"]
            team = "<team_members>" in (messages[0].get("content") or "")
            if messages[-1]["role"] == "tool":
                return Text("The planner added it." if team else "Added the step.")
            if team:
                return ToolCalls([("delegate_task_to_member", {"member_id": "planner", "task": "Add Setup Database"})])
            return ToolCalls([("add_step", {"name": "Setup Database"})])

        self.llm.responder = respond
        session = await sync_to_async(make_session)(self.alice, component_id="project-team", kind="team")
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "add a setup database step")
        frames = await frames_until(socket, lambda f: "Reply complete." in f)
        run_id = started_run_id(frames)

        member_row = next(f for f in frames if f"beforeend:#steps-{run_id}" in f)
        assert "Planner" in member_row and "member" in member_row and "Add Setup Database" in member_row
        assert not any("delegate_task_to_member" in f and "tool-call" in f for f in frames)  # shown as the member
        last = frames[-1]
        assert "The planner added it." in last and "Added the step." in last and "add_step" in last
        await settle()
        await socket.disconnect()
        state = (await ChatSession.objects.aget(pk=session.pk)).session_state
        assert state == {"steps": [{"name": "Setup Database", "priority": "medium", "status": "pending"}]}
        assert step_rows(last) == step_rows(await self.page(session))

    async def test_stop_ends_the_workflow_and_its_running_step_cancelled_and_no_later_step_starts(self):
        hold = threading.Event()  # never set: the step agent's reply stops after its first word
        self.llm.add(Text("Adding it now", wait_event=hold))
        session = await sync_to_async(make_session)(self.alice, component_id="shopping-workflow", kind="workflow")
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "add milk")
        frames = await frames_until(socket, lambda f: "beforeend:#steps-" in f)  # the agent step started...
        run_id = started_run_id(frames)
        assert await sync_to_async(self.llm.wait_for_requests)(1)  # ...and its model is streaming
        await frames_until(socket, lambda f: "Adding" in f)  # its first word reached the page: the stop comes after it
        await socket.send_to(text_data=json.dumps({"type": "stop", "run_id": run_id}))
        frames = await frames_until(socket, run_done("cancelled", run_id))
        await settle()

        assert "Stopped" in frames[-1]
        # Said in words, the step's words so far where the reply goes, and the step that never ran named.
        reply = re.search(rf'id="reply-{run_id}">(.*?)</div>', frames[-1], re.S).group(1)
        assert "Adding" in reply and "was cancelled" not in frames[-1]
        assert "Tally did not run: the state keeps the changes made before the stop" in frames[-1]
        assert [status for _, status, _ in map(lambda row: STEP.search(row).groups(), step_rows(frames[-1]))] == [
            "cancelled"]  # the agent step, stopped; Tally never started
        runs = [(run.kind, run.step_name, run.status) async for run in Run.objects.filter(session=session).order_by("pk")]
        assert runs == [("workflow", "", "cancelled"), ("agent", "Shopping assistant", "cancelled")]
        assert await sync_to_async(self.llm.wait_for_disconnects)(1, 5)  # the step's model stream was closed
        assert step_rows(frames[-1]) == step_rows(await self.page(session))
        await socket.disconnect()

    async def test_a_message_sent_while_a_team_works_is_queued_and_runs_next(self):
        hold = threading.Event()

        def respond(body):
            messages = body["messages"]
            if "<team_members>" not in (messages[0].get("content") or ""):
                return Text("Done.")
            if messages[-1]["role"] == "tool":
                return Text("The planner did it.")
            said = messages[-1]["content"]
            if said == "first":
                hold.wait(10)
            return ToolCalls([("delegate_task_to_member", {"member_id": "planner", "task": said})])

        self.llm.responder = respond
        session = await sync_to_async(make_session)(self.alice, component_id="project-team", kind="team")
        socket = await self.socket(session.session_id, self.alice)
        await self.send(socket, "first")
        await frames_until(socket, lambda f: "beforeend:#transcript" in f)  # the team's run started
        await self.send(socket, "second")
        frames = await frames_until(socket, lambda f: "beforeend:#queue" in f)
        assert "Queued: will run after the current reply" in frames[-1] and "second" in frames[-1]
        hold.set()
        await frames_until(socket, run_done())
        await frames_until(socket, run_done())
        await settle()
        runs = [(run.input, run.kind, run.status)
                async for run in Run.objects.filter(session=session, parent_run__isnull=True).order_by("pk")]
        assert runs == [("first", "team", "completed"), ("second", "team", "completed")]
        await socket.disconnect()

    async def test_the_admin_shows_a_workflow_runs_steps_as_a_tree(self):
        self.llm.add(ToolCalls([("add_item", {"item": "milk"})]), Text("Added milk."))
        from chatapp.assistants import get_assistant

        workflow = get_assistant("shopping-workflow")
        output = await workflow.arun("add milk", session_id="admin-tree", user_id="alice")
        admin = await sync_to_async(get_user_model().objects.create_superuser)("root", "root@example.com", "pw-root-123")
        client = Client()
        await sync_to_async(client.force_login)(admin)
        run = await Run.objects.aget(run_id=output.run_id)
        response = await sync_to_async(client.get)(reverse("admin:sessions_core_run_change", args=[run.pk]))
        html = response.content.decode()
        assert response.status_code == 200
        assert re.search(r'<ul class="step-runs"><li><a href="[^"]+">Shopping assistant</a> agent · completed', html)
        assert "Tally</a> function · completed" in html


class TestTitles(LiveTestMixin, TransactionTestCase):
    async def test_a_workflow_session_is_titled_by_the_apps_model_like_any_other(self):
        from chatapp import titles

        alice = await sync_to_async(make_user)("alice")
        self.llm.responder = lambda body: Text("Milk shopping plan") if "at most five words" in (
            body["messages"][0].get("content") or "") else ToolCalls([("add_item", {"item": "milk"})]) if (
            body["messages"][-1]["role"] != "tool") else Text("Added milk.")
        session = await sync_to_async(make_session)(alice, component_id="shopping-workflow", kind="workflow")
        from chatapp.assistants import get_assistant

        await get_assistant("shopping-workflow").arun("add milk", session_id=session.session_id, user_id=alice)
        assert await titles.generate_title(session, alice)
        named = await ChatSession.objects.aget(pk=session.pk)
        assert (named.name, named.name_source) == ("Milk shopping plan", "auto")
