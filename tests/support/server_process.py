"""A server the tests start as a process of its own: it waits until the port accepts connections (or the
process dies), keeps the output for error messages, and stops or kills it."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


class ServerProcess:
    def __init__(self, command: list[str], env: dict[str, str], port: int, start_seconds: float = 30):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        # Open for the server's whole life; closed and removed in stop().
        self.log = tempfile.NamedTemporaryFile("w+", prefix="server-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_seconds
        while True:  # wait until the port accepts connections (or the server died)
            if self.process.poll() is not None:
                raise RuntimeError(f"{command} exited with {self.process.returncode}:\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{command} did not start:\n{self.output()}") from None
                time.sleep(0.05)  # polling a port: there is no event to wait on

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-5000:]

    def kill(self) -> None:
        """Stop it as a crash would: at once, with no clean-up of its own (SIGKILL)."""
        self.process.kill()
        self.process.wait()
        self._remove_log()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._remove_log()

    def _remove_log(self) -> None:
        self.log.close()
        os.unlink(self.log.name)
