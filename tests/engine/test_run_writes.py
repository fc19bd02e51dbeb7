"""The run path's single-statement writes (sessions_core/run/writes.py) store exactly what the ORM would."""

from django.db import connection
from django.forms.models import model_to_dict
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sessions_core.models import ChatSession, Message, Role, Run, RunStatus, StateChange
from sessions_core.run import writes
from tests.support.factories import make_session, make_user


def stored(model, pk) -> dict:
    return model_to_dict(model.objects.get(pk=pk), exclude=["id"])


class TestInsert(TestCase):
    def test_a_run_is_stored_as_the_orm_stores_it_and_gets_its_pk(self):
        session, now = make_session(owner=make_user("ann")), timezone.now()
        fields = dict(session=session, kind="team", component_id="c", status=RunStatus.RUNNING, input="hé \"x\"",
                      metrics={"input_tokens": 3, "nested": {"a": [1, None]}}, history_seqs=[1, 2],
                      created_at=now, model_id="m")
        ours = Run(run_id="ours", **fields)
        with CaptureQueriesContext(connection) as queries:
            writes.insert([ours], "default", returning_pk=True)
        orm = Run.objects.create(run_id="orm", **fields)

        assert len(queries) == 1
        assert ours.pk is not None and not ours._state.adding
        assert {**stored(Run, ours.pk), "run_id": "orm"} == stored(Run, orm.pk)

    def test_many_rows_in_one_statement_with_json_and_nulls(self):
        session, now = make_session(owner=make_user("ann")), timezone.now()
        run = Run.objects.create(session=session, status=RunStatus.RUNNING, created_at=now)
        rows = [
            Message(session=session, run=run, seq=1, role=Role.USER, content="a'b", created_at=now),
            Message(session=session, run=run, seq=2, role=Role.ASSISTANT, content="",
                    tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": "{}"}}], created_at=now),
            Message(session=session, run=run, seq=3, role=Role.TOOL, content="ok", tool_call_id="c1",
                    tool_name="f", tool_error=True, created_at=now),
        ]
        with CaptureQueriesContext(connection) as queries:
            writes.insert(rows, "default")

        assert len(queries) == 1
        got = list(Message.objects.filter(run=run).order_by("seq").values_list(
            "seq", "content", "tool_calls", "tool_call_id", "tool_name", "tool_error", "created_at"))
        assert got == [(1, "a'b", None, "", "", False, now),
                       (2, "", [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}], "", "", False, now),
                       (3, "ok", None, "c1", "f", True, now)]

    def test_nothing_to_insert_runs_no_statement(self):
        with CaptureQueriesContext(connection) as queries:
            writes.insert([], "default")
        assert len(queries) == 0


class TestUpdate(TestCase):
    def test_it_changes_exactly_the_rows_the_orm_filter_would(self):
        session, now = make_session(owner=make_user("ann")), timezone.now()
        runs = [Run.objects.create(session=session, status=status, created_at=now)
                for status in (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.COMPLETED, RunStatus.RUNNING)]

        changed = writes.update(Run, "default", {"session_id": session.pk, "status": (RunStatus.RUNNING,
                                                                                      RunStatus.PAUSED)},
                                status=RunStatus.CANCELLED, finished_at=now, metrics={"k": [1]})

        assert changed == 3
        assert [Run.objects.get(pk=run.pk).status for run in runs] == [
            RunStatus.CANCELLED, RunStatus.CANCELLED, RunStatus.COMPLETED, RunStatus.CANCELLED]
        assert Run.objects.get(pk=runs[0].pk).metrics == {"k": [1]}
        assert Run.objects.get(pk=runs[0].pk).finished_at == now

    def test_an_empty_tuple_matches_nothing_without_a_statement(self):
        make_session(owner=make_user("ann"))
        with CaptureQueriesContext(connection) as queries:
            assert writes.update(ChatSession, "default", {"pk": ()}, lease_token="t") == 0
        assert len(queries) == 0
        assert not ChatSession.objects.filter(lease_token="t").exists()

    def test_none_matches_null_and_pk_names_the_primary_key(self):
        session = make_session(owner=make_user("ann"))
        assert writes.update(ChatSession, "default", {"pk": session.pk, "lease_expires_at": None},
                             lease_token="t") == 1
        assert writes.update(ChatSession, "default", {"pk": session.pk, "lease_token": "other"},
                             lease_token="u") == 0
        assert ChatSession.objects.get(pk=session.pk).lease_token == "t"

    def test_a_foreign_key_is_set_by_its_id(self):
        session, now = make_session(owner=make_user("ann")), timezone.now()
        run = Run.objects.create(session=session, status=RunStatus.COMPLETED, created_at=now)
        writes.update(ChatSession, "default", {"pk": session.pk}, current_leaf_id=run.pk)
        writes.insert([StateChange(session=session, run=run, version=1, patch=[], inverse=[], source="s",
                                   created_at=now)], "default")
        assert ChatSession.objects.get(pk=session.pk).current_leaf_id == run.pk
        assert StateChange.objects.get(session=session).run_id == run.pk
