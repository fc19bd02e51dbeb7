"""Simulated users chatting over real websockets with the app served as in production.

    .venv/bin/python bench/load.py                               # N = 1, 10, 50, 200 on 1 worker
    .venv/bin/python bench/load.py --workers 1,2                 # and on 2 worker processes
    .venv/bin/python bench/load.py --soak                        # issue 14: 200 clients x 10 turns, then the DB check
    .venv/bin/python bench/load.py --compare /path/to/other/checkout   # that code and this, interleaved
    .venv/bin/python bench/load.py --clients 50 --py-spy PATH    # and a py-spy profile of the wave
    .venv/bin/python bench/load.py --clients 50 --count          # SQL, renders, layer sends, thread hops per message

Setup: throwaway PostgreSQL and Redis servers (as scripts/test starts them; or --pg-url/--redis-url),
the app served by `scripts/serve` (DEBUG off, a local SECRET_KEY, TRUST_PROXY_HEADERS=true as behind a
proxy that ends TLS: with SECURE_SSL_REDIRECT=false its `check --deploy` refuses to start;
WEB_CONCURRENCY=<workers>, the rate limits off), and a local OpenAI-compatible model in a process of
its own (`_support.serve_fake_model`: 200 words at 5 ms apart, short title and summary answers).

Each client is its own user (created in the database beforehand, signed in by a session cookie made
for it), with a new chat (created as the New chat view creates one), and sends over its own websocket.
A wave: every client connects, then all send at once; each records when the first and the last text
frame of the reply arrived and the gaps between text frames, until the run's final form arrives, and
the fake model notes when each reply's request reached it ("to model": the app's work before the model
is called). Fewer
than --min-messages clients make several waves (fresh users and chats each time). Server CPU is the
user+system time of the server's processes (/proc) from the send until they are idle again (titles
and summaries included), per streamed token; RSS is the largest worker's at the end.

`--soak`: --clients (200) clients, each with one chat, each sending --turns (10) messages back to back;
afterwards every message and every run is looked for in the database (0 errors, 0 lost messages).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import _support
from _support import ROOT, percentile

TOKENS = 200
TOKEN_DELAY = 0.005
DONE = re.compile(r'<article id="run-[^"]+" class="run" data-status="(\w+)"')
EMPTY_REPLY = re.compile(r'id="reply-[^"]+">\s*</div>')
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Shared by the server and this process, which signs the clients in (session rows and their auth hashes).
SECRET_KEY = secrets.token_urlsafe(50)
# Where the fake model notes when each reply's request arrived (bench/_support.serve_fake_model).
ARRIVALS = os.path.join(tempfile.gettempdir(), f"bench-arrivals-{os.getpid()}.tsv")


# -- services --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def services(pg_url: str | None, redis_url: str | None):
    """(PostgreSQL URL, Redis URL): the ones given, else throwaway servers started like scripts/test's."""
    folder = Path(tempfile.mkdtemp(prefix="bench-load-"))
    folder.chmod(0o755)  # the postgres user must reach its cluster inside
    stops = []
    try:
        if not pg_url:
            pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]
            data, port = folder / "pg" / "data", free_port()
            data.parent.mkdir()
            shutil.chown(data.parent, "postgres", "postgres")
            as_postgres = ["runuser", "-u", "postgres", "--"]
            subprocess.run([*as_postgres, pgbin / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N",
                            "-E", "UTF8", "--locale=C.UTF-8"], check=True, stdout=subprocess.DEVNULL)
            options = (f"-p {port} -k {data.parent} -c listen_addresses=127.0.0.1 -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off -c max_connections=500")
            subprocess.run([*as_postgres, pgbin / "pg_ctl", "-D", data, "-l", data.parent / "log", "-w", "-o", options,
                            "start"], check=True, stdout=subprocess.DEVNULL)
            stops.append([*as_postgres, pgbin / "pg_ctl", "-D", data, "-m", "immediate", "stop"])
            subprocess.run(["psql", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-c",
                            "CREATE ROLE app LOGIN PASSWORD 'app' SUPERUSER", "-c", "CREATE DATABASE app OWNER app"],
                           check=True)
            pg_url = f"postgres://app:app@127.0.0.1:{port}/app"
        if not redis_url:
            port = free_port()
            subprocess.run(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                            "no", "--daemonize", "yes", "--pidfile", folder / "redis.pid", "--dir", folder],
                           check=True, stdout=subprocess.DEVNULL)
            stops.append(["sh", "-c", f"kill $(cat {folder / 'redis.pid'})"])
            redis_url = f"redis://127.0.0.1:{port}/0"
        yield pg_url, redis_url
    finally:
        for command in stops:
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)


def start_fake_model(tokens: int) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, __file__, "--fake-model", "--tokens", str(tokens)],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "BENCH_ARRIVALS": ARRIVALS})
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}/v1"


def fake_model_main(tokens: int) -> None:
    sys.path.insert(0, str(ROOT))

    def ready(port: int) -> None:
        print(port, flush=True)

    asyncio.run(_support.serve_fake_model(0, tokens, TOKEN_DELAY, ready))


# -- the server ------------------------------------------------------------------------------------


def wait_for_port(process: subprocess.Popen, port: int, name: str, output: Callable[[], str]) -> None:
    """Until `process` listens on `port` (3 minutes at most); its `output()` in the error if it exits first."""
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{output()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{output()}") from None
            time.sleep(0.1)  # polling a port: there is no event to wait on


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 1e6
    return 0.0


class Server:
    """scripts/serve of a checkout (its own code, this machine's services) on a free port."""

    def __init__(self, tree: Path, workers: int, pg_url: str, redis_url: str, model_url: str, batch: float | None,
                 count_file: str = "", extra_env: dict | None = None, layer_capacity: int = 0, cprofile: str = ""):
        self.port = free_port()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("OPENAI_", "CHAT_", "DJANGO_")) and key not in ("DEBUG", "REDIS_URL")}
        env.update(DATABASE_URL=pg_url, REDIS_URL=redis_url, SECRET_KEY=SECRET_KEY,
                   ALLOWED_HOSTS="127.0.0.1", TRUST_PROXY_HEADERS="true", PORT=str(self.port),
                   WEB_CONCURRENCY=str(workers), OPENAI_BASE_URL=model_url, OPENAI_API_KEY="bench",
                   OPENAI_TIMEOUT="120", STATIC_ROOT=str(Path(tempfile.gettempdir()) / f"bench-static-{os.getpid()}"),
                   CHAT_MESSAGES_PER_MINUTE="0", CHAT_RUNS_IN_FLIGHT="0", CHAT_NEW_CHATS_PER_MINUTE="0",
                   PYTHONUNBUFFERED="1")
        if batch is not None:
            env["CHAT_STREAM_BATCH_SECONDS"] = str(batch)
        env.update(extra_env or {})
        if cprofile:  # bench/thread_profile/sitecustomize.py: a pstats file per thread of every server process
            Path(cprofile).mkdir(parents=True, exist_ok=True)
            env["BENCH_CPROFILE"] = str(Path(cprofile).resolve())
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench" / "thread_profile"),
                                                              env.get("PYTHONPATH", "")]))
        if layer_capacity:  # bench/layer_capacity/sitecustomize.py raises channels-redis's capacity in every server process
            env["BENCH_LAYER_CAPACITY"] = str(layer_capacity)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "bench" / "layer_capacity"),
                                                              env.get("PYTHONPATH", "")]))
        command = ["bash", "scripts/serve"]
        if count_file:  # the counting entry point (bench/counting.py) instead of the plain one, after serve's steps
            env["BENCH_COUNT_FILE"] = count_file
            env["PYTHONPATH"] = str(tree)
            subprocess.run(["bash", "-c", 'source scripts/bootstrap.sh && export DEBUG=false && '
                            '"$VPY" manage.py migrate --no-input -v0 && "$VPY" manage.py collectstatic --no-input -v0'],
                           cwd=tree, env=env, check=True)
            command = [str(tree / ".venv/bin/python"), str(ROOT / "bench" / "counting.py"), "-b", "127.0.0.1",
                       "-p", str(self.port), "chatapp.asgi:application"]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-server-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(command, cwd=tree, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        wait_for_port(self.process, self.port, f"{tree}: scripts/serve", self.output)  # after its checks
        # The worker processes come up after the port opens (a master binds it first).
        time.sleep(1.0 if workers > 1 else 0)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def pids(self) -> list[int]:
        return descendants(self.process.pid)

    def workers(self) -> list[int]:
        """The processes that serve (the leaves of the tree: daphne itself, or a master's workers)."""
        pids = self.pids()
        parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                   for pid in pids if Path(f"/proc/{pid}").exists()}
        return [pid for pid in pids if pid not in parents] or pids

    def cpu(self) -> float:
        return cpu_seconds(self.pids())

    def wait_quiet(self, limit: float = 15.0) -> None:
        """Until the server's processes use under 2% of a core over 200 ms (titles, summaries finished)."""
        deadline = time.monotonic() + limit
        before = self.cpu()
        while time.monotonic() < deadline:
            time.sleep(0.2)  # sampling CPU time: there is no event to wait on
            now = self.cpu()
            if now - before < 0.004:
                return
            before = now

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


# -- users and chats -------------------------------------------------------------------------------


def setup_django(pg_url: str) -> None:
    os.environ.update(DATABASE_URL=pg_url, DJANGO_SETTINGS_MODULE="chatapp.settings", DEBUG="false",
                      SECRET_KEY=SECRET_KEY, ALLOWED_HOSTS="127.0.0.1")
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@dataclass
class Client:
    user_pk: int
    cookie: str
    session_id: str
    session_pk: int


MEMORIES = True  # --memories-off: the users have turned user memories off (no memory manager call per message)


def make_clients(count: int, label: str) -> list[Client]:
    """`count` users, each signed in (a session row and its cookie) with a new chat of the general assistant."""
    from chatapp.assistants import get_assistant
    from sessions_core.models import ChatSession, UserMemoryOptOut

    assistant = get_assistant("general")
    clients = []
    users = signed_in_users(count, label)
    if not MEMORIES:
        UserMemoryOptOut.objects.bulk_create([UserMemoryOptOut(user=user) for user, _ in users])
    for user, cookie in users:
        chat = ChatSession.objects.new(owner=user, component_id="general", kind=assistant.kind,
                                       metadata=assistant.metadata)
        chat.apply_state_change(assistant.session_state, "defaults")
        clients.append(Client(user.pk, cookie, chat.session_id, chat.pk))
    return clients


def signed_in_users(count: int, label: str) -> list[tuple[object, str]]:
    """`count` new users, each with a signed-in session: (user, its session cookie)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.auth.hashers import make_password
    from django.contrib.sessions.backends.db import SessionStore

    User = get_user_model()
    password = make_password("bench-password")
    users = User.objects.bulk_create([User(username=f"load-{label}-{number}", password=password)
                                      for number in range(count)])
    signed_in = []
    for user in users:
        store = SessionStore()
        store.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                      HASH_SESSION_KEY: user.get_session_auth_hash()})
        store.create()
        signed_in.append((user, store.session_key))
    return signed_in


def check_stored(clients: list[Client], turns: int) -> tuple[int, int]:
    """(messages missing, runs not completed): each chat must hold `turns` completed runs, each with its
    user message and its reply."""
    from django.db.models import Count, Q

    from sessions_core.models import Message, Run, RunStatus

    pks = [client.session_pk for client in clients]
    runs = dict(Run.objects.filter(session_id__in=pks, parent_run__isnull=True, status=RunStatus.COMPLETED)
                .values_list("session_id").annotate(Count("pk")))
    messages = Message.objects.filter(session_id__in=pks).values("session_id").annotate(
        user=Count("pk", filter=Q(role="user")), reply=Count("pk", filter=Q(role="assistant", content__gt="")))
    found = {row["session_id"]: row for row in messages}
    lost = sum(max(0, turns - found.get(pk, {}).get("user", 0)) + max(0, turns - found.get(pk, {}).get("reply", 0))
               for pk in pks)
    missing_runs = sum(max(0, turns - runs.get(pk, 0)) for pk in pks)
    return lost, missing_runs


# -- the clients -----------------------------------------------------------------------------------


@dataclass
class Turn:
    sent_at: float = math.nan  # wall clock at the send
    text: str = ""  # the message sent
    to_model: float = math.nan  # seconds from the send to its reply's request reaching the model
    first: float = math.nan  # seconds from the send to the first text frame
    last: float = math.nan  # ...to the last one
    gaps: list[float] = field(default_factory=list)  # between text frames
    frames: int = 0
    error: str = ""
    seen: str = ""  # the end of the last frame received (shown when a reply never ends)
    trace: list[str] = field(default_factory=list)


async def load_page(client: Client, port: int) -> int:
    """GET the chat's page as a browser would (behind the proxy that ends TLS); returns its size in bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write((f"GET /s/{client.session_id}/ HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: sessionid={client.cookie}"
                      "\r\nX-Forwarded-Proto: https\r\nAccept: text/html\r\nConnection: close\r\n\r\n").encode())
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
    status = response.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"the chat page answered {status.decode()}")
    return len(response.partition(b"\r\n\r\n")[2])


async def read_reply(ws, turn: Turn, sent: float, timeout: float) -> None:
    """Read the socket's frames until the run's final form: the first and last text frame (seconds from
    `sent`, a perf_counter reading) and the gaps between them into `turn`, or its error."""
    previous = None
    async with asyncio.timeout(timeout):
        while True:
            frame = await ws.recv()
            turn.seen = frame[-300:]
            if os.environ.get("BENCH_TRACE"):
                at = (time.perf_counter() - sent) * 1000  # ms from the send, the frame's length, its start
                turn.trace.append(f"{at:7.1f} {len(frame):6d} " + frame[:110].replace("\n", " "))
            now = time.perf_counter()
            match = DONE.search(frame)
            # A batch of the reply, or the run so far in one fragment (a socket that fell behind
            # is sent that instead of the batches it missed: docs/web.md, "Nothing dropped"); not the
            # run's start, whose reply is still empty.
            if "data-stream-run=" in frame or "#reply-" in frame or (
                    match and match.group(1) == "running" and not EMPTY_REPLY.search(frame)):
                if previous is None:
                    turn.first = now - sent
                else:
                    turn.gaps.append(now - previous)
                previous, turn.last = now, now - sent
                turn.frames += 1
            if match and match.group(1) != "running":
                if match.group(1) != "completed":
                    turn.error = f"run {match.group(1)}"
                elif previous is None:
                    turn.error = "no text frame"
                return
            if 'class="status-error"' in frame:
                turn.error = re.sub(r"<[^>]+>", "", frame)[:200]
                return


async def chat(client: Client, port: int, turns: int, start: asyncio.Barrier, timeout: float,
               page: bool = False) -> list[Turn]:
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/sessions/{client.session_id}/?last_run="
    done: list[Turn] = []
    waited = False
    try:
        if page:  # the page first, then its socket, as a tab opens a chat
            await load_page(client, port)
        async with websockets.connect(url, origin=f"http://127.0.0.1:{port}", max_size=None, open_timeout=120,
                                      ping_interval=None, compression=None,
                                      additional_headers={"Cookie": f"sessionid={client.cookie}"}) as ws:
            waited = True
            await start.wait()
            for number in range(turns):
                turn = Turn()
                done.append(turn)
                turn.text = f"Tell me about load, part {number + 1} ({client.session_pk})."
                sent, turn.sent_at = time.perf_counter(), time.time()
                await ws.send(json.dumps({"type": "send", "text": turn.text}))
                await read_reply(ws, turn, sent, timeout)
    except Exception as exc:  # noqa: BLE001 - a client's failure is a figure, not the end of the bench
        if not waited:  # it never connected: the others must not wait for it
            await start.wait()
        if not done or done[-1].error:
            done.append(Turn())
        done[-1].error = f"{type(exc).__name__}: {exc}"[:200] + (f" (last frame: ...{done[-1].seen})" if done else "")
    while len(done) < turns:
        done.append(Turn(error="not sent"))
    return done


async def wave(clients: list[Client], port: int, turns: int, timeout: float, page: bool = False) -> list[Turn]:
    start = asyncio.Barrier(len(clients))
    results = await asyncio.gather(*(chat(client, port, turns, start, timeout, page) for client in clients))
    return [turn for turns_of_one in results for turn in turns_of_one]


# -- one measurement -------------------------------------------------------------------------------


@dataclass
class Figures:
    label: str
    clients: int
    messages: int = 0
    turns: list[Turn] = field(default_factory=list)
    cpu: float = 0.0
    rss: float = 0.0
    lost: int = -1
    missing_runs: int = -1
    counts: dict = field(default_factory=dict)
    tokens: int = TOKENS  # streamed per reply

    def row(self) -> tuple[str, ...]:
        good = [turn for turn in self.turns if not turn.error]
        first = [turn.first * 1000 for turn in good]
        to_model = [turn.to_model * 1000 for turn in good if not math.isnan(turn.to_model)]
        last = [turn.last * 1000 for turn in good]
        gaps = [gap * 1000 for turn in good for gap in turn.gaps]

        def pct(values, p):
            return f"{percentile(values, p):,.0f}" if values else "-"

        errors = len(self.turns) - len(good)
        tokens = self.tokens * len(good)
        return (self.label, str(self.clients), str(len(self.turns)), pct(to_model, 50), pct(to_model, 99),
                pct(first, 50), pct(first, 99), pct(gaps, 99),
                pct(last, 50), pct(last, 99), str(errors),
                f"{self.cpu / tokens * 1e6:,.0f}" if tokens else "-", f"{self.cpu * 1000 / max(1, len(good)):,.1f}",
                f"{self.rss:,.0f}")


HEADER = ("code", "N", "messages", "to model p50 ms", "to model p99", "first p50", "first p99", "gap p99", "last p50",
          "last p99", "errors",
          "CPU us/token", "CPU ms/message", "RSS MB")


def measure(server: Server, label: str, clients: int, waves: int, turns: int, timeout: float,
            py_spy: str = "", count_file: str = "", page: bool = False) -> Figures:
    figures = Figures(label, clients)
    asyncio.run(wave(make_clients(2, f"{label}-warm-{secrets.token_hex(3)}"), server.port, 1, timeout))  # not counted
    server.wait_quiet()
    for number in range(waves):
        batch = make_clients(clients, f"{label}-{clients}-{number}-{secrets.token_hex(3)}")
        counts_before = read_counts(count_file)
        before = server.cpu()
        spy = None
        if py_spy:
            spy = subprocess.Popen([py_spy, "record", "--pid", str(server.workers()[0]), "--rate", "250", "--format",
                                    "raw", "--output", f"{label}-{clients}-{number}.pyspy.txt", "--nonblocking", "--gil"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        turns_done = asyncio.run(wave(batch, server.port, turns, timeout, page))
        server.wait_quiet()
        arrived = read_arrivals()
        for turn in turns_done:
            turn.to_model = arrived.get(turn.text, math.nan) - turn.sent_at
        figures.cpu += server.cpu() - before
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        counts_after = read_counts(count_file)
        for key, value in counts_after.items():
            figures.counts[key] = figures.counts.get(key, 0) + value - counts_before.get(key, 0)
        figures.turns += turns_done
        if turns > 1 or number == waves - 1:
            lost, missing = check_stored(batch, turns)
            figures.lost = max(0, figures.lost) + lost
            figures.missing_runs = max(0, figures.missing_runs) + missing
    figures.rss = max(rss_mb(pid) for pid in server.workers())
    return figures


def read_arrivals() -> dict[str, float]:
    """When each message's reply request reached the fake model (the first, by the message's text)."""
    arrived = {}
    with contextlib.suppress(OSError):
        for line in Path(ARRIVALS).read_text().splitlines():
            at, _, said = line.partition("\t")
            arrived.setdefault(json.loads(said), float(at))
    return arrived


def read_counts(path: str) -> dict:
    if not path:
        return {}
    time.sleep(0.3)  # the counting server writes its file every 0.1 s
    with contextlib.suppress(OSError, ValueError):
        return json.loads(Path(path).read_text())
    return {}


# -- the command -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", default="", help="comma-separated N (default 1,10,50,200; --soak: 200)")
    parser.add_argument("--workers", default="1", help="comma-separated worker counts (WEB_CONCURRENCY)")
    parser.add_argument("--cprofile", default="", metavar="DIR",
                        help="a cProfile file per thread of each served process, in DIR/<code>-x<workers>-<N>/")
    parser.add_argument("--page", action="store_true",
                        help="each client loads its chat's page before its socket (in the CPU figures)")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="words in each streamed reply (default 200)")
    parser.add_argument("--soak", action="store_true", help="issue 14: each client sends --turns messages")
    parser.add_argument("--turns", type=int, default=0, help="messages per client (default 1; --soak: 10)")
    parser.add_argument("--min-messages", type=int, default=20, help="waves until this many messages per N")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every (code, workers, N) this many times")
    parser.add_argument("--compare", action="append", default=[], help="another checkout, served in turn with this")
    parser.add_argument("--batch", type=float, default=None, help="CHAT_STREAM_BATCH_SECONDS for the server")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", ""))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a reply may take")
    parser.add_argument("--py-spy", default="", help="the py-spy binary: record the first worker during each wave")
    parser.add_argument("--memories-off", action="store_true",
                        help="the users have turned user memories off (the general assistant learns them otherwise)")
    parser.add_argument("--count", action="store_true", help="serve through bench/counting.py: counts per message")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a setting for the server")
    parser.add_argument("--layer-capacity", type=int, default=0,
                        help="channels-redis's capacity in the server (default 100: one per process, shared by its sockets)")
    args = parser.parse_args()
    global MEMORIES
    MEMORIES = not args.memories_off
    if args.fake_model:
        fake_model_main(args.tokens)
        return
    turns = args.turns or (10 if args.soak else 1)
    clients = [int(n) for n in (args.clients or ("200" if args.soak else "1,10,50,200")).split(",")]
    workers = [int(n) for n in args.workers.split(",")]
    trees = [(Path(tree).resolve().name, Path(tree).resolve()) for tree in args.compare] + [("this", ROOT)]
    if any(n > 1 for n in workers):
        for _, tree in trees:
            if "WEB_CONCURRENCY" not in (tree / "scripts" / "serve").read_text():
                sys.exit(f"{tree}/scripts/serve does not know WEB_CONCURRENCY: measure 1 worker there")
    model, model_url = start_fake_model(args.tokens)
    rows, soak = [HEADER], []
    try:
        with services(args.pg_url, args.redis_url) as (pg_url, redis_url):
            setup_django(pg_url)
            for round_number in range(args.rounds):
                for count in workers:
                    for n in clients:
                        for label, tree in trees:  # interleaved: each N on every checkout in turn
                            count_file = tempfile.mktemp(prefix="bench-counts-") if args.count else ""
                            server = Server(tree, count, pg_url, redis_url, model_url, args.batch, count_file,
                                            dict(item.split("=", 1) for item in args.env), args.layer_capacity,
                                            args.cprofile and f"{args.cprofile}/{label}-x{count}-{n}")
                            try:
                                waves = 1 if args.soak else max(1, math.ceil(args.min_messages / n))
                                name = f"{label} x{count}"
                                figures = measure(server, name, n, waves, turns, args.timeout, args.py_spy, count_file,
                                                  args.page)
                                figures.tokens = args.tokens
                                if any(turn.error for turn in figures.turns):
                                    print(f"  the server's log ends:\n{server.output()[-3000:]}")
                            finally:
                                server.stop()
                            rows.append(figures.row())
                            print(" | ".join(figures.row()), f"| lost {figures.lost} runs missing {figures.missing_runs}",
                                  flush=True)
                            if figures.counts:
                                messages = max(1, len([t for t in figures.turns if not t.error]))
                                print("  per message: " + ", ".join(
                                    f"{key} {value / messages:.1f}" for key, value in sorted(figures.counts.items())
                                    if " <- " not in key))
                                for key, value in sorted(figures.counts.items(), key=lambda item: -item[1]):
                                    if " <- " in key and value / messages >= 0.5:
                                        print(f"    {value / messages:5.1f} {key}")
                            errors = [turn.error for turn in figures.turns if turn.error]
                            if errors:
                                print("  errors (first 3):", errors[:3])
                                if os.environ.get("BENCH_TRACE"):
                                    bad = next(turn for turn in figures.turns if turn.error)
                                    print("\n".join(f for f in bad.trace if "#reply-" not in f))
                            soak.append(figures)
    finally:
        model.terminate()
        model.wait()
        with contextlib.suppress(OSError):
            os.remove(ARRIVALS)
    print()
    _support.print_table(rows)
    print()
    for figures in soak:
        print(f"{figures.label} N={figures.clients} turns={turns}: {len(figures.turns)} messages, "
              f"errors {sum(1 for t in figures.turns if t.error)}, lost messages {figures.lost}, "
              f"runs not stored as completed {figures.missing_runs}, server CPU {figures.cpu:.1f} s")
    print(_support.load_line())


if __name__ == "__main__":
    main()
