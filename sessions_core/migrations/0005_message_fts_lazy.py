"""SQLite: messages are indexed for search when someone searches, not as they are stored.

This drops 0002's insert trigger, which wrote to the FTS5 table inside every run's transaction.
sessions_core.search indexes the messages stored since the last search before it reads the index,
and a one-row table holds how far that got: every message with an id up to `indexed_upto` is indexed
(if it is a user or assistant message), none above it is.
Message ids are AUTOINCREMENT and SQLite has one writer at a time, so committed ids only grow and the
mark is exact.

The delete and update triggers stay, for indexed rows only: an external-content FTS5 table must be
told to forget a row with exactly the text it indexed, and told nothing about a row it never indexed.
A row above the mark is indexed later, with the text it has then. When the last message is deleted
the mark goes back to 0, because `manage.py flush` also resets the id sequence and the ids start
again from 1.

PostgreSQL (a generated column), other databases and SQLite without FTS5 have nothing to change.
"""

import importlib

from django.db import migrations

MESSAGE_FTS = "sessions_core_message_fts"
MARK = "sessions_core_message_fts_mark"  # keep in step with sessions_core.search.MESSAGE_FTS_MARK
SEARCHED_ROLES = "('user', 'assistant')"
INDEXED = f"(SELECT indexed_upto FROM {MARK})"

FORWARD = [
    f"CREATE TABLE {MARK} (id INTEGER PRIMARY KEY CHECK (id = 1), indexed_upto INTEGER NOT NULL)",
    # The insert trigger indexed everything that exists.
    f"INSERT INTO {MARK} (id, indexed_upto) SELECT 1, COALESCE(MAX(id), 0) FROM sessions_core_message",
    "DROP TRIGGER sessions_core_message_fts_ai",
    "DROP TRIGGER sessions_core_message_fts_ad",
    "DROP TRIGGER sessions_core_message_fts_au",
    f"""CREATE TRIGGER sessions_core_message_fts_ad AFTER DELETE ON sessions_core_message BEGIN
        INSERT INTO {MESSAGE_FTS}({MESSAGE_FTS}, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.role IN {SEARCHED_ROLES} AND old.id <= {INDEXED};
        UPDATE {MARK} SET indexed_upto = 0 WHERE NOT EXISTS (SELECT 1 FROM sessions_core_message);
        END""",
    f"""CREATE TRIGGER sessions_core_message_fts_au AFTER UPDATE OF content, role ON sessions_core_message BEGIN
        INSERT INTO {MESSAGE_FTS}({MESSAGE_FTS}, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.role IN {SEARCHED_ROLES} AND old.id <= {INDEXED};
        INSERT INTO {MESSAGE_FTS}(rowid, content)
        SELECT new.id, new.content WHERE new.role IN {SEARCHED_ROLES} AND new.id <= {INDEXED};
        END""",
]


def _backward() -> list[str]:
    # The triggers exactly as 0002 made them (an applied migration's text does not change).
    search_indexes = importlib.import_module("sessions_core.migrations.0002_search_indexes")
    triggers = [sql for sql in search_indexes.SQLITE_MESSAGE_FTS if sql.startswith("CREATE TRIGGER")]
    return [
        "DROP TRIGGER sessions_core_message_fts_ad",
        "DROP TRIGGER sessions_core_message_fts_au",
        f"""INSERT INTO {MESSAGE_FTS}(rowid, content) SELECT id, content FROM sessions_core_message
            WHERE id > {INDEXED} AND role IN {SEARCHED_ROLES} ORDER BY id""",
        *triggers,
        f"DROP TABLE {MARK}",
    ]


def _has_table(connection, name: str) -> bool:
    return connection.vendor == "sqlite" and name in connection.introspection.table_names()


def index_lazily(apps, schema_editor):
    if _has_table(schema_editor.connection, MESSAGE_FTS):
        for statement in FORWARD:
            schema_editor.execute(statement, params=None)


def index_on_insert(apps, schema_editor):
    if _has_table(schema_editor.connection, MARK):
        for statement in _backward():
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("sessions_core", "0004_drop_redundant_fk_indexes")]

    operations = [migrations.RunPython(index_lazily, index_on_insert)]
