"""The memory work's cost per run (the model's time excluded), at 10 and 1,000 memories of one user and at
1 and 200 sessions of that user, on SQLite and PostgreSQL.

    .venv/bin/python bench/memory.py                        # SQLite only
    .venv/bin/python bench/memory.py --pg-url postgres://app:app@127.0.0.1:5432/app   # and PostgreSQL

Setup: an agent with `update_memory_on_run=True` (its memories in the system message too) whose model is
an in-process scripted model that answers at once, with no HTTP: the agent's call gets "ok"; the memory
manager's first call gets one `update_memory` call (a change every run, of the same memory, so the user's
count stays as set), its second "Done.". The user's memories and sessions are inserted in bulk. Each row
times `--runs` runs of `agent.run(...)` (the sync path) in a new session each, alternating with the same
agent with memories off, so both see the same moments of the machine:

  memory work   the time (wall, and the process's CPU time) inside the work after the reply (`run_work.aupdate_after_run`: the manager's
                read of the memories, its prompt, the tool's row writes), the model calls included but
                costing nothing here
  run on / off  the whole run with memories on and off; their difference is the memory work plus the
                start's read of the memories for the system message
  first token   from the call to the first RunContent event, memories on and off (streamed runs): the
                reply's first token never waits for the memory work, only for the start's read
  SQL           the statements of a whole run with memories on and off (on: two more at the start, the
                opt-out check and the memories' texts; the rest is the work after the reply)

Each backend runs in its own child process against a throwaway database (bench/_support.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _support

MEMORY_COUNTS = (10, 1_000)
SESSION_COUNTS = (1, 200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", ""),
                        help="PostgreSQL server to use (default: env BENCH_PG_URL; unset: SQLite only)")
    parser.add_argument("--runs", type=int, default=100, help="measured runs per row")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured runs before each row")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    backends = [("SQLite", "")] + ([("PostgreSQL", args.pg_url)] if args.pg_url else [])
    results = []
    for name, url in backends:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            rows = _support.run_child(__file__, url or f"sqlite:///{tmp}/bench.sqlite3",
                                      ["--runs", str(args.runs), "--warmup", str(args.warmup)])
            results += [{"backend": name, **row} for row in rows]
    print_table(results, args.runs)


def print_table(results: list[dict], runs: int) -> None:
    print(f"\nMemory work per run (ms, medians of {runs} runs; the model answers at once, in process)")
    rows = [("backend", "memories", "sessions", "memory work", "p95", "CPU", "run on", "run off", "on - off",
             "first token on", "first token off", "SQL run on/off")]
    for row in results:
        rows.append((row["backend"], f"{row['memories']:,}", f"{row['sessions']:,}", f"{row['work']:.2f}",
                     f"{row['work_p95']:.2f}", f"{row['work_cpu']:.2f}", f"{row['on']:.2f}", f"{row['off']:.2f}", f"{row['on'] - row['off']:.2f}",
                     f"{row['first_on']:.2f}", f"{row['first_off']:.2f}", f"{row['sql_on']}/{row['sql_off']}"))
    _support.print_table(rows)
    print(_support.load_line())


# -- the child: one backend ----------------------------------------------------------------------------


def child(args) -> None:
    with _support.throwaway_database("bench_memory"):
        _support.analyze_if_postgres()
        rows = [measure(memories, sessions, args.runs, args.warmup)
                for memories in MEMORY_COUNTS for sessions in SESSION_COUNTS]
    print(json.dumps(rows))


def instant_model():
    """A model with no HTTP: the agent gets "ok"; the manager updates its user's first memory, then is done."""
    from sessions_core.model_api import Model, ModelChunk, ToolCall

    class Instant(Model):
        id, provider = "instant", "bench"
        turn = 0

        async def astream(self, messages, tools=None, response_format=None):
            system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
            if not system.startswith("You are a Memory Manager"):
                yield ModelChunk(content="ok")
                yield ModelChunk(finish_reason="stop", usage={"input_tokens": 1, "output_tokens": 1})
                return
            if messages[-1]["role"] == "tool":
                yield ModelChunk(content="Done.")
                yield ModelChunk(finish_reason="stop")
                return
            memory_id = system.split("ID: ", 1)[1].split("\n", 1)[0]
            Instant.turn += 1
            arguments = json.dumps({"memory_id": memory_id, "memory": f"The user said something {Instant.turn}",
                                    "topics": ["bench"]})
            yield ModelChunk(tool_calls=[ToolCall(id="call_1", name="update_memory", arguments=arguments)],
                             finish_reason="tool_calls")

    return Instant()


def prefill(username: str, memories: int, sessions: int):
    """A user with `memories` memories and `sessions` sessions of one run each, inserted in bulk."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from sessions_core.models import ChatSession, Run, UserMemoryRecord

    user = get_user_model().objects.create_user(username=username)
    now = timezone.now()
    UserMemoryRecord.objects.bulk_create(
        [UserMemoryRecord(user=user, memory=f"The user likes thing number {n}", topics=["bench"], created_at=now,
                          updated_at=now) for n in range(memories)], batch_size=500)
    made = ChatSession.objects.bulk_create(
        [ChatSession(owner=user, session_id=f"{username}-old-{n}", component_id="bench", created_at=now,
                     last_activity_at=now) for n in range(sessions)], batch_size=500)
    Run.objects.bulk_create([Run(session=session, component_id="bench", status="completed", input="hello",
                                 content="ok", created_at=now, finished_at=now) for session in made], batch_size=500)
    _support.analyze_if_postgres()
    return user


def measure(memories: int, sessions: int, runs: int, warmup: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions_core import Agent, RunEvent
    from sessions_core.user_memories import run_work

    username = f"user-{memories}-{sessions}"
    prefill(username, memories, sessions)
    model = instant_model()
    on = Agent(name="bench", model=model, update_memory_on_run=True, instructions="Be brief.")
    off = Agent(name="bench", model=model, instructions="Be brief.")
    work_times = []
    original = run_work.aupdate_after_run

    async def timed_work(run):
        started, cpu = time.perf_counter(), time.process_time()
        result = await original(run)
        work_times.append(((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
        return result

    import sessions_core.run.root as root

    root.aupdate_after_run = timed_work
    totals = {"on": [], "off": [], "first_on": [], "first_off": [], "sql_on": [], "sql_off": []}
    try:
        for number in range(warmup + runs):
            for label, agent in (("on", on), ("off", off)):
                session_id = f"{username}-{label}-{number}"
                connection.queries_log.clear()  # a bounded log: a long row would overflow it
                started = time.perf_counter()
                with CaptureQueriesContext(connection) as queries:
                    agent.run("hello there", session_id=session_id, user_id=username)
                elapsed = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                first = None
                for event in agent.run("hello again", session_id=session_id, user_id=username, stream=True,
                                       stream_events=True):
                    if first is None and event.event == RunEvent.run_content:
                        first = (time.perf_counter() - started) * 1000
                if number >= warmup:
                    totals[label].append(elapsed)
                    totals[f"first_{label}"].append(first)
                    totals[f"sql_{label}"].append(len(queries))
    finally:
        root.aupdate_after_run = original
    work = [wall for wall, _ in work_times[2 * warmup:]]  # two runs with memories on per round
    return {"memories": memories, "sessions": sessions, "work": statistics.median(work),
            "work_p95": _support.percentile(work, 95),
            "work_cpu": statistics.median(cpu for _, cpu in work_times[2 * warmup:]),
            **{key: statistics.median(values) for key, values in totals.items() if not key.startswith("sql")},
            "sql_on": max(totals["sql_on"]), "sql_off": max(totals["sql_off"])}


if __name__ == "__main__":
    main()
