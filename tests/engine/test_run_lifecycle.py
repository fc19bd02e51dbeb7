"""A run's life (sessions_core/run/lifecycle.py): its statuses, the queue, the one stop, and the
transactions of its start and finish as Django runs them."""

import threading
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, connections
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from sessions_core import QueuedRunTakenError, RunEvent
from sessions_core.component import Component
from sessions_core.models import ChatSession, Message, Run, RunStatus
from sessions_core.run import lifecycle, registry
from tests.support.engine_helpers import EngineTestMixin, Gate
from tests.support.factories import make_run, make_session, make_user
from tests.support.llm_server import Text

SQL_VERBS = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")


def until(condition, timeout: float = 10.0) -> None:
    event = threading.Event()
    deadline = timezone.now() + timedelta(seconds=timeout)
    while not condition():
        assert timezone.now() < deadline, "the condition never held"
        event.wait(0.01)


def run_in_thread(fn):
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()) or connections.close_all())
    thread.start()
    thread.join()
    return result[0]


class TestTransitions(TestCase):
    def test_each_transition_moves_only_a_run_in_the_status_it_leaves(self):
        session = make_session(owner=make_user("ann"))
        run = make_run(session, status=RunStatus.QUEUED)

        assert lifecycle.start_queued(run.pk, "default", timezone.now())
        assert not lifecycle.start_queued(run.pk, "default", timezone.now())  # running already
        assert lifecycle.end(run.pk, RunStatus.COMPLETED, "default") == 1
        assert lifecycle.end(run.pk, RunStatus.ERROR, "default") == 0  # over already
        assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED

    def test_a_transition_the_state_machine_does_not_have_is_refused(self):
        session = make_session(owner=make_user("ann"))
        run = make_run(session, status=RunStatus.RUNNING)

        with pytest.raises(lifecycle.TransitionError):
            lifecycle.end(run.pk, RunStatus.QUEUED, "default")
        assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING

    def test_cancel_ends_a_queued_run_at_once_and_asks_a_running_one_to_stop(self):
        session = make_session(owner=make_user("ann"))
        queued, running = make_run(session, status=RunStatus.QUEUED), make_run(session, status=RunStatus.RUNNING)
        done = make_run(session, status=RunStatus.COMPLETED)

        assert Component.cancel_run(queued.run_id) and Component.cancel_run(running.run_id)
        assert not Component.cancel_run(done.run_id)
        assert not Run.objects.filter(pk=queued.pk).exists()  # it never began: nothing of it is kept
        assert Run.objects.values_list("status", "cancel_requested").get(pk=running.pk) == (RunStatus.RUNNING, True)


class TestQueue(EngineTestMixin, TransactionTestCase):
    """A run started while its session's run is in flight is a queued row and starts in order."""

    def start_in_thread(self, agent, text, results, **kwargs):
        def run():
            try:
                results[text] = agent.run(text, session_id="s", user_id="ann", **kwargs)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def test_runs_sent_during_a_run_are_stored_queued_and_run_in_order(self):
        agent = self.agent()
        results = {}
        with Gate() as gate:
            self.llm.add(Text("First reply.", wait_event=gate), Text("Second reply."), Text("Third reply."))
            threads = [self.start_in_thread(agent, "first", results)]
            until(lambda: Run.objects.filter(status=RunStatus.RUNNING).exists())
            threads.append(self.start_in_thread(agent, "second", results))
            until(lambda: Run.objects.filter(status=RunStatus.QUEUED).count() == 1)
            threads.append(self.start_in_thread(agent, "third", results))
            until(lambda: Run.objects.filter(status=RunStatus.QUEUED).count() == 2)
            assert list(Run.objects.filter(status=RunStatus.QUEUED).order_by("pk").values_list("input", flat=True)) == [
                "second", "third"]
            assert not Message.objects.filter(content__in=("second", "third")).exists()  # nothing sent yet
        for thread in threads:
            thread.join(30)

        assert [results[text].content for text in ("first", "second", "third")] == [
            "First reply.", "Second reply.", "Third reply."]
        assert [request["messages"][-1]["content"] for request in self.llm.requests] == ["first", "second", "third"]
        assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}

    def test_a_stop_asked_in_its_process_reports_a_queued_run_open_even_when_it_drops_itself(self):
        """The run waiting here drops its own row at its next look; the stop still says it stopped an open
        run (before, a cancel that lost that race to the waiter answered False)."""
        agent = self.agent()
        results = {}
        with Gate() as gate:
            self.llm.add(Text("First reply.", wait_event=gate))
            first = self.start_in_thread(agent, "first", results)
            until(lambda: Run.objects.filter(status=RunStatus.RUNNING).exists())
            second = self.start_in_thread(agent, "second", results)
            until(lambda: Run.objects.filter(status=RunStatus.QUEUED).exists())
            queued = Run.objects.get(status=RunStatus.QUEUED)

            assert registry.request_cancel(queued.run_id)  # this process's part of a stop only
            second.join(30)
            assert not Run.objects.filter(pk=queued.pk).exists()  # the waiter dropped it itself
        first.join(30)
        assert results["second"].status == RunStatus.CANCELLED and results["first"].content == "First reply."
        assert not registry.request_cancel(queued.run_id)  # over: nothing of it waits here any more

    def test_stop_of_a_queued_run_ends_it_and_it_never_runs(self):
        agent = self.agent()
        results = {}
        with Gate() as gate:
            self.llm.add(Text("First reply.", wait_event=gate), Text("Never sent."))
            first = self.start_in_thread(agent, "first", results)
            until(lambda: Run.objects.filter(status=RunStatus.RUNNING).exists())
            second = self.start_in_thread(agent, "second", results)
            until(lambda: Run.objects.filter(status=RunStatus.QUEUED).exists())
            queued = Run.objects.get(status=RunStatus.QUEUED)
            # From another thread (as another process would: only the database is shared).
            assert run_in_thread(lambda: lifecycle.cancel(queued.run_id))
            second.join(30)
        first.join(30)

        assert results["second"].status == RunStatus.CANCELLED and results["first"].content == "First reply."
        assert "duration" not in results["second"].metrics  # it never started
        assert not Run.objects.filter(pk=queued.pk).exists()
        assert [request["messages"][-1]["content"] for request in self.llm.requests] == ["first"]

    def test_a_queued_run_says_so_to_a_caller_that_streams_events(self):
        agent = self.agent()
        with Gate() as gate:
            self.llm.add(Text("First.", wait_event=gate), Text("Second."))
            results = {}
            first = self.start_in_thread(agent, "first", results)
            until(lambda: Run.objects.filter(status=RunStatus.RUNNING).exists())
            events = []
            stream = agent.run("second", session_id="s", user_id="ann", stream=True, stream_events=True)
            events.append(next(stream))
            gate.set()
            events.extend(stream)
        first.join(30)

        assert [event.event for event in events[:2]] == [RunEvent.run_queued, RunEvent.run_started]
        assert events[0].run_id == events[1].run_id and events[0].input == "second"
        assert events[-1].event == RunEvent.run_completed and events[-1].content == "Second."

    def test_a_queued_run_survives_a_restart_of_its_server_and_runs(self):
        # What a process that stopped while its run waited leaves behind: a queued row whose claim expired.
        session = make_session(owner=make_user("ann"), session_id="s", component_id="tester")
        unclaimed = Run.objects.create(session=session, status=RunStatus.QUEUED, input="sent before the restart",
                                    claimed_until=timezone.now() - timedelta(seconds=1))
        assert [run.pk for run in lifecycle.unclaimed(session.pk)] == [unclaimed.pk]
        self.llm.add(Text("Answered after the restart."))

        output = self.agent().run(None, session_id="s", user_id="ann", run_id=unclaimed.run_id)

        assert (output.status, output.content, output.run_id) == ("completed", "Answered after the restart.",
                                                                   unclaimed.run_id)
        assert self.sent_pairs() == [("user", "sent before the restart")]
        # Stored with the model that answered it (a message queued for later names none).
        assert Run.objects.values_list("pk", "status", "model_id").get() == (unclaimed.pk, RunStatus.COMPLETED,
                                                                           self.model.id)
        assert lifecycle.unclaimed(session.pk) == []

    def test_a_queued_run_whose_process_is_alive_is_not_taken_over(self):
        session = make_session(owner=make_user("ann"), session_id="s", component_id="tester")
        waiting = Run.objects.create(session=session, status=RunStatus.QUEUED, input="mine",
                                     claimed_until=timezone.now() + timedelta(seconds=30))

        with pytest.raises(QueuedRunTakenError):
            self.agent().run(None, session_id="s", user_id="ann", run_id=waiting.run_id)
        assert Run.objects.get(pk=waiting.pk).status == RunStatus.QUEUED and self.llm.requests == []

    async def queued_behind_a_held_run(self, gate):
        """A run held mid-reply by `gate` ("first"), and a second one's stream, waiting behind it: (the first's
        stream, the second's, its RunQueued event)."""
        agent = self.agent()
        self.llm.add(Text("First.", wait_event=gate))
        first = agent.arun("first", session_id="s", user_id="ann", stream=True)
        await anext(first)
        stream = agent.arun("second", session_id="s", user_id="ann", stream=True, stream_events=True)
        queued = await anext(stream)
        assert queued.event == RunEvent.run_queued
        return first, stream, queued

    async def test_a_stop_in_the_waiting_process_is_answered_as_a_stop_whoever_drops_the_row(self):
        with Gate() as gate:
            first, stream, queued = await self.queued_behind_a_held_run(gate)
            # Known in this process while it waits: True, even when its own next look drops the row first.
            assert registry.request_cancel(queued.run_id)
            assert await Component.acancel_run(queued.run_id)
            rest = [event async for event in stream]
            assert [event.event for event in rest] == [RunEvent.run_cancelled]
            gate.set()
            async for _ in first:
                pass
        assert await sync_to_async(lambda: list(Run.objects.values_list("input", flat=True)))() == ["first"]

    async def test_a_caller_that_stops_listening_while_its_run_waits_cancels_it(self):
        with Gate() as gate:
            first, stream, _ = await self.queued_behind_a_held_run(gate)
            assert await Run.objects.filter(input="second", status=RunStatus.QUEUED).aexists()
            await stream.aclose()
            statuses = await sync_to_async(lambda: dict(Run.objects.values_list("input", "status")))()
            assert statuses == {"first": RunStatus.RUNNING}  # the waiting one never began: its row went
            gate.set()
            async for _ in first:
                pass


class TestOutsideAtomicBlocks(EngineTestMixin, TransactionTestCase):
    """As served (no test transaction around it): each step of a run is one transaction of its own."""

    def test_a_run_commits_its_steps_and_leaves_the_connection_as_it_found_it(self):
        self.llm.add(Text("stored"))
        output = self.agent().run("hi", session_id="s")

        assert output.status == "completed"
        assert (connection.in_atomic_block, connection.get_autocommit()) == (False, True)
        # Committed: another thread (another connection) reads the finished run.
        run = run_in_thread(lambda: Run.objects.values_list("status", "content").get(run_id=output.run_id))
        assert run == ("completed", "stored")

    def test_a_failing_statement_rolls_the_whole_step_back(self):
        self.llm.add(Text("first"))
        agent = self.agent()
        agent.run("first", session_id="s")
        session = ChatSession.objects.get(session_id="s")
        # A row in the way of the next run's first message: its insert fails inside the start step.
        Message.objects.create(session=session, run=Run.objects.get(), seq=session.last_seq + 1, role="user",
                               content="in the way")

        with pytest.raises(IntegrityError):
            agent.run("second", session_id="s")

        assert Run.objects.count() == 1  # the second run's row went with the rolled-back step
        assert not ChatSession.objects.get(session_id="s").is_running  # and so did its lease
        assert (connection.in_atomic_block, connection.get_autocommit()) == (False, True)

    def test_a_runs_statements_are_the_ones_query_counting_sees(self):
        seen = []

        def watch(execute, sql, params, many, context):
            seen.append(sql.split()[0].upper())
            return execute(sql, params, many, context)

        self.llm.add(Text("watched"))
        agent = self.agent()
        agent.run("first", session_id="s")  # the session exists: the run takes the usual path
        self.llm.add(Text("watched"))
        with connection.execute_wrapper(watch):
            agent.run("second", session_id="s")

        # The start: lock the session, look for runs queued before it, insert the run and its first
        # message, take the lease. The finish: release the lease with the session's new fields, insert
        # the reply, store the outcome.
        assert [kind for kind in seen if kind not in SQL_VERBS] == [
            "SELECT", "SELECT", "INSERT", "INSERT", "UPDATE", "UPDATE", "INSERT", "UPDATE"]
