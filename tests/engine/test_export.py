"""Downloads of a user's chats: one session as Markdown or JSON, or all of them as JSON."""

from __future__ import annotations

import contextlib
import json
import warnings
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncClient, Client
from django.urls import reverse
from django.utils import timezone

from chatapp import transfers
from chatapp.models import Transfer
from sessions_core import export
from sessions_core.models import ChatSession, Message, Run, RunStatus
from tests.support.factories import make_run, make_session, make_user
from tests.support.web_helpers import finished

pytestmark = pytest.mark.django_db(transaction=True)


def add_tool_run(session: ChatSession, arguments: str, result: str, error: bool = False) -> Run:
    """A run as the engine stores it: system prompt, user message, a tool call, its result, the reply."""
    run = Run.objects.create(session=session, status=RunStatus.COMPLETED, input="add it", content="Added.",
                             finished_at=timezone.now())
    seq = session.last_seq
    rows = [("system", "You keep a list.", {}), ("user", "add it", {}),
            ("assistant", "", {"tool_calls": [{"id": "call_1", "name": "add_item", "arguments": arguments}]}),
            ("tool", result, {"tool_call_id": "call_1", "tool_name": "add_item", "tool_error": error}),
            ("assistant", "Added.", {})]
    Message.objects.bulk_create(Message(session=session, run=run, seq=seq + number, role=role, content=content,
                                        **extra) for number, (role, content, extra) in enumerate(rows, start=1))
    ChatSession.objects.filter(pk=session.pk).update(last_seq=seq + len(rows))
    session.last_seq = seq + len(rows)
    return run


@pytest.fixture
def alice_chat():
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Groceries: week 48",
                           session_state={"shopping_list": ["milk"]}, state_version=1)
    make_run(session, "hello there", "Hi! **Welcome**.")
    add_tool_run(session, '{"item": "milk `2%`"}', "Added milk `2%`.")
    make_run(session, "and then?", None, status=RunStatus.ERROR, error="The model server answered 500.")
    return alice, session


def export_all(user):
    """The export page's POST, its process waited for, then its file downloaded: (response, text)."""
    client = Client()
    client.force_login(user)
    transfer = finished(client.post(reverse("chat:export_all")))
    assert transfer.status == "done", transfer.error
    return download(user, reverse("chat:transfer_download", args=[transfer.transfer_id]))


def download(user, url: str):
    """GET through Django's ASGI handler, as daphne serves it."""

    async def get():
        client = AsyncClient()
        await sync_to_async(client.force_login)(user)
        response = await client.get(url)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Django warns when it has to read a sync stream whole under ASGI
            body = b"".join([part async for part in response.streaming_content])
        return response, body.decode()

    return async_to_sync(get)()


def test_a_session_as_json_has_its_runs_messages_and_state(alice_chat):
    alice, session = alice_chat
    response, body = download(alice, reverse("chat:session_export_json", args=[session.session_id]))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="groceries-week-48-{session.session_id[:8]}.json"'
    assert response["Cache-Control"] == "private, no-store"
    data = json.loads(body)
    assert (data["format"], data["session_id"], data["name"]) == ("sessions_core.session", session.session_id,
                                                                  "Groceries: week 48")
    assert data["session_state"] == {"shopping_list": ["milk"]} and data["state_version"] == 1
    assert [run["status"] for run in data["runs"]] == ["completed", "completed", "error"]
    assert data["runs"][2]["error"] == "The model server answered 500."
    tool_run = data["runs"][1]
    assert [message["role"] for message in tool_run["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tool_run["messages"][1]["tool_calls"][0]["arguments"] == '{"item": "milk `2%`"}'
    assert tool_run["messages"][2]["tool_name"] == "add_item" and tool_run["messages"][2]["tool_error"] is False
    assert "You keep a list." not in body  # the system prompt is the assistant's, not the conversation


def test_a_session_as_markdown_reads_as_the_conversation(alice_chat):
    alice, session = alice_chat
    response, body = download(alice, reverse("chat:session_export_markdown", args=[session.session_id]))
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].endswith(f'-{session.session_id[:8]}.md"')
    assert body.startswith("# Groceries: week 48\n\nAssistant: Shopping list · started ")
    assert body.index("hello there") < body.index("Hi! **Welcome**.") < body.index("add it")
    assert '> Tool `add_item` called with `` {"item": "milk `2%`"} ``' in body  # backticks inside stay code
    assert "> Tool `add_item` returned: Added milk `2%`." in body
    assert "*The reply failed: The model server answered 500.*" in body
    assert body.rstrip().endswith('```json\n{\n  "shopping_list": [\n    "milk"\n  ]\n}\n```')
    assert "You keep a list." not in body


def test_all_chats_are_the_users_own_and_not_the_trash(alice_chat):
    alice, session = alice_chat
    make_session(make_user("bob", "pw-bob-123"), name="Bob's secret")
    older = make_session(alice, name="Older", last_activity_at=timezone.now() - timedelta(days=1))
    make_session(alice, name="Binned", deleted_at=timezone.now())
    response, body = export_all(alice)
    assert response["Content-Disposition"].startswith('attachment; filename="chats-alice-')
    data = json.loads(body)
    assert (data["format"], data["user"]) == ("sessions_core.export", "alice")
    assert [chat["session_id"] for chat in data["sessions"]] == [session.session_id, older.session_id]
    assert len(data["sessions"][0]["runs"]) == 3 and data["sessions"][1]["runs"] == []


@pytest.mark.parametrize("runs", [3, 30])
def test_the_export_reads_the_runs_in_batches_whatever_their_number(runs, django_assert_num_queries):
    session = make_session(make_user("alice"))
    for number in range(runs):
        make_run(session, f"question {number}", f"answer {number}")
    with django_assert_num_queries(2):  # the runs, then their messages: one batch of BATCH_RUNS
        json_parts = list(export.export_json(session))
    with django_assert_num_queries(2):
        markdown = "".join(export.export_markdown(session))
    assert len(json.loads("".join(json_parts))["runs"]) == runs
    assert markdown.count("**You**") == runs and f"answer {runs - 1}" in markdown


def test_an_export_of_many_chats_reads_them_a_group_at_a_time(monkeypatch, django_assert_max_num_queries):
    alice = make_user("alice")
    monkeypatch.setattr(export, "BATCH_RUNS", 5)
    monkeypatch.setattr(export, "EXPORT_CHATS_PER_READ", 10)
    chats = []
    for number in range(30):
        chats.append(make_session(alice, name=f"Chat {number}"))
        make_run(chats[-1], f"question {number}", f"answer {number}")
    long = make_session(alice, name="Long")  # more runs than a batch: read on its own
    for number in range(7):
        make_run(long, f"long question {number}", "answer")
    make_session(alice, name="Empty")
    workflow = make_session(alice, name="Flow", kind="workflow")
    make_run(workflow, parent_run=make_run(workflow, "go", "done"), step_name="Tally", user_text="", reply="3 items")
    sessions = ChatSession.objects.for_user(alice).order_by("-pk")
    # The ids, then per ten chats: the chats, their run counts, and per group of five runs the runs and
    # their messages; not a query per chat.
    with django_assert_max_num_queries(1 + 4 * (2 + 7) + 3):  # and the workflow's steps
        document = json.loads("".join(export.export_all_json(sessions, "alice", timezone.now())))
    one_by_one = [json.loads("".join(export.export_json(session))) for session in sessions]
    assert [chat["name"] for chat in document["sessions"]] == [
        "Flow", "Empty", "Long", *(f"Chat {n}" for n in range(29, -1, -1))]
    assert document["sessions"][0]["runs"][0]["steps"][0]["content"] == "3 items"
    assert document["sessions"] == one_by_one
    assert len(document["sessions"][2]["runs"]) == 7


# -- import ------------------------------------------------------------------------------------------


def exported(session) -> bytes:
    return "".join(export.export_json(session)).encode()


def conversation(session) -> list:
    """What a reader sees of a session: its runs' status, input, reply, and messages."""
    runs = Run.objects.filter(session=session).order_by("pk").prefetch_related("messages")
    return [(run.status, run.input, run.content, run.error,
             [(m.role, m.content, m.tool_calls, m.tool_call_id, m.tool_name, m.tool_error)
              for m in run.messages.exclude(role="system").order_by("seq")]) for run in runs]


def test_an_exported_chat_imports_as_a_new_chat_of_the_importer(alice_chat):
    alice, session = alice_chat
    bob = make_user("bob", "pw-bob-123")
    [copy] = export.import_json(exported(session), bob)
    assert copy.owner == bob and copy.session_id != session.session_id
    assert (copy.name, copy.name_source, copy.component_id) == ("Groceries: week 48", "user", "shopping")
    assert conversation(copy) == conversation(session)
    assert copy.session_state == {"shopping_list": ["milk"]} and copy.state_version == 1
    assert copy.state_changes.get().source == "import" and copy.state_at(0) == {}
    assert copy.last_seq == copy.messages.count() == 7  # renumbered: the system prompt stayed behind
    assert not Run.objects.filter(session=copy, run_id__in=Run.objects.filter(session=session).values("run_id"))
    assert ChatSession.objects.get(pk=session.pk).owner == alice  # the original is untouched


def test_all_chats_import_in_one_go_and_a_running_run_counts_as_interrupted(alice_chat):
    alice, session = alice_chat
    make_run(make_session(alice, name="Half done"), "go on", None, status=RunStatus.RUNNING)
    body = "".join(export.export_all_json(ChatSession.objects.for_user(alice).order_by("pk"), "alice",
                                          timezone.now())).encode()
    bob = make_user("bob", "pw-bob-123")
    copies = export.import_json(body, bob)
    assert [copy.name for copy in copies] == ["Groceries: week 48", "Half done"]
    assert Run.objects.get(session=copies[1]).status == RunStatus.INTERRUPTED


@pytest.mark.parametrize(("body", "says"), [
    (b"not json at all", "Not a JSON file"),
    (b'{"format": "somebody.else", "sessions": []}', "Not a chat export this app wrote"),
    (b'{"format": "sessions_core.session", "version": 1, "runs": [{"status": "completed", "messages": '
     b'[{"role": "system", "content": "x"}]}]}', "runs → 0 → messages → 0 → role"),
    (b'{"format": "sessions_core.session", "version": 1, "session_state": {"n": NaN}}', "NaN is not a JSON value"),
])
def test_a_damaged_or_foreign_file_is_refused_saying_where_and_stores_nothing(alice_chat, body, says):
    alice, _ = alice_chat
    before = (ChatSession.objects.count(), Run.objects.count(), Message.objects.count())
    with pytest.raises(export.ImportRefused) as refused:
        export.import_json(body, alice)
    assert says in str(refused.value)
    assert (ChatSession.objects.count(), Run.objects.count(), Message.objects.count()) == before


def test_one_bad_chat_among_several_stores_none_of_them(alice_chat):
    alice, session = alice_chat
    good = json.loads(exported(session))
    bad = {**good, "runs": [{"status": "completed", "messages": [{"role": "user", "content": "ok"}],
                             "metrics": {"x": float("nan")}}]}
    body = json.dumps({"format": "sessions_core.export", "version": 1, "sessions": [good, bad]})
    before = ChatSession.objects.count()
    with pytest.raises(export.ImportRefused):
        export.import_json(body, alice)
    assert ChatSession.objects.count() == before


def imported_here(user, data: bytes) -> Transfer:
    """An import's work done in this process, as `manage.py transfer --work` does it: the Transfer after."""
    transfer = Transfer.objects.create(owner=user, kind=Transfer.Kind.IMPORT)
    transfers.upload_path(transfer).write_bytes(data)
    transfers.work(transfer)
    transfer.refresh_from_db()
    return transfer


def test_the_import_page_adds_the_chats_and_opens_the_first(alice_chat, client):
    alice, session = alice_chat
    client.force_login(alice)
    page = client.get(reverse("chat:import"))
    assert page.status_code == 200 and b'type="file"' in page.content
    upload = SimpleUploadedFile("chats.json", exported(session), content_type="application/json")
    transfer = finished(client.post(reverse("chat:import"), {"file": upload}))
    copy = ChatSession.objects.for_user(alice).exclude(pk=session.pk).get()
    assert (transfer.status, transfer.done, transfer.total, transfer.stored) == ("done", 1, 1, [[copy.pk, copy.pk]])
    page = client.get(reverse("chat:transfer", args=[transfer.transfer_id])).content.decode()
    assert "Imported 1 chat." in page and reverse("chat:session", args=[copy.session_id]) in page
    assert "hx-trigger" not in page  # done: the page stops asking
    assert not transfers.upload_path(transfer).exists()
    # The copy says it is one; the original keeps its title.
    copy.refresh_from_db()
    session.refresh_from_db()
    assert copy.name == f"{session.name} (imported)" and not session.name.endswith("(imported)")
    assert f"{session.name} (imported)" in client.get(reverse("chat:session", args=[copy.session_id])).content.decode()


@pytest.mark.parametrize("data, words", [
    (b'{"hello": "world"}', "This file is not a chat export from this app."),
    (b'{"format": "somebody.else"}', "This file is not a chat export from this app."),
    (b'{"n": ' + b"9" * 5000 + b"}", "a number too long to read"),
    (b"not json", "This file is not JSON"),
])
def test_the_import_says_what_is_wrong_in_a_users_words(alice_chat, client, data, words):
    transfer = imported_here(alice_chat[0], data)
    client.force_login(alice_chat[0])
    html = client.get(reverse("chat:transfer", args=[transfer.transfer_id])).content.decode()
    assert transfer.status == "failed" and words in transfer.error and words in html
    for internals in ("discriminator", "set_int_max_str_digits", "expected tags", "Expecting value"):
        assert internals not in html


def test_the_import_page_explains_a_refusal(alice_chat, client, settings):
    alice, _ = alice_chat
    client.force_login(alice)
    transfer = finished(client.post(reverse("chat:import"), {"file": SimpleUploadedFile("x.json", b"[1, 2]")}))
    page = client.get(reverse("chat:transfer", args=[transfer.transfer_id]))
    assert transfer.status == "failed" and "This file is not a chat export from this app." in page.content.decode()
    assert not transfers.upload_path(transfer).exists()
    assert client.post(reverse("chat:import"), {}).status_code == 400
    settings.CHAT_IMPORT_MAX_BYTES = 10
    response = client.post(reverse("chat:import"), {"file": SimpleUploadedFile("x.json", b"{" + b" " * 20 + b"}")})
    assert response.status_code == 422 and b"the limit is 10" in response.content
    assert ChatSession.objects.for_user(alice).count() == 1


def test_the_import_needs_the_csrf_token(alice_chat):
    alice, session = alice_chat
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    upload = SimpleUploadedFile("chats.json", exported(session))
    assert client.post(reverse("chat:import"), {"file": upload}).status_code == 403
    assert ChatSession.objects.count() == 1


def failing_insert(table: str, number: int):
    """A connection's execute wrapper: the `number`th INSERT into `table` fails as a full disk would."""
    from django.db import DatabaseError

    inserts = []

    def refuse(execute, sql, params, many, context):
        if sql.startswith(f'INSERT INTO "{table}"'):
            inserts.append(sql)
            if len(inserts) == number:
                raise DatabaseError("disk full")
        return execute(sql, params, many, context)

    return refuse


def test_a_write_that_fails_half_way_leaves_no_chat_behind(alice_chat):
    from django.db import DatabaseError, connection

    alice, session = alice_chat
    one = json.loads(exported(session))
    body = json.dumps({"format": "sessions_core.export", "version": 1, "sessions": [one, one]})
    before = (ChatSession.objects.count(), Run.objects.count(), Message.objects.count())
    with connection.execute_wrapper(failing_insert("sessions_core_message", 1)), pytest.raises(DatabaseError):
        export.import_json(body, alice)
    assert (ChatSession.objects.count(), Run.objects.count(), Message.objects.count()) == before


def test_times_without_a_zone_are_taken_as_utc(alice_chat):
    alice, _ = alice_chat
    run = {"status": "completed", "created_at": "2025-01-02T10:01:00", "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps({"format": "sessions_core.session", "version": 1, "name": "Old",
                       "created_at": "2025-01-02T10:00:00", "runs": [run]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it is handed a naive datetime
        [copy] = export.import_json(body, alice)
    assert copy.created_at.isoformat() == copy.last_activity_at.isoformat() == "2025-01-02T10:00:00+00:00"
    run = copy.runs.get()
    assert run.created_at.isoformat() == "2025-01-02T10:01:00+00:00" and run.input == "hi"


# -- import: in batches, within limits, every field checked ------------------------------------------


def chats_document(count: int, **fields) -> str:
    """An export of `count` one-run chats."""
    run = {"status": "completed", "messages": [{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": "hello"}]}
    chats = [{"format": "sessions_core.session", "version": 1, "name": f"Chat {number}", "runs": [run], **fields}
             for number in range(count)]
    return json.dumps({"format": "sessions_core.export", "version": 1, "sessions": chats})


@contextlib.contextmanager
def zero_lock_wait():
    """This connection's wait for a lock another holds: none (a held lock is an error at once); as before after."""
    from django.db import connection

    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout" if sqlite else "SHOW lock_timeout")
        before = cursor.fetchone()[0]
        cursor.execute("PRAGMA busy_timeout = 0" if sqlite else "SET lock_timeout = '1ms'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(before)}" if sqlite else "SELECT set_config('lock_timeout', %s, false)",
                           None if sqlite else [before])


@pytest.mark.django_db(transaction=True)
def test_an_import_commits_batch_by_batch_and_another_users_writes_go_on_between(monkeypatch):
    import threading

    from django.db import connections

    alice, bob = make_user("alice"), make_user("bob")
    bobs = make_session(bob, name="Bob's chat")
    monkeypatch.setattr(export, "IMPORT_BATCH_ROWS", 4)  # a chat and its run and two messages: one chat a batch
    batch_stored, go_on, progress = threading.Event(), threading.Event(), []

    def between_batches(stored, total):
        progress.append((stored, total))
        if stored == 1:
            batch_stored.set()
            assert go_on.wait(timeout=60)

    def import_in_a_thread():
        try:
            export.import_json(chats_document(3), alice, on_batch=between_batches)
        finally:
            connections.close_all()

    importing = threading.Thread(target=import_in_a_thread)
    importing.start()
    try:
        assert batch_stored.wait(timeout=60)
        # The import is half done: its first chat is committed (this connection sees it) and it holds no lock,
        # so Bob's rename is written at once, with no wait allowed.
        assert list(ChatSession.objects.for_user(alice).values_list("name", flat=True)) == ["Chat 0"]
        client = Client()
        client.force_login(bob)
        with zero_lock_wait():
            response = client.post(reverse("chat:session_rename_hx", args=[bobs.session_id]), {"name": "Renamed"})
        assert response.status_code == 302  # back to the chat, renamed
        assert ChatSession.objects.get(pk=bobs.pk).name == "Renamed"
    finally:
        go_on.set()
        importing.join(timeout=60)
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert ChatSession.objects.for_user(alice).count() == 3


def test_a_failed_batch_takes_the_batches_before_it_away_again(alice_chat, monkeypatch):
    from django.db import DatabaseError, connection

    alice, _ = alice_chat
    monkeypatch.setattr(export, "IMPORT_BATCH_ROWS", 4)
    stored = []
    with connection.execute_wrapper(failing_insert("sessions_core_chatsession", 3)), pytest.raises(DatabaseError):
        export.import_json(chats_document(3), alice, on_batch=lambda done, total: stored.append(done))
    assert stored == [1, 2]  # two batches were committed, and are gone again
    assert ChatSession.objects.for_user(alice).count() == 1


def test_the_import_counts_the_chats_against_the_limits(alice_chat, settings):
    alice, _ = alice_chat
    settings.CHAT_IMPORT_MAX_CHATS = 2
    transfer = imported_here(alice, chats_document(3).encode())
    assert transfer.status == "failed" and "This file holds 3 chats; an import takes at most 2" in transfer.error
    settings.CHAT_IMPORT_MAX_CHATS, settings.CHAT_MAX_CHATS_PER_USER = 0, 3
    transfer = imported_here(alice, chats_document(3).encode())
    assert transfer.status == "failed" and "You have 1 chats and this file holds 3" in transfer.error
    assert ChatSession.objects.for_user(alice).count() == 1
    assert imported_here(alice, chats_document(2).encode()).status == "done"
    assert ChatSession.objects.for_user(alice).count() == 3


@pytest.mark.parametrize(("field", "value", "says"), [
    ("metrics", {"input_tokens": 9223372036854775807}, "runs → 0 → metrics → input_tokens"),
    ("metrics", {"input_tokens": -1}, "runs → 0 → metrics → input_tokens"),
    ("metrics", {"duration": "slow"}, "runs → 0 → metrics → duration"),
    ("summary", {"summary": "s", "topics": [1, 2, None]}, "summary → topics → 0"),
    ("summary", {"summary": "s", "updated_at": "yesterday"}, "summary → updated_at"),
    ("summary", ["not", "a", "summary"], "summary"),
    ("created_at", "0001-01-01T00:00:00+14:00", "created_at"),
    ("created_at", "9999-12-31T23:59:59", "created_at: Value error, a time between 1970 and 9000"),
    ("tool_calls", [{"name": "add_item"}], "messages → 0 → tool_calls → 0 → id"),
])
def test_every_imported_field_is_checked_by_type_and_range(alice_chat, field, value, says):
    alice, _ = alice_chat
    run = {"status": "completed", "messages": [{"role": "assistant", "content": "ok"}]}
    chat = {"format": "sessions_core.session", "version": 1, "runs": [run]}
    if field == "metrics":
        run["metrics"] = value
    elif field == "tool_calls":
        run["messages"][0]["tool_calls"] = value
    else:
        chat[field] = value
    with pytest.raises(export.ImportRefused) as refused:
        export.import_json(json.dumps(chat), alice)
    assert says in str(refused.value)
    transfer = imported_here(alice, json.dumps(chat).encode())
    assert transfer.status == "failed" and says.split(":")[0] in transfer.error
    assert ChatSession.objects.for_user(alice).count() == 1


def test_an_imported_summary_and_metrics_read_back_as_the_engine_writes_them(alice_chat):
    alice, _ = alice_chat
    run = {"status": "completed", "metrics": {"input_tokens": 12, "duration": 0.5},
           "messages": [{"role": "assistant", "content": "", "tool_calls": [
               {"id": "c1", "name": "add_item", "arguments": "{}", "type": "function"}]}]}
    chat = {"format": "sessions_core.session", "version": 1, "runs": [run],
            "summary": {"summary": "Milk.", "topics": ["food"], "updated_at": "2025-03-01T10:00:00+01:00"}}
    [copy] = export.import_json(json.dumps(chat), alice)
    assert copy.summary == {"summary": "Milk.", "topics": ["food"], "updated_at": "2025-03-01T10:00:00+01:00"}
    stored = copy.runs.get()
    assert stored.metrics == {"input_tokens": 12, "duration": 0.5}
    assert stored.messages.get().tool_calls == [{"id": "c1", "name": "add_item", "arguments": "{}"}]
