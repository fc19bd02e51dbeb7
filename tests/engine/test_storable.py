"""NUL characters (U+0000) and lone surrogates from the user, the model, tools and the state: stored as
U+FFFD on every database, where PostgreSQL would otherwise refuse the run's writes (see
sessions_core/storable.py)."""

from django.test import SimpleTestCase, TestCase

from sessions_core import RunContext
from sessions_core import state as state_module
from sessions_core.models import ChatSession, Message, Run, StateChange
from sessions_core.search import search_sessions
from sessions_core.storable import replace_unstorable, replace_unstorable_json
from tests.support.engine_helpers import EngineTestMixin, make_users
from tests.support.llm_server import Error, Text, ToolCalls


def note(text: str, run_context: RunContext) -> str:
    """Keep a note.

    Args:
        text: The note.
    """
    assert "\x00" not in text  # the model's arguments reach the tool with U+FFFD already
    run_context.session_state["notes"].append(text)
    run_context.session_state["k\x00ey"] = "v\x00alue"
    run_context.session_state["literal"] = "\\u0000"  # six characters, no NUL: kept as it is
    return f"Noted {text}\x00."


def fail() -> str:
    """Always fails."""
    raise ValueError("bad\x00input")


class TestNulIsReplaced(EngineTestMixin, TestCase):
    def test_in_the_users_message(self):
        self.llm.add(Text("ok"))

        output = self.agent().run("hello\x00world", session_id="s")

        assert output.status == "completed"
        assert self.sent()[-1]["content"] == "hello\ufffdworld"
        assert Message.objects.get(role="user").content == "hello\ufffdworld"
        assert Run.objects.get().input == "hello\ufffdworld"

    def test_in_the_models_reply_a_tools_result_and_the_state(self):
        self.llm.add(ToolCalls([("note", {"text": "mi\x00lk"}), ("fail", {})]))
        self.llm.add(Text("do\x00ne"))
        agent = self.agent(tools=[note, fail], session_state={"notes": []})

        output = agent.run("note milk", session_id="s")

        assert output.status == "completed", output.error
        assert output.content == "do\ufffdne"
        expected = {"notes": ["mi\ufffdlk"], "k\ufffdey": "v\ufffdalue", "literal": "\\u0000"}
        assert output.session_state == expected
        assert ChatSession.objects.get().session_state == expected
        assert [m for m in Message.objects.values_list("content", flat=True) if "\ufffd" in m] == [
            "Noted mi\ufffdlk\ufffd.", "Error: ValueError: bad\ufffdinput", "do\ufffdne"]
        patch = StateChange.objects.get(source="tool:note").patch
        assert sorted(op["path"] for op in patch) == ["/k\ufffdey", "/literal", "/notes/0"]

    def test_in_a_model_servers_error(self):
        self.llm.add(Error(400, "bad\x00request", "invalid_request_error"))

        output = self.agent().run("hi", session_id="s")

        assert output.status == "error"
        assert "\x00" not in output.error and "bad\ufffdrequest" in Run.objects.get().error


    def test_in_a_session_name(self):
        self.llm.add(Text("ok"))
        agent = self.agent()
        agent.run("hi", session_id="s")

        agent.set_session_name(session_id="s", session_name="Oat\x00milk")

        assert agent.get_session_name(session_id="s") == "Oat\ufffdmilk"


    def test_a_user_id_with_nul_or_too_long_is_refused_on_every_database(self):
        agent = self.agent()
        for user_id in ("jo\x00hn", "x" * 151):
            with self.subTest(user_id=user_id[:10]), self.assertRaisesMessage(ValueError, "printable characters"):
                agent.run("hi", session_id="s", user_id=user_id)
        assert not Run.objects.exists() and not ChatSession.objects.exists()


class TestLoneSurrogatesAreReplaced(EngineTestMixin, TestCase):
    def test_in_the_users_message_the_models_reply_and_the_state(self):
        def keep(text: str, run_context: RunContext) -> str:
            """Keep a text.

            Args:
                text: The text.
            """
            run_context.session_state["kept"] = [text, "pair \ud83d\ude00"]  # two surrogates that pair up
            return "kept \udc00"

        self.llm.add(ToolCalls([("keep", {"text": "lone \ud800"})]), Text("re\udfffply"))

        output = self.agent(tools=[keep]).run("in\ud800put", session_id="s")

        assert output.status == "completed", output.error
        assert Message.objects.get(role="user").content == "in\ufffdput"
        assert output.content == "re\ufffdply"
        assert Message.objects.get(role="tool").content == "kept \ufffd"
        assert ChatSession.objects.get().session_state == {"kept": ["lone \ufffd", "pair \U0001f600"]}


class TestStorableText(SimpleTestCase):
    def test_storable_replaces_nul_and_lone_surrogates_and_joins_pairs(self):
        assert replace_unstorable("a\x00b\ud800c\udc00d\ud83d\ude00") == "a\ufffdb\ufffdc\ufffdd\U0001f600"
        assert replace_unstorable("plain caf\u00e9") == "plain caf\u00e9"

    def test_storable_json_only_escapes_that_stand_for_nul(self):
        cases = {
            '"a\\u0000b"': '"a\\ufffdb"',
            '"\\\\u0000"': '"\\\\u0000"',  # an escaped backslash, then the text u0000
            '"\\\\\\u0000"': '"\\\\\\ufffd"',  # an escaped backslash, then a NUL
            '{"\\u0000": 1}': '{"\\ufffd": 1}',
            '"\\u00001"': '"\\ufffd1"',
            '"plain"': '"plain"',
        }
        for text, expected in cases.items():
            with self.subTest(text=text):
                assert replace_unstorable_json(text) == expected

    def test_dumps_and_to_json(self):
        assert state_module.to_json({"a\x00": ["b\x00", "\\u0000"]}) == {"a\ufffd": ["b\ufffd", "\\u0000"]}
        assert state_module.to_json({"k\ud800": "v\udc00", "n": None}) == {"k\ufffd": "v\ufffd", "n": None}


class TestSearch(EngineTestMixin, TestCase):
    def test_a_query_with_nul_finds_what_was_stored(self):
        (alice,) = make_users("alice")
        self.llm.add(Text("ok"))
        self.agent().run("buy oat\x00milk today", session_id="s", user_id="alice")

        page = search_sessions(alice, "oat\x00milk")

        assert [hit.session.session_id for hit in page.title_hits + page.message_hits] == ["s"]
