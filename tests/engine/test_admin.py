import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.support.factories import make_run, make_session, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_logged_in(client):
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw-admin-123")
    client.force_login(admin)
    return client


def test_session_changelist_and_change_page_show_state_and_summary(admin_client_logged_in):
    session = make_session(make_user("bob"), name="Groceries", session_state={"shopping_list": ["milk"]},
                           summary={"summary": "Bob buys milk.", "topics": ["food"], "updated_at": None})
    response = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_changelist"))
    assert response.status_code == 200 and b"Groceries" in response.content
    response = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_change", args=[session.pk]))
    assert b"Bob buys milk." in response.content
    assert b"&quot;shopping_list&quot;" in response.content or b'"shopping_list"' in response.content


def test_transcript_view_paginates_messages_and_escapes_them(admin_client_logged_in):
    session = make_session(make_user("carol"))
    for index in range(30):
        make_run(session, user_text=f"question {index} <script>x</script>", reply=f"answer {index}")
    url = reverse("admin:sessions_core_chatsession_transcript", args=[session.pk])
    first = admin_client_logged_in.get(url)
    assert first.status_code == 200
    assert b"question 0 &lt;script&gt;" in first.content and b"<script>x</script>" not in first.content
    assert b"answer 25" not in first.content  # 60 messages, 50 per page
    second = admin_client_logged_in.get(url + "?page=2")
    assert b"answer 29" in second.content


def test_transcript_view_requires_staff(client):
    session = make_session(make_user("dave"))
    client.force_login(get_user_model().objects.create_user("eve", password="pw-eve-123"))
    response = client.get(reverse("admin:sessions_core_chatsession_transcript", args=[session.pk]))
    assert response.status_code == 302


def test_messages_waiting_for_their_run_are_listed_and_stopped_as_queued_runs(admin_client_logged_in):
    from sessions_core.models import Run
    from sessions_core.run import lifecycle

    bob = make_user("bob")
    queued = lifecycle.enqueue(make_session(bob, name="Waiting"), "later")
    url = reverse("admin:sessions_core_run_changelist")
    response = admin_client_logged_in.get(url, {"status__exact": "queued"})
    assert response.status_code == 200 and queued.run_id.encode() in response.content
    response = admin_client_logged_in.post(url, {"action": "stop_runs", "_selected_action": [queued.pk]}, follow=True)
    assert b"Asked 1 run(s) to stop." in response.content
    assert not Run.objects.filter(pk=queued.pk).exists()  # it never began


def test_usage_sums_tokens_per_session_and_per_user(admin_client_logged_in):
    from datetime import timedelta

    from django.utils import timezone

    from sessions_core.models import Run

    bob, carol = make_user("bob"), make_user("carol")
    bobs = make_session(bob, name="Bob's chat")
    for tokens in (100, 250):
        run = make_run(bobs)
        Run.objects.filter(pk=run.pk).update(metrics={"input_tokens": tokens, "output_tokens": tokens // 10})
    make_run(bobs)  # a run without token figures (a stopped reply) counts as a run of unknown usage, not as 0
    old = make_run(make_session(carol))
    Run.objects.filter(pk=old.pk).update(metrics={"input_tokens": 7, "output_tokens": 1},
                                         created_at=timezone.now() - timedelta(days=40))

    page = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_change", args=[bobs.pk]))
    assert b"3 runs \xc2\xb7 350 input / 35 output tokens (1 with unknown usage)" in page.content
    transcript = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_transcript", args=[bobs.pk]))
    assert b"350 input / 35 output tokens" in transcript.content

    usage = reverse("admin:sessions_core_chatsession_usage")
    rows = admin_client_logged_in.get(usage).context["rows"]
    assert [(row["session__owner__username"], row["runs"], row["input_tokens"], row["output_tokens"],
             row["unknown_usage"]) for row in rows] == [("bob", 3, 350, 35, 1)]  # carol's run is older than 30 days
    rows = admin_client_logged_in.get(usage + "?days=60").context["rows"]
    assert [row["session__owner__username"] for row in rows] == ["bob", "carol"]
    assert admin_client_logged_in.get(usage + "?days=soon").context["days"] == 30
    changelist = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_changelist"))
    assert usage.encode() in changelist.content


def test_usage_is_for_staff_only(client):
    client.force_login(make_user("mallory"))
    response = client.get(reverse("admin:sessions_core_chatsession_usage"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_each_look_at_a_conversation_is_recorded_and_the_record_cannot_be_edited(admin_client_logged_in):
    from sessions_core.models import AdminAccess

    session = make_session(make_user("dora"), name="Private")
    run = make_run(session, "my secret", "noted")
    message = run.messages.get(role="user")
    change = session.state_changes.create(version=1, patch=[], inverse=[], source="manual")
    client = admin_client_logged_in
    client.get(reverse("admin:sessions_core_chatsession_change", args=[session.pk]))
    client.get(reverse("admin:sessions_core_chatsession_transcript", args=[session.pk]) + "?page=1")
    client.get(reverse("admin:sessions_core_run_change", args=[run.pk]))
    client.get(reverse("admin:sessions_core_message_change", args=[message.pk]))
    client.get(reverse("admin:sessions_core_statechange_change", args=[change.pk]))
    client.get(reverse("admin:sessions_core_chatsession_changelist"))  # titles only: not a read
    client.get(reverse("admin:sessions_core_message_changelist"))

    records = list(AdminAccess.objects.order_by("id").values_list("viewer_name", "session_label", "view"))
    assert records == [("admin", session.session_id, view) for view in (
        "session (state, summary)", "transcript, page 1", f"run {run.run_id}", f"message #{message.seq}",
        "state change v1")]

    listing = client.get(reverse("admin:sessions_core_adminaccess_changelist"))
    assert listing.status_code == 200 and b"transcript, page 1" in listing.content
    record = AdminAccess.objects.first()
    assert client.get(reverse("admin:sessions_core_adminaccess_add")).status_code == 403
    assert client.post(reverse("admin:sessions_core_adminaccess_delete", args=[record.pk]),
                       {"post": "yes"}).status_code == 403
    assert AdminAccess.objects.count() == 5

    session.delete()  # the record outlives the session
    assert AdminAccess.objects.filter(session__isnull=True, session_label=session.session_id).count() == 5


def test_runs_messages_and_state_changes_are_shown_but_never_added_or_edited(admin_client_logged_in):
    from sessions_core.models import Message, Run, StateChange

    client = admin_client_logged_in
    session = make_session(make_user("fay"), name="Plans")
    run = make_run(session, "go", "done", kind="workflow")
    step = make_run(session, "go", "counted", parent_run=run, kind="function", step_name="Count")
    message = run.messages.get(role="user")
    change = session.state_changes.create(run=step, version=1, patch=[], inverse=[], source="step:Count/function")
    for name, obj in (("run", run), ("message", message), ("statechange", change)):
        page = client.get(reverse(f"admin:sessions_core_{name}_change", args=[obj.pk]))
        assert page.status_code == 200 and b'name="_save"' not in page.content  # shown, with no Save
        assert client.get(reverse(f"admin:sessions_core_{name}_add")).status_code == 403
        assert client.post(reverse(f"admin:sessions_core_{name}_change", args=[obj.pk]), {}).status_code == 403
    assert b"Count</a> function" in client.get(reverse("admin:sessions_core_run_change", args=[run.pk])).content
    assert (Message.objects.get(pk=message.pk).content, Run.objects.get(pk=run.pk).content) == ("go", "done")

    # A session is still deleted whole, with its runs, messages and changes.
    response = client.post(reverse("admin:sessions_core_chatsession_delete", args=[session.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not (Run.objects.filter(session_id=session.pk).exists() or Message.objects.filter(session_id=session.pk)
                .exists() or StateChange.objects.filter(session_id=session.pk).exists())


def test_the_stop_action_asks_running_runs_to_stop_and_a_steps_run_through_its_root(admin_client_logged_in):
    from sessions_core.models import Run, RunStatus

    session = make_session(make_user("gus"))
    done = make_run(session, "old", "over")
    workflow = make_run(session, "go", None, status=RunStatus.RUNNING, kind="workflow")
    step = make_run(session, "go", None, status=RunStatus.RUNNING, parent_run=workflow, kind="agent", step_name="Keep")
    changelist = reverse("admin:sessions_core_run_changelist")

    response = admin_client_logged_in.post(changelist, {"action": "stop_runs", "_selected_action": [done.pk]},
                                           follow=True)
    assert b"None of the selected runs is running or queued." in response.content
    response = admin_client_logged_in.post(changelist, {"action": "stop_runs", "_selected_action": [step.pk, done.pk]},
                                           follow=True)
    assert b"Asked 1 run(s) to stop." in response.content
    flags = dict(Run.objects.values_list("pk", "cancel_requested"))
    assert flags == {done.pk: False, workflow.pk: True, step.pk: False}  # the root's flag is the one runs read


def test_chat_sessions_are_not_added_from_the_admin(admin_client_logged_in):
    changelist = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_changelist"))
    assert reverse("admin:sessions_core_chatsession_add").encode() not in changelist.content
    assert admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_add")).status_code == 403


def test_the_transcript_names_each_step_message_by_its_step_under_its_turn(admin_client_logged_in):
    session = make_session(make_user("hal"), component_id="shopping-workflow", kind="workflow")
    turn = make_run(session, "add milk", None, kind="workflow")
    make_run(session, "add milk", "Added milk.", parent_run=turn, kind="agent", step_name="Shopping assistant")
    html = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_transcript", args=[session.pk])
                                      ).content.decode()
    rows = re.findall(r'<tr id="msg-(\d+)"( class="step-message")?>\s*<td>\d+</td>\s*<td[^>]*>(.*?)</td>', html, re.S)
    assert [(seq, bool(step)) for seq, step, _ in rows] == [("1", False), ("2", True), ("3", True)]
    assert rows[0][2].startswith(turn.run_id[:8])
    assert "agent <strong>Shopping assistant</strong> of " + turn.run_id[:8] in rows[1][2]


@pytest.mark.parametrize(("metrics", "summary"), [
    ({"input_tokens": 9223372036854775807, "output_tokens": -2, "duration": "slow"},
     {"summary": "s", "topics": [1, 2, None], "updated_at": "not a date"}),
    ({"input_tokens": "lots", "output_tokens": 1.5, "duration": [1]}, ["not", "a", "summary"]),
])
def test_admin_pages_show_whatever_is_stored(admin_client_logged_in, client, metrics, summary):
    """Values no engine write makes (stored by other means) are shown as they are, and left out of the sums."""
    from sessions_core.models import Run

    bob = make_user("bob")
    session = make_session(bob, name="Odd", summary=summary)
    run = make_run(session)
    Run.objects.filter(pk=run.pk).update(metrics=metrics)
    make_run(session, parent_run=run, step_name="step")
    Run.objects.filter(parent_run=run).update(metrics=metrics)
    counted = make_run(session)
    Run.objects.filter(pk=counted.pk).update(metrics={"input_tokens": 5, "output_tokens": 3})
    for url in (reverse("admin:sessions_core_chatsession_change", args=[session.pk]),
                reverse("admin:sessions_core_chatsession_transcript", args=[session.pk]),
                reverse("admin:sessions_core_run_change", args=[run.pk]),
                reverse("admin:sessions_core_chatsession_usage")):
        assert admin_client_logged_in.get(url).status_code == 200, url
    [row] = admin_client_logged_in.get(reverse("admin:sessions_core_chatsession_usage")).context["rows"]
    assert (row["input_tokens"], row["output_tokens"]) == (5, 3)
    client.force_login(bob)
    assert client.get(reverse("chat:session", args=[session.session_id])).status_code == 200
    assert client.get(reverse("chat:index")).status_code in (200, 302)
