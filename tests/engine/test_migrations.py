from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_are_in_step():
    """makemigrations --check fails when a model change has no migration."""
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_hot_tables_carry_no_redundant_indexes_and_keep_their_search_triggers():
    """0004 dropped the foreign-key indexes that composite indexes already start with, without
    rebuilding the message table (which on SQLite would have dropped the FTS5 triggers); 0005 dropped
    the insert trigger (search indexes new messages)."""
    from django.db import connection

    from sessions_core.models import Message, Run, StateChange

    with connection.cursor() as cursor:
        indexed = {
            model: {
                tuple(info["columns"]) for info in
                connection.introspection.get_constraints(cursor, model._meta.db_table).values()
                if info["index"] or info["unique"]
            }
            for model in (Message, Run, StateChange)
        }
    assert ("session_id",) not in indexed[Message] and ("run_id",) not in indexed[Message]
    assert {("session_id", "seq"), ("run_id", "seq")} <= indexed[Message]
    assert ("session_id",) not in indexed[Run] and ("session_id", "status", "id") in indexed[Run]
    assert ("session_id",) not in indexed[StateChange] and ("session_id", "version") in indexed[StateChange]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
                           [Message._meta.db_table])
            triggers = {row[0] for row in cursor.fetchall()}
        # Update and delete keep indexed rows in step; no insert trigger writes the index during a run.
        assert triggers == {"sessions_core_message_fts_ad", "sessions_core_message_fts_au"}


@pytest.mark.django_db(transaction=True)
def test_messages_waiting_in_the_old_web_queue_become_queued_runs_in_order():
    """chatapp 0002: each stored message of the web's own queue becomes a queued run of its session that no
    process waits for (the next process to serve the session runs it), and back again."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("chatapp", "0001_queued_message")], [("chatapp", "0002_queued_messages_are_queued_runs")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    user = old.get_model("auth", "User").objects.create(username="ann")
    session = old.get_model("sessions_core", "ChatSession").objects.create(
        session_id="waiting", owner=user, kind="agent", component_id="general")
    for text in ("first", "second"):
        old.get_model("chatapp", "QueuedMessage").objects.create(session=session, user=user, text=text)

    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    runs = new.get_model("sessions_core", "Run").objects.order_by("pk")
    assert [(run.input, run.status, run.claimed_until, run.component_id) for run in runs] == [
        ("first", "queued", None, "general"), ("second", "queued", None, "general")]

    executor = MigrationExecutor(connection)
    executor.migrate(before)
    back = executor.loader.project_state(before).apps
    assert list(back.get_model("chatapp", "QueuedMessage").objects.order_by("pk").values_list("text", flat=True)) == [
        "first", "second"]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
