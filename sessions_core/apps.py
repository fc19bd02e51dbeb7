from django.apps import AppConfig


class SessionsCoreConfig(AppConfig):
    name = "sessions_core"
    verbose_name = "Sessions"

    def ready(self):
        from . import sqlite_steps

        sqlite_steps.connect_signals()
