"""Settings for the chat app: one module, driven by environment variables with local-dev defaults.

Every variable has a default that works on a fresh machine (SQLite, in-memory channel layer, the
offline model). A bad value raises ImproperlyConfigured at start-up, naming the variable and quoting
the value, rather than failing later.
"""

import ipaddress
import logging
import math
import os
import re
import zoneinfo
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _refuse(name: str, value: str, expected: str):
    # A URL's user and password are left out of the message, which may end up in a log.
    shown = re.sub(r"//[^/@]*@", "//…@", value)
    raise ImproperlyConfigured(f'Environment variable {name} has an invalid value "{shown}": {expected}')


def _env(parse, name, default):
    """Read one variable, turning a parse failure into a message that names it."""
    try:
        return parse(name, default=default)
    except (ValueError, TypeError, environ.ImproperlyConfigured) as exc:
        _refuse(name, os.environ.get(name, ""), str(exc))


def _bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    _refuse(name, value, "expected true or false (also 1/0, yes/no, on/off)")


def _number(name: str, default, kind=float, minimum=0, above: bool = False):
    """A number of `kind` at least `minimum` (more than it when `above`)."""
    value = os.environ.get(name)
    if value is None:
        return default
    bound = f"more than {minimum}" if above else f"at least {minimum}"
    try:
        number = kind(value)
    except ValueError:
        _refuse(name, value, f"expected {'a whole number' if kind is int else 'a number'} {bound}")
    if not math.isfinite(number) or number < minimum or (above and number == minimum):
        _refuse(name, value, f"expected a number {bound}")
    return number


def _time_zone(name: str, default: str) -> str:
    value = os.environ.get(name, default)
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        _refuse(name, value, "expected a time zone name such as UTC or Europe/Paris")
    return value


def _log_level(name: str, default: str) -> str:
    value = os.environ.get(name, default)
    if value.strip().upper() not in logging.getLevelNamesMapping():
        _refuse(name, value, "expected a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return value.strip().upper()


DEBUG = _bool("DEBUG", True)
SECRET_KEY = _env(env.str, "SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "dev-only-insecure-key-change-me"
if not DEBUG and not os.environ.get("ALLOWED_HOSTS", "").strip():
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off (the host names the app is served as).")
ALLOWED_HOSTS = _env(env.list, "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
# Other origins (scheme://host[:port]) whose pages may POST and open sockets (chatapp/socket_origin.py).
CSRF_TRUSTED_ORIGINS = _env(env.list, "CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "django_htmx",
    "sessions_core",
    "chatapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "chatapp.urls"
ASGI_APPLICATION = "chatapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_DATABASE_URLS = "expected a database URL such as sqlite:///path or postgres://user:pw@host:port/name"
try:
    DATABASES = {"default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
except (ValueError, KeyError, environ.ImproperlyConfigured) as exc:
    _refuse("DATABASE_URL", os.environ.get("DATABASE_URL", ""), f"{_DATABASE_URLS} ({exc})")
if "." not in DATABASES["default"].get("ENGINE", ""):  # a scheme django-environ does not know
    _refuse("DATABASE_URL", os.environ.get("DATABASE_URL", ""), _DATABASE_URLS)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE transactions take the write lock up front, so two writers queue instead of
    # deadlocking on a lock upgrade; the timeout is how long a writer waits for its turn.
    # WAL lets readers work while a run writes, and synchronous=NORMAL stops each commit waiting for a
    # disk sync (still durable against a crash of the process; a power cut may lose the last commits).
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": 30, "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    })
    # A file, not memory, so a test server in another process (the browser tests) sees the same data.
    (BASE_DIR / "var").mkdir(exist_ok=True)
    # One file per test process, so parallel test runs never share (and corrupt) a database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / f"test_db_{os.getpid()}.sqlite3")}
else:
    DATABASES["default"].setdefault("TEST", {"NAME": "test_" + DATABASES["default"]["NAME"]})
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A pool of connections per process (psycopg_pool), as Django advises under ASGI instead of persistent
    # connections: the socket and the run tasks close their connection after each message (Django's
    # close_old_connections), and without a pool every message would open a new PostgreSQL connection (a
    # round trip, authentication and this process's CPU). A connection is checked before it is
    # handed out (one empty query: one the server dropped, by a restart, is replaced), and a request waits
    # at most DATABASE_POOL_TIMEOUT seconds for one (a server that is down: an error, not a hang). 0 turns
    # the pool off.
    _pool_size = _number("DATABASE_POOL_MAX", 20, int)
    if _pool_size:
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # with a pool: the check before a connection is handed out
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, _pool_size), "max_size": _pool_size,
            "timeout": _number("DATABASE_POOL_TIMEOUT", 5.0, above=True)}
    # A ?prepare_threshold= in DATABASE_URL reaches psycopg as a number of uses or None, never as text.
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    if isinstance(_options.get("prepare_threshold"), str):  # django-environ leaves what is not a number as text
        if _options["prepare_threshold"].strip().lower() != "none":
            _refuse("DATABASE_URL", os.environ.get("DATABASE_URL", ""),
                    "prepare_threshold must be a whole number of uses (0: at once) or none (never)")
        _options["prepare_threshold"] = None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Messages a socket's channel holds before the layer drops its oldest (the in-memory layer drops new ones;
# both without a word; Channels' default is 100). A streamed reply never loses text to it (chatapp/live/
# coalesces and redraws), but a socket that far behind would lose the other updates: this bounds how
# far behind a socket may fall, and the memory a stalled one holds (a message is one batch of a reply, or a
# fragment).
CHAT_CHANNEL_CAPACITY = _number("CHAT_CHANNEL_CAPACITY", 1000, int, minimum=10)
REDIS_MAX_CONNECTIONS = 1000
REDIS_URL = _env(env.str, "REDIS_URL", "")
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        _refuse("REDIS_URL", REDIS_URL, "expected a URL starting with redis://, rediss:// or unix://")
    # Redis pub/sub, each socket's queue bounded (chatapp/channel_layer.py says why). A read waits up to
    # 15 s for Redis, so a Redis slowed by load is not taken for one that is gone (redis-py's default is
    # 5 s); redis-py's pool refuses a command past 100 connections ("Too many connections") instead of
    # waiting: up to 1,000.
    CHANNEL_LAYERS = {"default": {"BACKEND": "chatapp.channel_layer.ChatChannelLayer", "CONFIG": {
        "hosts": [{"address": REDIS_URL, "socket_timeout": 15, "max_connections": REDIS_MAX_CONNECTIONS}],
        "capacity": CHAT_CHANNEL_CAPACITY}}}
    # The rate limits' counters (chatapp/ratelimits.py) too, so a limit holds across server processes.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "chatapp"}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                  "CONFIG": {"capacity": CHAT_CHANNEL_CAPACITY}}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Sign-in sessions are read from the cache (Redis with REDIS_URL), the database behind it: one query
# fewer for every page and every socket; Django logs and carries on when the cache fails.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"

# The model. With no OpenAI settings the built-in offline demo model answers.
OPENAI_API_KEY = _env(env.str, "OPENAI_API_KEY", "")
OPENAI_BASE_URL = _env(env.str, "OPENAI_BASE_URL", "")
OPENAI_MODEL = _env(env.str, "OPENAI_MODEL", "")
OPENAI_TIMEOUT = _number("OPENAI_TIMEOUT", 60.0, above=True)
OPENAI_MAX_RETRIES = _number("OPENAI_MAX_RETRIES", 2, int)
if OPENAI_BASE_URL and not OPENAI_BASE_URL.startswith(("http://", "https://")):
    _refuse("OPENAI_BASE_URL", OPENAI_BASE_URL, "expected an http:// or https:// URL")
# Seconds between the offline model's streamed words (0 in tests; a little in the demo so streaming is visible).
OFFLINE_MODEL_DELAY = _number("OFFLINE_MODEL_DELAY", 0.02)

# Longest message a user may send, in characters.
CHAT_MAX_MESSAGE_CHARS = _number("CHAT_MAX_MESSAGE_CHARS", 20_000, int, minimum=1)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# E-mail (password reset links): SMTP when EMAIL_HOST is set, else printed on the console (development).
EMAIL_HOST = _env(env.str, "EMAIL_HOST", "")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = _number("EMAIL_PORT", 587, int, minimum=1)
    EMAIL_HOST_USER = _env(env.str, "EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = _env(env.str, "EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = _bool("EMAIL_USE_TLS", True)
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = _env(env.str, "DEFAULT_FROM_EMAIL", "webmaster@localhost")

LANGUAGE_CODE = "en-us"
TIME_ZONE = _time_zone("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(_env(env.str, "STATIC_ROOT", str(BASE_DIR / "var" / "static")))

# The Content-Security-Policy (django-csp), in development too: the pages load only their own scripts,
# styles, images and sockets (no inline script or style, no eval; htmx's own indicator style is off in
# templates/base.html), and are framed by no one.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # the socket: same host (CSP 3 lets 'self' cover ws: and wss:)
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}


def _addresses(name: str, default: str) -> list[str]:
    """Comma-separated addresses or networks (or "*", any address), as uvicorn's --forwarded-allow-ips takes them."""
    value = os.environ.get(name, default)
    parts = [part.strip() for part in value.split(",") if part.strip()]
    for part in parts:
        if part != "*":
            try:
                ipaddress.ip_network(part, strict=False)
            except ValueError:
                _refuse(name, value, "expected comma-separated addresses or networks (127.0.0.1, 10.0.0.0/8), or *")
    if not parts:
        _refuse(name, value, "expected at least one address or network")
    return parts


# Behind a proxy that ends TLS, set TRUST_PROXY_HEADERS=true (it must set X-Forwarded-Proto and
# X-Forwarded-For): scripts/serve then believes X-Forwarded-For (the client address, which the sign-in and
# sign-up limits count) from FORWARDED_ALLOW_IPS only, the loopback address unless it says otherwise, as
# uvicorn does. "*" lets anyone who reaches the server name any address, and so get round those limits:
# it is refused unless FORWARDED_ALLOW_ANY=true says the operator means it (a proxy that every request
# passes and that sets the header itself, on a network no one else reaches).
TRUST_PROXY_HEADERS = _bool("TRUST_PROXY_HEADERS", False)
FORWARDED_ALLOW_IPS = _addresses("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")
if TRUST_PROXY_HEADERS and "*" in FORWARDED_ALLOW_IPS and not _bool("FORWARDED_ALLOW_ANY", False):
    raise ImproperlyConfigured(
        "FORWARDED_ALLOW_IPS=* with TRUST_PROXY_HEADERS=true believes X-Forwarded-For from any address, so any "
        "client can pose as any address and get round the sign-in limits. Name the proxy's addresses, or set "
        "FORWARDED_ALLOW_ANY=true as well if only the proxy can reach this server.")

# Production (DEBUG off; scripts/serve): static files collected and served by the app (WhiteNoise), with
# hashed names cached for a year; cookies only over HTTPS; HSTS; plain HTTP redirected to HTTPS.
if not DEBUG:
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = _bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = _number("SECURE_HSTS_SECONDS", 31_536_000, int)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _bool("SECURE_HSTS_PRELOAD", True)
    if TRUST_PROXY_HEADERS:
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"sessions_core": {"handlers": ["console"], "level": _log_level("LOG_LEVEL", "WARNING")}},
}

# Live replies over the websocket (chatapp/live/).
# Streamed text is sent to the browser in batches at most this often (seconds).
CHAT_STREAM_BATCH_SECONDS = _number("CHAT_STREAM_BATCH_SECONDS", 0.03)
# The share of a core a streaming reply's drawing (markdown, chatapp/markdown_stream.py) may take: a batch
# also waits until the last batch's drawing time is this share of the time since. 1 leaves only the batch.
CHAT_STREAM_DRAW_SHARE = _number("CHAT_STREAM_DRAW_SHARE", 0.05, minimum=0, above=True)
# Threads for the web's own database work around a message (chatapp/dbthreads.py: the socket's session read,
# the finished reply's render), beside Django's one thread that the engine's queries use; 0: that thread.
CHAT_DB_THREADS = _number("CHAT_DB_THREADS", 4, int)
# Generated titles: attempts, and the first pause between them (doubled after each failure).
CHAT_TITLE_ATTEMPTS = _number("CHAT_TITLE_ATTEMPTS", 3, int, minimum=1)
CHAT_TITLE_RETRY_SECONDS = _number("CHAT_TITLE_RETRY_SECONDS", 1.0)
# A page watching another process's run: how long after the run's lease expired (its process stopped
# renewing it) the run is shown as interrupted.
CHAT_LEASE_GRACE_SECONDS = 1.0
# The largest chat export (JSON) a user may import, in bytes.
CHAT_IMPORT_MAX_BYTES = _number("CHAT_IMPORT_MAX_BYTES", 20_000_000, int, minimum=1)
# The most chats one import may add, and the most chats a user may have (the trash's too) after one; 0: no limit.
CHAT_IMPORT_MAX_CHATS = _number("CHAT_IMPORT_MAX_CHATS", 10_000, int)
CHAT_MAX_CHATS_PER_USER = _number("CHAT_MAX_CHATS_PER_USER", 50_000, int)
# Imports and exports run in a process of their own (`manage.py transfer`, chatapp/transfers.py): the
# folder for their files (an upload until it is stored, an export until the user's next one), the rows an
# import writes per transaction, and the nice value the process runs at (0 to 19: how far the server's
# own requests go first when the cores are busy).
CHAT_TRANSFER_DIR = Path(_env(env.str, "CHAT_TRANSFER_DIR", str(BASE_DIR / "var" / "transfers")))
CHAT_IMPORT_BATCH_ROWS = _number("CHAT_IMPORT_BATCH_ROWS", 25, int, minimum=1)
CHAT_TRANSFER_NICE = _number("CHAT_TRANSFER_NICE", 10, int)

# Limits on every JSON that enters (sessions_core/limits.py, which has the same defaults); 0 turns one off.
# Deepest nesting of arrays and objects: socket frames, state edits, imports, tool arguments and
# results, the state passed to a run, every state stored.
CHAT_MAX_JSON_DEPTH = _number("CHAT_MAX_JSON_DEPTH", 64, int)
# Largest JSON text in bytes (an import has CHAT_IMPORT_MAX_BYTES instead).
CHAT_MAX_JSON_BYTES = _number("CHAT_MAX_JSON_BYTES", 1_000_000, int)
# Largest session state as stored (JSON text, in bytes), whatever changes it: tools, edits, imports.
CHAT_MAX_STATE_BYTES = _number("CHAT_MAX_STATE_BYTES", 1_000_000, int)
# Rate limits per user (chatapp/ratelimits.py); 0 turns one off. They stop a burst, not a person chatting.
CHAT_MESSAGES_PER_MINUTE = _number("CHAT_MESSAGES_PER_MINUTE", 20, int)  # sends and retries on the socket
CHAT_RUNS_IN_FLIGHT = _number("CHAT_RUNS_IN_FLIGHT", 5, int)  # replies running or queued at once
CHAT_NEW_CHATS_PER_MINUTE = _number("CHAT_NEW_CHATS_PER_MINUTE", 10, int)
CHAT_IMPORTS_PER_HOUR = _number("CHAT_IMPORTS_PER_HOUR", 20, int)
CHAT_TITLES_PER_HOUR = _number("CHAT_TITLES_PER_HOUR", 30, int)
CHAT_BRANCH_SWITCHES_PER_MINUTE = _number("CHAT_BRANCH_SWITCHES_PER_MINUTE", 30, int)
# Sign-ins: wrong passwords per username and per client address; every attempt per address. Sign-up
# attempts (every POST of the form) per address.
CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR = _number("CHAT_LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", 20, int)
CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR = _number("CHAT_LOGIN_FAILURES_PER_ADDRESS_PER_HOUR", 50, int)
CHAT_LOGINS_PER_ADDRESS_PER_HOUR = _number("CHAT_LOGINS_PER_ADDRESS_PER_HOUR", 100, int)
CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR = _number("CHAT_SIGNUPS_PER_ADDRESS_PER_HOUR", 10, int)
# Password reset requests (each may send an e-mail) per address.
CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR = _number("CHAT_PASSWORD_RESETS_PER_ADDRESS_PER_HOUR", 10, int)
# How long one tool call may take before the model is told it timed out (seconds).
CHAT_TOOL_TIMEOUT_SECONDS = _number("CHAT_TOOL_TIMEOUT_SECONDS", 60.0)
# How many requests one run may make of its model (each answered with tool calls but the last) before it
# is stopped as an error (sessions_core/limits.py, which has the same default).
CHAT_MAX_MODEL_CALLS = _number("CHAT_MAX_MODEL_CALLS", 25, int, minimum=1)
