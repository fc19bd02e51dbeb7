"""chatapp.live with the session's run in another process: a message whose turn has come waits for that run
in the stored queue, where a tab served by any process can still drop it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from django.test import TransactionTestCase
from django.utils import timezone

from chatapp import live
from chatapp.live import queue
from chatapp.models import QueuedMessage
from sessions_core.run import registry as run_registry
from sessions_core.models import ChatSession, Run
from tests.factories import make_session, make_user
from tests.live_support import LiveTestMixin, settle
from tests.llm_server import Text


async def until(condition, timeout: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.005)  # polling this process's state: there is no event to wait on


class TestAnotherProcessHoldsTheSession(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")

    async def test_a_message_waiting_for_it_stays_stored_and_can_be_dropped(self):
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(
            lease_token="elsewhere", lease_expires_at=timezone.now() + timedelta(seconds=30))
        self.llm.add(Text("never asked"))
        session = await ChatSession.objects.aget(pk=self.session.pk)
        item = await live.submit(session, self.alice, "hello")
        assert item.shown_queued
        # Its turn has come, and something of this process waits for the lease.
        waiting = queue._queues[session.pk]
        await until(lambda: waiting.starting is item and run_registry._lease_waiters.get(session.pk))
        assert await QueuedMessage.objects.filter(queued_id=item.queued_id).aexists()  # still stored
        assert await live.stop(session, queued_id=item.queued_id)  # as a tab of any process drops it
        await ChatSession.objects.filter(pk=session.pk).aupdate(lease_token="", lease_expires_at=None)
        await settle()
        assert not await Run.objects.filter(session=session).aexists()
        assert self.llm.requests == []
