"""sessions_core: a session engine with Agno's names, on the Django ORM.

    from sessions_core import Agent
    from sessions_core.llm import OpenAIChat, OfflineModel

Inside a Django project, add "sessions_core" to INSTALLED_APPS. In a standalone script nothing else
is needed: importing this package does no work, and the first use of a public name (`Agent`, ...)
sets Django up and applies pending migrations (`setup()`). The settings are found as Django's own
tools find them: DJANGO_SETTINGS_MODULE, else the project whose manage.py is in the current folder
or the script's folder or one of their parents (the way pytest-django finds a project).
"""

import importlib

_EXPORTS = {
    "Agent": "agent",
    "Team": "team",
    "Workflow": "workflow",
    "Step": "steps",
    "Steps": "steps",
    "Condition": "steps",
    "Router": "steps",
    "Parallel": "steps",
    "Loop": "steps",
    "StepInput": "steps",
    "StepOutput": "steps",
    "StepFailed": "steps",
    "TeamRunOutput": "outputs",
    "WorkflowRunOutput": "outputs",
    "AgentSession": "accessors",
    "InMemoryDb": "memory",
    "RunOutput": "outputs",
    "RunConfig": "config",
    "SqliteDb": "stores",
    "AsyncSqliteDb": "stores",
    "PostgresDb": "stores",
    "AsyncPostgresDb": "stores",
    "StoreError": "stores",
    "RunContext": "tools",
    "Function": "tools",
    "Toolkit": "tools",
    "tool": "tools",
    "ToolError": "tools",
    "RunRequirement": "requirements",
    "UserInputField": "requirements",
    "HumanReview": "review",
    "StepRequirement": "review",
    "ChatMessage": "history",
    "RunStatus": "models",
    "SessionSummaryManager": "summary",
    "SessionSummary": "summary",
    "MemoryManager": "user_memories.manager",
    "UserMemory": "user_memories.record",
    "UserMemoryNotFoundError": "errors",
    "SessionOwnershipError": "errors",
    "SessionNotFoundError": "errors",
    "SessionIdNotSetError": "errors",
    "QueuedRunTakenError": "errors",
    "RunNotContinuableError": "errors",
    "UnresolvedRequirementsError": "errors",
    "RunNotFoundError": "branches",
    "SessionBusyError": "branches",
    "StateNotJSONError": "state",
    "RunEvent": "events",
    "ToolExecution": "requirements",
    "RunStartedEvent": "events",
    "RunContentEvent": "events",
    "ToolCallStartedEvent": "events",
    "ToolCallCompletedEvent": "events",
    "StateChangedEvent": "events",
    "RunCompletedEvent": "events",
    "RunErrorEvent": "events",
    "RunCancelledEvent": "events",
    "RunQueuedEvent": "events",
    "RunPausedEvent": "events",
    "RunContinuedEvent": "events",
    "SessionSummaryStartedEvent": "events",
    "SessionSummaryCompletedEvent": "events",
    "MemoryUpdateStartedEvent": "events",
    "MemoryUpdateCompletedEvent": "events",
    "TeamRunStartedEvent": "events",
    "TeamRunContentEvent": "events",
    "TeamToolCallStartedEvent": "events",
    "TeamToolCallCompletedEvent": "events",
    "TeamRunCompletedEvent": "events",
    "TeamRunErrorEvent": "events",
    "TeamRunCancelledEvent": "events",
    "TeamRunPausedEvent": "events",
    "TeamRunContinuedEvent": "events",
    "WorkflowStartedEvent": "events",
    "WorkflowCompletedEvent": "events",
    "WorkflowErrorEvent": "events",
    "WorkflowCancelledEvent": "events",
    "StepStartedEvent": "events",
    "StepCompletedEvent": "events",
    "StepErrorEvent": "events",
    "StepPausedEvent": "events",
    "StepContinuedEvent": "events",
    "StepsExecutionStartedEvent": "events",
    "StepsExecutionCompletedEvent": "events",
    "ConditionExecutionStartedEvent": "events",
    "ConditionExecutionCompletedEvent": "events",
    "RouterExecutionStartedEvent": "events",
    "RouterExecutionCompletedEvent": "events",
    "ParallelExecutionStartedEvent": "events",
    "ParallelExecutionCompletedEvent": "events",
    "LoopExecutionStartedEvent": "events",
    "LoopExecutionCompletedEvent": "events",
    "LoopIterationStartedEvent": "events",
    "LoopIterationCompletedEvent": "events",
}

__all__ = [*_EXPORTS, "setup"]


def setup(settings_module: str | None = None, migrate: bool = True) -> None:
    """Make the engine usable from a plain script: configure Django and migrate the database.

    `settings_module` wins over DJANGO_SETTINGS_MODULE; with neither, the nearest manage.py names it."""
    import os

    import django
    from django.apps import apps
    from django.conf import settings

    if not apps.ready:
        if settings_module:
            os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
        elif not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
            from ._project import find_settings_module

            os.environ["DJANGO_SETTINGS_MODULE"] = find_settings_module()
        django.setup()
    if migrate:
        from django.core.management import call_command
        from django.db import connections
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connections["default"])
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
