"""Rate limits per user (and per address, for logins): messages, runs in flight, new chats, imports,
login attempts.

Counters are django-ratelimit's (fixed windows in Django's cache: Redis when REDIS_URL is set, so a
limit holds across server processes; else each process counts for itself). The HTTP views use them
through `limit_posts`, the socket through `refuse_message`, so both count in the same place. Over a
limit: a 429 with Retry-After, or an error line on the socket; nothing is queued or written. Each
limit is a setting (README); 0 turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from asgiref.sync import sync_to_async
from django.conf import settings
from django.shortcuts import render
from django.utils import timezone
from django_ratelimit.core import get_usage

from sessions_core.models import Run, RunStatus

from .models import QueuedMessage


@dataclass(frozen=True)
class Rate:
    setting: str  # the number of requests allowed per period
    seconds: int  # the period
    what: str  # for the message: "messages", "new chats"

    @property
    def per(self) -> str:
        return {60: "minute", 3600: "hour"}[self.seconds]


MESSAGES = Rate("CHAT_MESSAGES_PER_MINUTE", 60, "messages")
NEW_CHATS = Rate("CHAT_NEW_CHATS_PER_MINUTE", 60, "new chats")
IMPORTS = Rate("CHAT_IMPORTS_PER_HOUR", 3600, "imports")
LOGINS_PER_ACCOUNT = Rate("CHAT_LOGINS_PER_ACCOUNT_PER_HOUR", 3600, "sign-in attempts for this account")
LOGINS_PER_ADDRESS = Rate("CHAT_LOGINS_PER_ADDRESS_PER_HOUR", 3600, "sign-in attempts from this address")


def over_limit(rate: Rate, key: str) -> int | None:
    """Count one more for `key`; the seconds until it may try again when that is over the limit, else None."""
    limit = getattr(settings, rate.setting)
    if not limit:
        return None
    usage = get_usage(None, group=f"chat.{rate.setting.lower()}", key=lambda group, request: key,
                      rate=(limit, rate.seconds), increment=True)
    if usage is None or not usage["should_limit"]:
        return None
    return max(1, usage["time_left"])


def refusal(rate: Rate, wait: int) -> str:
    limit = getattr(settings, rate.setting)
    return f"Too many {rate.what}: the limit is {limit:,} per {rate.per} ({rate.setting}). Try again in {wait} s."


def too_many(request, message: str, wait: int):
    response = render(request, "chatapp/rate_limited.html", {"message": message}, status=429)
    response["Retry-After"] = str(wait)
    return response


def limit_posts(*rates_and_keys):
    """A view decorator: each POST counts against every (rate, key function of the request) given;
    over any of them, a 429 and the view is not called."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if request.method == "POST":
                for rate, key in rates_and_keys:
                    if (wait := over_limit(rate, key(request))) is not None:
                        return too_many(request, refusal(rate, wait), wait)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def by_user(request) -> str:
    return f"user:{request.user.pk}"


def by_account(request) -> str:
    return "account:" + request.POST.get("username", "").strip().lower()[:150]


def by_address(request) -> str:
    return "address:" + request.META.get("REMOTE_ADDR", "")


def _in_flight(user) -> int:
    """The user's messages waiting for their run, and their runs still streaming (with a live lease)."""
    running = Run.objects.filter(session__owner=user, status=RunStatus.RUNNING, parent_run__isnull=True,
                                 session__lease_expires_at__gt=timezone.now())
    return QueuedMessage.objects.filter(user=user).count() + running.count()


def _refuse_message(user) -> str:
    in_flight_limit = settings.CHAT_RUNS_IN_FLIGHT
    if in_flight_limit and _in_flight(user) >= in_flight_limit:
        return (f"You have {in_flight_limit:,} replies running or waiting, the most at once "
                "(CHAT_RUNS_IN_FLIGHT). Send this when one has finished.")
    if (wait := over_limit(MESSAGES, f"user:{user.pk}")) is not None:
        return refusal(MESSAGES, wait)
    return ""


async def refuse_message(user) -> str:
    """Why the socket refuses a message (a send or a retry) from `user` now, or "" when it is let through
    (and counted)."""
    if not settings.CHAT_RUNS_IN_FLIGHT and not settings.CHAT_MESSAGES_PER_MINUTE:
        return ""  # both off: no trip to the database thread for nothing
    return await sync_to_async(_refuse_message)(user)
