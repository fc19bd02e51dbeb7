"""A PostgreSQL server of a test's own: a throwaway cluster (initdb in a temporary folder, on a free port)
that the test may stop, start and restart as an operator would, while the suite's shared server, which
every other test uses, is never touched."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import _free_port


def _server_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[4]))
    if not found:
        if os.environ.get("CHATAPP_TESTS_REQUIRE_SERVICES"):
            pytest.fail("PostgreSQL's server programs are missing (scripts/test installs them)")
        pytest.skip("no PostgreSQL server programs: run scripts/test")
    return Path(found[-1]).parent


class PostgresServer:
    def __init__(self):
        self.bin = _server_bin()
        self.root = Path(tempfile.mkdtemp(prefix="pg-own-"))
        self.root.chmod(0o755)
        # initdb refuses to run as root: the cluster then belongs to the postgres user.
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_owner:
            shutil.chown(self.root, "postgres", "postgres")
        self.data, self.port = self.root / "data", _free_port()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8",
                  "--locale=C.UTF-8")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([*self.as_owner, str(self.bin / program), *args], check=True, capture_output=True,
                       timeout=120)

    def _pg_ctl(self, *args: str) -> None:
        # -w: return once it is done (up and accepting connections, or stopped); the log goes to a file,
        # never to our pipe, which the server would keep open.
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", *args)

    def start(self) -> None:
        self._pg_ctl("-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                     "-c synchronous_commit=off -c full_page_writes=off", "start")

    def stop(self) -> None:
        """As an operator's fast shutdown: every connection is ended, new ones are refused."""
        self._pg_ctl("-m", "fast", "stop")

    def restart(self) -> None:
        self._pg_ctl("-m", "fast", "restart")

    def remove(self) -> None:
        subprocess.run([*self.as_owner, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                        "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def own_postgres():
    server = PostgresServer()
    yield server
    server.remove()
