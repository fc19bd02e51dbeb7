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
