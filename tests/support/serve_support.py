"""The production server (scripts/serve) as the tests start it, and the smallest clients they talk to it
with: HTTP requests with the headers a proxy that ended TLS adds, and a websocket."""

from __future__ import annotations

import base64
import http.client
import os
import re
import secrets
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from tests.e2e.conftest import _free_port
from tests.support.server_process import ServerProcess

HTTPS = {"X-Forwarded-Proto": "https"}  # as a proxy that ended TLS says it


class Server(ServerProcess):
    """A command serving the app on a free port, in its own process and environment."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.secret_key = env.get("SECRET_KEY", "")
        # scripts/serve checks, migrates and collects static files first
        super().__init__(command, env, int(env["PORT"]), start_seconds=120)
        # The port accepts connections once the first worker serves; wait for every one of them.
        workers = int(env.get("WEB_CONCURRENCY", "1"))
        deadline = time.monotonic() + 60
        while workers > 1 and self.output().count("Started server process") < workers:
            assert self.process.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.05)  # polling a log: there is no event to wait on

    def whole_output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def request(self, method: str, path: str, headers: dict | None = None,
                body: str | None = None, source: str = "") -> tuple[int, dict, str]:
        """`source`: the loopback address to send from (127.0.0.2 is a client that is not the proxy)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10,
                                                source_address=(source, 0) if source else None)
        connection.request(method, path, body=body, headers={"Host": "127.0.0.1", **(headers or {})})
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        connection.close()
        return response.status, {key.lower(): value for key, value in response.getheaders()}, text

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, str]:
        return self.request("GET", path, headers)

    def post_form(self, path: str, fields: dict[str, str], cookies: dict[str, str],
                  extra: dict | None = None, source: str = "") -> tuple[int, dict, str]:
        """A form posted as a browser behind the TLS proxy would: the CSRF cookie and token of the form's
        page (fetched first), the page as the referrer; `extra` headers on the POST, sent from `source`."""
        status, headers, page = self.get(path, {**HTTPS, **_cookie_header(cookies)})
        assert status == 200, page
        cookies.update(_set_cookies(headers))
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urlencode({"csrfmiddlewaretoken": token, **fields})
        status, headers, text = self.request("POST", path, {
            **HTTPS, **_cookie_header(cookies), "Content-Type": "application/x-www-form-urlencoded",
            "Origin": "https://127.0.0.1", "Referer": f"https://127.0.0.1{path}", **(extra or {})}, body, source)
        cookies.update(_set_cookies(headers))
        return status, headers, text


def _cookie_header(cookies: dict[str, str]) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{name}={value}" for name, value in cookies.items())} if cookies else {}


def _set_cookies(headers: dict) -> dict[str, str]:
    """The cookies a response sets (http.client joins its Set-Cookie headers with ", ")."""
    return dict(re.findall(r"(?:^|, )(\w+)=([^;]*);", headers.get("set-cookie", "")))



def production_env(**extra) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OPENAI_", "CHAT_")) and key not in ("REDIS_URL", "DEBUG", "DJANGO_SETTINGS_MODULE")}
    env.update(SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1", TRUST_PROXY_HEADERS="true",
               PORT=str(_free_port()), PYTHONUNBUFFERED="1", **extra)
    return env


class WebSocket:
    """The smallest client of RFC 6455 the test needs: text frames, masked as a client must, and the
    server's pings answered (uvicorn pings every 20 s; a long test on a busy machine gets one)."""

    def __init__(self, port: int, path: str, headers: dict[str, str]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                 *(f"{name}: {value}" for name, value in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buffer, self.pings = b"", 0
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        mask, length = secrets.token_bytes(4), len(payload)
        header = bytes([0x80 | opcode]) + (bytes([0x80 | length]) if length < 126
                                           else bytes([0x80 | 126]) + struct.pack("!H", length))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, count: int, deadline: float) -> bytes:
        while len(self.buffer) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nothing awaited came in time ({self.pings} pings answered meanwhile)")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the socket")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self, seconds: float = 20, deadline: float | None = None) -> str:
        """The next text frame (a ping on the way is answered, a pong skipped), within `seconds` or by
        `deadline` (time.monotonic()). The server pings every half second here, so the socket is never
        silent for long: the deadline, not the socket's own timeout, is what ends the wait."""
        deadline = time.monotonic() + seconds if deadline is None else deadline
        while (payload := self._next_frame(deadline)) is None:
            pass
        return payload

    def answer_pings(self, count: int, seconds: float = 20) -> None:
        """Read until the server has pinged `count` times more, each answered (text frames meanwhile are
        an error here: the caller expects none)."""
        goal, deadline = self.pings + count, time.monotonic() + seconds
        while self.pings < goal:
            payload = self._next_frame(deadline)
            assert payload is None, payload

    def _next_frame(self, deadline: float) -> str | None:
        """One frame: a text frame's text, or None for a ping (answered) or a pong."""
        first, second = self._read(2, deadline)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._read(2, deadline))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._read(8, deadline))[0]
        payload, opcode = self._read(length, deadline), first & 0x0F
        if opcode == 0x8:
            raise ConnectionError(f"closed: {payload!r}")
        if opcode == 0x9:
            self.pings += 1
            self._send_frame(0xA, payload)
            return None
        return None if opcode == 0xA else payload.decode()

    def close(self) -> None:
        self.sock.close()


def receive_until(ws: WebSocket, done: Callable[[str], bool], seconds: float = 20) -> list[str]:
    """The frames the socket receives up to and including the first one `done` accepts."""
    frames: list[str] = []
    deadline = time.monotonic() + seconds
    while not frames or not done(frames[-1]):
        try:
            frames.append(ws.receive(deadline=deadline))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the frames received: {frames}") from None
    return frames


def finished(status: str) -> Callable[[str], bool]:
    return lambda frame: f'data-status="{status}"' in frame and 'hx-swap-oob="true"' in frame


def logged_in_socket(server: Server, session, cookie: str, query: str = "") -> WebSocket:
    return WebSocket(server.port, f"/ws/sessions/{session.session_id}/{query}",
                     {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{server.port}"})
