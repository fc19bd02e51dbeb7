"""What the web chat stores beside the engine's tables."""

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from sessions_core.models import ChatSession


def new_queued_id() -> str:
    return secrets.token_hex(6)


class QueuedMessage(models.Model):
    """A message sent in the chat whose run has not started yet (it waits for the reply in flight).

    Stored, so that a server that stops (a restart, a crash) does not lose it: the next process to
    serve the session runs it. A process takes a message off the queue by deleting its row, just before
    its run starts, so no message runs twice.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="queued_messages")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    text = models.TextField()
    queued_id = models.CharField(max_length=32, unique=True, default=new_queued_id)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.queued_id} in {self.session_id}"
