from django.apps import AppConfig
from django.db.backends.signals import connection_created


class ChatappConfig(AppConfig):
    name = "chatapp"
    verbose_name = "Chat"

    def ready(self):
        from . import sqlite_checkpoint

        # SQLite's WAL checkpoints run in a thread of their own instead of inside a run's commit.
        connection_created.connect(sqlite_checkpoint.on_connection_created,
                                   dispatch_uid="chatapp.sqlite_checkpoint")
