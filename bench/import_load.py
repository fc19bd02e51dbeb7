"""Another user's request times while one user imports or exports many chats, against an idle server.

    .venv/bin/python bench/import_load.py            # SQLite: a 10,000-chat import, a 20,000-chat export
    .venv/bin/python bench/import_load.py --pg       # the same on a throwaway PostgreSQL
    .venv/bin/python bench/import_load.py --import-chats 2000 --export-chats 4000   # smaller
    .venv/bin/python bench/import_load.py --tree /path/to/other/checkout   # that checkout's server instead

The app is served by `scripts/serve` (DEBUG off, one worker, the import rate limit off) on a database of
its own. Three users: the importer, who uploads an export of --import-chats one-run chats (POST /import/,
the file as a browser sends it); the exporter, who has --export-chats such chats (stored beforehand) and
downloads them all (GET /export/, read to the end); and the other user, who meanwhile opens his chat's
page (a read) and renames it (a write), one request after the other, and records each one's time. The
same requests on the idle server first give the baseline. Every request stays on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

import load
from _support import ROOT, percentile, print_table

CSRF = secrets.token_hex(16)  # a CSRF cookie of our own making, sent back as the header (as a browser's script does)


def document(chats: int) -> bytes:
    """An export of `chats` one-run chats, as the app writes one."""
    run = {"status": "completed", "messages": [{"role": "user", "content": "add milk and eggs"},
                                                {"role": "assistant", "content": "Added milk and eggs."}]}
    sessions = [{"format": "sessions_core.session", "version": 1, "name": f"Chat {number}", "assistant": "general",
                 "runs": [run]} for number in range(chats)]
    return json.dumps({"format": "sessions_core.export", "version": 1, "sessions": sessions}).encode()


class Browser:
    """One signed-in user's requests, as a browser behind the TLS proxy sends them."""

    def __init__(self, port: int, cookie: str):
        self.port, self.headers = port, {
            "Host": "127.0.0.1", "X-Forwarded-Proto": "https", "Cookie": f"sessionid={cookie}; csrftoken={CSRF}"}

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 600) -> tuple[int, int, float]:
        """(status, bytes read, seconds to the last byte)."""
        began = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={**self.headers, **(headers or {})})
            response = connection.getresponse()
            size = 0
            while chunk := response.read(1 << 16):
                size += len(chunk)
            return response.status, size, time.perf_counter() - began
        finally:
            connection.close()

    def post(self, path: str, body: bytes, content_type: str, timeout: float = 600) -> tuple[int, int, float]:
        return self.request("POST", path, body, {"Content-Type": content_type, "X-CSRFToken": CSRF,
                                                  "Origin": "https://127.0.0.1", "HX-Request": "true"}, timeout)


def upload(browser: Browser, data: bytes) -> tuple[int, int, float]:
    boundary = secrets.token_hex(12)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"chats.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return browser.post("/import/", body, f"multipart/form-data; boundary={boundary}")


class Other:
    """The other user: his chat's page and a rename of it, in turn, until told to stop; each request timed."""

    def __init__(self, browser: Browser, session_id: str):
        self.browser, self.session_id = browser, session_id
        self.reads: list[float] = []
        self.writes: list[float] = []
        self.failures: list[str] = []

    def one_round(self, number: int) -> None:
        status, _, seconds = self.browser.request("GET", f"/s/{self.session_id}/", timeout=120)
        (self.reads if status == 200 else self.failures).append(seconds if status == 200 else f"read {status}")
        body = f"name=Renamed+{number}".encode()
        status, _, seconds = self.browser.post(f"/s/{self.session_id}/rename/", body,
                                               "application/x-www-form-urlencoded", timeout=120)
        (self.writes if status == 200 else self.failures).append(seconds if status == 200 else f"write {status}")

    def rounds(self, count: int) -> Other:
        for number in range(count):
            self.one_round(number)
        return self

    def during(self, work) -> tuple[Other, object]:
        """Rounds for as long as `work()` runs in another thread; (self, what `work` returned)."""
        result, done = [], threading.Event()
        worker = threading.Thread(target=lambda: (result.append(work()), done.set()))
        worker.start()
        number = 0
        while not done.is_set():
            self.one_round(number)
            number += 1
        worker.join()
        return self, result[0]


def row(label: str, other: Other, idle: Other | None) -> tuple[str, ...]:
    def figures(values: list[float], baseline: list[float] | None) -> list[str]:
        p50, p95 = percentile(values, 50) * 1000, percentile(values, 95) * 1000
        cells = [f"{p50:.1f}", f"{p95:.1f}", f"{max(values) * 1000:.1f}"]
        if baseline:
            cells.append(f"{p50 / (percentile(baseline, 50) * 1000):.2f}x / "
                         f"{p95 / (percentile(baseline, 95) * 1000):.2f}x")
        else:
            cells.append("-")
        return cells

    return (label, str(len(other.reads) + len(other.writes)), str(len(other.failures)),
            *figures(other.reads, idle.reads if idle else None), *figures(other.writes, idle.writes if idle else None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", action="store_true", help="a throwaway PostgreSQL instead of SQLite")
    parser.add_argument("--import-chats", type=int, default=10_000)
    parser.add_argument("--export-chats", type=int, default=20_000)
    parser.add_argument("--idle-rounds", type=int, default=30)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose scripts/serve serves (its .venv)")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-import-")))
        if args.pg:
            database_url, _ = stack.enter_context(load.services(None, None))
        else:
            database_url = f"sqlite:///{folder / 'db.sqlite3'}"
        load.setup_django(database_url)
        from sessions_core import export
        from sessions_core.models import ChatSession

        importer, other, exporter = load.make_clients(3, secrets.token_hex(3))
        began = time.perf_counter()
        owner = ChatSession.objects.get(pk=exporter.session_pk).owner
        export.import_json(document(args.export_chats), owner)
        print(f"{'PostgreSQL' if args.pg else 'SQLite'}: the exporter's {args.export_chats:,} chats stored in "
              f"{time.perf_counter() - began:.1f} s", flush=True)

        server = load.Server(args.tree.resolve(), 1, database_url, "", "http://127.0.0.1:9/v1", None,
                             extra_env={"CHAT_IMPORTS_PER_HOUR": "0", "CHAT_IMPORT_MAX_BYTES": "200000000",
                                        "CHAT_IMPORT_MAX_CHATS": "0", "CHAT_MAX_CHATS_PER_USER": "0"})
        stack.callback(server.stop)
        port = server.port
        others = Other(Browser(port, other.cookie), other.session_id)
        others.rounds(3)  # warm: the first requests of a process load its templates
        idle = Other(Browser(port, other.cookie), other.session_id).rounds(args.idle_rounds)

        data = document(args.import_chats)
        importing, (status, _, import_seconds) = Other(Browser(port, other.cookie), other.session_id).during(
            lambda: upload(Browser(port, importer.cookie), data))
        if status != 302:
            print(f"the import answered {status}", file=sys.stderr)
        exporting, (status, size, export_seconds) = Other(Browser(port, other.cookie), other.session_id).during(
            lambda: Browser(port, exporter.cookie).request("GET", "/export/"))
        if status != 200:
            print(f"the export answered {status}", file=sys.stderr)
        imported = ChatSession.objects.filter(owner_id=importer.user_pk).count() - 1

        print(f"import: {args.import_chats:,} chats ({len(data) / 1e6:.1f} MB) in {import_seconds:.1f} s, "
              f"{imported:,} stored; export: {args.export_chats:,} chats ({size / 1e6:.1f} MB) in "
              f"{export_seconds:.1f} s")
        print("The other user's requests (ms): his chat's page (read), a rename (write); "
              "p50 and p95 against the idle server's")
        print_table([("while", "requests", "failed", "read p50", "read p95", "read max", "read vs idle",
                      "write p50", "write p95", "write max", "write vs idle"),
                     row("idle", idle, None), row(f"import {args.import_chats:,}", importing, idle),
                     row(f"export {args.export_chats:,}", exporting, idle)])
        for label, figures in (("import", importing), ("export", exporting)):
            if figures.failures:
                print(f"{label}: failed requests: {figures.failures[:10]}", file=sys.stderr)


if __name__ == "__main__":
    main()
