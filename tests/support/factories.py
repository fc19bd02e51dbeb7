"""Plain factory functions for test data (no extra dependency)."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from sessions_core.models import ChatSession, Message, Run, RunStatus


def make_user(username="alice", password="pw-alice-123"):
    return get_user_model().objects.create_user(username=username, password=password)


def make_session(owner=None, **fields):
    fields.setdefault("component_id", "general")
    return ChatSession.objects.create(owner=owner, **fields)


def make_run(session, user_text="hello", reply="hi there", status=RunStatus.COMPLETED, **fields):
    """A finished run with its user message and (when given) the assistant's reply."""
    now = timezone.now()
    if not fields.get("parent_run"):  # a top-level run follows the last one, as the engine chains them
        fields.setdefault("follows_id", ChatSession.objects.filter(pk=session.pk).values_list(
            "current_leaf_id", flat=True).first())
    run = Run.objects.create(session=session, status=status, input=user_text, content=reply or "",
                             finished_at=now, **fields)
    if not fields.get("parent_run"):
        ChatSession.objects.filter(pk=session.pk).update(current_leaf=run)
    seq = session.last_seq
    rows = [Message(session=session, run=run, seq=seq + 1, role="user", content=user_text)]
    if reply is not None:
        rows.append(Message(session=session, run=run, seq=seq + 2, role="assistant", content=reply))
    Message.objects.bulk_create(rows)
    session.last_seq = seq + len(rows)
    session.last_activity_at = now
    fields = ["last_seq", "last_activity_at"]
    if status == RunStatus.RUNNING:  # as the engine runs it: holding the session's lease
        session.lease_token, session.lease_expires_at = "test-lease", now + timedelta(seconds=30)
        fields += ["lease_token", "lease_expires_at"]
    session.save(update_fields=fields)
    return run
