"""chatapp/settings.py read afresh under different environments: working defaults, clear errors."""

import importlib.util
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parents[2] / "chatapp" / "settings.py"
VARIABLES = ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_TIMEOUT",
             "OPENAI_MAX_RETRIES", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "CHAT_MAX_MESSAGE_CHARS",
             "CHAT_TITLE_ATTEMPTS", "CHAT_TITLE_RETRY_SECONDS", "CHAT_STREAM_BATCH_SECONDS", "CHAT_CHANNEL_CAPACITY",
             "CHAT_STREAM_DRAW_SHARE",
             "CHAT_IMPORT_MAX_BYTES", "OFFLINE_MODEL_DELAY", "TIME_ZONE", "LOG_LEVEL", "CHAT_MAX_JSON_DEPTH",
             "CHAT_MAX_JSON_BYTES", "CHAT_MAX_STATE_BYTES", "CHAT_TOOL_TIMEOUT_SECONDS", "CHAT_MESSAGES_PER_MINUTE",
             "CHAT_RUNS_IN_FLIGHT", "CHAT_NEW_CHATS_PER_MINUTE", "CHAT_IMPORTS_PER_HOUR", "CHAT_TITLES_PER_HOUR", "CHAT_BRANCH_SWITCHES_PER_MINUTE",
             "CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", "CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR",
             "CHAT_LOGINS_PER_ADDRESS_PER_HOUR", "CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR", "STATIC_ROOT",
             "TRUST_PROXY_HEADERS", "FORWARDED_ALLOW_IPS", "FORWARDED_ALLOW_ANY", "SECURE_SSL_REDIRECT",
             "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "DATABASE_POOL_MAX",
             "DATABASE_POOL_TIMEOUT", "CHAT_MAX_MODEL_CALLS", "EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER",
             "EMAIL_HOST_PASSWORD", "EMAIL_USE_TLS", "DEFAULT_FROM_EMAIL", "CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR")


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
    # A read waits longer than channels-redis's 5 s blocking pop of an idle channel.
    # and a process may hold many connections to Redis (one socket's read or send at a time each).
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] == [{"address": "redis://cache:6379/0",
                                                                      "socket_timeout": 15, "max_connections": 1000}]
    # A pool of PostgreSQL connections per process, each checked before it is handed out.
    assert database["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 20, "timeout": 5.0}
    assert database["CONN_HEALTH_CHECKS"] is True


def test_the_connection_pool_can_be_turned_off(monkeypatch):
    settings = load(monkeypatch, DATABASE_URL="postgres://app:pw@db.example:5432/chat", DATABASE_POOL_MAX="0")
    assert "pool" not in settings.DATABASES["default"].get("OPTIONS", {})


def test_a_prepare_threshold_in_the_url_reaches_psycopg_as_a_number_or_none(monkeypatch):
    url = "postgres://app:pw@db.example:5432/chat"
    given = load(monkeypatch, DATABASE_URL=url + "?prepare_threshold=0")
    assert given.DATABASES["default"]["OPTIONS"]["prepare_threshold"] == 0
    never = load(monkeypatch, DATABASE_URL=url + "?prepare_threshold=none")
    assert never.DATABASES["default"]["OPTIONS"]["prepare_threshold"] is None
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL.*prepare_threshold must be a whole number"):
        load(monkeypatch, DATABASE_URL=url + "?prepare_threshold=soon")
    assert "prepare_threshold" not in load(monkeypatch).DATABASES["default"].get("OPTIONS", {})  # SQLite


def test_a_sockets_channel_holds_what_chat_channel_capacity_says_in_either_layer(monkeypatch):
    assert load(monkeypatch).CHANNEL_LAYERS["default"]["CONFIG"] == {"capacity": 1000}
    settings = load(monkeypatch, CHAT_CHANNEL_CAPACITY="250", REDIS_URL="redis://cache:6379/0")
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "chatapp.channel_layer.ChatChannelLayer"
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["capacity"] == 250  # each socket's own queue


@pytest.mark.parametrize("env, named", [
    ({"DEBUG": "maybe"}, "DEBUG"),
    ({"OPENAI_TIMEOUT": "soon"}, "OPENAI_TIMEOUT"),
    ({"OPENAI_TIMEOUT": "0"}, "OPENAI_TIMEOUT"),
    ({"CHAT_MAX_MESSAGE_CHARS": "lots"}, "CHAT_MAX_MESSAGE_CHARS"),
    ({"CHAT_TITLE_ATTEMPTS": "0"}, "CHAT_TITLE_ATTEMPTS"),
    ({"CHAT_CHANNEL_CAPACITY": "5"}, "CHAT_CHANNEL_CAPACITY"),
    ({"CHAT_STREAM_DRAW_SHARE": "0"}, "CHAT_STREAM_DRAW_SHARE"),
    ({"DATABASE_URL": "nosuchdb://x"}, "DATABASE_URL"),
    ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
    ({"OPENAI_BASE_URL": "localhost:11434"}, "OPENAI_BASE_URL"),
    ({"DEBUG": "false"}, "SECRET_KEY"),
])
def test_bad_values_stop_the_start_with_a_message_naming_the_variable(monkeypatch, env, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        load(monkeypatch, **env)


@pytest.mark.parametrize("name, value", [
    ("TIME_ZONE", "Mars/Olympus"),
    ("TIME_ZONE", "../etc"),
    ("LOG_LEVEL", "LOUD"),
    ("DEBUG", "maybe"),
    ("DEBUG", "2"),
    ("CHAT_MAX_MESSAGE_CHARS", "0"),
    ("CHAT_MAX_MESSAGE_CHARS", "1.5"),
    ("OFFLINE_MODEL_DELAY", "-0.1"),
    ("OFFLINE_MODEL_DELAY", "nan"),
    ("OPENAI_MAX_RETRIES", "-1"),
    ("OPENAI_TIMEOUT", "-5"),
    ("OPENAI_TIMEOUT", "inf"),
    ("CHAT_STREAM_BATCH_SECONDS", "fast"),
    ("CHAT_TITLE_ATTEMPTS", "three"),
    ("CHAT_TITLE_RETRY_SECONDS", "-2"),
    ("CHAT_IMPORT_MAX_BYTES", "0"),
    ("CHAT_MAX_MODEL_CALLS", "0"),
    ("CHAT_MAX_MODEL_CALLS", "ten"),
    ("REDIS_URL", "localhost:6379"),
    ("DATABASE_URL", "nosuchdb://x"),
])
def test_a_bad_value_is_quoted_in_the_message(monkeypatch, name, value):
    with pytest.raises(ImproperlyConfigured) as refused:
        load(monkeypatch, **{name: value})
    assert name in str(refused.value) and f'"{value}"' in str(refused.value)


def test_a_password_in_a_bad_url_is_not_repeated(monkeypatch):
    with pytest.raises(ImproperlyConfigured) as refused:
        load(monkeypatch, DATABASE_URL="nosuchdb://app:s3cret@db/x")
    assert "DATABASE_URL" in str(refused.value) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("value, expected", [("true", True), ("On", True), ("1", True), ("yes", True),
                                             ("false", False), ("OFF", False), ("0", False), ("no", False)])
def test_debug_takes_the_usual_true_and_false_words(monkeypatch, value, expected):
    assert load(monkeypatch, DEBUG=value, SECRET_KEY="k", ALLOWED_HOSTS="chat.example.com").DEBUG is expected


def test_good_values_are_read(monkeypatch):
    settings = load(monkeypatch, TIME_ZONE="Europe/Paris", LOG_LEVEL="info", OPENAI_MAX_RETRIES="0",
                    OFFLINE_MODEL_DELAY="0", CHAT_TITLE_RETRY_SECONDS="0.5", CHAT_IMPORT_MAX_BYTES="1000",
                    CHAT_MAX_MODEL_CALLS="40")
    assert (settings.TIME_ZONE, settings.LOGGING["loggers"]["sessions_core"]["level"]) == ("Europe/Paris", "INFO")
    assert (settings.OPENAI_MAX_RETRIES, settings.OFFLINE_MODEL_DELAY) == (0, 0.0)
    assert (settings.CHAT_TITLE_RETRY_SECONDS, settings.CHAT_IMPORT_MAX_BYTES) == (0.5, 1000)
    assert settings.CHAT_MAX_MODEL_CALLS == 40 and load(monkeypatch).CHAT_MAX_MODEL_CALLS == 25


def test_a_database_url_that_is_not_a_url_is_refused(monkeypatch):
    with pytest.warns(UserWarning), pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        load(monkeypatch, DATABASE_URL="not a url")


LIMITS = ("CHAT_MAX_JSON_DEPTH", "CHAT_MAX_JSON_BYTES", "CHAT_MAX_STATE_BYTES", "CHAT_MESSAGES_PER_MINUTE",
          "CHAT_RUNS_IN_FLIGHT", "CHAT_NEW_CHATS_PER_MINUTE", "CHAT_IMPORTS_PER_HOUR", "CHAT_TITLES_PER_HOUR", "CHAT_BRANCH_SWITCHES_PER_MINUTE",
          "CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", "CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR",
          "CHAT_LOGINS_PER_ADDRESS_PER_HOUR", "CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR",
          "CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR")


@pytest.mark.parametrize("name", LIMITS + ("CHAT_TOOL_TIMEOUT_SECONDS",))
def test_a_limit_is_a_number_of_zero_or_more(monkeypatch, name):
    assert getattr(load(monkeypatch, **{name: "0"}), name) == 0  # 0 turns it off
    for bad in ("-1", "many", "1.5" if name in LIMITS else "nan"):
        with pytest.raises(ImproperlyConfigured, match=f'{name} has an invalid value "{bad}"'):
            load(monkeypatch, **{name: bad})


def test_with_redis_the_rate_limits_count_in_redis(monkeypatch):
    assert load(monkeypatch).CACHES["default"]["BACKEND"].endswith("LocMemCache")
    cache = load(monkeypatch, REDIS_URL="redis://cache:6379/1").CACHES["default"]
    assert (cache["BACKEND"], cache["LOCATION"]) == ("django.core.cache.backends.redis.RedisCache", "redis://cache:6379/1")


def test_production_needs_hosts_and_is_secure_by_default(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="ALLOWED_HOSTS must be set when DEBUG is off"):
        load(monkeypatch, DEBUG="false", SECRET_KEY="k")
    settings = load(monkeypatch, DEBUG="false", SECRET_KEY="k", ALLOWED_HOSTS="chat.example.com")
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE and settings.SECURE_SSL_REDIRECT
    assert (settings.SECURE_HSTS_SECONDS, settings.SECURE_HSTS_PRELOAD) == (31_536_000, True)
    assert settings.MIDDLEWARE[1] == "whitenoise.middleware.WhiteNoiseMiddleware"
    assert not hasattr(settings, "SECURE_PROXY_SSL_HEADER")  # a header is believed only behind a proxy
    behind = load(monkeypatch, DEBUG="false", SECRET_KEY="k", ALLOWED_HOSTS="x", TRUST_PROXY_HEADERS="yes",
                  SECURE_HSTS_SECONDS="60")
    assert behind.SECURE_PROXY_SSL_HEADER == ("HTTP_X_FORWARDED_PROTO", "https") and behind.SECURE_HSTS_SECONDS == 60
    with pytest.raises(ImproperlyConfigured, match="SECURE_HSTS_SECONDS"):
        load(monkeypatch, DEBUG="false", SECRET_KEY="k", ALLOWED_HOSTS="x", SECURE_HSTS_SECONDS="-5")
    development = load(monkeypatch)
    assert "whitenoise.middleware.WhiteNoiseMiddleware" not in development.MIDDLEWARE
    assert "csp.middleware.CSPMiddleware" in development.MIDDLEWARE  # the policy holds in development too


def test_trusted_origins_are_read_from_the_environment(monkeypatch):
    assert load(monkeypatch).CSRF_TRUSTED_ORIGINS == []
    trusted = load(monkeypatch, CSRF_TRUSTED_ORIGINS="https://chat.example.com:8443,https://other.example")
    assert trusted.CSRF_TRUSTED_ORIGINS == ["https://chat.example.com:8443", "https://other.example"]


def test_email_is_printed_on_the_console_until_a_host_is_set(monkeypatch):
    assert load(monkeypatch).EMAIL_BACKEND == "django.core.mail.backends.console.EmailBackend"
    settings = load(monkeypatch, EMAIL_HOST="smtp.example.com", EMAIL_PORT="465", EMAIL_HOST_USER="app",
                    EMAIL_HOST_PASSWORD="secret", EMAIL_USE_TLS="false", DEFAULT_FROM_EMAIL="chat@example.com")
    assert settings.EMAIL_BACKEND == "django.core.mail.backends.smtp.EmailBackend"
    assert (settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD,
            settings.EMAIL_USE_TLS, settings.DEFAULT_FROM_EMAIL) == (
        "smtp.example.com", 465, "app", "secret", False, "chat@example.com")
    with pytest.raises(ImproperlyConfigured, match="EMAIL_PORT"):
        load(monkeypatch, EMAIL_HOST="smtp.example.com", EMAIL_PORT="0")


def test_forwarded_addresses_are_believed_from_the_loopback_address_unless_the_operator_says_more(monkeypatch):
    assert load(monkeypatch).FORWARDED_ALLOW_IPS == ["127.0.0.1", "::1"]
    proxies = load(monkeypatch, TRUST_PROXY_HEADERS="true", FORWARDED_ALLOW_IPS="10.0.0.5, 192.168.0.0/16")
    assert proxies.FORWARDED_ALLOW_IPS == ["10.0.0.5", "192.168.0.0/16"]
    with pytest.raises(ImproperlyConfigured, match="FORWARDED_ALLOW_IPS=\\* with TRUST_PROXY_HEADERS=true"):
        load(monkeypatch, TRUST_PROXY_HEADERS="true", FORWARDED_ALLOW_IPS="*")
    meant = load(monkeypatch, TRUST_PROXY_HEADERS="true", FORWARDED_ALLOW_IPS="*", FORWARDED_ALLOW_ANY="true")
    assert meant.FORWARDED_ALLOW_IPS == ["*"]
    assert load(monkeypatch, FORWARDED_ALLOW_IPS="*").FORWARDED_ALLOW_IPS == ["*"]  # no proxy trusted: nothing believed
    with pytest.raises(ImproperlyConfigured, match='FORWARDED_ALLOW_IPS has an invalid value "proxy.local"'):
        load(monkeypatch, FORWARDED_ALLOW_IPS="proxy.local")
