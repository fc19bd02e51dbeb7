"""Rate limits per user (and per address, for sign-ins and sign-ups): messages, runs in flight, new chats,
imports, failed sign-ins, sign-up attempts.

Counters are django-ratelimit's (fixed windows in Django's cache: Redis when REDIS_URL is set, so a
limit holds across server processes; else each process counts for itself). The HTTP views use them
through `limit_posts`, the socket through `refuse_message`, so both count in the same place. Over a
limit: a 429 with Retry-After, or an error line on the socket; nothing is queued or written. Each
limit is a setting (README); 0 turns it off.

Sign-ins count failures (`limit_sign_ins`): per account, so guessing one account's password stops
wherever the guesses come from, and per address. A person who types the right password is let in
however many other attempts there were, unless that account (or that address) has had its allowance of
wrong passwords this hour. Every attempt also counts per address (`CHAT_LOGINS_PER_ADDRESS_PER_HOUR`), a
higher bound on the password hashing one address can ask of the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db.models import Q
from django.dispatch import receiver
from django.shortcuts import render
from django.utils import timezone
from django_ratelimit.core import get_usage

from sessions_core.models import Run, RunStatus

from . import dbthreads


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
TITLES = Rate("CHAT_TITLES_PER_HOUR", 3600, "title regenerations")
BRANCH_SWITCHES = Rate("CHAT_BRANCH_SWITCHES_PER_MINUTE", 60, "version switches")
LOGINS_PER_ADDRESS = Rate("CHAT_LOGINS_PER_ADDRESS_PER_HOUR", 3600, "sign-in attempts from this address")
LOGIN_FAILURES_PER_ACCOUNT = Rate("CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", 3600,
                                  "wrong passwords for this account")
LOGIN_FAILURES_PER_ADDRESS = Rate("CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR", 3600,
                                  "wrong passwords from this address")
SIGNUPS_PER_ADDRESS = Rate("CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR", 3600, "sign-up attempts from this address")
PASSWORD_RESETS_PER_ADDRESS = Rate("CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR", 3600,
                                   "password reset requests from this address")


def _usage(rate: Rate, key: str, increment: bool) -> dict | None:
    limit = getattr(settings, rate.setting)
    if not limit:
        return None
    return get_usage(None, group=f"chat.{rate.setting.lower()}", key=lambda group, request: key,
                     rate=(limit, rate.seconds), increment=increment)


def over_limit(rate: Rate, key: str) -> int | None:
    """Count one more for `key`; the seconds until it may try again when that is over the limit, else None."""
    usage = _usage(rate, key, increment=True)
    if usage is None or not usage["should_limit"]:
        return None
    return max(1, usage["time_left"])


def used_up(rate: Rate, key: str) -> int | None:
    """Without counting: the seconds until `key` may try again when its allowance is spent, else None."""
    usage = _usage(rate, key, increment=False)
    if usage is None or usage["count"] < usage["limit"]:
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


def account_key(username: str) -> str:
    return "account:" + username.strip().lower()[:150]


def by_account(request) -> str:
    return account_key(request.POST.get("username", ""))


def by_address(request) -> str:
    return "address:" + request.META.get("REMOTE_ADDR", "")


def limit_sign_ins(view):
    """The login views' limits (the app's and the admin's): every POST counts per address; one is refused while its account or its
    address has used up its wrong passwords (counted by `_count_failed_sign_in`)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method == "POST":
            checks = ((LOGINS_PER_ADDRESS, over_limit(LOGINS_PER_ADDRESS, by_address(request))),
                      (LOGIN_FAILURES_PER_ACCOUNT, used_up(LOGIN_FAILURES_PER_ACCOUNT, by_account(request))),
                      (LOGIN_FAILURES_PER_ADDRESS, used_up(LOGIN_FAILURES_PER_ADDRESS, by_address(request))))
            for rate, wait in checks:
                if wait is not None:
                    return too_many(request, refusal(rate, wait), wait)
        return view(request, *args, **kwargs)

    return wrapper


@receiver(user_login_failed, dispatch_uid="chatapp.ratelimits.failed_sign_in")
def _count_failed_sign_in(sender, credentials, request=None, **kwargs):
    """A wrong password (or an unknown or inactive account) through the login form or the admin's."""
    if request is None:
        return
    _usage(LOGIN_FAILURES_PER_ACCOUNT, account_key(str(credentials.get("username", ""))), increment=True)
    _usage(LOGIN_FAILURES_PER_ADDRESS, by_address(request), increment=True)


def _in_flight(user) -> int:
    """The user's messages waiting for their run, and their runs still streaming (with a live lease)."""
    runs = Run.objects.filter(session__owner=user, parent_run__isnull=True)
    return runs.filter(Q(status=RunStatus.QUEUED) | Q(status=RunStatus.RUNNING,
                                                      session__lease_expires_at__gt=timezone.now())).count()


def message_refusal(user) -> str:
    """Why a message (a send, a retry, a new chat's first message) from `user` is refused now, or "" when
    it is let through (and counted)."""
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
        return ""  # both off: no trip to a database thread for nothing
    # On the web's own database threads: on the way to a reply's first token, not behind every run's writes.
    return await dbthreads.run(message_refusal, user)


async def refuse(rate: Rate, user) -> tuple[str, int] | None:
    """Why an action of `user` counted by `rate` (a title regeneration: a model call; a switch of version: a
    state write) is refused now, and the seconds to wait; None when it is let through (and counted)."""
    if not getattr(settings, rate.setting):
        return None
    wait = await dbthreads.run(over_limit, rate, f"user:{user.pk}")
    return None if wait is None else (refusal(rate, wait), wait)
