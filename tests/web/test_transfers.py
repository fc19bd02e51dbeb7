"""Imports and exports done by a process of their own (chatapp/transfers.py): another user's requests go on
meanwhile, the page shows how far one got and how it went, a crash leaves nothing half imported."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from chatapp import transfers
from chatapp.models import Transfer
from sessions_core.models import ChatSession
from tests.support.factories import make_session, make_user
from tests.engine.test_export import chats_document, download
from tests.support.web_helpers import HX, finished, transfer_of

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_WAIT_MS = 2000  # far below SQLite's 30 s and any import's length, far above one batch's write


@contextlib.contextmanager
def bounded_lock_wait():
    """This connection waits at most LOCK_WAIT_MS for a lock another holds: a longer wait is an error."""
    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {LOCK_WAIT_MS}" if sqlite else f"SET lock_timeout = '{LOCK_WAIT_MS}ms'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 30000" if sqlite else "SET lock_timeout = 0")


def until(condition, what: str):
    """Waits for another process's progress, which it records in the database: read again until it holds."""
    deadline = time.monotonic() + 120
    while not (value := condition()):
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.02)  # polling a row another process writes: there is no event to wait on
    return value


@pytest.fixture
def users():
    alice, bob = make_user("alice"), make_user("bob")
    return alice, bob, make_session(bob, name="Bob's chat")


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def bobs_rounds_while(process, bob, chat) -> list[int]:
    """Bob opens his chat and renames it, round after round, until `process` ends; each round's statuses."""
    client, statuses, number = client_of(bob), [], 0
    with bounded_lock_wait():
        while process.poll() is None or number < 2:
            number += 1
            statuses.append(client.get(reverse("chat:session", args=[chat.session_id])).status_code)
            statuses.append(client.post(reverse("chat:session_rename_hx", args=[chat.session_id]),
                                        {"name": f"Renamed {number}"}).status_code)
    return statuses


def test_another_users_reads_and_writes_go_on_during_an_import_and_an_export(users, monkeypatch):
    alice, bob, chat = users
    monkeypatch.setenv("CHAT_IMPORT_BATCH_ROWS", "4")  # a chat, its run and two messages: one chat a batch
    client = client_of(alice)
    upload = SimpleUploadedFile("chats.json", chats_document(30).encode())
    started = transfer_of(client.post(reverse("chat:import"), {"file": upload}))
    statuses = bobs_rounds_while(transfers._processes[started.pk], bob, chat)
    assert set(statuses) == {200, 302} and len(statuses) >= 4  # no request failed, none waited past the bound
    imported = finished(started)
    assert (imported.status, imported.done) == ("done", 30)
    assert ChatSession.objects.for_user(alice).count() == 30

    started = transfer_of(client.post(reverse("chat:export_all")))
    statuses = bobs_rounds_while(transfers._processes[started.pk], bob, chat)
    assert set(statuses) == {200, 302}
    exported = finished(started)
    assert (exported.status, exported.done, exported.total) == ("done", 30, 30)
    _, body = download(alice, reverse("chat:transfer_download", args=[exported.transfer_id]))
    assert body.count('"format": "sessions_core.session"') == 30
    assert ChatSession.objects.get(pk=chat.pk).name.startswith("Renamed")


def test_the_page_shows_the_progress_then_the_outcome_and_never_writes(users):
    alice, _, _ = users
    client = client_of(alice)
    running = Transfer.objects.create(owner=alice, kind="import", status="running", done=3200, total=10000)
    url = reverse("chat:transfer", args=[running.transfer_id])
    with CaptureQueriesContext(connection) as queries:
        page = client.get(url).content.decode()
        fragment = client.get(url, headers=HX).content.decode()
    assert not [q["sql"] for q in queries if q["sql"].split()[0] in ("INSERT", "UPDATE", "DELETE")]
    assert "Importing 3,200 of 10,000 chats" in page and 'hx-trigger="every 1s"' in page
    assert fragment.count('id="transfer-status"') == 1 and "<html" not in fragment and "Importing 3,200 of 10,000 chats" in fragment
    # The import page points to the running import, and takes no second one meanwhile.
    assert url in client.get(reverse("chat:import")).content.decode()
    response = client.post(reverse("chat:import"), {"file": SimpleUploadedFile("x.json", chats_document(1).encode())})
    assert response.status_code == 422 and "still running" in response.content.decode()

    Transfer.objects.filter(pk=running.pk).update(status="failed", error="This file is not JSON, so it is not a chat export from this app.")
    page = client.get(url).content.decode()
    assert "This file is not JSON" in page and "hx-trigger" not in page


def test_a_crash_of_the_import_is_reported_as_failed_and_nothing_is_left_half_imported(users, monkeypatch):
    alice, _, _ = users
    monkeypatch.setenv("CHAT_IMPORT_BATCH_ROWS", "4")
    client = client_of(alice)
    upload = SimpleUploadedFile("chats.json", chats_document(200).encode())
    started = transfer_of(client.post(reverse("chat:import"), {"file": upload}))
    until(lambda: Transfer.objects.filter(pk=started.pk, done__gte=1).exists(), "a batch stored")
    with transaction.atomic():  # the next batch waits for this lock: the import is stopped half way
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("UPDATE chatapp_transfer SET done = done WHERE id = %s", [started.pk])
            else:
                cursor.execute("LOCK TABLE sessions_core_chatsession IN SHARE ROW EXCLUSIVE MODE")
        half_way = Transfer.objects.get(pk=started.pk)
        assert 0 < half_way.done < 200
        assert sum(last - first + 1 for first, last in half_way.stored) == half_way.done
        assert ChatSession.objects.for_user(alice).count() == half_way.done
        os.kill(half_way.worker_pid, signal.SIGKILL)  # the process gone, as the kernel's OOM killer does it
    failed = finished(started)
    assert failed.status == "failed" and "its process ended" in failed.error and failed.stored == []
    assert ChatSession.objects.for_user(alice).count() == 0
    assert not transfers.upload_path(failed).exists()
    assert "nothing of it was kept" in client.get(reverse("chat:transfer", args=[failed.transfer_id])).content.decode()


def test_another_users_transfer_is_a_404(users):
    alice, bob, _ = users
    export = Transfer.objects.create(owner=alice, kind="export", status="done", done=1, total=1, filename="x.json")
    transfers.export_path(export).write_text("{}")
    bobs = client_of(bob)
    assert bobs.get(reverse("chat:transfer", args=[export.transfer_id])).status_code == 404
    assert bobs.get(reverse("chat:transfer_download", args=[export.transfer_id])).status_code == 404
    assert bobs.get(reverse("chat:transfer", args=["0123456789abcdef"])).status_code == 404
    response, body = download(alice, reverse("chat:transfer_download", args=[export.transfer_id]))
    assert response.status_code == 200 and body == "{}"


def test_a_new_export_replaces_the_last_one(users):
    alice, _, _ = users
    last = Transfer.objects.create(owner=alice, kind="export", status="done", filename="x.json")
    transfers.export_path(last).write_text("{}")
    client = client_of(alice)
    assert "Export again" in client.get(reverse("chat:export_all")).content.decode()
    new = finished(client.post(reverse("chat:export_all")))
    assert new.status == "done" and not Transfer.objects.filter(pk=last.pk).exists()
    assert not transfers.export_path(last).exists() and transfers.export_path(new).exists()


def test_a_transfer_whose_process_went_with_the_machine_is_failed_at_the_next_start_or_import(users):
    import socket
    import subprocess

    from django.core.management import call_command

    alice, _, _ = users
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid now names no process
    half = [make_session(alice, name=f"Chat {number} (imported)").pk for number in range(2)]
    kept = make_session(alice, name="Her own")
    stale = Transfer.objects.create(owner=alice, kind="import", status="running", done=2, total=9,
                                    stored=[[pk, pk] for pk in half],
                                    host=socket.gethostname(), supervisor_pid=ended.pid)
    elsewhere = Transfer.objects.create(owner=alice, kind="export", status="running", host="another-host",
                                        supervisor_pid=ended.pid)
    call_command("transfer", recover=True)
    stale.refresh_from_db()
    assert stale.status == "failed" and "its process ended" in stale.error
    assert list(ChatSession.objects.for_user(alice).values_list("pk", flat=True)) == [kept.pk]
    assert Transfer.objects.get(pk=elsewhere.pk).status == "running"  # its host's to tell

    Transfer.objects.filter(pk=stale.pk).update(status="running", stored=[])
    response = client_of(alice).post(reverse("chat:import"), {"file": SimpleUploadedFile("x.json", b"[]")})
    assert response.status_code == 302 and Transfer.objects.get(pk=stale.pk).status == "failed"
    finished(response)
