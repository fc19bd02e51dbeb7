"""What the benchmarks share: child processes on a throwaway database, the local model server, the
bare-openai baseline, one timed run, and the table.

Used by bench/engine.py (agent runs) and bench/workflow.py (workflows and teams).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# -- processes and databases -----------------------------------------------------------------------


def run_child(script: str, url: str, arguments: list[str], capture: bool = True) -> list[dict]:
    """Run `script --child URL ARGUMENTS...` against the database at `url`, with the app's settings
    as deployed (DEBUG off: no query log kept); its last stdout line is the JSON of its rows."""
    command = [sys.executable, script, "--child", url, *arguments]
    env = child_env(url)
    if not capture:
        subprocess.run(command, env=env, check=True)
        return []
    done = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_env(url: str) -> dict[str, str]:
    """A child's environment: the app's settings as deployed (DEBUG off), on the database at `url`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "DJANGO_"))}
    env.update(DATABASE_URL=url, DEBUG="false", SECRET_KEY="bench-engine", ALLOWED_HOSTS="127.0.0.1",
               DJANGO_SETTINGS_MODULE="chatapp.settings")
    return env


@contextlib.contextmanager
def throwaway_database(prefix: str = "bench_engine") -> Iterator[None]:
    """Django set up on a fresh database: a new SQLite file beside the configured one, or on PostgreSQL
    a new database `<prefix>_<pid>` beside the one in the URL (the role needs CREATEDB), dropped after."""
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection, connections

    test_settings = settings.DATABASES["default"].setdefault("TEST", {})
    if connection.vendor == "sqlite":
        test_settings["NAME"] = str(Path(settings.DATABASES["default"]["NAME"]).with_suffix(".bench.sqlite3"))
    else:
        test_settings["NAME"] = f"{prefix}_{os.getpid()}"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield
    finally:
        connections.close_all()
        connection.creation.destroy_test_db(old_name, verbosity=0)


def analyze_if_postgres() -> None:
    """What autovacuum would do shortly after a bulk load anyway; measured without it, the first
    rows after a big prefill pay for a background ANALYZE and stale statistics."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


# -- the model server and the baseline -------------------------------------------------------------


def start_server(responder: Callable):
    """tests/support/llm_server.py's server, with Nagle's algorithm off: its many small streamed writes would
    otherwise wait on delayed ACKs (about 40 ms per response on Linux), which is not a zero-latency model."""
    from tests.support.llm_server import LLMServer, _Handler

    class Handler(_Handler):
        disable_nagle_algorithm = True

    server = LLMServer()
    server.RequestHandlerClass = Handler
    server.responder = responder
    return server.start()


class Baseline:
    """The bare-openai replay of a run's requests: the same bodies through `openai.AsyncOpenAI`
    (streamed, lines read, not parsed), sent the way the engine sends them."""

    def __init__(self, base_url: str):
        import openai

        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)

    async def replay(self, bodies: list[dict]) -> None:
        for body in bodies:
            # Sent as the engine sends it: messages and tools through extra_body, past the SDK's
            # per-message transform (which would add 2-3 ms per request to the baseline only).
            passed = ("stream", "stream_options", "messages", "tools")
            request = {key: value for key, value in body.items() if key not in passed}
            extra = {key: body[key] for key in ("messages", "tools") if key in body}
            async with self.client.chat.completions.with_streaming_response.create(
                **request, messages=[], extra_body=extra, stream=True, stream_options={"include_usage": True}
            ) as response:
                async for _line in response.iter_lines():
                    pass

    async def close(self) -> None:
        await self.client.close()


def timed_run(run: Callable[[], object], server, baseline: Baseline, loop, model_calls: int
              ) -> tuple[float, float, float, float]:
    """One run, then the baseline replay of its requests: (run wall ms, baseline wall ms, run CPU ms,
    baseline CPU ms); CPU is the whole process's. A run with no model call has a zero baseline."""
    mark = len(server.requests)
    started, started_cpu = time.perf_counter(), time.process_time()
    output = run()
    ran, ran_cpu = time.perf_counter(), time.process_time()
    assert output.status == "completed", output.error
    bodies = server.requests[mark:]
    assert len(bodies) == model_calls, (len(bodies), model_calls)
    if bodies:
        loop.run_until_complete(baseline.replay(bodies))
    done, done_cpu = time.perf_counter(), time.process_time()
    return (ran - started) * 1000, (done - ran) * 1000, (ran_cpu - started_cpu) * 1000, (done_cpu - ran_cpu) * 1000


# -- figures ---------------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


def print_table(rows: list[tuple[str, ...]]) -> None:
    """A Markdown table: the first row is the header; cells right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("| " + " | ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) + " |")
        if number == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")


def load_line() -> str:
    return (f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall figures suffer "
            "when other work shares the machine)")


def profile_runs(run: Callable[[], object], runs: int, warmup: int, label: str) -> None:
    """cProfile of `runs` calls of `run` after `warmup` unprofiled ones; prints the time per run and the
    40 costliest functions by own time, then the 80 costliest by cumulative time."""
    import cProfile
    import pstats

    for _ in range(warmup):
        run()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(runs):
        run()
    profiler.disable()
    elapsed = (time.perf_counter() - started) * 1000 / runs
    print(f"{runs} runs {label}: {elapsed:.2f} ms per run (profiler on)")
    stats = pstats.Stats(profiler)
    if os.environ.get("PROFILE_OUT"):  # the raw stats, for pstats or snakeviz
        stats.dump_stats(os.environ["PROFILE_OUT"])
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(80)


# -- a streaming model for load tests --------------------------------------------------------------


async def serve_fake_model(port: int, tokens: int, delay: float, ready: Callable[[int], None]) -> None:
    """An OpenAI-compatible chat completions endpoint on 127.0.0.1:`port` (0: a free one) that streams
    `tokens` words, one every `delay` seconds, to every request; title and summary requests get the
    short answers a real model gives. One asyncio loop serves every stream (a thread per stream, as
    tests/support/llm_server.py has, spends its time switching threads at hundreds of streams), with the same
    chunk format as tests/support/llm_server.py. `ready(port)` is called once it listens."""
    from tests.support.llm_server import _chunk, _usage, is_memory_request, is_summary_request, is_title_request

    words = [f"word{number} " for number in range(tokens)]
    # BENCH_ARRIVALS=<file>: when each reply's request arrived (wall clock) and its last user message.
    arrivals = open(os.environ["BENCH_ARRIVALS"], "a", buffering=1) if os.environ.get("BENCH_ARRIVALS") else None

    def answer(body: dict) -> tuple[list[str], float]:
        if is_title_request(body):
            return ["Load ", "test ", "chat"], 0.0
        if is_summary_request(body):
            return [json.dumps({"summary": "The user asked for a long answer.", "topics": ["load"]})], 0.0
        if is_memory_request(body):  # the memory manager: nothing worth remembering
            return ["No ", "change."], 0.0
        return words, delay

    def event(payload: dict) -> bytes:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length) or b"{}")
                parts, pause = answer(body)
                if arrivals is not None and pause:
                    said = next((m.get("content") for m in reversed(body.get("messages") or [])
                                 if m.get("role") == "user"), "")
                    arrivals.write(f"{time.time():.6f}\t{json.dumps(said)}\n")
                if not body.get("stream"):
                    message = {"role": "assistant", "content": "".join(parts)}
                    data = json.dumps({"id": "chatcmpl-load", "object": "chat.completion", "created": 0,
                                       "model": body.get("model", "load"), "usage": _usage(body, len(parts)),
                                       "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(data), data.encode()))
                    await writer.drain()
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(event(_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None}])))
                for part in parts:
                    if pause:
                        await asyncio.sleep(pause)
                    writer.write(event(_chunk([{"index": 0, "delta": {"content": part}, "finish_reason": None}])))
                    await writer.drain()
                writer.write(event(_chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])))
                if (body.get("stream_options") or {}).get("include_usage"):
                    writer.write(event({**_chunk([]), "usage": _usage(body, len(parts))}))
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


# -- side by side with another engine (bench/engine.py --agno) -------------------------------------


def serve_rounds(scenarios: dict[str, tuple[Callable[[str], object], int]], server, baseline: Baseline, loop,
                 completed: Callable[[object], bool], long_runs: int) -> None:
    """The child's half of a side-by-side comparison, driven by the parent over stdin/stdout.

    `scenarios`: name -> (run(session_id), model calls per run). "fresh" runs on a new session every
    time; every other scenario keeps one session, first grown to `long_runs` runs (untimed). Prints
    "ready", then answers each "round" line with one JSON line {name: [run wall, baseline wall, run CPU,
    baseline CPU]} (ms), one timed run of each scenario, in an order rotated round by round; stops at
    any other line or at the end of input."""
    fresh = iter(range(10**9))
    for name, (run, _calls) in scenarios.items():
        if name != "fresh":
            for _ in range(long_runs):
                assert completed(run(f"compare-{name}"))
    print("ready", flush=True)
    names = list(scenarios)
    for number, line in enumerate(sys.stdin):
        if line.strip() != "round":
            break
        timings = {}
        # The first run of a round follows the other engine's round (cold caches): each scenario takes
        # that place in turn.
        for name in names[number % len(names):] + names[:number % len(names)]:
            run, calls = scenarios[name]
            session_id = f"compare-fresh-{next(fresh)}" if name == "fresh" else f"compare-{name}"
            mark = len(server.requests)
            started, started_cpu = time.perf_counter(), time.process_time()
            output = run(session_id)
            ran, ran_cpu = time.perf_counter(), time.process_time()
            assert completed(output), output
            bodies = server.requests[mark:]
            assert len(bodies) == calls, (name, len(bodies), calls)
            loop.run_until_complete(baseline.replay(bodies))
            done, done_cpu = time.perf_counter(), time.process_time()
            timings[name] = [(ran - started) * 1000, (done - ran) * 1000, (ran_cpu - started_cpu) * 1000,
                             (done_cpu - ran_cpu) * 1000]
        print(json.dumps(timings), flush=True)


def drive_rounds(commands: dict[str, tuple[list[str], dict[str, str]]], rounds: int) -> tuple[dict, dict]:
    """The parent's half: start every child (name -> (command, environment)), wait until each is ready,
    then ask each in turn for one round, `rounds` times (so the engines see the same moments of the
    host). Returns ({engine: {scenario: [timings by round]}}, {engine: the child's last line after its
    rounds: its own summary})."""
    children = {name: subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name, (command, env) in commands.items()}
    try:
        for name, child in children.items():
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(f"{name}: the comparison child failed to start ({line.strip()!r})")
        results = {name: {} for name in children}
        for number in range(rounds):
            for name, child in children.items():
                child.stdin.write("round\n")
                child.stdin.flush()
                for scenario, timing in json.loads(child.stdout.readline()).items():
                    results[name].setdefault(scenario, []).append(timing)
            if (number + 1) % 25 == 0:
                print(f"  round {number + 1}/{rounds}", file=sys.stderr, flush=True)
        summaries = {}
        for name, child in children.items():
            child.stdin.write("done\n")
            child.stdin.close()
            summaries[name] = json.loads(child.stdout.read().strip().splitlines()[-1])
            if child.wait() != 0:
                raise SystemExit(f"{name}: the comparison child failed")
        return results, summaries
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
