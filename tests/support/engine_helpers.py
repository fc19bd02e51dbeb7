"""Shared helpers for the engine tests: personas, agents on the local test model server, and ways to
read what the server received and what the database holds.

Every engine test talks to the real `OpenAIChat` through the real `openai` client; the local test
server in tests/support/llm_server.py is the only thing standing in for a provider.
"""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import DataError
from django.utils import timezone

from sessions_core import Agent, RunEvent
from sessions_core.models import ChatSession, Message, Run, RunStatus, StateChange
from tests.support.llm_server import Text, ToolCalls


class EngineTestMixin:
    """Gives a test class `self.llm` (the test server) and `self.model` (an OpenAIChat pointed at it)."""

    @pytest.fixture(autouse=True)
    def _engine_fixtures(self, llm_server, openai_model):
        self.llm = llm_server
        self.model = openai_model

    def agent(self, **options) -> Agent:
        options.setdefault("name", "Tester")
        options.setdefault("model", self.model)
        return Agent(**options)

    # -- what the model server received --

    def sent(self, index: int = -1) -> list[dict]:
        """The messages of one recorded request (the last by default)."""
        return self.llm.requests[index]["messages"]

    def sent_pairs(self, index: int = -1, system: bool = False) -> list[tuple[str, str | None]]:
        """(role, content) of each message of a recorded request; system messages left out unless asked."""
        return [(m["role"], m.get("content")) for m in self.sent(index) if system or m["role"] != "system"]

    def system_prompt(self, index: int = -1) -> str:
        messages = [m for m in self.sent(index) if m["role"] == "system"]
        assert len(messages) == 1, f"expected one system message, got {messages}"
        return messages[0]["content"]


def make_users(*names):
    """Users without a password: the engine never logs anyone in, and hashing one costs a quarter second."""
    User = get_user_model()
    return [User.objects.create_user(username=name) for name in names]


def stream_all(agent: Agent, text: str, **kwargs) -> list:
    """Every event of a sync streamed run with stream_events on."""
    return list(agent.run(text, stream=True, stream_events=True, **kwargs))


async def astream_all(agent: Agent, text: str, **kwargs) -> list:
    return [event async for event in agent.arun(text, stream=True, stream_events=True, **kwargs)]


def of_kind(events: list, kind: RunEvent) -> list:
    return [event for event in events if event.event == kind]


def kinds(events: list) -> list[str]:
    return [str(event.event) for event in events]


def tool_then_text(tool: str, args_for=lambda body: {}, reply: str = "Done."):
    """A responder: call `tool` (args computed from the request body) unless the last message is a tool result."""

    def respond(body: dict):
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return Text(reply)
        return ToolCalls([(tool, args_for(body))])

    return respond


def last_user_text(body: dict) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def counts(alias: str = "default") -> dict:
    """Row counts of everything the engine writes, to prove a refused call wrote nothing."""
    return {
        "users": get_user_model().objects.using(alias).count(),
        "sessions": ChatSession.objects.using(alias).count(),
        "runs": Run.objects.using(alias).count(),
        "messages": Message.objects.using(alias).count(),
        "state_changes": StateChange.objects.using(alias).count(),
    }


def snapshot(session_id: str) -> dict:
    """What a session holds, without ids and timestamps: for comparing runs made different ways."""
    session = ChatSession.objects.get(session_id=session_id)
    runs = list(session.runs.order_by("id").values_list("status", "input", "content", "error", "state_version"))
    messages = [
        (m.seq, m.role, m.content, [c["name"] for c in m.tool_calls or []], m.tool_name, m.tool_error, m.run.input)
        for m in session.messages.select_related("run").order_by("seq")
    ]
    changes = list(session.state_changes.order_by("version").values_list("version", "source", "patch", "inverse"))
    return {
        "state": session.session_state, "state_version": session.state_version, "last_seq": session.last_seq,
        "runs": runs, "messages": messages, "changes": changes,
    }


def bulk_runs(session: ChatSession, count: int, status: str = RunStatus.COMPLETED) -> None:
    """`count` finished runs of one user and one assistant message each, in three queries (not 3 x count)."""
    now = timezone.now()
    runs = Run.objects.bulk_create([
        Run(session=session, component_id=session.component_id, status=status, input=f"question {n}",
            content=f"answer {n}", created_at=now, finished_at=now)
        for n in range(count)
    ])
    if runs[0].pk is None:  # backends that do not return ids from bulk inserts
        runs = list(session.runs.order_by("id"))[-count:]
    seq = session.last_seq
    rows = []
    for n, run in enumerate(runs):
        rows.append(Message(session=session, run=run, seq=seq + 1, role="user", content=f"question {n}",
                            created_at=now))
        rows.append(Message(session=session, run=run, seq=seq + 2, role="assistant", content=f"answer {n}",
                            created_at=now))
        seq += 2
    Message.objects.bulk_create(rows)
    ChatSession.objects.filter(pk=session.pk).update(last_seq=seq, last_activity_at=now)
    session.last_seq = seq


class Gate:
    """A threading.Event a held reply waits on, released at the end of the test whatever happens."""

    def __init__(self):
        self.event = threading.Event()

    def __enter__(self) -> threading.Event:
        return self.event

    def __exit__(self, *exc):
        self.event.set()


def refused_calls(component, session_id: str, user_id: str) -> list:
    """Every run entry point and accessor of `component` on `session_id`, as `user_id` (each should be
    refused with SessionOwnershipError when the session is someone else's)."""
    asked = {"session_id": session_id, "user_id": user_id}
    return [
        lambda: component.run("x", **asked),
        lambda: component.get_session_state(**asked),
        lambda: component.update_session_state({"a": 1}, **asked),
        lambda: component.get_chat_history(**asked),
        lambda: component.get_session(**asked),
        lambda: component.get_last_run_output(**asked),
        lambda: component.get_session_name(**asked),
        lambda: component.set_session_name(session_name="mine", **asked),
        lambda: component.set_session_name(autogenerate=True, **asked),
        lambda: component.regenerate(**asked),
        lambda: component.fork_session(**asked),
        lambda: component.delete_session(**asked),
    ]


class RefuseFinishOnce:
    """A database execute wrapper that refuses the first run finish it sees (its release of the lease),
    as a database refusing a value would; `refused` holds the statement."""

    def __init__(self):
        self.refused: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        if not self.refused and '"lease_expires_at" = NULL' in sql:
            self.refused.append(sql)
            raise DataError("value too long (simulated)")
        return execute(sql, params, many, context)
