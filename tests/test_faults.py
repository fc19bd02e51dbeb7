"""Faults: the database server drops the engine's connection in the middle of a run.

The fault is made on the real test PostgreSQL with `pg_terminate_backend` from a second connection, on a
database of the test's own: that is what a restart (or a failover) does to every open connection (the
backend ends it with "terminating connection due to administrator command"), without restarting the
server under the rest of the suite, which shares it, and without the server's data folder or its user.
It runs in the SQLite pass too: the store is PostgreSQL either way.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from sessions_core import Agent, PostgresDb
from sessions_core.events import RunEvent
from sessions_core.models import ChatSession, Run
from tests.llm_server import Text
from tests.store_support import db_access, pg_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("db_access")

REPLY = "one two three four five six seven eight nine ten eleven twelve"


def drop_connections(url: str) -> int:
    """End every connection to the URL's database but this one, as a server restart would; how many."""
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    return sum(1 for (ended,) in rows if ended)


@pytest.mark.parametrize("chunk_delay", [
    0.1,  # paced over about 1.2 s: the run's heartbeat (each second) meets the dropped connection first
    0.0,  # at once: storing the run's outcome meets it (its transaction is tried again on a new connection)
])
def test_a_run_whose_connection_the_server_drops_completes_and_the_next_one_works(pg_url, llm_server,  # noqa: F811
                                                                                  openai_model, chunk_delay):
    hold = threading.Event()
    llm_server.add(Text(REPLY, chunk_delay=chunk_delay, wait_event=hold), Text("The next reply."))
    db = PostgresDb(db_url=pg_url)
    agent = Agent(model=openai_model, db=db)
    stream = agent.run("count to twelve", session_id="s", user_id="ann", stream=True, stream_events=True)
    for event in stream:
        if event.event == RunEvent.run_content:
            break  # the run has started: it holds the lease, and its row is stored as running
    assert drop_connections(pg_url) >= 1  # the run's own connection among them
    hold.set()
    events = list(stream)

    assert events[-1].event == RunEvent.run_completed, events[-1]
    assert "".join(e.content for e in events if e.event == RunEvent.run_content) == REPLY[len("one "):]
    output = agent.run("and now?", session_id="s", user_id="ann")
    assert output.status == "completed" and output.content == "The next reply."
    runs = list(Run.objects.using(db.alias).order_by("pk"))
    assert [(run.status, run.content) for run in runs] == [("completed", REPLY), ("completed", "The next reply.")]
    history = [(m.role, m.content) for m in agent.get_chat_history(session_id="s", user_id="ann")]
    assert history == [("user", "count to twelve"), ("assistant", REPLY), ("user", "and now?"),
                       ("assistant", "The next reply.")]  # each message once: nothing half-written or doubled
    session = ChatSession.objects.using(db.alias).get(session_id="s")
    assert session.lease_token == "" and session.lease_expires_at is None
