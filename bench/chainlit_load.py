"""This app and Chainlit side by side: the same waves of simulated users against both, alternating in one
run, and the ratios.

    .venv/bin/python bench/chainlit_load.py                        # N = 1, 50, 200; SQLite x1, PostgreSQL + Redis x1 and x2
    .venv/bin/python bench/chainlit_load.py --clients 1,50 --setups sqlite    # a quicker look

Chainlit (CHAINLIT, pinned) is installed once in a throwaway virtual environment outside the repo
(--chainlit-venv; made with uv when missing, as bench/engine.py's --agno venv is by hand), and serves
bench/chainlit_app.py (AsyncOpenAI, `stream_token` per delta, no data layer) with `chainlit run` in a
process of its own; bench/chainlit_client.py drives it over its socket.io protocol from that venv's
Python. This app is served as bench/load.py serves it (scripts/serve, DEBUG off, the rate limits off), on
SQLite with the in-memory channel layer, or on PostgreSQL + Redis with one or two workers. Both stacks
talk to the same fake model (`_support.serve_fake_model`: 200 words, one every 5 ms).

A wave of N: N new chats started at once, then (once both servers are quiet) a message in each of those
now open chats, at once. This app's new chat is what the page does: the landing page is open with its
socket (its GET and the socket's connect not timed), then the first message sent on that socket, which
makes the chat and streams the reply there, timed from the send. Chainlit's new chat is its page's socket
connected (not timed: Chainlit has no page of its own per chat and no request before the first message)
and the first message sent on it. On both, the wave's first messages go TYPING_SECONDS (0.2) after its
last socket opened, as a person types once the page is open. The stacks take turns wave by wave (the first
place alternating), with fresh users and chats each wave; fewer than --min-messages clients make more waves.
`--assistant notes` starts this app's chats on an assistant that makes no summary and learns no memories
(a title is still asked for); `--env NAME=VALUE` sets a setting of this app's server; BENCH_TRACE=1 prints
each new chat's frames with their ms from the send.

Printed per setup, N and kind of chat: first word p50/p99 and last word p99 (ms from the send), server
CPU per streamed word (user+system time of the server's processes from the send until they are idle
again: for this app titles and summaries included), errors (replies that did not end, or did not carry
every word), lost (this app: messages or completed runs missing from the database afterwards; Chainlit
stores nothing), the clients' own CPU per word, then the ratios this app / Chainlit; after each N, when
this app's new chats reached the model and their first word.
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import _support
import load
from _support import ROOT, percentile
from load import Server, Turn

CHAINLIT = "chainlit==2.12.0"
HERE = Path(__file__).resolve().parent
SETUPS = {"sqlite": ("SQLite", 1), "pg": ("PostgreSQL + Redis", 1), "pg2": ("PostgreSQL + Redis", 2)}


# -- Chainlit: its venv, its server, its clients ---------------------------------------------------


def chainlit_python(venv: Path) -> Path:
    """The throwaway venv's Python, with CHAINLIT and the socket.io client installed there first if missing."""
    python = venv / "bin" / "python"
    if (venv / "bin" / "chainlit").exists():
        return python
    uv = shutil.which("uv") or next((str(path) for path in (ROOT / ".ci-tools/bin/uv",
                                                             ROOT.parent / "main/.ci-tools/bin/uv") if path.exists()), "")
    if not uv:
        sys.exit("uv is needed to make the Chainlit venv (pip install uv), or give --chainlit-venv an existing one")
    subprocess.run([uv, "venv", str(venv), "--python", sys.executable], check=True)
    subprocess.run([uv, "pip", "install", CHAINLIT, "openai", "aiohttp", "python-socketio"], check=True,
                   env={**os.environ, "VIRTUAL_ENV": str(venv)})
    return python


class ChainlitServer(Server):
    """`chainlit run bench/chainlit_app.py` on a free port, in a folder of its own (its config is made there)."""

    def __init__(self, venv: Path, model_url: str):  # noqa: D107 - Server's methods, another start
        self.port = load.free_port()
        self.folder = tempfile.mkdtemp(prefix="bench-chainlit-")
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-chainlit-", suffix=".log")  # noqa: SIM115
        env = {key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "CHAINLIT_"))}
        env.update(OPENAI_BASE_URL=model_url, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([str(venv / "bin" / "chainlit"), "run", str(HERE / "chainlit_app.py"),
                                         "--headless", "--host", "127.0.0.1", "--port", str(self.port)],
                                        cwd=self.folder, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        load.wait_for_port(self.process, self.port, "chainlit run", self.output)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class ChainlitChats:
    """bench/chainlit_client.py in the Chainlit venv: one JSON line of turns per command."""

    def __init__(self, python: Path, port: int, tokens: int, timeout: float):
        self.client = subprocess.Popen([str(python), str(HERE / "chainlit_client.py"), str(port), str(tokens),
                                        str(timeout), str(TYPING_SECONDS)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> list[Turn]:
        self.client.stdin.write(command + "\n")
        self.client.stdin.flush()
        line = self.client.stdout.readline()
        if not line:
            raise RuntimeError("the Chainlit client exited")
        turns = []
        for row in json.loads(line):
            turn = Turn(error=row["error"], text=row.get("text", ""), sent_at=row.get("sent_at", math.nan))
            if not turn.error:
                turn.first, turn.last, turn.gaps = row["first"], row["last"], row["gaps"]
            turns.append(turn)
        return turns

    def new(self, count: int) -> list[Turn]:
        return self.ask(f"new {count}")

    def open(self) -> list[Turn]:
        return self.ask("open")

    def cpu(self) -> float:
        return load.cpu_seconds([self.client.pid])

    def close(self) -> tuple[int, int]:
        self.ask("close")
        return -1, -1  # nothing stored to check

    def stop(self) -> None:
        self.client.stdin.close()
        self.client.wait(30)


# -- this app: users made by a child process, chats started as the page starts them ----------------


def django_child(db_url: str, command: dict) -> object:
    """`command` run by a child process set up on the database at `db_url` (this process may serve
    several databases in one run; Django is set up once per process)."""
    done = subprocess.run([sys.executable, __file__, "--django-child", db_url], input=json.dumps(command),
                          stdout=subprocess.PIPE, text=True, check=True, env={**os.environ, "BENCH_SECRET_KEY": load.SECRET_KEY})
    return json.loads(done.stdout.strip().splitlines()[-1])


def django_child_main(db_url: str) -> None:
    load.SECRET_KEY = os.environ["BENCH_SECRET_KEY"]  # the server's, which signs the sessions' auth hashes
    load.setup_django(db_url)
    command = json.loads(sys.stdin.read())
    if "users" in command:
        result = [cookie for _user, cookie in load.signed_in_users(*command["users"])]
    else:
        from sessions_core.models import ChatSession

        ids, turns = command["check"]
        pks = dict(ChatSession.objects.filter(session_id__in=ids).values_list("session_id", "pk"))
        stored = [load.Client(0, "", session_id, pks[session_id]) for session_id in ids if session_id in pks]
        lost, missing = load.check_stored(stored, turns)
        result = [lost + 2 * turns * (len(ids) - len(stored)), missing + turns * (len(ids) - len(stored))]
    print(json.dumps(result))


async def request(port: int, method: str, path: str, cookies: dict[str, str], form: dict | None = None
                  ) -> tuple[int, str, str]:
    """One HTTP/1.1 request as a browser behind the proxy that ends TLS sends it: (status, the cookies and
    Location it set, as raw header text, the body)."""
    body = urlencode(form).encode() if form is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Proto: https\r\nAccept: text/html\r\n"
            f"Cookie: {'; '.join(f'{name}={value}' for name, value in cookies.items())}\r\nConnection: close\r\n")
    if form is not None:
        head += ("Content-Type: application/x-www-form-urlencoded\r\nOrigin: https://127.0.0.1\r\n"
                 f"Referer: https://127.0.0.1{path}\r\nContent-Length: {len(body)}\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
    headers, _, content = response.partition(b"\r\n\r\n")
    return int(headers.split(b" ", 2)[1]), headers.decode("latin-1"), content.decode("utf-8", "replace")


STAGES = ("to_model", "first")
# Between the last socket's connect and the first messages of a wave of new chats, on both stacks: nobody sends
# the moment the page opens, and channels-redis's receiving loop, idle while its process has no subscription,
# looks for messages every 0.1 s until the first one, which would add up to 100 ms that no person meets.
TYPING_SECONDS = 0.2
CHAT_HEADER = re.compile(r'id="chat-header" data-session-id="([^"]+)"')


class NoteChat:
    """The landing's socket, noting the chat's id from the header that turns the landing into the chat's page."""

    def __init__(self, ws, chat: "OurChat"):
        self.ws, self.chat = ws, chat

    async def recv(self) -> str:
        frame = await self.ws.recv()
        if not self.chat.session_id and (match := CHAT_HEADER.search(frame)):
            self.chat.session_id = match.group(1)
        return frame


class OurChat:
    def __init__(self, cookie: str, number: int, assistant: str):
        self.cookies = {"sessionid": cookie}
        self.number, self.assistant, self.session_id, self.ws = number, assistant, "", None

    async def new(self, port: int, start: asyncio.Barrier, timeout: float) -> Turn:
        import websockets

        turn = Turn(text=f"Tell me about load, a new chat ({self.cookies['sessionid'][:12]}).")
        waited = False
        try:
            status, _, _ = await request(port, "GET", "/new/", self.cookies)  # the landing, open already...
            if status != 200:
                raise RuntimeError(f"the landing page answered {status}")
            cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
            self.ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws/new/",  # ...with its socket
                                               origin=f"http://127.0.0.1:{port}", max_size=None, open_timeout=120,
                                               ping_interval=None, compression=None,
                                               additional_headers={"Cookie": cookie})
            waited = True
            await start.wait()
            await asyncio.sleep(TYPING_SECONDS)  # a person types once the page is open (as the Chainlit clients do)
            sent, turn.sent_at = time.perf_counter(), time.time()
            await self.ws.send(json.dumps({"type": "send", "assistant": self.assistant, "text": turn.text}))
            await load.read_reply(NoteChat(self.ws, self), turn, sent, timeout)
            if not self.session_id and not turn.error:
                turn.error = "no chat header"
        except Exception as exc:  # noqa: BLE001 - a client's failure is a figure, not the end of the bench
            if not waited:
                await start.wait()
            turn.error = f"{type(exc).__name__}: {exc}"[:200]
        return turn

    async def again(self, timeout: float) -> Turn:
        turn = Turn(text=f"Tell me about load, an open chat ({self.session_id}).")
        if self.ws is None:
            return Turn(error="no open chat")
        try:
            sent, turn.sent_at = time.perf_counter(), time.time()
            await self.ws.send(json.dumps({"type": "send", "text": turn.text}))
            await load.read_reply(self.ws, turn, sent, timeout)
        except Exception as exc:  # noqa: BLE001
            turn.error = f"{type(exc).__name__}: {exc}"[:200]
        return turn


class OurChats:
    """This app's side of a wave, on one event loop kept across the wave's steps (the sockets stay open)."""

    def __init__(self, server: Server, db_url: str, timeout: float, assistant: str):
        self.server, self.db_url, self.timeout, self.assistant = server, db_url, timeout, assistant
        self.loop = asyncio.Runner()
        self.chats: list[OurChat] = []
        self.cookies: list[str] = []

    def sign_in(self, count: int) -> None:
        """Users for the waves to come, made beforehand (one child process per N, not per wave)."""
        self.cookies = django_child(self.db_url, {"users": [count, f"cl-{secrets.token_hex(4)}"]})

    def new(self, count: int) -> list[Turn]:
        cookies, self.cookies = self.cookies[:count], self.cookies[count:]
        if len(cookies) < count:
            cookies += django_child(self.db_url, {"users": [count - len(cookies), f"cl-{secrets.token_hex(4)}"]})
        self.chats = [OurChat(cookie, number, self.assistant) for number, cookie in enumerate(cookies)]

        async def all_at_once():
            start = asyncio.Barrier(count)
            return await asyncio.gather(*(chat.new(self.server.port, start, self.timeout) for chat in self.chats))

        return self.loop.run(all_at_once())

    def open(self) -> list[Turn]:
        async def all_at_once():
            return await asyncio.gather(*(chat.again(self.timeout) for chat in self.chats))

        return self.loop.run(all_at_once())

    def cpu(self) -> float:
        return time.process_time()

    def close(self) -> tuple[int, int]:
        async def close_all():
            await asyncio.gather(*(chat.ws.close() for chat in self.chats if chat.ws is not None))

        self.loop.run(close_all())
        ids = [chat.session_id for chat in self.chats if chat.session_id]
        lost, missing = django_child(self.db_url, {"check": [ids, 2]})
        return lost, missing

    def stop(self) -> None:
        self.loop.close()


# -- the run ---------------------------------------------------------------------------------------


class Tally:
    def __init__(self):
        self.turns: list[Turn] = []
        self.cpu = 0.0
        self.client_cpu = 0.0
        self.lost = -1


def wave(chats, server: Server, count: int, tallies: dict[str, Tally], arrivals, py_spy: str = "") -> None:
    """One wave on one stack: N new chats at once, then a message in each of them at once; with `py_spy`
    (the binary and the output file's name, tab-separated), a profile of the server's first process
    during the new chats."""
    for kind in ("new chat", "open chat"):
        server.wait_quiet()
        spy = None
        if py_spy and kind == "new chat":
            binary, output = py_spy.split("\t")
            spy = subprocess.Popen([binary, "record", "--pid", str(server.workers()[0]), "--rate", "250", "--format",
                                    "raw", "--output", output, "--nonblocking", "--gil"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        before, client_before = server.cpu(), chats.cpu()
        turns = chats.new(count) if kind == "new chat" else chats.open()
        tallies[kind].client_cpu += chats.cpu() - client_before
        server.wait_quiet()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        tallies[kind].cpu += server.cpu() - before
        arrived = arrivals()
        for turn in turns:
            turn.to_model = arrived.get(turn.text, math.nan) - turn.sent_at
            if os.environ.get("BENCH_TRACE") and turn.trace:
                print(f"TRACE {kind} to_model {turn.to_model * 1000:.1f} first {turn.first * 1000:.1f}")
                print("\n".join(turn.trace[:12]))
        tallies[kind].turns += turns
    lost, missing = chats.close()
    if lost >= 0:  # the chats' two messages, counted in both rows
        for tally in tallies.values():
            tally.lost = max(0, tally.lost) + lost + missing


def figures(tally: Tally, tokens: int) -> dict[str, float]:
    good = [turn for turn in tally.turns if not turn.error]

    def pct(values, p):
        return percentile(values, p) if values else math.nan

    first = [turn.first * 1000 for turn in good]
    to_model = [turn.to_model * 1000 for turn in good if not math.isnan(turn.to_model)]
    return {"messages": len(tally.turns), "to model p50": pct(to_model, 50), "first p50": pct(first, 50),
            "first p99": pct(first, 99), "last p99": pct([turn.last * 1000 for turn in good], 99),
            "errors": len(tally.turns) - len(good), "lost": tally.lost,
            "CPU us/word": tally.cpu / (tokens * len(good)) * 1e6 if good else math.nan,
            "client CPU us/word": tally.client_cpu / (tokens * len(good)) * 1e6 if good else math.nan}


def cell(value: float, ratio: bool = False) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.2f}" if ratio else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--django-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--clients", default="1,50,200", help="comma-separated N (default 1,50,200)")
    parser.add_argument("--setups", default="sqlite,pg,pg2",
                        help="this app's setups, comma-separated: sqlite (1 worker, in-memory layer), pg (PostgreSQL + "
                             "Redis, 1 worker), pg2 (the same, 2 workers); default all three")
    parser.add_argument("--min-messages", type=int, default=20, help="waves until this many messages per N and kind")
    parser.add_argument("--tokens", type=int, default=load.TOKENS, help="words in each streamed reply (default 200)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a reply may take")
    parser.add_argument("--chainlit-venv", type=Path, default=Path(tempfile.gettempdir()) / f"bench-{CHAINLIT.replace('==', '-')}",
                        help="the throwaway venv with Chainlit (made when missing; default under the temp folder)")
    parser.add_argument("--py-spy", default="", metavar="PATH",
                        help="the py-spy binary: a profile (collapsed stacks, --gil) of this app's first server process "
                             "during each wave of new chats of N > 1, in <setup>-<N>-<wave>.pyspy.txt")
    parser.add_argument("--assistant", default="general",
                        help="the assistant of this app's chats (default general: a summary after each reply, the "
                             "user's memories and a title, each a model call; notes: a title only)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for this app's server, such as CHAT_DB_THREADS=0 (repeatable)")
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", ""))
    args = parser.parse_args()
    if args.django_child:
        django_child_main(args.django_child)
        return
    counts = [int(n) for n in args.clients.split(",")]
    setups = args.setups.split(",")
    if unknown := set(setups) - set(SETUPS):
        sys.exit(f"--setups: unknown {', '.join(sorted(unknown))} (known: {', '.join(SETUPS)})")
    python = chainlit_python(args.chainlit_venv.resolve())
    model, model_url = load.start_fake_model(args.tokens)
    results = []  # (setup, N, kind, ours, Chainlit's)
    folder = Path(tempfile.mkdtemp(prefix="bench-chainlit-load-"))
    try:
        with contextlib.ExitStack() as stack:
            pg_url = redis_url = ""
            if any(setup != "sqlite" for setup in setups):
                pg_url, redis_url = stack.enter_context(load.services(args.pg_url, args.redis_url))
            for setup in setups:
                database, workers = SETUPS[setup]
                db_url = f"sqlite:///{folder / f'{setup}.sqlite3'}" if setup == "sqlite" else pg_url
                ours = Server(ROOT, workers, db_url, redis_url if setup != "sqlite" else "", model_url, None,
                              extra_env=dict(pair.split("=", 1) for pair in args.env))
                theirs = ChainlitServer(args.chainlit_venv.resolve(), model_url)
                stacks = {"this app": (OurChats(ours, db_url, args.timeout, args.assistant), ours),
                          "Chainlit": (ChainlitChats(python, theirs.port, args.tokens, args.timeout), theirs)}
                label = f"{database}, {workers} worker{'s' if workers > 1 else ''}"
                try:
                    for chats, server in stacks.values():  # warm up, not counted
                        wave(chats, server, 2, {"new chat": Tally(), "open chat": Tally()}, load.read_arrivals)
                    for count in counts:
                        waves = max(1, math.ceil(args.min_messages / count))
                        stacks["this app"][0].sign_in(count * waves)
                        tallies = {name: {"new chat": Tally(), "open chat": Tally()} for name in stacks}
                        names = list(stacks)
                        for number in range(waves):  # the stacks take turns, the first place alternating
                            for name in names[number % 2:] + names[:number % 2]:
                                chats, server = stacks[name]
                                spy = (f"{args.py_spy}\t{setup}-{count}-{number}.pyspy.txt"
                                       if args.py_spy and name == "this app" and count > 1 else "")
                                wave(chats, server, count, tallies[name], load.read_arrivals, spy)
                        for kind in ("new chat", "open chat"):
                            row = (label, count, kind, figures(tallies["this app"][kind], args.tokens),
                                   figures(tallies["Chainlit"][kind], args.tokens))
                            results.append(row)
                            print_row(*row)
                        print_stages(tallies["this app"]["new chat"].turns)
                        for name in stacks:
                            errors = [t.error for kind in tallies[name].values() for t in kind.turns if t.error]
                            if errors:
                                print(f"  {name} errors (first 3): {errors[:3]}", flush=True)
                                if name == "this app":
                                    print(f"  the server's log ends:\n{ours.output()[-2000:]}")
                finally:
                    for chats, server in stacks.values():
                        chats.stop()
                        server.stop()
    finally:
        model.terminate()
        model.wait()
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.remove(load.ARRIVALS)
    print_tables(results)
    print(_support.load_line())


COLUMNS = ("first p50", "first p99", "last p99", "CPU us/word")


def print_row(label: str, count: int, kind: str, ours: dict, theirs: dict) -> None:
    print(f"{label} N={count} {kind}: " + ", ".join(
        f"{column} {cell(ours[column])} / {cell(theirs[column])}" for column in COLUMNS)
        + f", errors {ours['errors']} / {theirs['errors']}, lost {ours['lost']} (this app / Chainlit)", flush=True)


def print_stages(turns: list[Turn]) -> None:
    """Where this app's new chats spent the time to their first word: when each step ended, ms from the send."""
    good = [turn for turn in turns if not turn.error]
    if not good:
        return
    parts = []
    for stage in STAGES:
        values = [getattr(turn, stage) * 1000 for turn in good if not math.isnan(getattr(turn, stage))]
        if values:
            parts.append(f"{stage.replace('_', ' ')} {percentile(values, 50):,.0f} / {percentile(values, 99):,.0f}")
    print("  this app's new chat, ms from the send (p50 / p99) when each step ended: " + ", ".join(parts), flush=True)


def print_tables(results: list) -> None:
    print("\nBoth stacks (ms from the send):\n")
    rows = [("setup", "N", "chat", "stack", "messages", "to model p50", *COLUMNS, "errors", "lost",
             "client CPU us/word")]
    for label, count, kind, ours, theirs in results:
        for name, found in (("this app", ours), ("Chainlit", theirs)):
            rows.append((label, str(count), kind, name, str(found["messages"]), cell(found["to model p50"]),
                         *(cell(found[column]) for column in COLUMNS), str(found["errors"]),
                         str(found["lost"]) if found["lost"] >= 0 else "-", cell(found["client CPU us/word"])))
    _support.print_table(rows)
    print("\nRatios, this app / Chainlit (below 1: this app is ahead):\n")
    rows = [("setup", "N", "chat", *COLUMNS)]
    for label, count, kind, ours, theirs in results:
        rows.append((label, str(count), kind, *(cell(ours[column] / theirs[column], ratio=True) if theirs[column]
                                               else "-" for column in COLUMNS)))
    _support.print_table(rows)
    print()


if __name__ == "__main__":
    main()
