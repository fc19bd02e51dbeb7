"""chatapp/settings.py read afresh under different environments: working defaults, clear errors."""

import importlib.util
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parent.parent / "chatapp" / "settings.py"
VARIABLES = ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_TIMEOUT",
             "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "CHAT_MAX_MESSAGE_CHARS", "CHAT_TITLE_ATTEMPTS")


def load(monkeypatch, **env):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("settings_under_test", SETTINGS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_work_on_a_fresh_machine(monkeypatch):
    settings = load(monkeypatch)
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings.DATABASES["default"]["NAME"].endswith("db.sqlite3")
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"
    assert settings.OPENAI_API_KEY == "" and settings.OPENAI_BASE_URL == ""  # the offline model answers
    assert settings.DEBUG is True and settings.SECRET_KEY


def test_urls_pick_postgres_and_redis(monkeypatch):
    settings = load(monkeypatch, DATABASE_URL="postgres://app:pw@db.example:5432/chat", REDIS_URL="redis://cache:6379/0")
    database = settings.DATABASES["default"]
    assert (database["ENGINE"], database["HOST"], database["NAME"]) == ("django.db.backends.postgresql", "db.example", "chat")
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] == ["redis://cache:6379/0"]


@pytest.mark.parametrize("env, named", [
    ({"DEBUG": "maybe"}, "DEBUG"),
    ({"OPENAI_TIMEOUT": "soon"}, "OPENAI_TIMEOUT"),
    ({"OPENAI_TIMEOUT": "0"}, "OPENAI_TIMEOUT"),
    ({"CHAT_MAX_MESSAGE_CHARS": "lots"}, "CHAT_MAX_MESSAGE_CHARS"),
    ({"CHAT_TITLE_ATTEMPTS": "0"}, "CHAT_TITLE_ATTEMPTS"),
    ({"DATABASE_URL": "nosuchdb://x"}, "DATABASE_URL"),
    ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
    ({"OPENAI_BASE_URL": "localhost:11434"}, "OPENAI_BASE_URL"),
    ({"DEBUG": "false"}, "SECRET_KEY"),
])
def test_bad_values_stop_the_start_with_a_message_naming_the_variable(monkeypatch, env, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        load(monkeypatch, **env)


def test_a_database_url_that_is_not_a_url_is_refused(monkeypatch):
    with pytest.warns(UserWarning), pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        load(monkeypatch, DATABASE_URL="not a url")
