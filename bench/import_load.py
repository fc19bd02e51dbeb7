"""Another user's request times while one user imports or exports many chats, against an idle server.

    .venv/bin/python bench/import_load.py            # SQLite: a 10,000-chat import, a 20,000-chat export
    .venv/bin/python bench/import_load.py --pg       # the same on a throwaway PostgreSQL
    .venv/bin/python bench/import_load.py --import-chats 2000 --export-chats 4000   # smaller
    .venv/bin/python bench/import_load.py --tree /path/to/other/checkout   # that checkout's server instead
    .venv/bin/python bench/import_load.py --against /path/to/other/checkout  # both, in turn, in one run
    .venv/bin/python bench/import_load.py --batch-rows 100   # this checkout again with CHAT_IMPORT_BATCH_ROWS=100

The app is served by `scripts/serve` (DEBUG off, one worker, the import rate limit off) on a database of
its own. Three users: the importer, who uploads an export of --import-chats one-run chats (POST /import/,
the file as a browser sends it) and, if it answers with a transfer's page, asks for its status every
second as the page does until it is done; the exporter, who has --export-chats such chats (stored
beforehand) and downloads them all (POST /export/ and its page, then the file; on a checkout without
transfers GET /export/, read to the end); and the other user, who meanwhile opens his chat's page (a
read) and renames it (a write), one request after the other, and records each one's time. The same
requests on the idle server first give the baseline. Every request stays on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import re
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
                timeout: float = 600, keep: bool = False) -> tuple[int, int, float]:
        """(status, bytes read, seconds to the last byte); with `keep`, the body and the Location are kept
        in `self.body` and `self.location`."""
        began = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={**self.headers, **(headers or {})})
            response = connection.getresponse()
            size, kept = 0, []
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if keep:
                    kept.append(chunk)
            self.body, self.location = b"".join(kept).decode(errors="replace"), response.getheader("Location", "")
            return response.status, size, time.perf_counter() - began
        finally:
            connection.close()

    def post(self, path: str, body: bytes, content_type: str, timeout: float = 600) -> tuple[int, int, float]:
        return self.request("POST", path, body, {"Content-Type": content_type, "X-CSRFToken": CSRF,
                                                  "Origin": "https://127.0.0.1", "HX-Request": "true"}, timeout)


def upload(browser: Browser, data: bytes) -> tuple[str, float]:
    """The import from the upload to its end: (its outcome, seconds)."""
    began = time.perf_counter()
    boundary = secrets.token_hex(12)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"chats.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    status, _, _ = browser.post("/import/", body, f"multipart/form-data; boundary={boundary}")
    if status != 302:
        return f"answered {status}", time.perf_counter() - began
    if not browser.location.startswith("/transfers/"):  # a checkout that imports inside the request
        return "done", time.perf_counter() - began
    return follow(browser, browser.location), time.perf_counter() - began


def follow(browser: Browser, page: str) -> str:
    """A transfer's status, asked for every second (the page's htmx request) until it is done or failed."""
    while True:
        status, _, _ = browser.request("GET", page, headers={"HX-Request": "true"}, keep=True)
        if status != 200:
            return f"its page answered {status}"
        if "hx-trigger" not in browser.body:
            return "done" if "form-error" not in browser.body else "failed: " + re.sub(r"<[^>]+>", "", browser.body).strip()
        time.sleep(1)  # the page's own pace (hx-trigger="every 1s")


def download_all(browser: Browser) -> tuple[str, int, float]:
    """The whole export from the click to the last byte: (its outcome, bytes, seconds)."""
    began = time.perf_counter()
    status, _, _ = browser.post("/export/", b"", "application/x-www-form-urlencoded")
    if status == 405:  # a checkout that streams the export from GET /export/
        status, size, _ = browser.request("GET", "/export/")
        return ("done" if status == 200 else f"answered {status}"), size, time.perf_counter() - began
    outcome = follow(browser, browser.location) if status == 302 else f"answered {status}"
    if outcome != "done":
        return outcome, 0, time.perf_counter() - began
    file = re.search(r'href="(/transfers/[^"]+/download/)"', browser.body).group(1)
    status, size, _ = browser.request("GET", file)
    return ("done" if status == 200 else f"download answered {status}"), size, time.perf_counter() - began


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
    parser.add_argument("--against", type=Path, help="another checkout, served too (each phase on both, in turn)")
    parser.add_argument("--nice", type=int, action="append", default=[],
                        help="--tree served again with this CHAT_TRANSFER_NICE (repeatable)")
    parser.add_argument("--batch-rows", type=int, action="append", default=[],
                        help="--tree served again with this CHAT_IMPORT_BATCH_ROWS (repeatable)")
    args = parser.parse_args()
    again = [("CHAT_TRANSFER_NICE", "nice", value) for value in args.nice] + [
        ("CHAT_IMPORT_BATCH_ROWS", "batch rows", value) for value in args.batch_rows]
    setups = ([(args.against.resolve(), {}, str(args.against.resolve()))] if args.against else [])
    setups.append((args.tree.resolve(), {}, str(args.tree.resolve()) if args.against or again else ""))
    setups += [(args.tree.resolve(), {name: str(value)}, f"{args.tree.resolve()} {words} {value}")
               for name, words, value in again]

    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-import-")))
        if args.pg:
            database_url, _ = stack.enter_context(load.services(None, None))
        else:
            database_url = f"sqlite:///{folder / 'db.sqlite3'}"
        load.setup_django(database_url)
        from sessions_core import export
        from sessions_core.models import ChatSession

        clients = load.make_clients(1 + 2 * len(setups), secrets.token_hex(3))
        exporter = clients[0]
        began = time.perf_counter()
        owner = ChatSession.objects.get(pk=exporter.session_pk).owner
        export.import_json(document(args.export_chats), owner)
        print(f"{'PostgreSQL' if args.pg else 'SQLite'}: the exporter's {args.export_chats:,} chats stored in "
              f"{time.perf_counter() - began:.1f} s", flush=True)

        served = []  # per setup: (label, server, importer, other), all on the same database, one busy at a time
        for number, (tree, env, label) in enumerate(setups):
            server = load.Server(tree, 1, database_url, "", "http://127.0.0.1:9/v1", None,
                                 extra_env={"CHAT_IMPORTS_PER_HOUR": "0", "CHAT_IMPORT_MAX_BYTES": "200000000",
                                            "CHAT_IMPORT_MAX_CHATS": "0", "CHAT_MAX_CHATS_PER_USER": "0", **env})
            stack.callback(server.stop)
            served.append((label, server, clients[1 + 2 * number], clients[2 + 2 * number]))
        idle = {}
        for label, server, _, other in served:
            Other(Browser(server.port, other.cookie), other.session_id).rounds(3)  # warm: the first requests load templates
            idle[label] = Other(Browser(server.port, other.cookie), other.session_id).rounds(args.idle_rounds)

        data = document(args.import_chats)
        measured: dict[tuple[str, str], Other] = {}
        server_cpu: dict[tuple[str, str], float] = {}
        # Each phase on every setup in turn, then again in the reverse order (A B B A), so that a load that
        # grows or falls over the run (a shared machine) weighs on every setup alike.
        for phase in ("import", "export"):
            for label, server, importer, other in served + served[::-1]:
                pids = server.pids()  # the server's own processes: not the transfer's, started from it
                cpu = load.cpu_seconds(pids)
                if phase == "import":
                    figures, (outcome, seconds) = Other(Browser(server.port, other.cookie), other.session_id).during(
                        lambda port=server.port, importer=importer: upload(Browser(port, importer.cookie), data))
                    print(f"{label or 'import'}: {args.import_chats:,} chats ({len(data) / 1e6:.1f} MB) {outcome} "
                          f"in {seconds:.1f} s", flush=True)
                else:
                    figures, (outcome, size, seconds) = Other(Browser(server.port, other.cookie), other.session_id).during(
                        lambda port=server.port: download_all(Browser(port, exporter.cookie)))
                    print(f"{label or 'export'}: {args.export_chats:,} chats ({size / 1e6:.1f} MB) {outcome} in "
                          f"{seconds:.1f} s", flush=True)
                key = (label, phase)
                server_cpu[key] = server_cpu.get(key, 0) + load.cpu_seconds(pids) - cpu
                if key in measured:
                    measured[key].reads += figures.reads
                    measured[key].writes += figures.writes
                    measured[key].failures += figures.failures
                else:
                    measured[key] = figures

        print("The other user's requests (ms): his chat's page (read), a rename (write); p50 and p95 against the "
              "idle server's; server CPU: the server process's CPU seconds over both runs of the phase (ms per request of his)")
        rows = [row(f"{label} idle".strip(), idle[label], None) + ("-",) for label, *_ in served]
        for (label, phase), figures in measured.items():
            chats = args.import_chats if phase == "import" else args.export_chats
            requests = len(figures.reads) + len(figures.writes)
            rows.append(row(f"{label} {phase} {chats:,}".strip(), figures, idle[label])
                        + (f"{server_cpu[label, phase]:.1f} ({server_cpu[label, phase] / requests * 1000:.1f})",))
        print_table([("while", "requests", "failed", "read p50", "read p95", "read max", "read vs idle",
                      "write p50", "write p95", "write max", "write vs idle", "server CPU"), *rows])
        for (label, phase), figures in measured.items():
            for failure in figures.failures[:10]:
                print(f"failed request: {label} {phase}: {failure}", file=sys.stderr)


if __name__ == "__main__":
    main()
