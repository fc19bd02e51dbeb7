"""Drop the indexes Django gave four foreign keys of their own: each is the leading column of a
composite index already (message (session, seq) and (run, seq), run_history_idx (session, status,
-id), statechange (session, version)), so they only made every insert of a run, message and state
change update one index more.

Written by hand: Django's AlterField would rebuild the message table on SQLite, dropping the FTS5
triggers of 0002, and is a no-op on PostgreSQL. The index names are the ones 0001 created.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = [
    ("sessions_core_message_session_id_f8218738", "sessions_core_message", "session_id"),
    ("sessions_core_message_run_id_8257a00e", "sessions_core_message", "run_id"),
    ("sessions_core_run_session_id_94609fa1", "sessions_core_run", "session_id"),
    ("sessions_core_statechange_session_id_9d5b5bca", "sessions_core_statechange", "session_id"),
]


class Migration(migrations.Migration):

    dependencies = [
        ("sessions_core", "0003_sidebar_partial_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"', reverse_sql=f'CREATE INDEX "{name}" ON "{table}" ("{column}")'
                )
                for name, table, column in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="message",
                    name="run",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="messages", to="sessions_core.run"),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="session",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="messages", to="sessions_core.chatsession"),
                ),
                migrations.AlterField(
                    model_name="run",
                    name="session",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="runs", to="sessions_core.chatsession"),
                ),
                migrations.AlterField(
                    model_name="statechange",
                    name="session",
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name="state_changes", to="sessions_core.chatsession"),
                ),
            ],
        ),
    ]
