"""chatapp.live with the session's run in another process: a message sent meanwhile waits for that run as a
queued run, which a tab served by any process can drop."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from django.test import TransactionTestCase
from django.utils import timezone

from chatapp import live
from sessions_core.models import ChatSession, Run, RunStatus
from tests.support.factories import make_session, make_user
from tests.support.live_support import LiveTestMixin, settle
from tests.support.llm_server import Text


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
        # Stored as submit returns, queued behind the other process's run.
        assert await Run.objects.filter(run_id=item.run_id, status=RunStatus.QUEUED).aexists()
        assert await live.stop(session, queued_id=item.run_id)  # as a tab of any process drops it
        await ChatSession.objects.filter(pk=session.pk).aupdate(lease_token="", lease_expires_at=None)
        await settle()
        assert not await Run.objects.filter(session=session).aexists()
        assert self.llm.requests == []
