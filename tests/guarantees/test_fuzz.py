"""Generated input (hypothesis, a bounded number of examples): socket frames and state edits never crash
the consumer or the view, write nothing when refused, and never show anyone else's data."""

from __future__ import annotations

import json

from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase as HypothesisTestCase
from hypothesis.extra.django import TransactionTestCase as HypothesisTransactionTestCase

from chatapp.asgi import application
from chatapp.consumers import FrameError, parse_frame
from sessions_core.models import ChatSession, Message, Run, StateChange
from sessions_core.storable import replace_unstorable_tree
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import HOST, ORIGIN, LiveTestMixin

SECRET = "quokka-lantern-5521"  # Bob's words: in no response to Alice
BOUNDED = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
nested_text = st.integers(60, 20_000).flatmap(lambda depth: st.sampled_from([
    "[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "[" * depth,  # the last: never closed
    '{"type": "send", "text": "x", "y": ' + "[" * depth + "]" * depth + "}",
]))
frame_objects = st.fixed_dictionaries(
    {"type": st.sampled_from(["send", "stop", "retry", "regenerate_title", "shout", "", None]) | json_values},
    optional={"text": json_values, "run_id": json_values, "queued_id": json_values, "HEADERS": json_values},
)
frames = (frame_objects.map(json.dumps) | json_values.map(json.dumps) | st.text(max_size=200) | nested_text
          | st.binary(max_size=50))


def numbers_as_floats(value):
    if isinstance(value, dict):
        return {key: numbers_as_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [numbers_as_floats(item) for item in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def harmless(frame: str | bytes) -> bool:
    """A frame that is refused, or accepted without starting anything (a stop, a retry of an unknown run)."""
    if isinstance(frame, bytes):
        return True
    try:
        parsed = parse_frame(frame)
    except FrameError:
        return True
    return parsed.type in ("stop", "retry")


class TestFrames(LiveTestMixin, HypothesisTransactionTestCase):
    """The database is emptied after each example: each makes its own users and sessions."""

    def given_two_users(self):
        self.alice = make_user("alice")
        self.bob = make_user("bob")
        self.session = make_session(self.alice, component_id="shopping", name="Mine")
        theirs = make_session(self.bob, component_id="shopping", name=f"Theirs {SECRET}")
        make_run(theirs, f"bob says {SECRET}", "ok")
        theirs.apply_state_change({"secret": SECRET}, "manual")
        self.counts = self.count()

    @staticmethod
    def count() -> tuple:
        return (Run.objects.count(), Message.objects.count(), StateChange.objects.count(),
                ChatSession.objects.count())

    @BOUNDED
    @given(frame=frames)
    def test_no_frame_crashes_writes_or_leaks(self, frame):
        assume(frame and harmless(frame))  # (the test client cannot send an empty frame)
        self.given_two_users()

        async def exchange() -> list[str]:
            cookie = await self.cookie_for(self.alice)
            socket = WebsocketCommunicator(application, f"/ws/sessions/{self.session.session_id}/",
                                           headers=[ORIGIN, HOST, (b"cookie", cookie)])
            connected, _ = await socket.connect(timeout=5)
            assert connected
            if isinstance(frame, bytes):
                await socket.send_to(bytes_data=frame)
            else:
                await socket.send_to(text_data=frame)
            answers = [await socket.receive_from(timeout=5)]
            # Still open and still answering: a stop with nothing running is answered.
            await socket.send_to(text_data=json.dumps({"type": "stop"}))
            answers.append(await socket.receive_from(timeout=5))
            await socket.disconnect()
            return answers

        answers = async_to_sync(exchange)()
        assert "run-status" in answers[0]  # an answer for the sender, on the status line
        assert "Nothing to stop." in answers[1]
        for answer in answers:
            assert SECRET not in answer and "Traceback" not in answer
        assert self.count() == self.counts
        session = ChatSession.objects.get(pk=self.session.pk)
        assert (session.name, session.session_state, session.state_version) == ("Mine", {}, 0)


class TestStateEdits(HypothesisTestCase):
    """Each example runs in a transaction of its own, rolled back after it."""

    def setUp(self):
        self.alice = make_user("alice")
        bob = make_user("bob")
        self.session = make_session(self.alice, component_id="shopping", name="Mine")
        self.session.apply_state_change({"shopping_list": ["milk"]}, "manual")
        theirs = make_session(bob, component_id="shopping", name=f"Theirs {SECRET}")
        theirs.apply_state_change({"secret": SECRET}, "manual")
        self.client = Client()
        self.client.force_login(self.alice)

    @BOUNDED
    @given(state=st.one_of(json_values.map(json.dumps), st.text(max_size=300), nested_text,
                           st.dictionaries(st.text(max_size=10), json_values, max_size=5).map(json.dumps)),
           version=st.one_of(st.just("1"), st.integers(-3, 5).map(str), st.text(max_size=5)),
           htmx=st.booleans())
    @example(state='{"5\\ud951\\udc8c": 6.461278643408241e+16}', version="1", htmx=False)  # jsonb's numbers
    def test_no_edit_crashes_leaks_or_writes_when_refused(self, state, version, htmx):
        url = reverse("chat:state_edit_hx", args=[self.session.session_id])
        headers = {"HX-Request": "true"} if htmx else {}
        response = self.client.post(url, {"state": state, "version": version}, headers=headers)
        assert response.status_code in (200, 302, 409, 422), response.status_code
        body = response.content.decode()
        assert SECRET not in body and "Traceback" not in body
        session = ChatSession.objects.get(pk=self.session.pk)
        if response.status_code in (200, 302):  # saved: the state is what was sent
            # (PostgreSQL's jsonb keeps a number as a decimal: 6.4e+16 comes back as an int of that value.)
            assert version == "1" and numbers_as_floats(session.session_state) == numbers_as_floats(
                replace_unstorable_tree(json.loads(state)))
            assert session.state_version in (1, 2)  # 1 when it was the same state
        else:
            assert (session.session_state, session.state_version) == ({"shopping_list": ["milk"]}, 1)
            assert StateChange.objects.filter(session=session).count() == 1
