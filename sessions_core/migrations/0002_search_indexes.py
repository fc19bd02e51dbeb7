"""Search indexes for sessions_core.search, one design per database, none of them in the model state.

PostgreSQL
  * Message.search_vector: a STORED generated tsvector column (user and assistant messages only; NULL
    for system and tool rows, so repeated system prompts are never indexed) with a GIN index. Stored
    rather than an expression index because the planner's two good plans both re-read the vector:
    phrase queries (`"a b"`) are rechecked against positions the GIN index does not keep, and a common
    word is answered by walking the newest messages and testing each one. With a stored column both are
    a cheap read; with an expression index each would re-run to_tsvector over the text.
  * ChatSession.name: a GIN trigram index (pg_trgm) for substring and typo-tolerant title matches.
SQLite
  * FTS5 external-content tables (no second copy of the text): one over Message.content (porter
    stemming, user and assistant rows only), one over ChatSession.name with the trigram tokenizer
    (typo candidates). Triggers on insert, update and delete keep them in step, so there is no sync job.
  * Without FTS5 nothing is created and search falls back to LIKE scans (sessions_core.search).

The column and indexes are managed here rather than in models.py because their definitions differ per
database; the ORM never reads or writes the generated column.
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

# Keep in step with sessions_core.search (the query side must use the very same expression).
TS_CONFIG = "english"
INDEXED_CHARS = 100_000
MARKUP_CHARS, MARKUP_STANDINS = "<>&", "\ue002\ue003\ue004"
SEARCHED_ROLES = "('user', 'assistant')"

PG_FORWARD = [
    f"""ALTER TABLE sessions_core_message ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
        CASE WHEN role IN {SEARCHED_ROLES}
        THEN to_tsvector('{TS_CONFIG}'::regconfig,
                         translate(left(content, {INDEXED_CHARS}), '{MARKUP_CHARS}', '{MARKUP_STANDINS}'))
        END) STORED""",
    "CREATE INDEX message_search_vector_idx ON sessions_core_message USING gin (search_vector)",
    "CREATE INDEX session_name_trgm_idx ON sessions_core_chatsession USING gin (name gin_trgm_ops)",
    "ANALYZE sessions_core_message",
]
PG_BACKWARD = [
    "DROP INDEX IF EXISTS session_name_trgm_idx",
    "DROP INDEX IF EXISTS message_search_vector_idx",
    "ALTER TABLE sessions_core_message DROP COLUMN IF EXISTS search_vector",
]

SQLITE_MESSAGE_FTS = [
    """CREATE VIRTUAL TABLE sessions_core_message_fts USING fts5(
        content, content='sessions_core_message', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER sessions_core_message_fts_ai AFTER INSERT ON sessions_core_message
        WHEN new.role IN {SEARCHED_ROLES} BEGIN
        INSERT INTO sessions_core_message_fts(rowid, content) VALUES (new.id, new.content);
        END""",
    # An external-content FTS5 table forgets a row only when told the exact text it indexed.
    f"""CREATE TRIGGER sessions_core_message_fts_ad AFTER DELETE ON sessions_core_message
        WHEN old.role IN {SEARCHED_ROLES} BEGIN
        INSERT INTO sessions_core_message_fts(sessions_core_message_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
        END""",
    f"""CREATE TRIGGER sessions_core_message_fts_au AFTER UPDATE OF content, role ON sessions_core_message BEGIN
        INSERT INTO sessions_core_message_fts(sessions_core_message_fts, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.role IN {SEARCHED_ROLES};
        INSERT INTO sessions_core_message_fts(rowid, content)
        SELECT new.id, new.content WHERE new.role IN {SEARCHED_ROLES};
        END""",
    f"""INSERT INTO sessions_core_message_fts(rowid, content)
        SELECT id, content FROM sessions_core_message WHERE role IN {SEARCHED_ROLES}""",
]
SQLITE_NAME_TRIGRAMS = [
    """CREATE VIRTUAL TABLE sessions_core_chatsession_trgm USING fts5(
        name, content='sessions_core_chatsession', content_rowid='id', tokenize='trigram')""",
    """CREATE TRIGGER sessions_core_chatsession_trgm_ai AFTER INSERT ON sessions_core_chatsession BEGIN
        INSERT INTO sessions_core_chatsession_trgm(rowid, name) VALUES (new.id, new.name);
        END""",
    """CREATE TRIGGER sessions_core_chatsession_trgm_ad AFTER DELETE ON sessions_core_chatsession BEGIN
        INSERT INTO sessions_core_chatsession_trgm(sessions_core_chatsession_trgm, rowid, name)
        VALUES ('delete', old.id, old.name);
        END""",
    """CREATE TRIGGER sessions_core_chatsession_trgm_au AFTER UPDATE OF name ON sessions_core_chatsession
        WHEN old.name IS NOT new.name BEGIN
        INSERT INTO sessions_core_chatsession_trgm(sessions_core_chatsession_trgm, rowid, name)
        VALUES ('delete', old.id, old.name);
        INSERT INTO sessions_core_chatsession_trgm(rowid, name) VALUES (new.id, new.name);
        END""",
    "INSERT INTO sessions_core_chatsession_trgm(sessions_core_chatsession_trgm) VALUES ('rebuild')",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS sessions_core_chatsession_trgm_au",
    "DROP TRIGGER IF EXISTS sessions_core_chatsession_trgm_ad",
    "DROP TRIGGER IF EXISTS sessions_core_chatsession_trgm_ai",
    "DROP TABLE IF EXISTS sessions_core_chatsession_trgm",
    "DROP TRIGGER IF EXISTS sessions_core_message_fts_au",
    "DROP TRIGGER IF EXISTS sessions_core_message_fts_ad",
    "DROP TRIGGER IF EXISTS sessions_core_message_fts_ai",
    "DROP TABLE IF EXISTS sessions_core_message_fts",
]


def sqlite_supports(connection, tokenize: str) -> bool:
    """Whether this SQLite build has FTS5 with the given tokenizer (trigram needs SQLite 3.34+)."""
    with connection.cursor() as cursor:
        try:
            cursor.execute(f"CREATE VIRTUAL TABLE temp.sessions_core_fts5_probe USING fts5(x, tokenize='{tokenize}')")
        except Exception:
            return False
        cursor.execute("DROP TABLE temp.sessions_core_fts5_probe")
        return True


def _statements(connection, forward: bool) -> list[str]:
    if connection.vendor == "postgresql":
        return PG_FORWARD if forward else PG_BACKWARD
    if connection.vendor != "sqlite":
        return []  # other databases: search uses LIKE scans
    if not forward:
        return SQLITE_BACKWARD
    # Each table is optional: search checks which ones exist and falls back to LIKE scans without them.
    statements = []
    if sqlite_supports(connection, "porter unicode61"):
        statements += SQLITE_MESSAGE_FTS
    if sqlite_supports(connection, "trigram"):
        statements += SQLITE_NAME_TRIGRAMS
    return statements


def create_search_indexes(apps, schema_editor):
    for statement in _statements(schema_editor.connection, forward=True):
        schema_editor.execute(statement, params=None)


def drop_search_indexes(apps, schema_editor):
    for statement in _statements(schema_editor.connection, forward=False):
        schema_editor.execute(statement, params=None)


class TrigramExtensionOnPostgres(TrigramExtension):
    """Django's CreateExtension skips other databases going forward, but not backward (it queries
    pg_extension on SQLite too); this one is a no-op on other databases both ways."""

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [("sessions_core", "0001_initial")]

    operations = [
        TrigramExtensionOnPostgres(),  # CREATE EXTENSION pg_trgm
        migrations.RunPython(create_search_indexes, drop_search_indexes),
    ]
