from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from sessions_core.models import ChatSession, Message, Run
from tests.support.factories import make_run, make_session, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def sessions():
    owner = make_user("trashy")
    now = timezone.now()
    old = make_session(owner, name="old", deleted_at=now - timedelta(days=31))
    make_run(old)
    recent = make_session(owner, name="recent", deleted_at=now - timedelta(days=2))
    live = make_session(owner, name="live")
    return old, recent, live


def test_it_deletes_only_sessions_long_in_the_trash_with_their_runs(sessions):
    old, recent, live = sessions
    out = StringIO()
    call_command("purge_trash", stdout=out)
    assert "Deleted 1 session(s)" in out.getvalue()
    assert set(ChatSession.objects.values_list("name", flat=True)) == {"recent", "live"}
    assert not Run.objects.filter(session_id=old.pk).exists()
    assert not Message.objects.filter(session_id=old.pk).exists()


def test_dry_run_deletes_nothing(sessions):
    out = StringIO()
    call_command("purge_trash", "--days", "1", "--dry-run", stdout=out)
    assert "2 session(s)" in out.getvalue()
    assert ChatSession.objects.count() == 3


def test_negative_days_are_refused(sessions):
    with pytest.raises(CommandError, match="--days"):
        call_command("purge_trash", "--days", "-1")
