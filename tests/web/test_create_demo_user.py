"""create_demo_user."""

from __future__ import annotations

import re
from io import StringIO

from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.test import TestCase

from tests.support.web_helpers import FAST_HASHERS


def run(*args) -> str:
    out = StringIO()
    call_command("create_demo_user", *args, stdout=out)
    return out.getvalue()


def password_in(output: str) -> str:
    return re.search(r"password: (\S+)", output).group(1)


@FAST_HASHERS
class TestCreateDemoUser(TestCase):
    def test_it_creates_demo_with_a_random_password_it_prints(self):
        output = run()
        assert "Created the demo user" in output
        assert authenticate(username="demo", password=password_in(output)) is not None

    def test_a_second_run_leaves_the_password_alone(self):
        password = password_in(run())
        output = run()
        assert "already exists" in output and "password:" not in output
        assert authenticate(username="demo", password=password) is not None
        assert get_user_model().objects.filter(username="demo").count() == 1

    def test_reset_prints_a_new_password_that_replaces_the_old(self):
        old = password_in(run())
        new = password_in(run("--reset"))
        assert new != old
        assert authenticate(username="demo", password=new) is not None
        assert authenticate(username="demo", password=old) is None

    def test_passwords_differ_between_installs(self):
        first = password_in(run())
        get_user_model().objects.all().delete()
        assert password_in(run()) != first
