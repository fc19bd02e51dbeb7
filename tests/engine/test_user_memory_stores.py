"""User memories through the stores (SqliteDb, PostgresDb, InMemoryDb and the async twins), across OS
processes, and two concurrent runs of one user."""

import asyncio
import threading

import pytest
from django.db import connection

from sessions_core import Agent, AsyncSqliteDb, InMemoryDb, PostgresDb, SqliteDb, UserMemory, UserMemoryNotFoundError
from tests.support.engine_helpers import Gate
from tests.support.llm_server import Text
from tests.support.memory_support import HeldToolCalls, is_memory_request, memory_requests, memory_responder
from tests.support.store_support import db_access, pg_url  # noqa: F401  (fixtures)
from tests.engine.test_stores import in_tmp, script  # noqa: F401  (fixture)


def learn(said, _system):
    return [("add_memory", {"memory": f"The user said: {said}", "topics": ["said"]})]


def isolation_matrix(db) -> None:
    """Every store accessor: another user's memory id is not found, clearing clears one user's."""
    anas = db.add_user_memory(UserMemory(memory="Ana likes tea", topics=["drinks"], user_id="ana"))
    bobs = db.add_user_memory(UserMemory(memory="Bob likes jazz"), user_id="bob")
    assert anas.user_id == "ana" and [m.memory for m in db.get_user_memories(user_id="ana")] == ["Ana likes tea"]
    assert db.get_user_memory(bobs.memory_id, user_id="ana") is None
    with pytest.raises(UserMemoryNotFoundError):
        db.update_user_memory(bobs.memory_id, "Taken over", user_id="ana")
    assert db.delete_user_memory(bobs.memory_id, user_id="ana") is False
    assert db.get_user_memory_history(bobs.memory_id, user_id="ana") == []
    assert db.update_user_memory(anas.memory_id, "Ana likes green tea", user_id="ana").memory == "Ana likes green tea"
    assert db.clear_user_memories(user_id="ana") == 1
    assert db.get_user_memories(user_id="ana") == []
    assert [(m.memory, m.user_id) for m in db.get_user_memories(user_id="bob")] == [("Bob likes jazz", "bob")]
    assert [c.action for c in db.get_user_memory_history(anas.memory_id, user_id="ana")] == [
        "added", "updated", "deleted"]


@pytest.mark.usefixtures("db_access")
def test_memories_made_through_sqlite_db_are_read_by_another_process(in_tmp, llm_server, openai_model):
    db = SqliteDb(db_file="tmp/memories.db")
    llm_server.side_responder = memory_responder(learn)
    llm_server.add(Text("Noted."))
    out = Agent(model=openai_model, db=db, update_memory_on_run=True).run("I am vegetarian", session_id="s",
                                                                          user_id="ana")
    done = script(in_tmp, """
        from sessions_core import SqliteDb

        db = SqliteDb(db_file="tmp/memories.db")
        for memory in db.get_user_memories(user_id="ana"):
            print(memory.memory, memory.topics, memory.run_id, memory.session_id)
        print(len(db.get_user_memories(user_id="bob")))
    """)
    assert done.stdout.splitlines() == [f"The user said: I am vegetarian ['said'] {out.run_id} s", "0"]


@pytest.mark.usefixtures("db_access")
def test_sqlite_db_accessors_keep_each_users_memories_apart(in_tmp):
    isolation_matrix(SqliteDb(db_file="tmp/isolation.db"))


@pytest.mark.usefixtures("db_access")
def test_postgres_db_accessors_keep_each_users_memories_apart(pg_url):
    isolation_matrix(PostgresDb(db_url=pg_url, session_table="memories"))


@pytest.mark.usefixtures("db_access")
def test_in_memory_db_accessors_keep_each_users_memories_apart():
    isolation_matrix(InMemoryDb())


@pytest.mark.usefixtures("db_access")
def test_async_sqlite_db_memory_accessors_are_coroutines(in_tmp):
    async def main():
        db = AsyncSqliteDb(db_file="tmp/async.db")
        memory = await db.add_user_memory(UserMemory(memory="Ana likes tea"), user_id="ana")
        listed = await db.get_user_memories(user_id="ana")
        return memory, listed, await db.delete_user_memory(memory.memory_id, user_id="bob")

    memory, listed, deleted = asyncio.run(main())
    assert [m.memory_id for m in listed] == [memory.memory_id] and deleted is False


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_runs_of_one_user_both_keep_their_memories(openai_model, llm_server):
    """Both manager calls read the memories before either adds (held until both have asked): both adds stay."""
    agent = Agent(model=openai_model, update_memory_on_run=True)
    agent.add_user_memory("The user lives in Lyon", user_id="ana")
    with Gate() as both_asked:
        def manager(body):
            if not is_memory_request(body):
                return None
            if body["messages"][-1]["role"] == "tool":
                return Text("Done.")
            return HeldToolCalls(learn(body["messages"][-1]["content"], ""), event=both_asked)

        llm_server.side_responder = manager
        outputs, errors = {}, []

        def run(text):
            try:
                outputs[text] = agent.run(text, session_id=f"s-{text}", user_id="ana")
            except Exception as exc:  # surfaced below
                errors.append(exc)
            finally:
                connection.close()

        llm_server.responder = lambda body: Text("ok")
        threads = [threading.Thread(target=run, args=(text,)) for text in ("I am vegetarian", "I like jazz")]
        for thread in threads:
            thread.start()
        assert llm_server.wait_for_requests(4)  # two replies, then both manager calls
        assert len(memory_requests(llm_server)) == 2
        both_asked.set()
        for thread in threads:
            thread.join()
    assert errors == [] and {o.status for o in outputs.values()} == {"completed"}
    assert sorted(m.memory for m in agent.get_user_memories(user_id="ana")) == [
        "The user lives in Lyon", "The user said: I am vegetarian", "The user said: I like jazz"]
