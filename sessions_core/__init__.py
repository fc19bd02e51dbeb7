"""sessions_core: a session engine with Agno's names, on the Django ORM.

    from sessions_core import Agent
    from sessions_core.llm import OpenAIChat, OfflineModel

Inside a Django project, add "sessions_core" to INSTALLED_APPS. In a standalone script nothing is
needed: the first use of a public name sets Django up with this project's settings
(DJANGO_SETTINGS_MODULE, default "chatapp.settings") and applies pending migrations.
"""

import importlib

_EXPORTS = {
    "Agent": "agent",
    "AgentSession": "agent",
    "InMemoryDb": "memory",
    "SqliteDb": "stores",
    "AsyncSqliteDb": "stores",
    "PostgresDb": "stores",
    "AsyncPostgresDb": "stores",
    "StoreError": "stores",
    "RunOutput": "runtime",
    "RunContext": "tools",
    "Function": "tools",
    "Toolkit": "tools",
    "tool": "tools",
    "ToolError": "tools",
    "ChatMessage": "history",
    "RunStatus": "models",
    "SessionSummaryManager": "summary",
    "SessionSummary": "summary",
    "SessionOwnershipError": "errors",
    "SessionNotFoundError": "errors",
    "SessionIdNotSetError": "errors",
    "StateNotJSONError": "state",
    "RunEvent": "events",
    "ToolExecution": "events",
    "RunStartedEvent": "events",
    "RunContentEvent": "events",
    "ToolCallStartedEvent": "events",
    "ToolCallCompletedEvent": "events",
    "StateChangedEvent": "events",
    "RunCompletedEvent": "events",
    "RunErrorEvent": "events",
    "RunCancelledEvent": "events",
    "SessionSummaryStartedEvent": "events",
    "SessionSummaryCompletedEvent": "events",
}

__all__ = [*_EXPORTS, "setup"]


def setup(settings_module: str = "chatapp.settings", migrate: bool = True) -> None:
    """Make the engine usable from a plain script: configure Django and migrate the database."""
    import os

    import django
    from django.apps import apps

    if not apps.ready:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
        django.setup()
    if migrate:
        from django.core.management import call_command
        from django.db import connections
        from django.db.migrations.executor import MigrationExecutor

        connection = connections["default"]
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", verbosity=0, interactive=False)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sessions_core' has no attribute {name!r}")
    from django.apps import apps

    if not apps.ready:
        setup()
    return getattr(importlib.import_module(f"sessions_core.{module}"), name)


def _setup_standalone_script() -> None:
    """A plain script that imports sessions_core (or one of its modules) first gets Django set up here."""
    import os

    from django.conf import settings

    if not os.environ.get("DJANGO_SETTINGS_MODULE") and not settings.configured:
        setup()


_setup_standalone_script()
