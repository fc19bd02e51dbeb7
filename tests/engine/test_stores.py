"""SqliteDb, PostgresDb and their async twins: real files and the real test PostgreSQL, across processes."""

import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from sessions_core import (
    Agent, AsyncPostgresDb, AsyncSqliteDb, InMemoryDb, PostgresDb, SessionOwnershipError, SqliteDb, StoreError,
)
from sessions_core.models import ChatSession, Run
from sessions_core.stores import StoreConfigError, StoreConnectionError, StoreMigrationError
from tests.support.example_support import ROOT, offline_env
from tests.support.llm_server import Text
from tests.support.store_support import db_access, pg_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("db_access")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Relative db_file paths land in the test's own folder, as a script's land in its working folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def script(tmp_path: Path, body: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "store_script.py"
    path.write_text(textwrap.dedent(body))
    env = {**offline_env(tmp_path, "default"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(path), *args], cwd=tmp_path, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def together(tmp_path: Path, body: str, *args: str, count: int = 2) -> list[str]:
    """Start `count` processes, let each get ready, then release them at once; their outputs."""
    path = tmp_path / "together.py"
    path.write_text(textwrap.dedent(body))
    # Each with a Django database of its own: sessions_core.setup() migrates that one unguarded.
    envs = [{**offline_env(tmp_path, f"default_{n}"), "PYTHONPATH": str(ROOT)} for n in range(count)]
    processes = [subprocess.Popen([sys.executable, str(path), *args], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    for process in processes:
        assert process.stdout.readline() == "ready\n", process.stderr.read()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs.append(out)
    return outputs


TOGETHER = """
    import sys

    from sessions_core import PostgresDb, SqliteDb

    store = {store}
    print("ready", flush=True)
    sys.stdin.readline()
    store.alias  # the first use: both processes migrate the new database at the same moment
    print("sessions:", len(store.get_sessions(user_id="ann")))
"""


def migrations_recorded(alias: str) -> tuple[int, int]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT app || '.' || name) FROM django_migrations")
        return cursor.fetchone()


# -- SqliteDb ----------------------------------------------------------------------------------------


def test_a_session_written_through_sqlite_db_is_read_back_by_another_process(in_tmp, llm_server, openai_model):
    llm_server.add(Text("Noted: milk."))
    db = SqliteDb(db_file="tmp/nested/agents.db")  # relative, in folders that do not exist yet
    agent = Agent(model=openai_model, db=db, session_state={"items": ["milk"]})
    agent.run("remember milk", session_id="shop", user_id="ann")

    done = script(in_tmp, """
        from sessions_core import SqliteDb

        session = SqliteDb(db_file="tmp/nested/agents.db").get_session("shop", user_id="ann")
        print(session.user_id, session.session_state, [m.content for m in session.get_chat_history()])
    """)

    assert done.stdout.strip() == "ann {'items': ['milk']} ['remember milk', 'Noted: milk.']"
    assert (in_tmp / "tmp" / "nested" / "agents.db").is_file()
    assert db.path == in_tmp / "tmp" / "nested" / "agents.db"


def test_equal_arguments_are_one_store_and_agents_given_it_share_its_sessions(in_tmp, llm_server, openai_model):
    llm_server.add(Text("Hello."))
    first, second = SqliteDb(db_file="tmp/agents.db"), SqliteDb(db_file=str(in_tmp / "tmp" / "agents.db"))
    Agent(model=openai_model, db=first, session_state={"n": 1}).run("hi", session_id="s", user_id="ann")

    assert first.alias == second.alias
    assert Agent(model=openai_model, db=second).get_session_state(session_id="s", user_id="ann") == {"n": 1}
    assert [s.session_id for s in second.get_sessions(user_id="ann")] == ["s"]


def test_session_table_on_sqlite_is_a_file_of_its_own_next_to_db_file(in_tmp, llm_server, openai_model):
    llm_server.add(Text("One."), Text("Two."))
    plain, named = SqliteDb(db_file="tmp/agents.db"), SqliteDb(db_file="tmp/agents.db", session_table="sessions")
    Agent(model=openai_model, db=plain).run("first", session_id="s", user_id="ann")
    Agent(model=openai_model, db=named).run("second", session_id="s", user_id="bob")  # same id, another store

    assert named.path == in_tmp / "tmp" / "agents.sessions.db"
    assert plain.get_session("s", user_id="ann").user_id == "ann"
    assert named.get_session("s", user_id="bob").user_id == "bob"
    assert [m.content for m in named.get_session("s", user_id="bob").get_chat_history()] == ["second", "Two."]


def test_two_processes_starting_together_on_a_new_sqlite_file_both_work(in_tmp):
    outputs = together(in_tmp, TOGETHER.format(store='SqliteDb(db_file="tmp/race.db")'))

    assert outputs == ["sessions: 0\n", "sessions: 0\n"]
    total, distinct = migrations_recorded(SqliteDb(db_file="tmp/race.db").alias)
    assert total == distinct > 10  # each migration applied once


def test_sqlite_db_migrates_once_per_process(in_tmp):
    db = SqliteDb(db_file="tmp/agents.db")
    alias = db.alias
    with connections[alias].cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'sessions_core'")

    assert SqliteDb(db_file="tmp/agents.db").alias == alias  # ready already: not migrated again
    assert migrations_recorded(alias)[0] > 0


# -- the db accessors and their owner checks ------------------------------------------------------------


@pytest.fixture
def shared(in_tmp, llm_server, openai_model):
    """A store holding ann's sessions a1, a2 (newest), bob's b1 and an ownerless one."""
    llm_server.responder = lambda body: Text("ok")
    db = SqliteDb(db_file="tmp/shared.db")
    agent = Agent(model=openai_model, db=db)
    for session_id, user in [("a1", "ann"), ("b1", "bob"), ("a2", "ann"), ("anon", None)]:
        agent.run("hello", session_id=session_id, user_id=user)
    return db


def test_the_db_lists_one_users_sessions_newest_first_by_page(shared):
    assert [s.session_id for s in shared.get_sessions(user_id="ann")] == ["a2", "a1"]
    assert [s.session_id for s in shared.get_sessions(user_id="ann", limit=1, page=2)] == ["a1"]
    assert [s.session_id for s in shared.get_sessions()] == ["anon"]
    assert shared.get_sessions(user_id="nobody") == []
    with pytest.raises(ValueError):
        shared.get_sessions(user_id="ann", page=1)  # a page needs a limit


def test_the_db_refuses_another_users_session_and_writes_nothing(shared):
    with pytest.raises(SessionOwnershipError):
        shared.get_session("a1", user_id="bob")
    with pytest.raises(SessionOwnershipError):
        shared.delete_session("a1", user_id="bob")
    with pytest.raises(SessionOwnershipError):
        shared.get_session("a1")  # anonymous
    with pytest.raises(SessionOwnershipError):
        shared.delete_session("anon", user_id="ann")  # an ownerless session is never claimed

    assert ChatSession.objects.using(shared.alias).count() == 4
    assert shared.get_session("missing", user_id="ann") is None
    assert shared.delete_session("missing", user_id="ann") is False


def test_the_db_deletes_the_owners_session_with_its_runs(shared):
    assert shared.delete_session("a1", user_id="ann") is True

    assert shared.get_session("a1", user_id="ann") is None
    assert not Run.objects.using(shared.alias).filter(session__session_id="a1").exists()
    assert shared.get_session("b1", user_id="bob").user_id == "bob"


def test_in_memory_db_answers_the_same_accessors(llm_server, openai_model):
    llm_server.add(Text("Hi."))
    db = InMemoryDb()
    Agent(model=openai_model, db=db).run("hi", session_id="m", user_id="ann")

    assert db.get_session("m", user_id="ann").user_id == "ann"
    with pytest.raises(SessionOwnershipError):
        db.delete_session("m", user_id="bob")


# -- the async twins ------------------------------------------------------------------------------------


def test_async_sqlite_db_under_arun_and_its_accessors_are_coroutines(in_tmp, llm_server, openai_model):
    llm_server.add(Text("Async hello."))

    async def main():
        db = AsyncSqliteDb(db_file="tmp/data.db")  # first used inside the event loop
        agent = Agent(model=openai_model, db=db, session_state={"n": 1})
        output = await agent.arun("hi", session_id="s", user_id="ann")
        session = await db.get_session("s", user_id="ann")
        listed = await db.get_sessions(user_id="ann")
        with pytest.raises(SessionOwnershipError):
            await db.delete_session("s", user_id="bob")
        return output, session, listed

    output, session, listed = asyncio.run(main())

    assert output.status == "completed" and session.session_state == {"n": 1}
    assert [s.session_id for s in listed] == ["s"]


def test_async_postgres_db_under_arun(pg_url, llm_server, openai_model):
    llm_server.add(Text("Async hello."))

    async def main():
        db = AsyncPostgresDb(db_url=pg_url.replace("postgres://", "postgresql+psycopg_async://"),
                             session_table="sessions")
        agent = Agent(model=openai_model, db=db)
        await agent.arun("hi", session_id="s", user_id="ann")
        session = await db.aget_session("s", user_id="ann")
        history = [(m.role, m.content) for m in await session.aget_messages()]
        deleted = await db.delete_session("s", user_id="ann")
        return session, history, deleted, await db.get_session("s", user_id="ann")

    session, history, deleted, after = asyncio.run(main())

    assert session.user_id == "ann" and ("user", "hi") in history and history[-1] == ("assistant", "Async hello.")
    assert deleted is True and after is None


# -- PostgresDb ----------------------------------------------------------------------------------------


def tables_in(url: str, schema: str) -> set[str]:
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema]).fetchall()
    return {name for (name,) in rows}


def test_two_session_tables_on_one_postgres_database_keep_their_sessions_apart(pg_url, llm_server, openai_model):
    llm_server.add(Text("In a."), Text("In b."))
    a = PostgresDb(db_url=pg_url.replace("postgres://", "postgresql+psycopg://"), session_table="sessions_a")
    b = PostgresDb(db_url=pg_url, session_table="sessions_b")
    Agent(model=openai_model, db=a, session_state={"where": "a"}).run("x", session_id="same", user_id="ann")
    Agent(model=openai_model, db=b, session_state={"where": "b"}).run("y", session_id="same", user_id="bob")

    assert a.get_session("same", user_id="ann").session_state == {"where": "a"}
    assert b.get_session("same", user_id="bob").session_state == {"where": "b"}
    assert a.get_sessions(user_id="bob") == [] and b.get_sessions(user_id="ann") == []
    assert "sessions_core_chatsession" in tables_in(pg_url, "sessions_a") & tables_in(pg_url, "sessions_b")
    assert tables_in(pg_url, "public") == set()  # each store's tables are in its schema only


def test_agno_url_forms_name_one_store_and_processes_share_it(pg_url, tmp_path, llm_server, openai_model):
    llm_server.add(Text("Stored."))
    forms = [pg_url, pg_url.replace("postgres://", "postgresql://"), pg_url.replace("postgres://", "postgresql+psycopg://")]
    stores = [PostgresDb(db_url=url) for url in forms]
    Agent(model=openai_model, db=stores[0]).run("keep this", session_id="p", user_id="ann")

    done = script(tmp_path, """
        import sys

        from sessions_core import PostgresDb

        session = PostgresDb(db_url=sys.argv[1]).get_session("p", user_id="ann")
        print([m.content for m in session.get_chat_history()])
    """, forms[2])

    assert len({store.alias for store in stores}) == 1
    assert done.stdout.strip() == "['keep this', 'Stored.']"
    assert "sessions_core_chatsession" in tables_in(pg_url, "public")  # no session_table: the default schema


def test_two_processes_starting_together_on_a_new_postgres_schema_both_work(pg_url, tmp_path):
    outputs = together(tmp_path, TOGETHER.format(store='PostgresDb(db_url=sys.argv[1], session_table="race")'), pg_url)

    assert outputs == ["sessions: 0\n", "sessions: 0\n"]
    total, distinct = migrations_recorded(PostgresDb(db_url=pg_url, session_table="race").alias)
    assert total == distinct > 10


# -- bad input: a clear StoreError naming the store, raised on first use ----------------------------------


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_postgres_is_reported_on_first_use_with_the_password_masked():
    port = closed_port()
    db = PostgresDb(db_url=f"postgresql+psycopg://ai:s3cret@127.0.0.1:{port}/ai")  # made: no error yet

    with pytest.raises(StoreConnectionError) as raised:
        Agent(db=db).get_session_state(session_id="s")

    message = str(raised.value)
    assert message.startswith(f"PostgresDb(postgresql+psycopg://ai:***@127.0.0.1:{port}/ai): cannot connect: ")
    assert "s3cret" not in message and "refused" in message
    with pytest.raises(StoreConnectionError):  # still not usable, still said so
        db.get_sessions()


def test_a_wrong_password_or_an_unknown_database_is_a_store_error(pg_url):
    wrong = PostgresDb(db_url=pg_url.replace(":app@", ":wrong@", 1))
    unknown = PostgresDb(db_url=pg_url.rsplit("/", 1)[0] + "/no_such_database")

    with pytest.raises(StoreError, match=r"^PostgresDb\(postgres://app:\*\*\*@.*cannot connect: .*password authentication failed"):
        wrong.get_sessions()
    with pytest.raises(StoreConnectionError, match="no_such_database"):
        unknown.get_sessions()


def test_a_db_file_where_no_file_can_be_written_is_a_store_error(in_tmp):
    (in_tmp / "a_file").write_text("not a folder")
    cases = [SqliteDb(db_file="a_file/agents.db"), SqliteDb(db_file="/proc/sessions_core/agents.db"),
             SqliteDb(db_file="/proc/agents.db")]

    for db in cases:
        with pytest.raises(StoreConnectionError, match=rf"^{re.escape(repr(db))}: cannot open: "):
            db.get_sessions()


def test_arguments_that_cannot_name_a_store_fail_when_it_is_made():
    for url in ["http://example.com/db", "not a url", "", "sqlite:///tmp/x.db", "postgresql://"]:
        with pytest.raises(StoreConfigError, match="is not a PostgreSQL URL"):
            PostgresDb(db_url=url)
    for name in ["bad-name", "1st", "x" * 64, "a;DROP", ""]:
        with pytest.raises(ValueError, match="is not a safe name"):
            PostgresDb(db_url="postgresql://ai:ai@localhost:5532/ai", session_table=name)
        with pytest.raises(ValueError, match="is not a safe name"):
            SqliteDb(db_file="tmp/agents.db", session_table=name)
    with pytest.raises(StoreConfigError):
        SqliteDb(db_file="")
    with pytest.raises(StoreConfigError, match="prepare_threshold in db_url must be a whole number"):
        PostgresDb(db_url="postgresql://ai:ai@localhost:5532/ai?prepare_threshold=soon")


def test_a_prepare_threshold_in_the_url_reaches_psycopg_as_a_number(pg_url, llm_server, openai_model):
    # As text in the URL it would reach psycopg as text, and the first statement would fail with a TypeError.
    db, never = (PostgresDb(db_url=f"{pg_url}?prepare_threshold={value}", session_table=f"prepared_{value}")
                 for value in ("0", "none"))
    for store in (db, never):
        llm_server.add(Text("Prepared."))
        assert Agent(model=openai_model, db=store).run("hi", session_id="p", user_id="ann").content == "Prepared."
    assert [connections[store.alias].get_connection_params()["prepare_threshold"] for store in (db, never)] == [0, None]


def test_a_failed_sqlite_migration_leaves_nothing_half_made(in_tmp):
    import sqlite3

    (in_tmp / "tmp").mkdir()
    with sqlite3.connect(in_tmp / "tmp" / "taken.db") as conn:  # a table in the way of a later migration
        conn.execute("CREATE TABLE sessions_core_run (id integer)")
    db = SqliteDb(db_file="tmp/taken.db")

    with pytest.raises(StoreMigrationError, match=r"^SqliteDb\(tmp/taken.db\): cannot create its tables"):
        db.get_sessions()

    with sqlite3.connect(in_tmp / "tmp" / "taken.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"sessions_core_run"}


def test_a_failed_postgres_migration_leaves_no_schema(pg_url):
    with psycopg.connect(pg_url.replace("postgres://", "postgresql://", 1)) as conn:
        conn.execute("CREATE SCHEMA taken")
        conn.execute("CREATE TABLE taken.sessions_core_run (id integer)")
    db, fresh = PostgresDb(db_url=pg_url, session_table="taken"), PostgresDb(db_url=pg_url, session_table="fresh")

    with pytest.raises(StoreMigrationError, match="cannot create its tables"):
        db.get_sessions()

    assert tables_in(pg_url, "taken") == {"sessions_core_run"}
    fresh.get_sessions()  # the failure took no lock or schema with it
    assert "sessions_core_chatsession" in tables_in(pg_url, "fresh")


def test_an_agent_a_team_and_a_workflow_given_one_store_share_its_sessions(in_tmp, llm_server, openai_model):
    from sessions_core import Team, Workflow

    llm_server.responder = lambda body: Text("hello")
    db = SqliteDb(db_file="tmp/shared.db")

    def bump(step_input, run_context):
        run_context.session_state["steps"] = run_context.session_state.get("steps", 0) + 1

    workflow = Workflow(name="W", steps=[bump], db=db)
    workflow.run("one", session_id="w", user_id="ann")
    team = Team(name="T", model=openai_model, members=[Agent(name="M", model=openai_model)], db=db)
    team.run("two", session_id="t", user_id="ann")
    agent = Agent(model=openai_model, db=SqliteDb(db_file="tmp/shared.db"))
    assert agent.get_session_state(session_id="w", user_id="ann") == {"steps": 1}  # the workflow's, read by the agent
    assert [(s.session_id, s.kind) for s in db.get_sessions(user_id="ann")] == [("t", "team"), ("w", "workflow")]
    assert sorted(Run.objects.using(db.alias).values_list("kind", flat=True)) == ["function", "team", "workflow"]
