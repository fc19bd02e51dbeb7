"""Identity and isolation (SPEC Part 1, item 8): every path checks the owner and a refusal writes nothing."""

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import TestCase

from sessions_core import SessionNotFoundError, SessionOwnershipError
from sessions_core.models import ChatSession, NameSource
from tests.support.engine_helpers import EngineTestMixin, counts, make_users


class IsolationTest(EngineTestMixin, TestCase):
    def setUp(self):
        self.alice, self.bob = make_users("alice", "bob")
        self.agent_ = self.agent(session_state={"secret": "alice's"})
        assert self.agent_.run("my secret plan", session_id="alice-s", user_id="alice").status == "completed"
        assert self.agent_.run("nobody's", session_id="free-s").status == "completed"
        self.agent_.set_session_name(session_id="alice-s", user_id="alice", session_name="Alice's plans")
        self.requests_before = len(self.llm.requests)
        self.before = counts()

    def assert_nothing_changed(self):
        assert counts() == self.before
        session = ChatSession.objects.get(session_id="alice-s")
        assert (session.owner, session.name, session.session_state) == (self.alice, "Alice's plans",
                                                                        {"secret": "alice's"})
        assert ChatSession.objects.get(session_id="free-s").owner is None
        assert len(self.llm.requests) == self.requests_before  # nothing reached the model either

    def assert_refused(self, call, session_id="alice-s"):
        with self.assertRaises(SessionOwnershipError) as caught:
            call()
        assert caught.exception.session_id == session_id
        assert "does not belong" in str(caught.exception)
        self.assert_nothing_changed()


class TestRuns(IsolationTest):
    def test_another_users_session_is_refused_on_run(self):
        self.assert_refused(lambda: self.agent_.run("show me", session_id="alice-s", user_id="bob"))

    def test_a_streamed_run_is_refused_too(self):
        self.assert_refused(lambda: list(self.agent_.run("show me", session_id="alice-s", user_id="bob",
                                                         stream=True, stream_events=True)))

    def test_a_new_user_name_is_refused_and_not_created(self):
        self.assert_refused(lambda: self.agent_.run("hi", session_id="alice-s", user_id="mallory"))
        assert not get_user_model().objects.filter(username="mallory").exists()

    def test_an_anonymous_run_on_an_owned_session_is_refused(self):
        self.assert_refused(lambda: self.agent_.run("hi", session_id="alice-s"))

    def test_an_ownerless_session_is_not_claimed(self):
        self.assert_refused(lambda: self.agent_.run("mine now", session_id="free-s", user_id="bob"), "free-s")

    def test_the_agents_own_user_id_is_checked_too(self):
        agent = self.agent(user_id="bob", session_id="alice-s")
        self.assert_refused(lambda: agent.run("hi"))
        self.assert_refused(lambda: agent.get_session_state())

    async def test_async_runs_are_refused(self):
        async def attempt():
            await self.agent_.arun("show me", session_id="alice-s", user_id="bob")

        with self.assertRaises(SessionOwnershipError):
            await attempt()
        with self.assertRaises(SessionOwnershipError):
            async for _ in self.agent_.arun("show me", session_id="alice-s", user_id="bob", stream=True):
                pass
        await sync_to_async(self.assert_nothing_changed)()

    def test_the_owner_still_gets_in(self):
        output = self.agent_.run("again", session_id="alice-s", user_id="alice")

        assert output.status == "completed" and output.session_state == {"secret": "alice's"}


class TestAccessors(IsolationTest):
    def test_every_accessor_refuses_another_user(self):
        agent, sid = self.agent_, "alice-s"
        calls = {
            "get_session": lambda: agent.get_session(session_id=sid, user_id="bob"),
            "get_session_state": lambda: agent.get_session_state(session_id=sid, user_id="bob"),
            "update_session_state": lambda: agent.update_session_state({"secret": "bob's"}, session_id=sid,
                                                                       user_id="bob"),
            "get_chat_history": lambda: agent.get_chat_history(session_id=sid, user_id="bob"),
            "get_last_run_output": lambda: agent.get_last_run_output(session_id=sid, user_id="bob"),
            "get_session_name": lambda: agent.get_session_name(session_id=sid, user_id="bob"),
            "set_session_name": lambda: agent.set_session_name(session_id=sid, user_id="bob", session_name="Bob's"),
            "autogenerate name": lambda: agent.set_session_name(session_id=sid, user_id="bob", autogenerate=True),
            "get_session_summary": lambda: agent.get_session_summary(session_id=sid, user_id="bob"),
            "delete_session": lambda: agent.delete_session(session_id=sid, user_id="bob"),
        }
        for name, call in calls.items():
            with self.subTest(name):
                self.assert_refused(call)

    def test_every_accessor_refuses_an_anonymous_caller_and_an_unknown_user(self):
        agent = self.agent_
        for user in (None, "mallory"):
            for call in (
                lambda user=user: agent.get_session_state(session_id="alice-s", user_id=user),
                lambda user=user: agent.update_session_state({"x": 1}, session_id="alice-s", user_id=user),
                lambda user=user: agent.get_chat_history(session_id="alice-s", user_id=user),
                lambda user=user: agent.delete_session(session_id="alice-s", user_id=user),
            ):
                self.assert_refused(call)
        assert not get_user_model().objects.filter(username="mallory").exists()

    def test_a_user_cannot_touch_an_ownerless_session(self):
        agent = self.agent_
        for call in (
            lambda: agent.get_session_state(session_id="free-s", user_id="bob"),
            lambda: agent.update_session_state({"x": 1}, session_id="free-s", user_id="bob"),
            lambda: agent.get_chat_history(session_id="free-s", user_id="bob"),
            lambda: agent.set_session_name(session_id="free-s", user_id="bob", session_name="mine"),
            lambda: agent.delete_session(session_id="free-s", user_id="bob"),
        ):
            self.assert_refused(call, "free-s")

    async def test_async_accessors_refuse_another_user(self):
        agent, sid = self.agent_, "alice-s"
        calls = [
            agent.aget_session(session_id=sid, user_id="bob"),
            agent.aget_session_state(session_id=sid, user_id="bob"),
            agent.aupdate_session_state({"secret": "bob's"}, session_id=sid, user_id="bob"),
            agent.aget_chat_history(session_id=sid, user_id="bob"),
            agent.aget_last_run_output(session_id=sid, user_id="bob"),
            agent.aget_session_name(session_id=sid, user_id="bob"),
            agent.aset_session_name(session_id=sid, user_id="bob", session_name="Bob's"),
            agent.adelete_session(session_id=sid, user_id="bob"),
        ]
        for call in calls:
            with self.assertRaises(SessionOwnershipError):
                await call
        await sync_to_async(self.assert_nothing_changed)()

    def test_a_session_view_reads_messages_as_its_owner_only(self):
        view = self.agent_.get_session(session_id="alice-s", user_id="alice")
        assert [(m.role, m.content) for m in view.get_messages()] == [("user", "my secret plan"), ("assistant", "ok")]
        view.user_id = "bob"  # a tampered view is checked again

        self.assert_refused(view.get_messages)

    def test_get_sessions_lists_only_the_callers_sessions(self):
        self.agent_.run("bob's own", session_id="bob-s", user_id="bob")

        assert [s.session_id for s in self.agent_.get_sessions(user_id="bob")] == ["bob-s"]
        assert [s.session_id for s in self.agent_.get_sessions(user_id="alice")] == ["alice-s"]
        assert [s.session_id for s in self.agent_.get_sessions()] == ["free-s"]
        assert self.agent_.get_sessions(user_id="mallory") == []

    def test_a_missing_session_is_not_found_not_refused(self):
        with self.assertRaises(SessionNotFoundError):
            self.agent_.get_session_state(session_id="nope", user_id="bob")


class TestIdentity(EngineTestMixin, TestCase):
    def test_a_user_id_string_maps_to_the_user_with_that_username(self):
        (john,) = make_users("john_doe")

        output = self.agent().run("hi", session_id="s", user_id="john_doe")

        session = ChatSession.objects.get(session_id="s")
        assert session.owner == john and output.user_id == "john_doe"
        assert get_user_model().objects.filter(username="john_doe").count() == 1

    def test_a_first_run_creates_the_user_without_a_usable_password(self):
        self.agent().run("hi", session_id="s", user_id="jane")

        jane = get_user_model().objects.get(username="jane")
        assert ChatSession.objects.get(session_id="s").owner == jane
        assert not jane.has_usable_password()

    def test_a_user_object_is_accepted(self):
        (alice,) = make_users("alice")

        self.agent().run("hi", session_id="s", user_id=alice)

        assert ChatSession.objects.get(session_id="s").owner == alice
        assert self.agent().get_session_state(session_id="s", user_id="alice") == {}

    def test_the_session_view_reports_the_owner(self):
        self.agent().run("hi", session_id="s", user_id="jane")

        view = self.agent().get_session(session_id="s", user_id="jane")

        assert (view.user_id, view.agent_id) == ("jane", "tester")

    def test_renaming_records_who_named_it(self):
        self.agent().run("hi", session_id="s", user_id="jane")

        self.agent().set_session_name(session_id="s", user_id="jane", session_name="  Trip  ")

        session = ChatSession.objects.get(session_id="s")
        assert (session.name, session.name_source) == ("Trip", NameSource.USER)
