"""Imports and exports, each done by a process of its own so the server's process never does their work.

    transfer = Transfer.objects.create(owner=user, kind=Transfer.Kind.IMPORT)  # its upload at upload_path()
    start(transfer)  # `manage.py transfer <pk>`, detached; the request returns at once

`manage.py transfer <pk>` runs the work in a child process (`--work`, at CHAT_TRANSFER_NICE) and waits for
it: should the child end without saying how it went (killed, out of memory), the parent reports the
transfer failed and takes away what it stored. The work itself records its progress on the Transfer row
(`done` of `total` chats) for the transfer's page to show:

- an import reads and checks the whole file first (`sessions_core.export.read_import`: nothing is written
  for a file refused), counts its chats against CHAT_IMPORT_MAX_CHATS and CHAT_MAX_CHATS_PER_USER, then
  writes CHAT_IMPORT_BATCH_ROWS rows per transaction, each batch's sessions listed on the row in the same
  transaction, so a failure of any kind deletes exactly what was stored: all of the file or none of it.
  A batch's rows are built before its transaction, which only inserts them, and the document is frozen
  out of garbage collection (`gc.freeze`), so SQLite's write lock, which another user's write waits for,
  is held for the inserts alone;
- an export writes all of the user's chats (not the trash) and memories to a file in CHAT_TRANSFER_DIR,
  which the user downloads when it is done.

Its own process takes the import's and the export's Python work off the server process (where other
users' requests would queue behind it for the interpreter's lock), and its nice value lets the server's
requests go first when the cores are busy. Each batch or group it reads is followed by a pause as long as
it took, so it holds the database (SQLite's one writer at a time) for at most half the time.
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.text import slugify

from sessions_core import export
from sessions_core.models import ChatSession

from .models import Transfer

STOPPED = "The {kind} stopped before it finished (its process ended); nothing of it was kept. Try again."
FAILED = "The {kind} failed unexpectedly; nothing of it was kept. Try again."
IMPORTED = " (imported)"
NOT_AN_EXPORT = ("This file is not a chat export from this app. Import takes the JSON file that “Export” "
                 "(or a chat's “Download as JSON”) saved.")

# The supervising processes this server process started: polled (so an ended one does not linger as a
# zombie) by `recover`, which each import and export POST calls first.
_processes: dict[int, subprocess.Popen] = {}


def folder() -> Path:
    path = Path(settings.CHAT_TRANSFER_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def upload_path(transfer: Transfer) -> Path:
    return folder() / f"{transfer.transfer_id}.upload.json"


def export_path(transfer: Transfer) -> Path:
    return folder() / f"{transfer.transfer_id}.export.json"


def _command(transfer_pk: int, *extra: str) -> list[str]:
    """`manage.py transfer`, on the database this process uses (the test database, in tests)."""
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "transfer", str(transfer_pk),
            "--database-name", str(connection.settings_dict["NAME"]), *extra]


def start(transfer: Transfer) -> subprocess.Popen:
    """Starts the transfer's process, in a session of its own (a server that stops does not stop it)."""
    process = subprocess.Popen(_command(transfer.pk), cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    _processes[transfer.pk] = process
    return process


def supervise(transfer_pk: int) -> None:
    """Runs the work in a child process and waits for it; a child gone without an outcome is a failure."""
    worker = subprocess.Popen(_command(transfer_pk, "--work"), cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL)
    Transfer.objects.filter(pk=transfer_pk).update(host=socket.gethostname(), supervisor_pid=os.getpid(),
                                                   worker_pid=worker.pid)
    worker.wait()
    transfer = Transfer.objects.get(pk=transfer_pk)
    if not transfer.finished:
        fail(transfer, STOPPED.format(kind=transfer.kind))


def recover(transfers) -> int:
    """Of `transfers`, those unfinished whose `manage.py transfer` on this host is gone (with the machine,
    say) failed as stopped, their stored chats deleted; how many. Transfers another host runs are left
    to it, and so are those whose process has not started yet."""
    for pk, process in list(_processes.items()):  # this process's children: ended ones reaped first
        if process.poll() is not None:
            del _processes[pk]
    stopped = 0
    unfinished = transfers.exclude(status__in=(Transfer.Status.DONE, Transfer.Status.FAILED))
    for transfer in unfinished.filter(host=socket.gethostname(), supervisor_pid__isnull=False):
        if not _alive(transfer.supervisor_pid):
            fail(transfer, STOPPED.format(kind=transfer.kind))
            stopped += 1
    return stopped


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (an ended one not yet reaped by its parent, a zombie, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: the signal 0 check
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state != "Z"


def work(transfer: Transfer) -> None:
    """Does the import or export; any error fails it (and is raised)."""
    Transfer.objects.filter(pk=transfer.pk).update(status=Transfer.Status.RUNNING)
    try:
        if transfer.kind == Transfer.Kind.IMPORT:
            _import(transfer)
        else:
            _export(transfer)
    except BaseException:
        fail(transfer, FAILED.format(kind=transfer.kind))
        raise


def fail(transfer: Transfer, error: str) -> None:
    """The transfer as failed, saying why; the chats it stored deleted again, its files removed."""
    stored = Transfer.objects.filter(pk=transfer.pk).values_list("stored", flat=True).get()
    for first, last in stored:
        for begin in range(first, last + 1, 100):  # a transaction per 100 chats: no writer waits long
            with transaction.atomic():
                ChatSession.objects.for_user(transfer.owner_id).filter(
                    pk__range=(begin, min(begin + 99, last))).delete()
    for path in (upload_path(transfer), export_path(transfer), _part(export_path(transfer))):
        path.unlink(missing_ok=True)
    Transfer.objects.filter(pk=transfer.pk).update(status=Transfer.Status.FAILED, error=error, stored=[], done=0,
                                                   finished_at=timezone.now())


def discard(transfers) -> None:
    """Finished transfers deleted, with their files."""
    for transfer in transfers:
        for path in (upload_path(transfer), export_path(transfer)):
            path.unlink(missing_ok=True)
        transfer.delete()


def _part(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _finished(transfer: Transfer, **fields) -> None:
    Transfer.objects.filter(pk=transfer.pk).update(status=Transfer.Status.DONE, finished_at=timezone.now(), **fields)


# -- import -------------------------------------------------------------------------------------------


def _import(transfer: Transfer) -> None:
    path = upload_path(transfer)
    try:
        chats = export.read_import(path.read_bytes())
    except export.ImportRefused as exc:
        return fail(transfer, refusal_in_words(str(exc)))
    Transfer.objects.filter(pk=transfer.pk).update(total=len(chats))
    error = over_chat_limits(transfer.owner, len(chats))
    if error:
        return fail(transfer, error)
    mark_imported(chats)
    stored: list[list[int]] = []

    def record(sessions: list[ChatSession], count: int) -> None:  # in the batch's transaction
        _add_ranges(stored, sorted(session.pk for session in sessions))
        Transfer.objects.filter(pk=transfer.pk).update(done=count, stored=stored)

    # The document's chats live until the import ends: frozen, a garbage collection leaves them out, and its
    # pause (which may come inside a batch's transaction, holding SQLite's write lock) stays short.
    gc.freeze()
    try:
        sessions = export.store_import(chats, transfer.owner, in_batch=record,
                                       batch_rows=settings.CHAT_IMPORT_BATCH_ROWS)
    finally:
        gc.unfreeze()
    path.unlink(missing_ok=True)
    _finished(transfer, done=len(sessions), memories=sessions.memories,
              first_session_id=sessions[0].session_id if sessions else "")


def _add_ranges(ranges: list[list[int]], pks: list[int]) -> None:
    """`pks` (ascending) added to `ranges`, `[first, last]` runs of consecutive pks (a bulk insert's are,
    unless another insert came between): the row stays small however many chats the import stores."""
    for pk in pks:
        if ranges and ranges[-1][1] == pk - 1:
            ranges[-1][1] = pk
        else:
            ranges.append([pk, pk])


def mark_imported(sessions: list[export.ImportedSession]) -> None:
    """An imported chat says so in its title, so it is never taken for its original (in the sidebar, in
    search, in the tab's title)."""
    for session in sessions:
        name = " ".join(session.name.split())
        if not name:
            session.name = "Imported chat"
        elif not name.endswith(IMPORTED):
            session.name = name[: 200 - len(IMPORTED)] + IMPORTED


def over_chat_limits(user, count: int) -> str:
    """Why `count` more chats for `user` are too many (CHAT_IMPORT_MAX_CHATS, CHAT_MAX_CHATS_PER_USER), or ""."""
    per_import, per_user = settings.CHAT_IMPORT_MAX_CHATS, settings.CHAT_MAX_CHATS_PER_USER
    if per_import and count > per_import:
        return (f"This file holds {count:,} chats; an import takes at most {per_import:,} "
                "(CHAT_IMPORT_MAX_CHATS). Split it, or import fewer chats.")
    if per_user:
        have = ChatSession.objects.for_user(user).count()  # the trash's too: they are stored
        if have + count > per_user:
            return (f"You have {have:,} chats and this file holds {count:,}; a user may have at most "
                    f"{per_user:,} (CHAT_MAX_CHATS_PER_USER, the trash counts). Empty the trash or delete some first.")
    return ""


def refusal_in_words(message: str) -> str:
    """The engine's refusal, where it names a parser's or a validator's internals, in a user's words."""
    if "discriminator" in message or "expected tags" in message or "the document: Input should be a valid dict" in message:
        return NOT_AN_EXPORT
    if "integer string conversion" in message:
        return "This file holds a number too long to read (more than 4,300 digits): it is not a chat export."
    if message.startswith("Not a JSON file"):
        return "This file is not JSON, so it is not a chat export from this app."
    return message


# -- export -------------------------------------------------------------------------------------------


def _export(transfer: Transfer) -> None:
    owner = transfer.owner
    sessions = ChatSession.objects.for_user(owner).alive().order_by("-last_activity_at", "-id")
    Transfer.objects.filter(pk=transfer.pk).update(total=sessions.count())
    now = timezone.now()
    last = time.monotonic()

    def progress(written: int, total: int) -> None:  # after each group read: a pause as long as it took
        nonlocal last
        Transfer.objects.filter(pk=transfer.pk).update(done=written, total=total)
        time.sleep(time.monotonic() - last)
        last = time.monotonic()

    path = export_path(transfer)
    with _part(path).open("w", encoding="utf-8") as file:
        for part in export.export_all_json(sessions, owner.get_username(), now, user=owner, on_read=progress):
            file.write(part)
    _part(path).replace(path)
    _finished(transfer, size=path.stat().st_size, filename=f"chats-{slugify(owner.get_username())}-{now:%Y%m%d}.json")
