"""Sign up, log in and log out."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import TestCase
from django.urls import reverse

from tests.factories import make_session, make_user
from tests.web_helpers import FAST_HASHERS


@FAST_HASHERS
class TestAccounts(TestCase):
    def test_sign_up_creates_the_account_and_logs_in(self):
        page = self.client.get(reverse("signup"))
        assert page.status_code == 200 and b'name="password1"' in page.content
        response = self.client.post(reverse("signup"), {
            "username": "carol", "password1": "a-long-pass-phrase-9", "password2": "a-long-pass-phrase-9"})
        assert response["Location"] == reverse("chat:index")
        assert get_user_model().objects.filter(username="carol").exists()
        assert self.client.get(reverse("chat:new")).status_code == 200

    def test_sign_up_shows_what_is_wrong(self):
        make_user("carol")
        response = self.client.post(reverse("signup"), {"username": "carol", "password1": "x", "password2": "y"})
        assert response.status_code == 400
        assert b"already exists" in response.content and b"didn\xe2\x80\x99t match" in response.content
        assert get_user_model().objects.count() == 1

    def test_log_in_and_go_where_you_were_going(self):
        make_user("alice")
        page = self.client.get(reverse("login") + "?next=/trash/")
        assert b'name="next" value="/trash/"' in page.content and b"Sign up" in page.content
        response = self.client.post(reverse("login"), {"username": "alice", "password": "pw-alice-123",
                                                       "next": "/trash/"})
        assert response["Location"] == "/trash/"

    def test_a_wrong_password_is_refused(self):
        make_user("alice")
        response = self.client.post(reverse("login"), {"username": "alice", "password": "nope"})
        assert response.status_code == 200 and b'role="alert"' in response.content
        assert self.client.get(reverse("chat:index")).status_code == 302

    def test_log_out_is_a_post(self):
        self.client.force_login(make_user("alice"))
        assert self.client.get(reverse("logout")).status_code == 405
        assert self.client.get(reverse("chat:new")).status_code == 200
        response = self.client.post(reverse("logout"))
        assert response["Location"] == reverse("login")
        assert self.client.get(reverse("chat:new"))["Location"].startswith(reverse("login"))

    def test_logged_in_users_skip_the_login_and_signup_pages(self):
        self.client.force_login(make_user("alice"))
        assert self.client.get(reverse("login"))["Location"] == "/"
        assert self.client.get(reverse("signup"))["Location"] == reverse("chat:index")

    def test_the_chat_page_offers_log_out_as_a_form(self):
        alice = make_user("alice")
        session = make_session(owner=alice)
        self.client.force_login(alice)
        html = self.client.get(reverse("chat:session", args=[session.session_id])).content.decode()
        assert f'<form method="post" action="{reverse("logout")}">' in html and "alice" in html


def test_pages_name_an_icon_that_exists(client, db):
    """Without one, every page load costs the browser a 404 on /favicon.ico."""
    from django.contrib.staticfiles import finders

    page = client.get(reverse("login"))
    assert b'rel="icon" href="/static/chatapp/favicon.svg"' in page.content
    assert finders.find("chatapp/favicon.svg")
