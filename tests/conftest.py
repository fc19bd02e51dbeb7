import os
from contextlib import suppress

import pytest

from tests.support.example_support import served  # noqa: F401  (fixtures)
from tests.support.llm_server import llm_server, llm_server_session, openai_model  # noqa: F401


def pytest_configure(config):
    # The README test command runs every test against real services; it must fail, not skip, without them.
    if os.environ.get("CHATAPP_TESTS_REQUIRE_SERVICES") and not os.path.exists("/usr/bin/chromium"):
        raise pytest.UsageError("Chromium is required for the browser tests (apt-get install chromium).")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # Sync Playwright keeps an event loop running in the main thread once started: browser tests go last.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session", autouse=True)
def _close_worker_connections(django_db_setup):
    """Async code does its ORM work on asgiref's worker thread, whose connection would otherwise stay
    open and keep PostgreSQL from dropping the test database at the end."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)


def pytest_sessionfinish(session):
    """Django drops the SQLite test database's file but not its WAL and shared-memory files
    (`<name>-wal`, `<name>-shm`): remove them too, unless the database itself was kept (--reuse-db)."""
    from django.conf import settings

    if not settings.configured:
        return
    database = settings.DATABASES["default"]
    name = database.get("TEST", {}).get("NAME")
    if database["ENGINE"] != "django.db.backends.sqlite3" or not name or os.path.exists(name):
        return
    for leftover in (f"{name}-wal", f"{name}-shm"):
        with suppress(FileNotFoundError):
            os.remove(leftover)


@pytest.fixture(autouse=True)
def _fresh_rate_limit_counters():
    """The rate limits count in Django's cache, which outlives a test (user pks repeat on SQLite, whose
    sequences roll back with the test's transaction): each test starts from zero."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(scope="session", autouse=True)
def _transfer_folder(tmp_path_factory):
    """Imports' and exports' files in a folder of the test run's, for the test process and the transfer
    processes it starts (which read the environment)."""
    from django.conf import settings

    folder = str(tmp_path_factory.mktemp("transfers"))
    os.environ["CHAT_TRANSFER_DIR"] = settings.CHAT_TRANSFER_DIR = folder
    yield
