"""Sign up, log in and log out; the account page, password change and reset."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.test import TestCase
from django.urls import reverse

from tests.support.factories import make_session, make_user
from tests.support.web_helpers import FAST_HASHERS


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


@FAST_HASHERS
class TestAccountPages(TestCase):
    def test_the_sidebar_links_the_account_page_which_keeps_an_email_address(self):
        alice = make_user("alice")
        self.client.force_login(alice)
        html = self.client.get(reverse("chat:new")).content.decode()
        assert f'href="{reverse("account_settings")}"' in html
        page = self.client.get(reverse("account_settings"))
        assert page.status_code == 200 and b"alice" in page.content and reverse("password_change").encode() in page.content
        refused = self.client.post(reverse("account_settings"), {"email": "not an address"})
        assert refused.status_code == 400 and b'role="alert"' in refused.content
        response = self.client.post(reverse("account_settings"), {"email": "alice@example.com"})
        assert response["Location"] == reverse("account_settings")
        alice.refresh_from_db()
        assert alice.email == "alice@example.com"
        assert self.client.get(reverse("account_settings")).content.count(b"Your e-mail address was saved.") == 1

    def test_the_account_page_needs_a_sign_in(self):
        assert self.client.get(reverse("account_settings"))["Location"].startswith(reverse("login"))

    def test_a_password_is_changed_with_the_old_one(self):
        alice = make_user("alice")
        self.client.force_login(alice)
        wrong = self.client.post(reverse("password_change"), {
            "old_password": "nope", "new_password1": "a-new-pass-phrase-7", "new_password2": "a-new-pass-phrase-7"})
        assert wrong.status_code == 200 and b'role="alert"' in wrong.content
        response = self.client.post(reverse("password_change"), {
            "old_password": "pw-alice-123", "new_password1": "a-new-pass-phrase-7", "new_password2": "a-new-pass-phrase-7"})
        assert response["Location"] == reverse("password_change_done")
        alice.refresh_from_db()
        assert alice.check_password("a-new-pass-phrase-7")
        assert b"Password changed" in self.client.get(reverse("password_change_done")).content

    def test_a_forgotten_password_is_reset_through_the_emailed_link(self):
        from django.core import mail

        alice = make_user("alice")
        alice.email = "alice@example.com"
        alice.save()
        assert reverse("password_reset").encode() in self.client.get(reverse("login")).content
        response = self.client.post(reverse("password_reset"), {"email": "alice@example.com"})
        assert response["Location"] == reverse("password_reset_done")
        assert len(mail.outbox) == 1 and mail.outbox[0].to == ["alice@example.com"]
        assert "alice" in mail.outbox[0].body
        link = re.search(r"http://testserver(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
        form = self.client.get(link, follow=True)  # Django moves the token out of the URL first
        assert b'name="new_password1"' in form.content
        done = self.client.post(form.redirect_chain[-1][0], {"new_password1": "a-reset-pass-phrase-3",
                                                             "new_password2": "a-reset-pass-phrase-3"})
        assert done["Location"] == reverse("password_reset_complete")
        alice.refresh_from_db()
        assert alice.check_password("a-reset-pass-phrase-3")
        assert b"has been used already" in self.client.get(link, follow=True).content

    def test_an_unknown_address_sends_nothing_and_says_the_same(self):
        from django.core import mail

        response = self.client.post(reverse("password_reset"), {"email": "nobody@example.com"})
        assert response["Location"] == reverse("password_reset_done") and mail.outbox == []

