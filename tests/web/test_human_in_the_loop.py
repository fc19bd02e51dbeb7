"""A reply that waits for the user, in the chat: its cards in place of the reply, answered over the socket
(Channels' real routing), continued live in every tab; the cards survive a reload and become records of
the decision; Stop ends a waiting reply; a chat that waits is marked in the sidebar."""

from __future__ import annotations

import json
import re

from asgiref.sync import sync_to_async
from django.test import Client, TransactionTestCase

from chatapp import live
from sessions_core.models import ChatSession, Run, RunStatus
from tests.support.factories import make_session, make_user
from tests.support.live_support import LiveTestMixin, frames_until, run_done, settle
from tests.support.llm_server import Text, ToolCalls

REQUIREMENT_ID = re.compile(r'data-requirement-id="([0-9a-f-]{36})"')


class WaitingReplyTests(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="approvals",
                                    session_state={"shopping_list": ["milk", "eggs"]})

    async def paused(self, socket, call=("remove_item", {"item": "eggs"})) -> tuple[str, str, list[str]]:
        """Send a message whose reply calls `call`: (run id, requirement id, the frames up to the paused run)."""
        self.llm.add(ToolCalls([call]))
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "please do it"}))
        frames = await frames_until(socket, run_done("paused"))
        run_id = re.search(r'id="run-([0-9a-f-]{36})"', frames[-1]).group(1)
        return run_id, REQUIREMENT_ID.search(frames[-1]).group(1), frames

    async def answer(self, socket, run_id: str, **answer) -> None:
        await socket.send_to(text_data=json.dumps({"type": "answer", "run_id": run_id, "answers": json.dumps([answer])}))

    def page(self) -> str:
        client = Client()
        client.force_login(self.alice)
        response = client.get(f"/s/{self.session.session_id}/")
        assert response.status_code == 200
        return response.content.decode()

    async def stored(self, run_id: str) -> Run:
        return await Run.objects.aget(run_id=run_id)


class TestAnswering(WaitingReplyTests):
    async def test_approve_continues_the_run_live_in_every_tab_and_the_card_becomes_a_record(self):
        first = await self.socket(self.session.session_id, self.alice)
        second = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, frames = await self.paused(first)
        card = frames[-1]
        assert "waits for your approval" in card and "<dt>item</dt><dd>eggs</dd>" in card  # readable, not JSON
        assert ">Approve</button>" in card and ">Reject</button>" in card and 'id="reply-' not in card
        assert "The reply waits for your answer." in card  # the status line, announced
        await frames_until(second, run_done("paused", run_id))  # the other tab shows it too

        self.llm.add(Text("Removed eggs."))
        await self.answer(second, run_id, id=requirement_id, approve=True)
        for socket in (first, second):  # the answer in one tab goes on in both
            done = (await frames_until(socket, run_done("completed", run_id)))[-1]
            assert "Approved by you at " in done and "Removed eggs." in done and "requirement-form" not in done
        await settle()
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert session.session_state["shopping_list"] == ["milk"]
        run = await self.stored(run_id)
        assert (run.status, run.requirements[0]["confirmation"], run.requirements[0]["answered_by"]) == (
            RunStatus.COMPLETED, True, "alice")
        for socket in (first, second):
            await socket.disconnect()

    async def test_reject_with_a_note_tells_the_model_and_the_record_says_so(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, _ = await self.paused(socket)
        self.llm.add(Text("Kept them."))
        await self.answer(socket, run_id, id=requirement_id, approve=False, note="not today")
        done = (await frames_until(socket, run_done("completed", run_id)))[-1]
        assert "Rejected by you at " in done and ": not today" in done
        assert "rejected by the user. Note: not today" in self.llm.requests[-1]["messages"][-1]["content"]
        await settle()
        assert (await ChatSession.objects.aget(pk=self.session.pk)).session_state["shopping_list"] == ["milk", "eggs"]
        await socket.disconnect()

    async def test_user_input_is_checked_and_a_bad_answer_changes_nothing(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, frames = await self.paused(socket, call=("schedule_delivery", {}))
        assert 'type="date"' in frames[-1] and "required" in frames[-1] and ">Send</button>" in frames[-1]
        for bad in ({"input": {}}, {"input": {"when": "soon"}}, {"approve": True}):
            await self.answer(socket, run_id, id=requirement_id, **bad)
            refusal = (await frames_until(socket, lambda frame: "run-status" in frame))[-1]
            assert "status-error" in refusal and ("Fill in every field" in refusal or "no field named when" in refusal
                                                  or "values are missing" in refusal)
        assert (await self.stored(run_id)).status == RunStatus.PAUSED
        self.llm.add(Text("Booked."))
        await self.answer(socket, run_id, id=requirement_id, input={"date": "2026-12-24"})
        done = (await frames_until(socket, run_done("completed", run_id)))[-1]
        assert "Answered by you" in done and "<dt>date</dt><dd>2026-12-24</dd>" in done
        await settle()
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert session.session_state["delivery"] == {"date": "2026-12-24", "items": 2}
        await socket.disconnect()

    async def test_two_answers_of_two_tabs_continue_the_run_once(self):
        first = await self.socket(self.session.session_id, self.alice)
        second = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, _ = await self.paused(first)
        self.llm.add(Text("Done."))
        await self.answer(first, run_id, id=requirement_id, approve=True)
        await self.answer(second, run_id, id=requirement_id, approve=False)
        await frames_until(first, run_done("completed", run_id))
        await settle()
        run = await self.stored(run_id)
        # Whichever reached the engine first went on, once: one decision stored, one continuation of the model.
        assert run.requirements[0]["confirmation"] in (True, False)
        assert sum(1 for request in self.llm.requests if request["messages"][-1]["role"] == "tool") == 1
        state = (await ChatSession.objects.aget(pk=self.session.pk)).session_state["shopping_list"]
        assert state == (["milk"] if run.requirements[0]["confirmation"] else ["milk", "eggs"])
        for socket in (first, second):
            await socket.disconnect()


class TestWaiting(WaitingReplyTests):
    async def test_the_card_survives_a_reload_and_the_chat_is_marked_waiting(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, _ = await self.paused(socket)
        await socket.disconnect()
        await settle()
        html = await sync_to_async(self.page)()
        assert f'data-requirement-id="{requirement_id}"' in html and ">Approve</button>" in html
        assert 'class="waiting-mark"' in html and "Waits for your answer" in html  # the sidebar row
        assert "chatapp/requirements.js" in html

        # After a restart of the server (nothing of the run is held in memory): a new socket answers it.
        live.runner._not_started.clear()
        socket = await self.socket(self.session.session_id, self.alice)
        self.llm.add(Text("Removed eggs."))
        await self.answer(socket, run_id, id=requirement_id, approve=True)
        await frames_until(socket, run_done("completed", run_id))
        await socket.disconnect()
        await settle()
        html = await sync_to_async(self.page)()
        assert "Approved by you at " in html and "requirement-form" not in html and 'class="waiting-mark"' not in html

    async def test_stop_ends_a_waiting_reply(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, _ = await self.paused(socket)
        await socket.send_to(text_data=json.dumps({"type": "stop", "run_id": run_id}))
        stopped = (await frames_until(socket, run_done("cancelled", run_id)))[-1]
        assert "Not answered: the request was stopped." in stopped and "requirement-form" not in stopped
        await self.answer(socket, run_id, id=requirement_id, approve=True)
        refusal = (await frames_until(socket, lambda frame: "no longer waiting" in frame))[-1]
        assert "status-error" in refusal
        assert (await self.stored(run_id)).status == RunStatus.CANCELLED
        await socket.disconnect()

    async def test_a_new_message_while_a_reply_waits_is_allowed(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, _, _ = await self.paused(socket)
        self.llm.add(Text("Here is your list."))
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "what is on my list"}))
        frames = await frames_until(socket, run_done("completed"))
        assert "Here is your list." in frames[-1]
        await socket.disconnect()
        await settle()
        assert (await self.stored(run_id)).status == RunStatus.PAUSED  # still waiting, below the new reply
        html = await sync_to_async(self.page)()
        assert html.index(f'id="run-{run_id}"') < html.index("Here is your list.")
        assert 'class="waiting-mark"' in html

    async def test_another_users_socket_cannot_answer(self):
        socket = await self.socket(self.session.session_id, self.alice)
        run_id, requirement_id, _ = await self.paused(socket)
        await socket.disconnect()
        bob = await sync_to_async(make_user)("bob")
        bobs = await sync_to_async(make_session)(bob, component_id="approvals")
        other = await self.socket(bobs.session_id, bob)
        await self.answer(other, run_id, id=requirement_id, approve=True)
        refusal = (await frames_until(other, lambda frame: "run-status" in frame))[-1]
        assert "no longer waiting" in refusal
        assert (await self.stored(run_id)).status == RunStatus.PAUSED
        await other.disconnect()
