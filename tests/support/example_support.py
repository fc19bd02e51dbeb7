"""Shared by the example tests: import an example as its script sees it, and point it at the test server."""

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(name: str):
    """Import examples/<name>.py as the scripts see it (with examples/ on sys.path for `_model`)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


@pytest.fixture
def served(llm_server, settings):
    """default_model() (the examples' model line) now returns OpenAIChat pointed at the test server."""
    settings.OPENAI_BASE_URL = llm_server.base_url
    settings.OPENAI_API_KEY = "test"
    settings.OPENAI_MODEL = "test-model"
    settings.OPENAI_MAX_RETRIES = 0
    return llm_server


@pytest.fixture
def examples_folder(tmp_path, monkeypatch):
    """The examples' stores (`SqliteDb(db_file="tmp/...")`) land in the test's folder, not the project's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def offline_env(tmp_path: Path, name: str) -> dict:
    """The environment of a script run as a command: the offline model and a database of its own."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "DJANGO_"))}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / name}.sqlite3", OFFLINE_MODEL_DELAY="0")
    return env
