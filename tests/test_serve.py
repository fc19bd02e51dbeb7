"""The production start (scripts/serve): daphne with DEBUG off behind the security headers, static
files served by the app, error pages that reveal nothing, and a chat that streams over the socket."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import secrets
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.test import Client

from tests.e2e.conftest import _free_port, _test_database_url
from tests.factories import make_session, make_user
from tests.llm_server import Text, background_responder
from tests.server_process import ServerProcess

BASE_DIR = Path(__file__).resolve().parent.parent
HTTPS = {"X-Forwarded-Proto": "https"}  # as a proxy that ended TLS says it


class Server(ServerProcess):
    """A command serving the app on a free port, in its own process and environment."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.secret_key = env.get("SECRET_KEY", "")
        # scripts/serve checks, migrates and collects static files first
        super().__init__(command, env, int(env["PORT"]), start_seconds=120)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        connection.request("GET", path, headers={"Host": "127.0.0.1", **(headers or {})})
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace")
        connection.close()
        return response.status, {key.lower(): value for key, value in response.getheaders()}, body



def production_env(**extra) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OPENAI_", "CHAT_")) and key not in ("REDIS_URL", "DEBUG", "DJANGO_SETTINGS_MODULE")}
    env.update(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1", TRUST_PROXY_HEADERS="true",
               PORT=str(_free_port()), PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def static_root():
    with tempfile.TemporaryDirectory(prefix="static-") as folder:
        yield folder


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, llm_server_session, static_root):
    env = production_env(DATABASE_URL=_test_database_url(), STATIC_ROOT=static_root,
                         OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test", OPENAI_TIMEOUT="10")
    server = Server(["bash", "scripts/serve"], env)
    yield server
    server.stop()


def test_it_refuses_to_start_without_a_secret_key_or_hosts():
    for missing in ("SECRET_KEY", "ALLOWED_HOSTS"):
        env = production_env()
        env.pop(missing)
        result = subprocess.run(["bash", "scripts/serve"], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode != 0 and f"{missing}: must be set" in result.stderr


def test_the_pages_carry_the_security_headers(served):
    status, headers, body = served.get("/accounts/login/", HTTPS)
    assert status == 200, body
    assert headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    policy = headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "same-origin"
    assert "Secure" in headers["set-cookie"] and "csrftoken" in headers["set-cookie"]
    # Plain HTTP is sent to HTTPS.
    status, headers, _ = served.get("/accounts/login/")
    assert status == 301 and headers["location"] == "https://127.0.0.1/accounts/login/"


def test_static_files_are_collected_and_served_by_the_app(served):
    _, _, body = served.get("/accounts/login/", HTTPS)
    stylesheet = re.search(r'href="(/static/chatapp/chat\.[0-9a-f]{12}\.css)"', body).group(1)
    status, headers, css = served.get(stylesheet, HTTPS)
    assert status == 200 and headers["content-type"].startswith("text/css") and css
    assert "immutable" in headers["cache-control"]
    for script in re.findall(r'<script src="([^"]+)"', body):
        assert re.fullmatch(r"/static/[\w/.-]+\.[0-9a-f]{12}\.js", script), script
        assert served.get(script, HTTPS)[0] == 200


def test_a_404_reveals_nothing(served):
    status, _, body = served.get("/no/such/page/", HTTPS)
    assert status == 404
    for leak in ("URLconf", "chat:", "admin/", "accounts/", "Traceback", "DEBUG", "Django"):
        assert leak not in body, leak


def test_a_500_reveals_nothing(static_root):
    """A fault the app cannot help (its database is gone) is a bare 500 page."""
    closed = _free_port()
    env = production_env(DATABASE_URL=f"postgres://app:s3cret-pw@127.0.0.1:{closed}/app", STATIC_ROOT=static_root,
                         DEBUG="false")  # as scripts/serve sets it
    server = Server([str(BASE_DIR / ".venv/bin/python"), "-m", "daphne", "-b", "127.0.0.1", "-p", env["PORT"],
                     "chatapp.asgi:application"], env)
    try:
        status, _, body = server.get("/accounts/login/", {**HTTPS, "Cookie": "sessionid=" + "a" * 32})
    finally:
        server.stop()
    assert status == 500
    for leak in ("OperationalError", "psycopg", "Traceback", "s3cret", str(closed), "settings", "sessionid", "File "):
        assert leak not in body, leak


# -- a chat over the socket, through the production server ------------------------------------------


class WebSocket:
    """The smallest client of RFC 6455 the test needs: text frames, masked as a client must."""

    def __init__(self, port: int, path: str, headers: dict[str, str]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                 *(f"{name}: {value}" for name, value in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, text: str) -> None:
        payload, mask = text.encode(), secrets.token_bytes(4)
        length = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | length]) if length < 126 else bytes([0x80 | 126]) + struct.pack("!H", length))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the socket")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> str:
        first, second = self._read(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._read(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._read(8))[0]
        payload = self._read(length)
        if first & 0x0F == 0x8:
            raise ConnectionError(f"closed: {payload!r}")
        return payload.decode()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.django_db(transaction=True)
def test_a_chat_streams_through_the_production_server(served, llm_server, settings):
    settings.SECRET_KEY = served.secret_key  # the session cookie made here is the server's
    llm_server.side_responder = background_responder
    llm_server.add(Text("The production server streams this reply word by word", chunk_delay=0.02))
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Chat")
    client = Client()
    client.force_login(alice)
    cookie = client.cookies["sessionid"].value
    origin = f"http://127.0.0.1:{served.port}"
    ws = WebSocket(served.port, f"/ws/sessions/{session.session_id}/", {"Cookie": f"sessionid={cookie}", "Origin": origin})
    try:
        ws.send(json.dumps({"type": "send", "text": "hello"}))
        frames = []
        deadline = time.monotonic() + 20
        while not any('data-status="completed"' in frame and 'hx-swap-oob="true"' in frame for frame in frames):
            assert time.monotonic() < deadline, frames
            frames.append(ws.receive())
    finally:
        ws.close()
    tokens = [frame for frame in frames if frame.startswith("<template data-stream-run=")]
    assert len(tokens) >= 2  # streamed in batches, not at once
    assert "word by word" in frames[-1]
