"""The web chat's own table: a user's import or export (`Transfer`), done by a process of its own
(chatapp/transfers.py) while its page shows how far it got. Everything else is the engine's
(a message waiting for its run is the engine's queued Run).

`new_queued_id` was the default of the web's own queue table, which migration 0002 moved into queued runs
and dropped; migration 0001 refers to it, so it stays.
"""

import secrets

from django.conf import settings
from django.db import models


def new_queued_id() -> str:
    return secrets.token_hex(6)


def new_transfer_id() -> str:
    return secrets.token_hex(8)


class TransferQuerySet(models.QuerySet):
    def for_user(self, user) -> "TransferQuerySet":
        """The one way views reach a transfer: the user's own (anyone else's id is a 404)."""
        return self.filter(owner=user)


class Transfer(models.Model):
    """One import (an uploaded export, stored as new chats) or export (all of a user's chats, written to a
    file to download), done by `manage.py transfer` in a process of its own. `done` of `total` chats so far;
    an import's stored chats are listed in `stored` (as runs of pks) as each batch commits, so a failed one, whatever
    stopped it, is taken away again whole."""

    class Kind(models.TextChoices):
        IMPORT = "import"
        EXPORT = "export"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    transfer_id = models.CharField(max_length=16, unique=True, default=new_transfer_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="transfers")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(null=True, blank=True)  # known once the file is read (or the chats counted)
    error = models.TextField(blank=True)
    stored = models.JSONField(default=list, blank=True)  # an import's sessions committed so far: [first, last] pk runs
    first_session_id = models.CharField(max_length=64, blank=True)  # the chat an import opens when done
    memories = models.PositiveIntegerField(default=0)  # memories an import added
    filename = models.CharField(max_length=200, blank=True)  # an export's name for the download
    size = models.PositiveBigIntegerField(default=0)  # an export file's bytes
    host = models.CharField(max_length=255, blank=True)  # where its processes run
    supervisor_pid = models.IntegerField(null=True, blank=True)  # `manage.py transfer`
    worker_pid = models.IntegerField(null=True, blank=True)  # its child, doing the work
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TransferQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["owner", "kind", "-created_at"], name="transfer_owner_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.transfer_id} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)
