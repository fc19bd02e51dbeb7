"""Faults: the PostgreSQL server restarts, or is down for a moment, in the middle of a run; for the engine
on its own and for a chat through the production server. The run completes (or, with the database gone
for good, ends as an error), nothing is half-written or written twice, and the next message works.

Each test has a PostgreSQL server of its own (tests/support/postgres_server.py) and restarts or stops it with
pg_ctl as an operator would: that ends every open connection and refuses new ones until it is back, which
is the whole fault, and the suite's shared server is never touched. They run in both passes of
scripts/test: the database under test is that server either way.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time

import psycopg
import pytest
from django.db import connections

from sessions_core import Agent, PostgresDb
from sessions_core.events import RunEvent
from sessions_core.models import ChatSession, Run
from tests.support.live_support import is_stream_frame
from tests.support.llm_server import Text, background_responder
from tests.support.postgres_server import own_postgres  # noqa: F401  (a fixture)
from tests.support.serve_support import Server, WebSocket, finished, production_env, receive_until
from tests.support.store_support import db_access  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("db_access")

REPLY = "one two three four five six seven eight nine ten eleven twelve"
RETRIED = "storing its outcome is tried again"  # the engine's warning when it tries to store a run again


def stored(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
        return conn.execute(sql).fetchall()


def assert_two_replies_stored_once(url: str) -> None:
    assert stored(url, "SELECT status, content FROM sessions_core_run ORDER BY id") == [
        ("completed", REPLY), ("completed", "The next reply.")]
    messages = "SELECT role, content FROM sessions_core_message WHERE role <> 'system' ORDER BY id"
    assert stored(url, messages) == [("user", "count to twelve"), ("assistant", REPLY), ("user", "and now?"),
                                     ("assistant", "The next reply.")]
    assert stored(url, "SELECT count(*) FROM sessions_core_chatsession WHERE lease_token <> ''") == [(0,)]


class StartOnRetry(logging.Handler):
    """Starts the stopped server when the engine says it will try storing the run again."""

    def __init__(self, server):
        super().__init__()
        self.server, self.started = server, False

    def emit(self, record: logging.LogRecord) -> None:
        if RETRIED in record.getMessage() and not self.started:
            self.started = True
            self.server.start()


@pytest.fixture
def agent(own_postgres, openai_model):  # noqa: F811
    db = PostgresDb(db_url=own_postgres.url)
    yield Agent(model=openai_model, db=db)
    connections[db.alias].close()


def streamed_to_the_first_word(agent):
    stream = agent.run("count to twelve", session_id="s", user_id="ann", stream=True, stream_events=True)
    for event in stream:
        if event.event == RunEvent.run_content:
            return stream  # the run has started: it holds the lease, and its row is stored as running
    raise AssertionError("the run never streamed")


@pytest.mark.parametrize("chunk_delay", [
    0.1,  # paced over about 1.2 s: the run's heartbeat (each second) meets the lost connection first
    0.0,  # at once: storing the run's outcome meets it
])
def test_a_run_whose_database_restarts_mid_reply_completes_and_the_next_one_works(own_postgres, agent,  # noqa: F811
                                                                                  llm_server, chunk_delay):
    hold = threading.Event()
    llm_server.add(Text(REPLY, chunk_delay=chunk_delay, wait_event=hold), Text("The next reply."))
    stream = streamed_to_the_first_word(agent)
    own_postgres.restart()  # every connection ended, the run's among them; back up when this returns
    hold.set()
    events = list(stream)

    assert events[-1].event == RunEvent.run_completed, events[-1]
    assert "".join(e.content for e in events if e.event == RunEvent.run_content) == REPLY[len("one "):]
    output = agent.run("and now?", session_id="s", user_id="ann")
    assert output.status == "completed" and output.content == "The next reply."
    assert_two_replies_stored_once(own_postgres.url)
    history = [(m.role, m.content) for m in agent.get_chat_history(session_id="s", user_id="ann")]
    assert history == [("user", "count to twelve"), ("assistant", REPLY), ("user", "and now?"),
                       ("assistant", "The next reply.")]


def test_a_run_that_ends_while_its_database_is_down_is_stored_once_it_is_back(own_postgres, agent,  # noqa: F811
                                                                              llm_server):
    hold = threading.Event()
    llm_server.add(Text(REPLY, wait_event=hold), Text("The next reply."))
    stream = streamed_to_the_first_word(agent)
    own_postgres.stop()
    restarter = StartOnRetry(own_postgres)
    logging.getLogger("sessions_core").addHandler(restarter)
    try:
        hold.set()
        events = list(stream)  # storing the outcome fails (refused), then is tried again once the server is up
    finally:
        logging.getLogger("sessions_core").removeHandler(restarter)

    assert restarter.started  # the first try did fail
    assert events[-1].event == RunEvent.run_completed, events[-1]
    assert agent.run("and now?", session_id="s", user_id="ann").content == "The next reply."
    assert_two_replies_stored_once(own_postgres.url)


def test_a_run_whose_database_stays_down_ends_as_an_error_and_writes_nothing(own_postgres, agent,  # noqa: F811
                                                                             llm_server, monkeypatch):
    monkeypatch.setattr("sessions_core.run.finish.FINISH_RETRY_SECONDS", 0.5)
    hold = threading.Event()
    llm_server.add(Text(REPLY, wait_event=hold))
    stream = streamed_to_the_first_word(agent)
    own_postgres.stop()
    hold.set()
    events = list(stream)

    assert events[-1].event == RunEvent.run_error and events[-1].error_type == "storage_error", events[-1]
    assert "could not be stored" in events[-1].content
    own_postgres.start()
    # Nothing of the run's end was written: the run is still marked running (its lease expires and the
    # session's next run settles it as interrupted), the reply and the state are not stored.
    run = Run.objects.using(agent.db.alias).get()
    assert run.status == "running" and run.content == ""
    assert stored(own_postgres.url, "SELECT role FROM sessions_core_message ORDER BY id") == [("user",)]
    assert ChatSession.objects.using(agent.db.alias).get().lease_token != ""


# -- the same through the production server ---------------------------------------------------------


def test_a_chat_whose_database_is_down_as_the_reply_ends_completes_and_goes_on(own_postgres, llm_server,  # noqa: F811
                                                                              llm_server_session, tmp_path):
    # The first try to store the run waits DATABASE_POOL_TIMEOUT for a connection the stopped server
    # cannot give, and the test waits on that try: a short one here.
    env = production_env(DATABASE_URL=own_postgres.url, STATIC_ROOT=str(tmp_path / "static"),
                         OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test", OPENAI_TIMEOUT="10",
                         DATABASE_POOL_TIMEOUT="1")
    server = Server(["bash", "scripts/serve"], env)
    try:
        llm_server.side_responder = background_responder
        cookies: dict[str, str] = {}
        password = "a-long-pass-phrase-9"
        status, _, page = server.post_form("/accounts/signup/", {"username": "dana", "password1": password,
                                                                  "password2": password}, cookies)
        assert status == 302 and "sessionid" in cookies, page
        hold = threading.Event()
        llm_server.add(Text(REPLY, wait_event=hold), Text("The next reply."))
        # A new chat is made with its first message, which its page's socket runs once it connects.
        status, headers, page = server.post_form("/new/", {"assistant": "general", "text": "count to twelve"},
                                                 cookies)
        assert status == 302, page
        session_id = re.search(r"/s/([^/]+)/$", headers["location"]).group(1)
        ws = WebSocket(server.port, f"/ws/sessions/{session_id}/",
                       {"Cookie": f"sessionid={cookies['sessionid']}", "Origin": f"http://127.0.0.1:{server.port}"})
        try:
            receive_until(ws, is_stream_frame)  # the run is streaming
            own_postgres.stop()
            hold.set()
            deadline = time.monotonic() + 20
            while RETRIED not in server.whole_output():  # the server tried to store the run and was refused
                assert time.monotonic() < deadline, server.output()
                time.sleep(0.05)  # polling a log: there is no event to wait on
            own_postgres.start()
            assert REPLY in receive_until(ws, finished("completed"))[-1]
            ws.send(json.dumps({"type": "send", "text": "and now?"}))
            assert "The next reply." in receive_until(ws, finished("completed"))[-1]
        finally:
            ws.close()
    finally:
        server.stop()
    assert_two_replies_stored_once(own_postgres.url)
