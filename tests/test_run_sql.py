"""The run's hand-written statements (sessions_core/run_sql.py) against their ORM equivalents.

Each statement must read and write exactly what the ORM would, on SQLite and on PostgreSQL: the
same rows, JSON values, aware datetimes and booleans.
"""

import json
import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, connections
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from sessions_core.models import ChatSession, Message, Role, Run, RunStatus, StateChange
from sessions_core.run_sql import HistoryRead, RunStore
from tests.engine_helpers import EngineTestMixin
from tests.factories import make_run, make_session, make_user
from tests.llm_server import Text

HISTORY_FIELDS = ("seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at")


def add_tool_turn(session, run_status=RunStatus.COMPLETED, parent_run=None):
    """A run with a system prompt, a tool call and its result, as the engine stores one."""
    run = Run.objects.create(session=session, status=run_status, input="add milk", parent_run=parent_run)
    seq = session.last_seq
    call = {"id": f"call_{run.pk}", "name": "add_item", "arguments": '{"item": "milk"}'}
    rows = [
        Message(session=session, run=run, seq=seq + 1, role=Role.SYSTEM, content="You keep a list."),
        Message(session=session, run=run, seq=seq + 2, role=Role.USER, content="add milk"),
        Message(session=session, run=run, seq=seq + 3, role=Role.ASSISTANT, content="", tool_calls=[call]),
        Message(session=session, run=run, seq=seq + 4, role=Role.TOOL, content="Added milk", tool_call_id=call["id"],
                tool_name="add_item", tool_error=run_status == RunStatus.ERROR),
        Message(session=session, run=run, seq=seq + 5, role=Role.ASSISTANT, content="Done: milk."),
    ]
    Message.objects.bulk_create(rows)
    session.last_seq = seq + len(rows)
    session.save(update_fields=["last_seq"])
    return run


class TestHistory(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.session = make_session()
        for number in range(6):
            add_tool_turn(cls.session)
            make_run(cls.session, user_text=f"question {number}", reply=f"answer {number}")
        add_tool_turn(cls.session, run_status=RunStatus.ERROR)
        make_run(cls.session, user_text="stopped", reply="half", status=RunStatus.CANCELLED)
        parent = Run.objects.filter(session=cls.session, status=RunStatus.COMPLETED).last()
        add_tool_turn(cls.session, parent_run=parent)  # a member run: never history of the session
        make_session()  # another session's messages must never appear

    def orm_by_runs(self, num_runs):
        runs = (Run.objects.filter(session=self.session, status=RunStatus.COMPLETED, parent_run__isnull=True)
                .order_by("-id").values("id")[:num_runs])
        return list(Message.objects.filter(run_id__in=runs).exclude(role=Role.SYSTEM).order_by("seq")
                    .values_list(*HISTORY_FIELDS))

    def orm_by_messages(self, num_messages):
        rows = list(Message.objects.filter(session=self.session, run__status=RunStatus.COMPLETED,
                                           run__parent_run__isnull=True)
                    .exclude(role=Role.SYSTEM).order_by("-seq").values_list(*HISTORY_FIELDS)[:num_messages])
        rows.reverse()
        return rows

    def test_by_runs_reads_what_the_orm_reads(self):
        store = self.enterContext(RunStore("default"))
        for num_runs in (1, 2, 3, 7, 50):
            with self.subTest(num_runs=num_runs):
                rows = [tuple(row) for row in store.history(self.session.pk, num_runs, None)]
                assert rows == self.orm_by_runs(num_runs)
                assert rows  # the comparison is not between two empty lists

    def test_by_messages_reads_what_the_orm_reads(self):
        store = self.enterContext(RunStore("default"))
        for num_messages in (1, 2, 3, 4, 9, 200):
            with self.subTest(num_messages=num_messages):
                rows = [tuple(row) for row in store.history(self.session.pk, None, num_messages)]
                assert rows == self.orm_by_messages(num_messages)

    def test_a_step_agents_own_runs_read_what_the_orm_reads(self):
        parent = Run.objects.filter(session=self.session, parent_run__isnull=True).last()
        for number in range(4):  # step runs of "shopper", one of another step, one failed
            step = add_tool_turn(self.session, parent_run=parent)
            Run.objects.filter(pk=step.pk).update(component_id="shopper", content=f"step {number}")
        other = add_tool_turn(self.session, parent_run=parent)
        Run.objects.filter(pk=other.pk).update(component_id="other")
        failed = add_tool_turn(self.session, run_status=RunStatus.ERROR, parent_run=parent)
        Run.objects.filter(pk=failed.pk).update(component_id="shopper")
        runs = Run.objects.filter(session=self.session, status=RunStatus.COMPLETED, parent_run__isnull=False,
                                  component_id="shopper").order_by("-id")
        store = self.enterContext(RunStore("default"))
        for num_runs in (1, 3, 10):
            with self.subTest(num_runs=num_runs):
                orm = list(Message.objects.filter(run_id__in=runs.values("id")[:num_runs]).exclude(role=Role.SYSTEM)
                           .order_by("seq").values_list(*HISTORY_FIELDS))
                rows = [tuple(row) for row in store.history(self.session.pk, num_runs, None, component_id="shopper")]
                assert rows == orm and rows
        for num_messages in (1, 3, 9):
            with self.subTest(num_messages=num_messages):
                orm = list(Message.objects.filter(run_id__in=runs.values("id")).exclude(role=Role.SYSTEM)
                           .order_by("-seq").values_list(*HISTORY_FIELDS)[:num_messages])[::-1]
                rows = [tuple(row) for row in store.history(self.session.pk, None, num_messages, component_id="shopper")]
                assert rows == orm and rows

    def test_a_start_reads_its_history_as_history_does(self):
        # On PostgreSQL in the start's own statement (one round trip), which must read the same rows and
        # leave out the rows it writes; elsewhere before it.
        session, now = self.session, timezone.now()
        parent = Run.objects.filter(session=session, parent_run__isnull=True).last()
        for _ in range(2):
            step = add_tool_turn(session, parent_run=parent)
            Run.objects.filter(pk=step.pk).update(component_id="shopper")
        store = self.enterContext(RunStore("default"))
        reads = [HistoryRead(session.pk, 2, None), HistoryRead(session.pk, None, 7),
                 HistoryRead(session.pk, 1, None, "shopper"), HistoryRead(session.pk, None, 3, "shopper"),
                 HistoryRead(session.pk, 3, None, "nobody")]
        seq = Message.objects.filter(session=session).order_by("-seq").values_list("seq", flat=True)[0]
        for number, read in enumerate(reads):
            with self.subTest(read=read):
                expected = store.history(*read)
                run = {"run_id": f"r-{number}", "session_pk": session.pk, "component_id": read.component_id or "shop",
                       "input": "add milk", "model_id": "m", "history_seqs": None, "now": now}
                seq += 2
                first = [(session.pk, None, seq - 1, Role.SYSTEM, "Be brief.", None, "", "", False, now),
                         (session.pk, None, seq, Role.USER, "add milk", None, "", "", False, now)]
                with store.atomic(one_statement=store.writes_in_one_statement):
                    if read.component_id:
                        run_pk, rows, _ = store.start_child(run={**run, "kind": "agent", "parent_pk": parent.pk,
                                                                 "step_name": "keep"}, messages=first, history=read)
                    else:
                        run_pk, rows = store.start_run(run=run, messages=first, history=read,
                                                       lease=(session.pk, "tok", now, now, seq))
                assert rows == expected and bool(rows) == (read.component_id != "nobody")
                assert Run.objects.get(run_id=f"r-{number}").pk == run_pk
                assert list(Message.objects.filter(run_id=run_pk).values_list("seq", flat=True)) == [seq - 1, seq]
                # What it wrote is the next read's: a completed top-level run's user message is history.
                Run.objects.filter(pk=run_pk).update(status=RunStatus.COMPLETED, parent_run=None)
                assert store.history(session.pk, 1, None) == [
                    (seq, "user", "add milk", None, "", "", False, now)]

    def test_values_come_back_typed(self):
        with RunStore("default") as store:
            rows = store.history(self.session.pk, 2, None)
        tool_call = next(row for row in rows if row.tool_calls)
        assert tool_call.tool_calls[0]["name"] == "add_item"
        assert all(isinstance(row.tool_error, bool) for row in rows)
        assert all(timezone.is_aware(row.created_at) for row in rows)


class TestSessionRow(TestCase):
    def test_loads_the_row_with_its_owner(self):
        owner = make_user("ann")
        session = make_session(owner, session_id="s1", session_state={"items": ["milk", {"n": 1.5}]},
                               state_version=4, summary={"summary": "Milk."}, last_seq=9)

        with RunStore("default") as store:
            row = store.load_session("s1", timezone.now())

        assert (row.pk, row.owner_id, row.owner_name) == (session.pk, owner.pk, "ann")
        assert json.loads(row.state_text) == {"items": ["milk", {"n": 1.5}]}
        assert (row.state_version, row.summary, row.last_seq) == (4, {"summary": "Milk."}, 9)
        assert (row.lease_token, row.lease_live) == ("", False)

    def test_unknown_and_ownerless(self):
        make_session(None, session_id="free")
        store = self.enterContext(RunStore("default"))
        assert store.load_session("missing", timezone.now()) is None
        row = store.load_session("free", timezone.now())
        assert (row.owner_id, row.owner_name) == (None, None)

    def test_lease_live_only_until_it_expires(self):
        now = timezone.now()
        make_session(session_id="held", lease_token="t", lease_expires_at=now + timedelta(seconds=5))
        make_session(session_id="expired", lease_token="t", lease_expires_at=now - timedelta(seconds=5))
        store = self.enterContext(RunStore("default"))
        assert store.load_session("held", now).lease_live is True
        assert store.load_session("expired", now).lease_live is False


class TestAdapters(TestCase):
    """The values a store's statements send are what Django's backend would send for the same field."""

    def test_datetimes_and_json_values_are_adapted_as_django_adapts_them(self):
        store = RunStore("default")
        ops = connection.ops
        when = timezone.now()
        for value in (when, when.replace(microsecond=0), when.astimezone(timezone.get_fixed_timezone(-300)), None):
            assert store._adapt_datetime(value) == ops.adapt_datetimefield_value(value)
        values = [{"items": ["milk", "thé"], "n": 2, "x": 1.5, "ok": True}, [{"op": "remove", "path": "/a~1b"}],
                  {"model_calls": 2, "duration": 0.000811}, [3, 4], {"gone": None}, {"big": 2 ** 70},
                  {"nan": float("nan")}, {"odd": "\ud800"}, {1: "int key"}]
        for value in values:
            ours, django = store._json(value), ops.adapt_json_value(value, None)
            if isinstance(django, str):  # SQLite: the same JSON (spacing and escapes aside); NaN as Django writes it
                assert json.loads(ours) == json.loads(django) or (ours == django), value
            else:  # PostgreSQL: Django's own adapter, untouched
                assert type(ours) is type(django) and ours.obj == django.obj
        if connection.vendor == "sqlite":  # (psycopg's wrapper encodes only as the statement runs)
            with pytest.raises(TypeError):  # what the json module cannot encode is refused as before
                store._json({"when": when})
        assert store._json(None) is None


class TestWrites(TestCase):
    def setUp(self):
        self.session = make_session(session_id="w", session_state={"items": []}, state_version=2, last_seq=0)
        self.store = self.enterContext(RunStore("default"))
        self.now = timezone.now()

    def test_a_run_its_messages_and_changes_read_back_through_the_orm(self):
        store, now, session = self.store, self.now, self.session
        run_pk = store.insert_run(run_id="r-1", session_pk=session.pk, component_id="shop", input="add milk",
                                  model_id="m", history_seqs=[3, 4], now=now)
        store.insert_messages([
            (session.pk, run_pk, 1, Role.USER, "add milk", None, "", "", False, now),
            (session.pk, run_pk, 2, Role.ASSISTANT, "", [{"id": "c1", "name": "add", "arguments": "{}"}], "", "",
             False, now),
            (session.pk, run_pk, 3, Role.TOOL, "failed", None, "c1", "add", True, now),
        ])
        store.insert_changes([(session.pk, run_pk, 3, [{"op": "add", "path": "/items/0", "value": "milk"}],
                               [{"op": "remove", "path": "/items/0"}], "tool:add", now)])

        run = Run.objects.get(pk=run_pk)
        assert (run.run_id, run.session_id, run.status, run.input, run.model_id) == (
            "r-1", session.pk, RunStatus.RUNNING, "add milk", "m")
        assert (run.history_seqs, run.metrics, run.content_type, run.cancel_requested) == ([3, 4], {}, "str", False)
        assert run.created_at == now
        messages = list(Message.objects.filter(run_id=run_pk).values_list("seq", "role", "tool_calls", "tool_error"))
        assert messages == [(1, "user", None, False), (2, "assistant", [{"id": "c1", "name": "add", "arguments": "{}"}],
                                                      False), (3, "tool", None, True)]
        change = StateChange.objects.get(session=session)
        assert (change.version, change.patch[0]["value"], change.inverse[0]["op"]) == (3, "milk", "remove")

        store.finish_run(run_pk, status=RunStatus.COMPLETED, content="Added.", content_type="str", error="",
                         metrics={"model_calls": 2}, state_version=3, now=now)
        run.refresh_from_db()
        assert (run.status, run.content, run.metrics, run.state_version, run.finished_at) == (
            "completed", "Added.", {"model_calls": 2}, 3, now)

    def test_start_run_inserts_the_run_and_its_first_messages_and_takes_the_lease(self):
        store, now, session = self.store, self.now, self.session
        expires = now + timedelta(seconds=30)
        with store.atomic(one_statement=store.writes_in_one_statement):
            run_pk, history = store.start_run(
                run={"run_id": "r-1", "session_pk": session.pk, "component_id": "shop", "input": "add milk",
                     "model_id": "m", "history_seqs": [1], "now": now},
                messages=[(session.pk, None, 1, Role.SYSTEM, "Be brief.", None, "", "", False, now),
                          (session.pk, None, 2, Role.USER, "add milk", None, "", "", False, now)],
                lease=(session.pk, "tok", expires, now, 2),
            )

        run = Run.objects.get()
        assert history == []  # none asked for
        assert (run.pk, run.run_id, run.status, run.input, run.history_seqs, run.created_at) == (
            run_pk, "r-1", RunStatus.RUNNING, "add milk", [1], now)
        assert list(Message.objects.order_by("seq").values_list("run_id", "seq", "role", "content", "created_at")) == [
            (run_pk, 1, "system", "Be brief.", now), (run_pk, 2, "user", "add milk", now)]
        session.refresh_from_db()
        assert (session.lease_token, session.lease_expires_at, session.last_seq, session.last_activity_at) == (
            "tok", expires, 2, now)

    def test_start_child_inserts_a_step_run_under_its_parent_with_its_first_messages(self):
        store, now, session = self.store, self.now, self.session
        parent = Run.objects.create(session=session, input="go", kind="workflow")
        with store.atomic(one_statement=store.writes_in_one_statement):
            run_pk, history, _ = store.start_child(
                run={"run_id": "s-1", "session_pk": session.pk, "component_id": "keeper", "input": "add milk",
                     "model_id": "m", "history_seqs": [4], "now": now, "kind": "agent", "parent_pk": parent.pk,
                     "step_name": "keep"},
                messages=[(session.pk, None, 5, Role.SYSTEM, "Be brief.", None, "", "", False, now),
                          (session.pk, None, 6, Role.USER, "add milk", None, "", "", False, now)],
            )
            without_messages, _, _ = store.start_child(
                run={"run_id": "s-2", "session_pk": session.pk, "component_id": "count", "input": "go",
                     "model_id": "", "history_seqs": None, "now": now, "kind": "function", "parent_pk": parent.pk,
                     "step_name": "count"},
                messages=[],
            )

        run = Run.objects.get(run_id="s-1")
        assert history == []
        assert (run.pk, run.parent_run_id, run.kind, run.step_name, run.status, run.history_seqs, run.created_at) == (
            run_pk, parent.pk, "agent", "keep", RunStatus.RUNNING, [4], now)
        assert list(Message.objects.order_by("seq").values_list("session_id", "run_id", "seq", "role", "content")) == [
            (session.pk, run_pk, 5, "system", "Be brief."), (session.pk, run_pk, 6, "user", "add milk")]
        bare = Run.objects.get(run_id="s-2")
        assert (bare.pk, bare.parent_run_id, bare.kind, bare.messages.count()) == (without_messages, parent.pk,
                                                                                    "function", 0)

    def test_start_child_writes_what_earlier_steps_left_for_it_and_reads_its_history_before(self):
        # A workflow's earlier steps: an agent step whose end (and messages) waited, two function steps
        # whose whole rows did. On PostgreSQL all of it goes in the next step's one statement.
        store, now, session = self.store, self.now, self.session
        parent = Run.objects.create(session=session, input="go", kind="workflow")
        waited = Run.objects.create(session=session, parent_run=parent, input="add milk", kind="agent",
                                    component_id="keeper", step_name="keep")
        ended = now + timedelta(milliseconds=4)
        end = (waited.pk, ended, {"status": RunStatus.COMPLETED, "content": "Added.", "content_type": "str",
                                  "error": "", "metrics": {"model_calls": 1}})
        functions = [dict(run_id=f"f-{n}", session_pk=session.pk, component_id="count", input="go", model_id="",
                          now=now, kind="function", parent_pk=parent.pk, step_name=f"count {n}", history_seqs=None,
                          finished_at=ended, status=RunStatus.COMPLETED, content=f"counted {n}", content_type="str",
                          error="", metrics={}) for n in (1, 2)]
        read = HistoryRead(session.pk, 1, None, "keeper")
        with store.atomic(one_statement=store.writes_in_one_statement):
            run_pk, history, stored = store.start_child(
                run={"run_id": "s-1", "session_pk": session.pk, "component_id": "keeper", "input": "and eggs",
                     "model_id": "m", "history_seqs": None, "now": now, "kind": "agent", "parent_pk": parent.pk,
                     "step_name": "keep again"},
                messages=[(session.pk, None, 3, Role.USER, "and eggs", None, "", "", False, now)],
                history=read, children=[end],
                children_messages=[(session.pk, waited.pk, 1, Role.USER, "add milk", None, "", "", False, now),
                                   (session.pk, waited.pk, 2, Role.ASSISTANT, "Added.", None, "", "", False, ended)],
                new_children=functions)

        assert history == []  # read before the end it stores: that run was not completed yet
        assert list(Run.objects.filter(parent_run=parent).order_by("pk").values_list("run_id", flat=True))[1:] == [
            "f-1", "f-2", "s-1"]  # in start order
        assert stored == list(Run.objects.filter(run_id__in=["f-1", "f-2"]).order_by("pk").values_list("pk", flat=True))
        assert Run.objects.get(run_id="s-1").pk == run_pk
        assert Run.objects.values_list("status", "content", "finished_at").get(pk=waited.pk) == (
            "completed", "Added.", ended)
        assert Run.objects.values_list("status", "content").get(run_id="f-2") == ("completed", "counted 2")
        assert list(Message.objects.order_by("seq").values_list("run_id", "seq", "content")) == [
            (waited.pk, 1, "add milk"), (waited.pk, 2, "Added."), (run_pk, 3, "and eggs")]
        # and the next start sees that end
        assert [row.content for row in store.history(*read)] == ["add milk", "Added."]

    def test_a_new_session_its_first_run_and_messages_are_written_at_once_as_the_orm_would(self):
        store, now = self.store, self.now
        owner = make_user()
        expires = now + timedelta(seconds=30)
        built = ChatSession.objects.build(session_id="fresh", owner=owner, kind="workflow", component_id="shop",
                                          metadata={"team": "a"}, now=now, lease_token="tok",
                                          lease_expires_at=expires, last_seq=2)
        run = {"run_id": "r-1", "component_id": "shop", "input": "add milk", "model_id": "m", "history_seqs": None,
               "now": now, "kind": "workflow"}
        messages = [(0, None, 1, Role.SYSTEM, "Be brief.", None, "", "", False, now),
                    (0, None, 2, Role.USER, "add milk", None, "", "", False, now)]
        with store.atomic(one_statement=store.writes_in_one_statement):
            session_pk, run_pk = store.start_new_session(session=built, run=run, messages=messages)

        session = ChatSession.objects.get(session_id="fresh")
        orm = ChatSession.objects.new(session_id="orm", owner=owner, kind="workflow", component_id="shop",
                                      metadata={"team": "a"}, now=now, lease_token="tok", lease_expires_at=expires,
                                      last_seq=2)
        skip = {"id", "session_id", "current_leaf"}
        fields = [field.attname for field in ChatSession._meta.concrete_fields if field.name not in skip]
        assert {name: getattr(session, name) for name in fields} == {name: getattr(orm, name) for name in fields}
        assert (session.pk, session.current_leaf_id) == (session_pk, run_pk)
        stored = Run.objects.get(pk=run_pk)
        assert (stored.session_id, stored.run_id, stored.kind, stored.status, stored.input, stored.follows_id,
                stored.created_at) == (session_pk, "r-1", "workflow", RunStatus.RUNNING, "add milk", None, now)
        assert list(Message.objects.filter(session_id=session_pk).order_by("seq").values_list(
            "run_id", "seq", "role", "content")) == [(run_pk, 1, "system", "Be brief."), (run_pk, 2, "user", "add milk")]
        # The next run made the usual way gets the next id: the one drawn for this run is taken.
        later = Run.objects.create(session=session, input="next")
        assert later.pk > run_pk

    def test_a_new_session_whose_id_exists_writes_nothing(self):
        store, now = self.store, self.now
        built = ChatSession.objects.build(session_id="w", owner=None, now=now, lease_token="tok",
                                          lease_expires_at=now + timedelta(seconds=30), last_seq=1)
        run = {"run_id": "r-1", "component_id": "shop", "input": "hi", "model_id": "m", "history_seqs": None,
               "now": now}
        with store.atomic(one_statement=store.writes_in_one_statement):
            assert store.start_new_session(session=built, run=run, messages=[
                (0, None, 1, Role.USER, "hi", None, "", "", False, now)]) is None
        self.session.refresh_from_db()
        assert (self.session.lease_token, self.session.last_seq) == ("", 0)
        assert (Run.objects.count(), Message.objects.count(), ChatSession.objects.count()) == (0, 0, 1)

    def test_the_lease_is_taken_and_released_with_the_new_state(self):
        store, now, session = self.store, self.now, self.session
        store.take_lease(session.pk, "tok", now + timedelta(seconds=30), now, 5)
        session.refresh_from_db()
        expires = now + timedelta(seconds=30)
        assert (session.lease_token, session.lease_expires_at, session.last_seq) == ("tok", expires, 5)

        assert store.release_lease(session.pk, "tok", 2, now, 8, '{"items": ["milk"]}', 3) is True
        session.refresh_from_db()
        assert (session.lease_token, session.lease_expires_at, session.last_seq) == ("", None, 8)
        assert (session.session_state, session.state_version) == ({"items": ["milk"]}, 3)

    def test_release_refuses_a_lost_lease_or_a_changed_state(self):
        store, now, session = self.store, self.now, self.session
        store.take_lease(session.pk, "tok", now + timedelta(seconds=30), now, 0)

        assert store.release_lease(session.pk, "other", 2, now, 1) is False  # someone else holds it now
        assert store.release_lease(session.pk, "tok", 1, now, 1, "{}", 2) is False  # state moved on meanwhile
        session.refresh_from_db()
        assert (session.lease_token, session.session_state, session.state_version) == ("tok", {"items": []}, 2)
        assert store.release_lease(session.pk, "tok", 2, now, 1) is True  # no state change: state untouched
        session.refresh_from_db()
        assert (session.lease_token, session.session_state) == ("", {"items": []})


class TestFinish(TestCase):
    """`RunStore.finish`: the usual finish (one statement on PostgreSQL), all of it or nothing."""

    def setUp(self):
        self.session = make_session(session_id="f", session_state={"items": []}, state_version=2, last_seq=1)
        self.store = self.enterContext(RunStore("default"))
        self.now = now = timezone.now()
        self.run_pk = self.store.insert_run(run_id="r-1", session_pk=self.session.pk, component_id="shop",
                                            input="add milk", model_id="m", history_seqs=None, now=now)
        self.store.take_lease(self.session.pk, "tok", now + timedelta(seconds=30), now, 1)

    def finish(self, token="tok", base_version=2, **overrides):
        pk, now = self.session.pk, self.now
        arguments = dict(
            session_pk=pk, token=token, base_version=base_version, last_seq=3, state_text='{"items": ["milk"]}',
            state_version=3, changes=[(pk, self.run_pk, 3, [{"op": "add", "path": "/items/0", "value": "milk"}],
                                       [{"op": "remove", "path": "/items/0"}], "tool:add", now)],
            messages=[(pk, self.run_pk, 2, Role.ASSISTANT, "", [{"id": "c1", "name": "add", "arguments": "{}"}],
                       "", "", False, now),
                      (pk, self.run_pk, 3, Role.TOOL, "Added milk", None, "c1", "add", False, now)],
            run_pk=self.run_pk, status=RunStatus.COMPLETED, content="Added.", content_type="str", error="",
            metrics={"model_calls": 2}, now=now,
        )
        arguments.update(overrides)
        with self.store.atomic(one_statement=self.store.writes_in_one_statement):
            return self.store.finish(**arguments)

    def test_it_releases_the_lease_and_writes_the_state_the_changes_the_messages_and_the_outcome(self):
        assert self.finish() is True

        session = ChatSession.objects.get(pk=self.session.pk)
        assert (session.lease_token, session.lease_expires_at, session.last_seq, session.last_activity_at) == (
            "", None, 3, self.now)
        assert (session.session_state, session.state_version) == ({"items": ["milk"]}, 3)
        change = StateChange.objects.get()
        assert (change.run_id, change.version, change.patch, change.inverse, change.source, change.created_at) == (
            self.run_pk, 3, [{"op": "add", "path": "/items/0", "value": "milk"}],
            [{"op": "remove", "path": "/items/0"}], "tool:add", self.now)
        assert list(Message.objects.order_by("seq").values_list(
            "session_id", "run_id", "seq", "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error",
            "created_at")) == [
            (self.session.pk, self.run_pk, 2, "assistant", "", [{"id": "c1", "name": "add", "arguments": "{}"}], "",
             "", False, self.now),
            (self.session.pk, self.run_pk, 3, "tool", "Added milk", None, "c1", "add", False, self.now)]
        run = Run.objects.get()
        assert (run.status, run.content, run.metrics, run.state_version, run.finished_at) == (
            "completed", "Added.", {"model_calls": 2}, 3, self.now)

    def test_without_a_state_change_or_new_messages_only_the_lease_and_the_outcome_are_written(self):
        assert self.finish(state_text=None, state_version=2, changes=[], messages=[], last_seq=1,
                           status=RunStatus.ERROR, content="boom", error="boom") is True

        session = ChatSession.objects.get(pk=self.session.pk)
        assert (session.lease_token, session.session_state, session.state_version) == ("", {"items": []}, 2)
        assert (StateChange.objects.count(), Message.objects.count()) == (0, 0)
        assert Run.objects.values_list("status", "error").get() == ("error", "boom")

    def test_the_ends_of_steps_that_waited_for_it_are_written_with_it(self):
        pk, now = self.session.pk, self.now
        step = self.store.insert_run(run_id="r-step", session_pk=pk, component_id="helper", input="sub", model_id="m",
                                     history_seqs=None, now=now, parent_pk=self.run_pk, step_name="help")
        ended = now + timedelta(milliseconds=5)
        step_end = (step, ended, {"status": RunStatus.COMPLETED, "content": "helped", "content_type": "str",
                                  "error": "", "metrics": {"model_calls": 1}})
        step_message = (pk, step, 2, Role.ASSISTANT, "helped", None, "", "", False, ended)
        root_message = (pk, self.run_pk, 3, Role.ASSISTANT, "Added.", None, "", "", False, now)

        assert self.finish(children=[step_end], messages=[step_message, root_message]) is True

        assert Run.objects.values_list("status", "content", "metrics", "state_version", "finished_at").get(pk=step) == (
            "completed", "helped", {"model_calls": 1}, None, ended)
        assert Run.objects.values_list("status", "state_version").get(pk=self.run_pk) == ("completed", 3)
        assert list(Message.objects.order_by("seq").values_list("run_id", "seq", "content")) == [
            (step, 2, "helped"), (self.run_pk, 3, "Added.")]

    def test_the_rows_of_steps_stored_only_now_are_inserted_and_their_changes_name_them(self):
        pk, now = self.session.pk, self.now
        ended = now + timedelta(milliseconds=3)
        row = dict(run_id="r-count", session_pk=pk, component_id="count", input="add milk", model_id="", now=now,
                   kind="function", parent_pk=self.run_pk, step_name="Count", history_seqs=None, finished_at=ended,
                   status=RunStatus.COMPLETED, content="counted", content_type="str", error="", metrics={"n": 1})
        changes = [(pk, self.run_pk, 3, [{"op": "add", "path": "/items/0", "value": "milk"}],
                    [{"op": "remove", "path": "/items/0"}], "tool:add", now),
                   (pk, "r-count", 4, [{"op": "add", "path": "/count", "value": 1}],
                    [{"op": "remove", "path": "/count"}], "step:Count/function", now)]

        assert self.finish(changes=changes, state_version=4, new_children=[row]) is True

        step = Run.objects.get(run_id="r-count")
        assert (step.parent_run_id, step.kind, step.step_name, step.status, step.content, step.metrics,
                step.created_at, step.finished_at) == (
            self.run_pk, "function", "Count", "completed", "counted", {"n": 1}, now, ended)
        assert list(StateChange.objects.order_by("version").values_list("version", "run_id", "source")) == [
            (3, self.run_pk, "tool:add"), (4, step.pk, "step:Count/function")]
        assert ChatSession.objects.values_list("state_version", flat=True).get(pk=pk) == 4

    def test_a_lost_lease_writes_nothing_of_the_steps_either(self):
        pk, now = self.session.pk, self.now
        step = self.store.insert_run(run_id="r-step", session_pk=pk, component_id="helper", input="sub", model_id="m",
                                     history_seqs=None, now=now, parent_pk=self.run_pk, step_name="help")
        step_end = (step, now, {"status": RunStatus.COMPLETED, "content": "helped", "content_type": "str",
                                "error": "", "metrics": {}})

        assert self.finish(token="other", children=[step_end],
                           messages=[(pk, step, 2, Role.ASSISTANT, "helped", None, "", "", False, now)]) is False

        assert Run.objects.values_list("status", "finished_at").get(pk=step) == ("running", None)
        assert Message.objects.count() == 0

        row = dict(run_id="r-count", session_pk=pk, component_id="count", input="sub", model_id="", now=now,
                   kind="function", parent_pk=self.run_pk, step_name="Count", history_seqs=None, finished_at=now,
                   status=RunStatus.COMPLETED, content="counted", content_type="str", error="", metrics={})
        changes = [(pk, "r-count", 3, [{"op": "add", "path": "/count", "value": 1}],
                    [{"op": "remove", "path": "/count"}], "step:Count/function", now)]
        assert self.finish(token="other", changes=changes, new_children=[row]) is False
        assert not Run.objects.filter(run_id="r-count").exists() and not StateChange.objects.exists()

    def test_a_lost_lease_or_a_moved_state_writes_nothing(self):
        for overrides in ({"token": "other"}, {"base_version": 1}):
            with self.subTest(**overrides):
                assert self.finish(**overrides) is False

                session = ChatSession.objects.get(pk=self.session.pk)
                assert (session.lease_token, session.session_state, session.state_version, session.last_seq) == (
                    "tok", {"items": []}, 2, 1)
                assert (StateChange.objects.count(), Message.objects.count()) == (0, 0)
                assert Run.objects.values_list("status", "finished_at").get() == ("running", None)


class TestStepsOutsideAtomicBlocks(EngineTestMixin, TransactionTestCase):
    """With nothing watching Django's cursor, a run's steps use the driver's cursor and begin and end
    their own transactions: the same rows, Django's error classes, and nothing left half-written."""

    def test_a_run_commits_its_steps_and_leaves_the_connection_as_it_found_it(self):
        self.llm.add(Text("stored"))
        output = self.agent().run("hi", session_id="s")

        assert output.status == "completed"
        assert (connection.in_atomic_block, connection.get_autocommit()) == (False, True)
        # Committed: another thread (another connection) reads the finished run.
        run = run_in_thread(lambda: Run.objects.values_list("status", "content").get(run_id=output.run_id))
        assert run == ("completed", "stored")

    def test_a_failing_statement_rolls_the_whole_step_back_and_raises_djangos_error(self):
        self.llm.add(Text("first"))
        agent = self.agent()
        agent.run("first", session_id="s")
        session = ChatSession.objects.get(session_id="s")
        # A row in the way of the next run's first message: its insert fails inside the start step.
        Message.objects.create(session=session, run=Run.objects.get(), seq=session.last_seq + 1, role="user",
                               content="in the way")

        with pytest.raises(IntegrityError):  # django.db's, not the driver's
            agent.run("second", session_id="s")

        assert Run.objects.count() == 1  # the second run's row went with the rolled-back step
        assert not ChatSession.objects.get(session_id="s").is_running  # and so did its lease
        assert (connection.in_atomic_block, connection.get_autocommit()) == (False, True)

    def test_execute_wrappers_see_every_statement_of_a_run(self):
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

        # Load the session; insert the run and its first messages and take the lease; then the finish:
        # release the lease, insert the last messages, store the outcome. On PostgreSQL the writes of
        # each step are one statement.
        if connection.vendor == "postgresql":
            expected = ["SELECT", "WITH", "WITH"]
        else:
            expected = ["SELECT", "INSERT", "INSERT", "UPDATE", "UPDATE", "INSERT", "UPDATE"]
        assert [kind for kind in seen if kind not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")] == expected


def run_in_thread(fn):
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()) or connections.close_all())
    thread.start()
    thread.join()
    return result[0]


if connection.vendor == "postgresql":  # SQLite has no prepared statements of the server's to show

    class TestPreparedStatements(EngineTestMixin, TransactionTestCase):
        def test_a_runs_statements_are_prepared_on_the_server_after_their_fifth_use(self):
            # chatapp/settings.py sets psycopg's prepare_threshold (5); the run's statements bind on the server.
            assert connection.settings_dict["OPTIONS"]["prepare_threshold"] == 5
            agent = self.agent()
            for turn in range(6):
                self.llm.add(Text("ok"))
                agent.run(f"turn {turn}", session_id="s")

            with connection.cursor() as cursor:
                cursor.execute("SELECT statement FROM pg_prepared_statements")
                prepared = [row[0] for row in cursor.fetchall()]
            assert any("sessions_core_chatsession" in statement and "FOR UPDATE" in statement
                       for statement in prepared), prepared


def test_statements_for_the_raw_cursor_number_their_placeholders():
    from sessions_core.run_sql import _numbered

    assert _numbered("SELECT a FROM t WHERE b = %s AND c IN (%s, %s)") == (
        b"SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)")
    assert _numbered("COMMIT") == b"COMMIT"


def test_no_statement_holds_a_percent_sign_but_its_placeholders():
    # What lets the statements' placeholders be rewritten by plain replacement (? for SQLite's driver,
    # $1... for PostgreSQL's raw cursor): a literal % (LIKE '%x%') would be taken for one.
    from sessions_core.run_sql import RunSQL

    sql = RunSQL(connection)
    statements = [value for value in vars(sql).values() if isinstance(value, str)]
    if connection.vendor == "postgresql":  # the steps' writes as one statement each
        statements += [sql.start_together(2), sql.start_child_together(2), sql.start_new_session(2),
                       sql.start_together(2, sql.history_by_messages),
                       sql.start_child_together(2, sql.step_history_by_runs),
                       sql.start_child_together(2, sql.step_history_by_runs, held=(1, 2, 2)),
                       sql.finish_together(2, 2, True, children=1, new_children=1)]
    assert statements and all("%" not in text.replace("%s", "") and "?" not in text for text in statements)
