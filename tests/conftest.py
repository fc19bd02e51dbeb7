import os

import pytest

from tests.llm_server import llm_server, llm_server_session, openai_model  # noqa: F401  (fixtures)


def pytest_configure(config):
    # The README test command runs every test against real services; it must fail, not skip, without them.
    if os.environ.get("CHATAPP_TESTS_REQUIRE_SERVICES") and not os.path.exists("/usr/bin/chromium"):
        raise pytest.UsageError("Chromium is required for the browser tests (apt-get install chromium).")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # Sync Playwright keeps an event loop running in the main thread once started: browser tests go last.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)
