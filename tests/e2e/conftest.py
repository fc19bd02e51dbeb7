"""Browser tests: headless Debian Chromium (Playwright, sync API) against daphne in a subprocess that
uses the test database and the local OpenAI-compatible test server.

Every test here is marked `e2e` and runs last (tests/conftest.py): sync Playwright keeps an event
loop running in the main thread once it has started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.test import Client

from tests.support.llm_server import background_responder
from tests.support.server_process import ServerProcess

BASE_DIR = Path(__file__).resolve().parents[2]
SCREENSHOTS = BASE_DIR / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "executable_path": "/usr/bin/chromium", "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session", autouse=True)
def _database_before_browser(django_db_setup):
    """Create the test database before Playwright starts its event loop in this thread, and let the
    ORM run next to that loop from then on (pytest-django's flush after each test included). These
    tests run last, so nothing else in the session sees the variable."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="session", autouse=True)
def _flush_outlasts_a_deadlock(_database_before_browser):
    """After each test the database is flushed (TRUNCATE of every table, one lock after another) while
    the app server, another process, may still be reading from a finished run (its summary, the state
    panel): a query joining two tables can take their locks in the other order, and PostgreSQL then
    ends one of the two as a deadlock. If that is the flush, flush again: the server's query is over."""
    from django.db import OperationalError, connection

    flush = type(connection.ops).execute_sql_flush

    def execute_sql_flush(ops, sql_list):
        for attempt in range(5):
            try:
                return flush(ops, sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(connection.ops), "execute_sql_flush", execute_sql_flush)
        yield


@pytest.fixture(autouse=True)
def _summaries_answered_aside(llm_server):
    """Summaries and titles are made in the background and may outlive the test that started them:
    answer them aside, so each test's scripted replies go to the requests they are meant for."""
    llm_server.side_responder = background_responder


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _test_database_url() -> str:
    db = settings.DATABASES["default"]  # after django_db_setup: the test database
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    user, password = quote(db.get("USER") or ""), quote(db.get("PASSWORD") or "")
    return f"postgres://{user}:{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class Daphne(ServerProcess):
    """`python -m daphne` on a free port, in its own process with its own environment."""

    def __init__(self, env: dict[str, str], port: int | None = None):
        port = port or _free_port()
        super().__init__([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                          "chatapp.asgi:application"], env, port)


def _server_env(redis_url: str | None = None, **extra) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("OPENAI_") and key not in ("REDIS_URL", "DATABASE_URL")}
    env.update(DATABASE_URL=_test_database_url(), DEBUG="true", PYTHONUNBUFFERED="1", **extra)
    redis_url = redis_url or os.environ.get("REDIS_URL_FOR_TESTS")
    if redis_url:
        env["REDIS_URL"] = redis_url  # the real Redis channel layer
    return env


@pytest.fixture(scope="session")
def redis_url():
    """The test Redis of scripts/test, else a throwaway redis-server of our own (required, never skipped)."""
    if os.environ.get("REDIS_URL_FOR_TESTS"):
        yield os.environ["REDIS_URL_FOR_TESTS"]
        return
    port, workdir = _free_port(), tempfile.mkdtemp(prefix="redis-")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.02)
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="session")
def daphne_server(django_db_setup, llm_server_session):
    """The app with its model pointed at the local test server."""
    server = Daphne(_server_env(OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test",
                                OPENAI_TIMEOUT="10", CHAT_TITLE_RETRY_SECONDS="0.05"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def daphne_pair(django_db_setup, llm_server_session, redis_url):
    """Two app processes sharing the test database and a Redis channel layer (no sticky sessions)."""
    env = _server_env(redis_url, OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test",
                      OPENAI_TIMEOUT="10")
    servers = [Daphne(env), Daphne(env)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def offline_daphne_server(django_db_setup):
    """The app with no model settings: the built-in offline model answers."""
    server = Daphne(_server_env(OFFLINE_MODEL_DELAY="0"))
    yield server
    server.stop()


def log_in(context, base_url: str, user) -> None:
    """Give a browser context the session cookie of `user` (the login form has its own test)."""
    client = Client()
    client.force_login(user)
    context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base_url}])


@pytest.fixture
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
