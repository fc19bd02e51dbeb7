"""Rate limits (chatapp/ratelimits.py): messages and runs in flight on the socket, new chats and imports
over HTTP, wrong passwords per account and per address, sign-in and sign-up attempts per address; over a limit a clear refusal and nothing
queued or written; 0 turns a limit off; with Redis the counters hold across processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import TransactionTestCase, override_settings
from django.urls import reverse

from chatapp import ratelimits
from chatapp import titles as chat_titles
from sessions_core.export import export_json
from sessions_core.models import ChatSession, Run, RunStatus
from tests.e2e.conftest import redis_url  # noqa: F401  (fixture)
from tests.support.factories import make_session, make_user
from tests.support.live_support import LiveTestMixin, frames_until, is_stream_frame, run_done, settle
from tests.support.llm_server import Text
from tests.support.web_helpers import WebTestCase

BASE_DIR = Path(__file__).resolve().parents[2]


def is_error(frame: str) -> bool:
    return "innerHTML:#run-status" in frame and "status-error" in frame


class TestSocketLimits(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general", name="Chat")

    async def send(self, socket, text: str) -> None:
        await socket.send_to(text_data=json.dumps({"type": "send", "text": text}))

    async def test_messages_over_the_per_minute_limit_are_refused_and_nothing_is_queued(self):
        self.llm.responder = lambda body: Text("ok")
        with self.settings(CHAT_MESSAGES_PER_MINUTE=3, CHAT_RUNS_IN_FLIGHT=0):
            socket = await self.socket(self.session.session_id, self.alice)
            for number in range(3):
                await self.send(socket, f"message {number}")
                await frames_until(socket, run_done())
            await self.send(socket, "one too many")
            frames = await frames_until(socket, is_error)
            assert "Too many messages: the limit is 3 per minute (CHAT_MESSAGES_PER_MINUTE)" in frames[-1]
            assert "Try again in" in frames[-1]
            assert 'id="composer-text"' in frames[-1] and ">one too many</textarea>" in frames[-1]  # handed back
            retry = await Run.objects.filter(session=self.session).afirst()
            await socket.send_to(text_data=json.dumps({"type": "retry", "run_id": retry.run_id}))
            assert "CHAT_MESSAGES_PER_MINUTE" in (await frames_until(socket, is_error))[-1]  # a retry counts too
            for frame in ({"type": "regenerate", "run_id": retry.run_id},  # so do new versions of a reply
                          {"type": "edit", "run_id": retry.run_id, "text": "edited"}):
                await socket.send_to(text_data=json.dumps(frame))
                assert "CHAT_MESSAGES_PER_MINUTE" in (await frames_until(socket, is_error))[-1]
            await settle()
            assert await Run.objects.filter(session=self.session).acount() == 3
            assert not await Run.objects.filter(status=RunStatus.QUEUED).aexists()
            await socket.send_to(text_data=json.dumps({"type": "stop"}))
            assert "Nothing to stop." in await socket.receive_from(timeout=5)  # the socket is still open
            await socket.disconnect()

    async def test_the_default_stops_a_burst(self):
        """30 messages in a burst at the defaults (20 a minute, 5 in flight): the first few run, the rest are
        refused."""
        hold = threading.Event()
        self.llm.responder = lambda body: Text("a slow reply", wait_event=hold)
        socket = await self.socket(self.session.session_id, self.alice)
        for number in range(30):
            await self.send(socket, f"burst {number}")
        refusals: list[str] = []

        def refused(frame: str) -> bool:
            if is_error(frame):
                refusals.append(frame)
            return len(refusals) >= 24

        await frames_until(socket, refused)
        assert all("CHAT_RUNS_IN_FLIGHT" in frame for frame in refusals)
        hold.set()
        await settle()
        # The last message may be read after the replies were released, when one has finished.
        assert 5 <= await Run.objects.filter(session=self.session).acount() <= 6
        assert not await Run.objects.filter(status=RunStatus.QUEUED).aexists()
        await socket.disconnect()

    async def test_runs_in_flight_are_limited_across_the_users_chats(self):
        hold = threading.Event()
        self.llm.responder = lambda body: Text("held reply", wait_event=hold)
        other = await sync_to_async(make_session)(self.alice, component_id="general", name="Other")
        with self.settings(CHAT_RUNS_IN_FLIGHT=2):
            first = await self.socket(self.session.session_id, self.alice)
            await self.send(first, "one")
            await frames_until(first, is_stream_frame)  # running
            await self.send(first, "two")
            await frames_until(first, lambda f: "beforeend:#queue" in f)  # queued
            second = await self.socket(other.session_id, self.alice)
            await self.send(second, "three")
            frames = await frames_until(second, is_error)
            assert "You have 2 replies running or waiting" in frames[-1] and "CHAT_RUNS_IN_FLIGHT" in frames[-1]
            assert await Run.objects.filter(status=RunStatus.QUEUED).acount() == 1
            assert not await Run.objects.filter(session=other).aexists()
            hold.set()
            await frames_until(first, run_done())
            await frames_until(first, run_done())
            await settle()
            await self.send(second, "three again")  # nothing in flight now
            await frames_until(second, run_done())
            await settle()
        assert await Run.objects.acount() == 3
        for socket in (first, second):
            await socket.disconnect()


class TestRefusedBeforeCounting(LiveTestMixin, TransactionTestCase):
    async def test_a_frame_naming_another_users_run_is_refused_before_it_counts(self):
        alice, bob = await sync_to_async(lambda: (make_user("alice"), make_user("bob")))()
        session = await sync_to_async(make_session)(alice, component_id="general", name="Chat")
        bobs = await sync_to_async(make_session)(bob, component_id="general", name="Bob's")
        theirs = await Run.objects.acreate(session=bobs, status=RunStatus.COMPLETED, input="bob's question")
        self.llm.responder = lambda body: Text("ok")
        with self.settings(CHAT_MESSAGES_PER_MINUTE=1, CHAT_RUNS_IN_FLIGHT=0):
            socket = await self.socket(session.session_id, alice)
            for kind in ("regenerate", "edit", "retry", "regenerate"):
                await socket.send_to(text_data=json.dumps({"type": kind, "run_id": theirs.run_id, "text": "x"}))
                frame = (await frames_until(socket, is_error))[-1]
                assert "CHAT_MESSAGES_PER_MINUTE" not in frame and ("not in this chat" in frame or "retried" in frame)
            await socket.send_to(text_data=json.dumps({"type": "send", "text": "my own"}))  # the allowance is whole
            await frames_until(socket, run_done())
            await settle()
            await socket.disconnect()
        assert [r.input async for r in Run.objects.filter(session=session)] == ["my own"]


class TestTitleJobs(LiveTestMixin, TransactionTestCase):
    async def test_the_socket_counts_title_regenerations(self):
        alice = await sync_to_async(make_user)("alice")
        session = await sync_to_async(make_session)(alice, component_id="general", name="Chat")
        self.llm.responder = lambda body: Text("A title")
        with self.settings(CHAT_TITLES_PER_HOUR=3):
            socket = await self.socket(session.session_id, alice)
            for _ in range(3):
                await socket.send_to(text_data=json.dumps({"type": "regenerate_title"}))
                assert "Generating a new title" in await socket.receive_from(timeout=5)
            await socket.send_to(text_data=json.dumps({"type": "regenerate_title"}))
            frames = await frames_until(socket, is_error)
            assert "CHAT_TITLES_PER_HOUR" in frames[-1]
            await settle()
            await socket.disconnect()

    async def test_a_chat_has_one_title_job_at_a_time(self):
        session = await sync_to_async(make_session)(await sync_to_async(make_user)("alice"), component_id="general")
        release, ran = asyncio.Event(), []

        async def job(number):
            ran.append(number)
            await release.wait()

        first = chat_titles._start(job(1), session)
        again = chat_titles._start(job(2), session)  # asked while the first runs: that one, nothing new
        assert again is first
        release.set()
        await first
        assert ran == [1]
        later = chat_titles._start(job(3), session)  # once it is over, a new one may start
        await later
        assert ran == [1, 3] and later is not first


class TestHTTPLimits(WebTestCase):
    def new_chat(self, text: str = "hello"):
        return self.client.post(reverse("chat:new"), {"assistant": "general", "text": text})

    def assert_429(self, response, setting: str, period: int):
        assert response.status_code == 429
        assert setting in response.content.decode()
        assert 1 <= int(response["Retry-After"]) <= period

    @override_settings(CHAT_NEW_CHATS_PER_MINUTE=2)
    def test_new_chats_per_minute(self):
        assert [self.new_chat().status_code for _ in range(2)] == [302, 302]
        before = ChatSession.objects.count()
        self.assert_429(self.new_chat(), "CHAT_NEW_CHATS_PER_MINUTE", 60)
        assert ChatSession.objects.count() == before
        assert self.client.get(reverse("chat:new")).status_code == 200  # the form itself is not counted
        self.client.force_login(self.bob)  # per user
        assert self.new_chat().status_code == 302

    @override_settings(CHAT_MESSAGES_PER_MINUTE=1)
    def test_a_new_chats_first_message_counts_as_a_message(self):
        assert self.new_chat("one").status_code == 302
        before = ChatSession.objects.count()
        response = self.new_chat("two, kept")
        self.assert_429(response, "CHAT_MESSAGES_PER_MINUTE", 60)
        assert ChatSession.objects.count() == before
        assert ">two, kept</textarea>" in response.content.decode()  # the text comes back in the composer

    @override_settings(CHAT_TITLES_PER_HOUR=2)
    def test_title_regenerations_per_hour(self):
        url = reverse("chat:session_retitle_hx", args=[self.session.session_id])
        for _ in range(2):
            assert self.client.post(url).status_code == 302
        self.assert_429(self.client.post(url), "CHAT_TITLES_PER_HOUR", 3600)

    @override_settings(CHAT_IMPORTS_PER_HOUR=1)
    def test_imports_per_hour(self):
        document = "".join(export_json(self.session)).encode()
        upload = lambda: self.client.post(reverse("chat:import"), {"file": SimpleUploadedFile("c.json", document)})  # noqa: E731
        assert upload().status_code == 302
        before = ChatSession.objects.count()
        self.assert_429(upload(), "CHAT_IMPORTS_PER_HOUR", 3600)
        assert ChatSession.objects.count() == before

    def login(self, username: str, password: str, address: str = "10.0.0.1"):
        self.client.logout()
        return self.client.post(reverse("login"), {"username": username, "password": password},
                                REMOTE_ADDR=address)

    @override_settings(CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR=3, CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR=100)
    def test_wrong_passwords_per_account(self):
        for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):  # from anywhere
            assert self.login("Bob", "wrong", address).status_code == 200
        self.assert_429(self.login("bob", "pw-bob-123", "10.0.0.4"), "CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", 3600)
        assert "_auth_user_id" not in self.client.session
        assert self.login("carol", "whatever").status_code == 200  # another account is not held up

    @override_settings(CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR=20, CHAT_LOGINS_PER_ADDRESS_PER_HOUR=100)
    def test_the_right_password_after_wrong_ones_is_let_in_and_successes_never_count(self):
        for _ in range(19):
            assert self.login("bob", "wrong").status_code == 200
        assert self.login("bob", "pw-bob-123").status_code == 302 and "_auth_user_id" in self.client.session
        for _ in range(30):  # signing in again and again (other tabs, other devices) is never refused
            assert self.login("bob", "pw-bob-123").status_code == 302

    @override_settings(CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR=2, CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR=100)
    def test_the_admin_login_counts_against_the_same_limits(self):
        admin_login = lambda password: self.client.post("/admin/login/", {"username": "bob", "password": password},  # noqa: E731
                                                        REMOTE_ADDR="10.0.0.8")
        assert admin_login("wrong").status_code == 200 and self.login("bob", "wrong").status_code == 200
        self.assert_429(admin_login("pw-bob-123"), "CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", 3600)
        self.assert_429(self.login("bob", "pw-bob-123"), "CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", 3600)

    @override_settings(CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR=100, CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR=3)
    def test_wrong_passwords_per_address(self):
        for name in ("a", "b", "c"):
            assert self.login(name, "wrong").status_code == 200
        self.assert_429(self.login("bob", "pw-bob-123"), "CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR", 3600)
        assert self.login("bob", "pw-bob-123", "10.9.9.9").status_code == 302  # from elsewhere it works

    @override_settings(CHAT_LOGINS_PER_ADDRESS_PER_HOUR=3)
    def test_every_sign_in_attempt_per_address(self):
        for _ in range(3):
            assert self.login("bob", "pw-bob-123").status_code == 302
        self.assert_429(self.login("bob", "pw-bob-123"), "CHAT_LOGINS_PER_ADDRESS_PER_HOUR", 3600)
        assert self.login("bob", "pw-bob-123", "10.9.9.9").status_code == 302

    def signup(self, username: str, address: str = "10.0.0.1"):
        self.client.logout()
        return self.client.post(reverse("signup"), {"username": username, "password1": "a-long-pass-phrase-9",
                                                    "password2": "a-long-pass-phrase-9"}, REMOTE_ADDR=address)

    @override_settings(CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR=2)
    def test_sign_ups_per_address(self):
        assert self.signup("dave").status_code == 302 and self.signup("erin").status_code == 302
        self.assert_429(self.signup("frank"), "CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR", 3600)
        assert not User.objects.filter(username="frank").exists()  # nothing written
        assert self.signup("frank", "10.9.9.9").status_code == 302  # from elsewhere it works

    @override_settings(CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR=2)
    def test_password_reset_requests_per_address(self):
        reset = lambda address="10.0.0.1": self.client.post(reverse("password_reset"), {"email": "x@example.com"},
                                                            REMOTE_ADDR=address)  # noqa: E731
        assert reset().status_code == 302 and reset().status_code == 302
        self.assert_429(reset(), "CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR", 3600)
        assert reset("10.9.9.9").status_code == 302

    @override_settings(CHAT_NEW_CHATS_PER_MINUTE=0, CHAT_MESSAGES_PER_MINUTE=0, CHAT_RUNS_IN_FLIGHT=0,
                       CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR=0, CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR=0,
                       CHAT_LOGINS_PER_ADDRESS_PER_HOUR=0, CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR=0)
    def test_zero_turns_a_limit_off(self):
        assert all(self.new_chat().status_code == 302 for _ in range(30))
        assert all(self.login("bob", "wrong").status_code == 200 for _ in range(30))
        assert all(self.signup(f"user{n}").status_code == 302 for n in range(15))


def test_with_redis_the_counters_hold_across_processes(redis_url, settings):  # noqa: F811
    """Two processes on one Redis count against one limit. (An hourly limit: the counters are fixed windows,
    and a per-minute one could roll over between the two processes' counts, about once in 40 runs.)"""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url,
                                   "KEY_PREFIX": "chatapp"}}
    settings.CHAT_IMPORTS_PER_HOUR = 5
    key = f"user:cross-process-{os.getpid()}"
    script = ("import django; django.setup(); from chatapp import ratelimits; "
              f"print([ratelimits.over_limit(ratelimits.IMPORTS, {key!r}) for _ in range(3)])")
    env = {**os.environ, "REDIS_URL": redis_url, "CHAT_IMPORTS_PER_HOUR": "5",
           "DJANGO_SETTINGS_MODULE": "chatapp.settings"}
    env.pop("DATABASE_URL", None)
    out = subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[None, None, None]"
    try:
        assert [ratelimits.over_limit(ratelimits.IMPORTS, key) is None for _ in range(3)] == [True, True, False]
    finally:
        caches["default"].clear()
