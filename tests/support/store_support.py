"""Shared by the store tests: the test PostgreSQL server, a throwaway database on it, and DB access for
stores made mid-test (Django's test cases only know the databases that existed when they were set up)."""

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest


def server_url() -> str:
    """The test PostgreSQL of scripts/test (PG_URL_FOR_TESTS), or DATABASE_URL when that is PostgreSQL."""
    url = os.environ.get("PG_URL_FOR_TESTS") or ""
    if not url and os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        url = os.environ["DATABASE_URL"]
    if not url:
        if os.environ.get("CHATAPP_TESTS_REQUIRE_SERVICES"):
            pytest.fail("PG_URL_FOR_TESTS is not set: scripts/test exports it for the PostgresDb tests")
        pytest.skip("no PostgreSQL: run scripts/test, or set PG_URL_FOR_TESTS")
    return url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture
def pg_url():
    """The URL of a new, empty database on the test server, dropped afterwards."""
    import psycopg

    server = server_url()
    name = f"stores_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.replace("postgres://", "postgresql://", 1), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield with_database(server, name)
    with psycopg.connect(server.replace("postgres://", "postgresql://", 1), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # our connections to it go too


@pytest.fixture
def db_access(django_db_setup, django_db_blocker):
    """Queries to any database, including the aliases the stores register while the test runs."""
    with django_db_blocker.unblock():
        yield
