import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.factories import make_run, make_session, make_user

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


def test_queued_messages_are_listed(admin_client_logged_in):
    from chatapp.models import QueuedMessage

    bob = make_user("bob")
    queued = QueuedMessage.objects.create(session=make_session(bob, name="Waiting"), user=bob, text="later")
    response = admin_client_logged_in.get(reverse("admin:chatapp_queuedmessage_changelist"))
    assert response.status_code == 200 and queued.queued_id.encode() in response.content
