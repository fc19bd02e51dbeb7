"""Downloads of a user's chats: one session as Markdown or JSON, or all of them as JSON."""

from __future__ import annotations

import json
import warnings
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from sessions_core import export
from sessions_core.models import ChatSession, Message, Run, RunStatus
from tests.factories import make_run, make_session, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def add_tool_run(session: ChatSession, arguments: str, result: str, error: bool = False) -> Run:
    """A run as the engine stores it: system prompt, user message, a tool call, its result, the reply."""
    run = Run.objects.create(session=session, status=RunStatus.COMPLETED, input="add it", content="Added.",
                             finished_at=timezone.now())
    seq = session.last_seq
    rows = [("system", "You keep a list.", {}), ("user", "add it", {}),
            ("assistant", "", {"tool_calls": [{"id": "call_1", "name": "add_item", "arguments": arguments}]}),
            ("tool", result, {"tool_call_id": "call_1", "tool_name": "add_item", "tool_error": error}),
            ("assistant", "Added.", {})]
    Message.objects.bulk_create(Message(session=session, run=run, seq=seq + number, role=role, content=content,
                                        **extra) for number, (role, content, extra) in enumerate(rows, start=1))
    ChatSession.objects.filter(pk=session.pk).update(last_seq=seq + len(rows))
    session.last_seq = seq + len(rows)
    return run


@pytest.fixture
def alice_chat():
    alice = make_user("alice")
    session = make_session(alice, component_id="shopping", name="Groceries: week 48",
                           session_state={"shopping_list": ["milk"]}, state_version=1)
    make_run(session, "hello there", "Hi! **Welcome**.")
    add_tool_run(session, '{"item": "milk `2%`"}', "Added milk `2%`.")
    make_run(session, "and then?", None, status=RunStatus.ERROR, error="The model server answered 500.")
    return alice, session


def download(user, url: str):
    """GET through Django's ASGI handler, as daphne serves it."""

    async def get():
        client = AsyncClient()
        await sync_to_async(client.force_login)(user)
        response = await client.get(url)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Django warns when it has to read a sync stream whole under ASGI
            body = b"".join([part async for part in response.streaming_content])
        return response, body.decode()

    return async_to_sync(get)()


def test_a_session_as_json_has_its_runs_messages_and_state(alice_chat):
    alice, session = alice_chat
    response, body = download(alice, reverse("chat:session_export_json", args=[session.session_id]))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="groceries-week-48-{session.session_id[:8]}.json"'
    assert response["Cache-Control"] == "private, no-store"
    data = json.loads(body)
    assert (data["format"], data["session_id"], data["name"]) == ("sessions_core.session", session.session_id,
                                                                  "Groceries: week 48")
    assert data["session_state"] == {"shopping_list": ["milk"]} and data["state_version"] == 1
    assert [run["status"] for run in data["runs"]] == ["completed", "completed", "error"]
    assert data["runs"][2]["error"] == "The model server answered 500."
    tool_run = data["runs"][1]
    assert [message["role"] for message in tool_run["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tool_run["messages"][1]["tool_calls"][0]["arguments"] == '{"item": "milk `2%`"}'
    assert tool_run["messages"][2]["tool_name"] == "add_item" and tool_run["messages"][2]["tool_error"] is False
    assert "You keep a list." not in body  # the system prompt is the assistant's, not the conversation


def test_a_session_as_markdown_reads_as_the_conversation(alice_chat):
    alice, session = alice_chat
    response, body = download(alice, reverse("chat:session_export_markdown", args=[session.session_id]))
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].endswith(f'-{session.session_id[:8]}.md"')
    assert body.startswith("# Groceries: week 48\n\nAssistant: Shopping list · started ")
    assert body.index("hello there") < body.index("Hi! **Welcome**.") < body.index("add it")
    assert '> Tool `add_item` called with `` {"item": "milk `2%`"} ``' in body  # backticks inside stay code
    assert "> Tool `add_item` returned: Added milk `2%`." in body
    assert "*The reply failed: The model server answered 500.*" in body
    assert body.rstrip().endswith('```json\n{\n  "shopping_list": [\n    "milk"\n  ]\n}\n```')
    assert "You keep a list." not in body


def test_all_chats_are_the_users_own_and_not_the_trash(alice_chat):
    alice, session = alice_chat
    make_session(make_user("bob", "pw-bob-123"), name="Bob's secret")
    older = make_session(alice, name="Older", last_activity_at=timezone.now() - timedelta(days=1))
    make_session(alice, name="Binned", deleted_at=timezone.now())
    response, body = download(alice, reverse("chat:export_all"))
    assert response["Content-Disposition"].startswith('attachment; filename="chats-alice-')
    data = json.loads(body)
    assert (data["format"], data["user"]) == ("sessions_core.export", "alice")
    assert [chat["session_id"] for chat in data["sessions"]] == [session.session_id, older.session_id]
    assert len(data["sessions"][0]["runs"]) == 3 and data["sessions"][1]["runs"] == []


@pytest.mark.parametrize("runs", [3, 30])
def test_the_export_reads_the_runs_in_batches_whatever_their_number(runs, django_assert_num_queries):
    session = make_session(make_user("alice"))
    for number in range(runs):
        make_run(session, f"question {number}", f"answer {number}")
    with django_assert_num_queries(2):  # the runs, then their messages: one batch of BATCH_RUNS
        json_parts = list(export.export_json(session))
    with django_assert_num_queries(2):
        markdown = "".join(export.export_markdown(session))
    assert len(json.loads("".join(json_parts))["runs"]) == runs
    assert markdown.count("**You**") == runs and f"answer {runs - 1}" in markdown
