from django.apps import AppConfig


class SessionsCoreConfig(AppConfig):
    name = "sessions_core"
    verbose_name = "Sessions"
