"""A session's run lease as the web reads it: whether a run holds the session (in this process or another),
and the runs a process that stopped left marked running (their lease expired before their outcome was
stored), which are settled as the session's next run would settle them."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.utils import timezone

from sessions_core.models import ChatSession, Run, RunStatus
from sessions_core.run import lifecycle

from .. import rendering
from .fragments import INTERRUPTED_NOTE


async def lease_left(session_pk: int, owner_pk: int | None) -> float | None:
    """Seconds until the session's run lease expires; None when no run holds it."""
    now = timezone.now()
    expires = await (ChatSession.objects.for_user(owner_pk).filter(pk=session_pk).leased(now)
                     .values_list("lease_expires_at", flat=True).afirst())
    return None if expires is None else (expires - now).total_seconds()


async def running_elsewhere(session: ChatSession) -> bool:
    """A run holds the session's lease (in another process, or just starting here)."""
    return await lease_left(session.pk, session.owner_id) is not None


def may_have_abandoned(session: ChatSession) -> bool:
    """Whether the row says a run may have been left running by a process that stopped: its lease is
    still taken but expired (a run that ends, however it ends, clears the lease with its outcome)."""
    return bool(session.lease_token) and not session.is_running


def _settle_abandoned(session_pk: int) -> str:
    runs = Run.objects.filter(session_id=session_pk)
    abandoned = lifecycle.settle_abandoned(runs)
    if not abandoned:
        return ""
    settled = runs.filter(pk__in=abandoned).exclude(status=RunStatus.RUNNING).order_by("pk")
    html = "".join(rendering.render_run(run, oob="true") for run in settled)
    return html and html + rendering.render_status(*INTERRUPTED_NOTE)


async def settle_abandoned(session_pk: int) -> str:
    """Runs of the session still marked running whose process is gone (their lease has expired), marked
    interrupted; their final form for the page, with the status note ("" if there were none)."""
    return await sync_to_async(_settle_abandoned)(session_pk)
