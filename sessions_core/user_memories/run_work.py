"""The memory work of a run: after its reply is complete (`update_memory_on_run`), and the agentic tool
`update_user_memory(task)` during it (`enable_agentic_memory`).

After the reply: the manager reads the run's own user message and the user's current memories (never the
session's history), so the work is bounded by the user's memories, not by their sessions. It runs after
the run's outcome is stored (the reply is never held up) and before `run()` returns. A failure is logged,
kept on the run (its metrics' `memory_error`) and reported by `MemoryUpdateCompleted`; the reply stands.
"""

from __future__ import annotations

import logging

from ..bridge import call_sync
from ..models import Run
from ..owners import memory_owner
from ..tools import Function, RunContext
from . import store
from .manager import MemoryManager, MemoryWork, _Scope

logger = logging.getLogger("sessions_core")


async def aupdate_after_run(run) -> tuple[MemoryWork, str]:
    """The manager's task on a finished root run's input: (what it did, the error text or "")."""
    config = run.config
    manager = config.memory_manager or MemoryManager()
    team = config.kind == "team"
    scope = _Scope(run.start.memory_owner, run.alias, store.Source.RUN, run_pk=run.run_pk, input=run.input,
                   agent_id="" if team else config.component_id, team_id=config.component_id if team else "")
    try:
        work = await manager.arun_task(manager.model or config.model, run.input, scope, agentic=False)
    except Exception as exc:  # noqa: BLE001 - a memory failure never fails the run
        logger.exception("Memory update failed for run %s; the reply is kept", run.run_id)
        error = f"The memories could not be updated ({type(exc).__name__}: {exc})."[:1000]
        run.output.metrics = {**run.output.metrics, "memory_error": error}
        await call_sync(_store_error, run.run_pk, run.alias, error)
        return MemoryWork(), error
    return work, ""


def _store_error(run_pk: int, alias: str, error: str) -> None:
    run = Run.objects.using(alias).only("metrics").get(pk=run_pk)
    Run.objects.using(alias).filter(pk=run_pk).update(metrics={**(run.metrics or {}), "memory_error": error})


def _scope_of(run_context: RunContext, alias: str, team: bool, component_id: str) -> _Scope | None:
    """Blocking: the tool's scope, None when the run has no user or the user turned memories off."""
    owner = memory_owner(run_context.user_id, alias)
    if owner is None or not store.memories_enabled(owner, alias):
        return None
    run_pk = Run.objects.using(alias).filter(run_id=run_context.run_id).values_list("pk", flat=True).first()
    return _Scope(owner, alias, store.Source.AGENTIC, run_pk=run_pk, team_id=component_id if team else "")


async def update_user_memory(task: str, run_context: RunContext, agent) -> str:
    """Add, update or delete memories about the user: describe in `task` what to remember or forget.

    Args:
        task: What to do with the user's memories, e.g. "The user is vegetarian" or "Forget where the user lives".
    """
    manager = agent.memory_manager or MemoryManager()
    scope = await call_sync(_scope_of, run_context, agent.db_alias, agent.kind == "team", agent.id)
    if scope is None:
        return "Memories are off for this conversation: nothing was remembered."
    scope.input = task
    work = await manager.arun_task(manager.model or agent.resolved_model(), task, scope, agentic=True)
    return work.reply or f"{len(work.changes)} memory change(s) made."


update_user_memory_tool = Function.from_callable(update_user_memory)
