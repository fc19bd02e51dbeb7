"""The engine's own time per workflow and team run, beside a plain agent run, by session length.

    .venv/bin/python bench/workflow.py                        # SQLite only
    .venv/bin/python bench/workflow.py --pg-url postgres://app:app@127.0.0.1:5432/app   # and PostgreSQL
    BENCH_PG_URL=postgres://... .venv/bin/python bench/workflow.py
    .venv/bin/python bench/workflow.py --profile workflow:1000     # cProfile of one shape (SQLite;
                                                                   # PostgreSQL with --skip-sqlite --pg-url)

Issue 12's benchmark. The same setup as bench/engine.py (whose machinery it imports): the local
model server started in-process (a tool call, then one word, at once), `agent.run`-style sync runs
(`component.run(...)` from a thread with no event loop), the engine's own time = run wall time minus
a bare-openai replay of the run's requests, run and baseline alternating. Shapes:

  agent        the plain agent of bench/engine.py: history on (last 3 runs), a state tool appending
               to a list; 2 model calls
  workflow     three steps: a function step (counts the run in the state), an agent step (that agent),
               a condition (greets a new user once: a state read, its step skipped); 2 model calls
  team         a team (history on) whose model delegates once to a member with the state tool (the
               same agent's settings): 4 model calls (team, member, member, team)
  function     a workflow of the function step alone; no model call
  condition    a workflow of the condition alone; no model call
  empty        a workflow with no steps: what a workflow run costs before any step
  agent-step   a workflow of the agent step alone; 2 model calls

Per-step figures (medians over rounds of the paired per-round differences, so each subtraction is
between runs made moments apart): function step = function - empty; condition = condition - empty;
agent step = workflow - function step - condition (the agent step with the workflow run around it,
which is what a plain agent run also pays for: a lease, a start and a finish); its overhead = agent step
- agent; cross-checked directly as agent-step - agent.

Sessions are pre-filled with 1, 100 and 1,000 earlier runs of their own shape: one real run, whose Run
rows (root and step/member runs) and messages are then copied in bulk, so a long session is exactly
what that many runs of the shape leave behind. Every (shape, length) takes its turn in every round,
so a difference between two rows is the shape or the length, not the host's moment. SQL statements
per run: CaptureQueriesContext on the engine's connection around one run per (shape, length).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid

import _support
import engine
from engine import PROMPT, append_item, make_agent

LENGTHS = (1, 100, 1_000)
FUNCTION_STEP_TARGET_MS = 0.3
AGENT_STEP_TARGET_MS = 0.5
GROWTH_NOISE_MS = engine.GROWTH_NOISE_MS
# (name, model calls per run)
SHAPES = (("agent", 2), ("workflow", 2), ("team", 4), ("function", 0), ("condition", 0), ("empty", 0),
          ("agent-step", 2))
MEMBER = "keeper"


# -- the parent ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", ""),
                        help="PostgreSQL server to use (default: env BENCH_PG_URL; unset: SQLite only)")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="earlier runs per session")
    parser.add_argument("--runs", type=int, default=100, help="rounds: measured runs per (shape, length)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured runs per (shape, length) first")
    parser.add_argument("--shapes", default=",".join(name for name, _ in SHAPES),
                        help="shapes to measure (the breakdown needs them all)")
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--profile", metavar="SHAPE:LENGTH",
                        help="cProfile --runs runs of one shape at one length instead "
                        "(SQLite, or PostgreSQL with --pg-url and --skip-sqlite)")
    parser.add_argument("--show-sql", metavar="SHAPE:LENGTH", help="print the SQL statements of one run of a shape "
                        "(SQLite, or PostgreSQL with --pg-url and --skip-sqlite)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        child(args)
        return
    if args.profile or args.show_sql:
        with tempfile.TemporaryDirectory() as tmp:
            url = args.pg_url if args.skip_sqlite and args.pg_url else f"sqlite:///{tmp}/b.sqlite3"
            _support.run_child(__file__, url, child_arguments(args), capture=False)
        return
    backends = [] if args.skip_sqlite else [("SQLite", None)]
    if args.pg_url:
        backends.append(("PostgreSQL", args.pg_url))
    if not backends:
        parser.error("nothing to measure: --skip-sqlite without --pg-url")
    results = []
    started = time.perf_counter()
    for name, url in backends:
        with tempfile.TemporaryDirectory() as tmp:
            url = url or f"sqlite:///{tmp}/bench.sqlite3"
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            results.append({"backend": name, **_support.run_child(__file__, url, child_arguments(args))[0]})
    report(results, args)
    print(f"Measured in {time.perf_counter() - started:.0f} s.")


def child_arguments(args) -> list[str]:
    arguments = ["--lengths", args.lengths, "--runs", str(args.runs), "--warmup", str(args.warmup),
                 "--shapes", args.shapes]
    arguments += ["--profile", args.profile] if args.profile else []
    return arguments + (["--show-sql", args.show_sql] if args.show_sql else [])


def report(results: list[dict], args) -> None:
    print(f"\nEngine time per run (ms): run minus bare-openai baseline, sync path (component.run), {args.runs} "
          "runs per row, the rows of one backend taking turns run by run")
    rows = [("backend", "shape", "earlier runs", "model calls", "own median", "own p95", "own CPU median",
             "run median", "baseline median", "SQL/run")]
    for result in results:
        for row in result["rows"]:
            rows.append((result["backend"], row["shape"], f"{row['length']:,}", str(row["model_calls"]),
                         f"{row['own_median']:.2f}", f"{row['own_p95']:.2f}", f"{row['cpu_median']:.2f}",
                         f"{row['run_median']:.2f}", f"{row['baseline_median']:.2f}", str(row["queries"])))
    _support.print_table(rows)

    print("\nPer-step breakdown (ms, medians of per-round paired differences; wall / CPU):")
    rows = [("backend", "earlier runs", "empty workflow", "function step", "condition", "agent step",
             "plain agent", "agent step - agent", "agent-step wf - agent", "team - agent")]
    for result in results:
        for length, figures in result["breakdown"].items():
            rows.append((result["backend"], f"{int(length):,}", *(
                f"{figures[key][0]:.2f} / {figures[key][1]:.2f}" if key in figures else "-"
                for key in ("empty", "function_step", "condition", "agent_step", "agent", "agent_step_overhead",
                            "agent_step_direct", "team_overhead"))))
    _support.print_table(rows)

    print()
    for result in results:
        backend, breakdown = result["backend"], result["breakdown"]
        by_shape: dict[str, list[dict]] = {}
        for row in result["rows"]:
            by_shape.setdefault(row["shape"], []).append(row)
        for shape, mine in by_shape.items():
            if len(mine) > 1:
                growth = result["growth"][shape]
                print(f"{backend}, {shape}, {mine[0]['length']:,} -> {mine[-1]['length']:,} earlier runs: own median "
                      f"{mine[0]['own_median']:.2f} -> {mine[-1]['own_median']:.2f} ms (paired growth "
                      f"{growth[0]:+.2f} ms wall, {growth[1]:+.2f} ms CPU), SQL/run "
                      f"{' -> '.join(str(row['queries']) for row in mine)}")
        lengths = list(breakdown)
        if all("function_step" in breakdown[length] for length in lengths):
            worst = max(breakdown[length]["function_step"][0] for length in lengths)
            worst_cpu = max(breakdown[length]["function_step"][1] for length in lengths)
            verdict = _verdicts(worst < FUNCTION_STEP_TARGET_MS, worst_cpu < FUNCTION_STEP_TARGET_MS)
            print(f"{backend}: target function step under {FUNCTION_STEP_TARGET_MS:g} ms: {verdict} (worst "
                  f"{worst:.2f} ms wall, {worst_cpu:.2f} ms CPU over {', '.join(f'{int(n):,}' for n in lengths)} "
                  "earlier runs)")
        if all("agent_step_overhead" in breakdown[length] for length in lengths):
            worst = max(breakdown[length]["agent_step_overhead"][0] for length in lengths)
            worst_cpu = max(breakdown[length]["agent_step_overhead"][1] for length in lengths)
            direct = max(breakdown[length].get("agent_step_direct", (float("nan"),))[0] for length in lengths)
            verdict = _verdicts(worst <= AGENT_STEP_TARGET_MS, worst_cpu <= AGENT_STEP_TARGET_MS)
            print(f"{backend}: target agent step within {AGENT_STEP_TARGET_MS:g} ms of a plain agent run: {verdict} "
                  f"(worst {worst:+.2f} ms wall, {worst_cpu:+.2f} ms CPU; agent-step workflow - agent: worst "
                  f"{direct:+.2f} ms wall)")
        if all({"function_step", "agent_step_overhead", "agent"} <= breakdown[length].keys() for length in lengths):
            # The machine's speed taken out: the same code's figures move together from one VM to the next.
            shares = [(breakdown[length]["function_step"][1] / breakdown[length]["agent"][1],
                       breakdown[length]["agent_step_overhead"][1] / breakdown[length]["agent"][1]) for length in lengths]
            plain = statistics.median(breakdown[length]["agent"][1] for length in lengths)
            print(f"{backend}: as shares of a plain agent run on this machine ({plain:.2f} ms CPU): function step worst "
                  f"{max(share[0] for share in shares):.0%}, agent step worst {max(share[1] for share in shares):+.0%} "
                  f"(the targets are {FUNCTION_STEP_TARGET_MS / plain:.0%} and {AGENT_STEP_TARGET_MS / plain:+.0%} of it)")
        flat_sql = all(len({row["queries"] for row in mine}) == 1 for mine in by_shape.values())
        # Judged on CPU time (this process's): on PostgreSQL the wall time also holds the server's work and
        # the round trips, whose noise on a busy host is larger than the allowance; the wall growth is shown.
        growths = {shape: result["growth"][shape] for shape, mine in by_shape.items() if len(mine) > 1}
        if growths:
            steepest = max(growths, key=lambda shape: growths[shape][1])
            steepest_wall = max(growths, key=lambda shape: growths[shape][0])
            flat = flat_sql and growths[steepest][1] < GROWTH_NOISE_MS
            print(f"{backend}: target flat in session length: {'met' if flat else 'MISSED'} (SQL/run "
                  f"{'the same at every length for every shape' if flat_sql else 'GROWS'}; steepest paired growth "
                  f"{growths[steepest][1]:+.2f} ms CPU ({steepest}), {growths[steepest_wall][0]:+.2f} ms wall "
                  f"({steepest_wall}); noise allowance {GROWTH_NOISE_MS:g} ms)")
    print(_support.load_line() + "; other engineers run tests on this machine too: compare rows of one run.")


def _verdicts(wall: bool, cpu: bool) -> str:
    """Both readings of a speed target: wall time (on PostgreSQL it holds the server's own work, such as
    its foreign key checks and index updates for the rows stored, and the round trips) and this process's
    CPU time (the engine's own work alone)."""
    return f"{'met' if wall else 'MISSED'} on wall time, {'met' if cpu else 'MISSED'} on CPU time"


# -- the child: one backend ------------------------------------------------------------------------


def child(args) -> None:
    with _support.throwaway_database("bench_workflow"):
        lengths = [int(value) for value in args.lengths.split(",") if value]
        shapes = [value for value in args.shapes.split(",") if value]
        unknown = set(shapes) - {name for name, _ in SHAPES}
        if unknown:
            raise SystemExit(f"unknown shapes: {', '.join(sorted(unknown))}")
        if args.profile:
            shape, _, length = args.profile.partition(":")
            profile(shape, int(length or 1000), args.runs, args.warmup)
            return
        if args.show_sql:
            shape, _, length = args.show_sql.partition(":")
            show_sql(shape, int(length or 100))
            return
        result = measure(shapes, lengths, args.runs, args.warmup)
    print(json.dumps([result]))


def responder(body: dict):
    """The team's model delegates; the member's (and the plain agent's) calls the state tool; after a
    tool's result, one word."""
    from tests.support.llm_server import Text, ToolCalls

    if body["messages"][-1]["role"] == "tool":
        return Text("Done.")
    tools = {tool["function"]["name"] for tool in body.get("tools") or ()}
    if "delegate_task_to_member" in tools:
        return ToolCalls([("delegate_task_to_member", {"member_id": MEMBER, "task": PROMPT})])
    return ToolCalls([("append_item", {"item": "x"})])


def count_run(step_input, session_state) -> str:
    """The function step: counts the workflow's runs in the state, passes the input on."""
    session_state["runs"] = session_state.get("runs", 0) + 1
    return step_input.input


def new_user(step_input, session_state) -> bool:
    return not session_state.get("greeted", False)


def greet(step_input, session_state) -> str:
    session_state["greeted"] = True
    return "Welcome!"


def make_components(model) -> dict:
    from sessions_core import Agent, Condition, Step, Team, Workflow

    agent = make_agent(model)
    state = {"items": [], "runs": 0, "greeted": False}

    def function_step():
        return Step(name="count", executor=count_run)

    def condition():  # after a session's first run it is no longer a new user: the branch is skipped
        return Condition(evaluator=new_user, steps=[Step(name="greet", executor=greet)], name="first_visit")

    def workflow(name, steps):
        return Workflow(name=name, steps=steps, session_state=dict(state))

    member = Agent(name=MEMBER, model=model, role="Keeps the user's list of items", tools=[append_item],
                   session_state={"items": []}, instructions="You keep a list of items for the user.",
                   add_history_to_context=True, num_history_runs=3)
    team = Team(name="bench-team", model=model, members=[member], session_state={"items": []},
                instructions="Hand list work to the keeper.", add_history_to_context=True, num_history_runs=3)
    return {
        "agent": agent,
        "workflow": workflow("bench-workflow", [function_step(), Step(name="keep", agent=agent), condition()]),
        "team": team,
        "function": workflow("bench-function", [function_step()]),
        "condition": workflow("bench-condition", [condition()]),
        "empty": workflow("bench-empty", []),
        "agent-step": workflow("bench-agent-step", [Step(name="keep", agent=agent)]),
    }


def prefill(component, session_id: str, length: int) -> None:
    """A session with `length` earlier runs of `component`: one real run, then copies of its rows (its
    Run rows, step and member runs under it, and their messages) inserted in bulk, seqs consecutive."""
    from django.db import transaction

    from sessions_core.models import ChatSession, Message, Run

    output = component.run(PROMPT, session_id=session_id)
    assert output.status == "completed", output.error
    if length > 1:
        session = ChatSession.objects.get(session_id=session_id)
        runs = list(Run.objects.filter(session=session).order_by("id"))
        messages = list(Message.objects.filter(session=session).order_by("seq"))
        per_run = session.last_seq
        assert [message.seq for message in messages] == list(range(1, per_run + 1))
        skip = {"id", "run_id", "session", "parent_run"}
        run_fields = [field.name for field in Run._meta.concrete_fields if field.name not in skip]
        message_fields = [field.name for field in Message._meta.concrete_fields
                          if field.name not in {"id", "session", "run", "seq"}]
        with transaction.atomic():
            for start in range(1, length, 500):
                copies = range(start, min(length, start + 500))
                pk_of = {}  # (copy, template run pk) -> new pk
                pending = list(runs)
                while pending:  # parents before children
                    ready = [run for run in pending if run.parent_run_id is None or run.parent_run_id not in
                             {other.pk for other in pending}]
                    made = Run.objects.bulk_create([
                        Run(session=session, run_id=str(uuid.uuid4()),
                            parent_run_id=pk_of[(copy, run.parent_run_id)] if run.parent_run_id else None,
                            **{name: getattr(run, name) for name in run_fields})
                        for copy in copies for run in ready])
                    for (copy, run), new in zip([(c, r) for c in copies for r in ready], made, strict=True):
                        pk_of[(copy, run.pk)] = new.pk
                    pending = [run for run in pending if run not in ready]
                Message.objects.bulk_create([
                    Message(session=session, run_id=pk_of[(copy, message.run_id)], seq=copy * per_run + message.seq,
                            **{name: getattr(message, name) for name in message_fields})
                    for copy in copies for message in messages], batch_size=2000)
            session.last_seq = per_run * length
            session.save(update_fields=["last_seq"])
    _support.analyze_if_postgres()


def measure(shapes: list[str], lengths: list[int], runs: int, warmup: int) -> dict:
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from sessions_core.llm import OpenAIChat

    loop = asyncio.new_event_loop()
    server = _support.start_server(responder)
    model = OpenAIChat(id="bench-model", base_url=server.base_url, api_key="bench", max_retries=0)
    components = make_components(model)
    calls = dict(SHAPES)
    baseline = _support.Baseline(server.base_url)
    sessions = {(shape, length): f"bench-{shape}-{length}" for shape in shapes for length in lengths}

    def one_run(key):
        return _support.timed_run(lambda: components[key[0]].run(PROMPT, session_id=sessions[key]), server,
                                  baseline, loop, calls[key[0]])

    try:
        for key, session_id in sessions.items():
            started = time.perf_counter()
            prefill(components[key[0]], session_id, key[1])
            for _ in range(warmup):
                one_run(key)
            print(f"  {key[0]:>10} {key[1]:>6,}: prefilled and warmed up in {time.perf_counter() - started:.1f} s",
                  file=sys.stderr, flush=True)
        # Every (shape, length) takes its turn in every round: the rows see the same moments of the host.
        # The order changes from round to round (the same for every run of the benchmark): a run right
        # after a heavy one (a team's, with its garbage and its server threads) pays a little for it, and
        # that share is spread over all rows instead of falling on the same few.
        own = {key: [] for key in sessions}  # [(own wall, own CPU, run wall, baseline wall)] by round
        order, shuffle = list(sessions), random.Random(12).shuffle
        for number in range(runs):
            shuffle(order)
            for key in order:
                run_wall, base_wall, run_cpu, base_cpu = one_run(key)
                own[key].append((run_wall - base_wall, run_cpu - base_cpu, run_wall, base_wall))
            if (number + 1) % 25 == 0:
                print(f"  round {number + 1}/{runs}", file=sys.stderr, flush=True)
        queries = {}
        for key, session_id in sessions.items():
            with CaptureQueriesContext(connection) as captured:
                components[key[0]].run(PROMPT, session_id=session_id)
            queries[key] = len(captured.captured_queries)
    finally:
        loop.run_until_complete(baseline.close())
        server.stop()
        connections.close_all()
        loop.close()

    rows = []
    for (shape, length), timings in own.items():
        walls, cpus = [t[0] for t in timings], [t[1] for t in timings]
        rows.append({"shape": shape, "length": length, "model_calls": calls[shape], "queries": queries[(shape, length)],
                     "own_median": statistics.median(walls), "own_p95": _support.percentile(walls, 95),
                     "cpu_median": statistics.median(cpus),
                     "run_median": statistics.median(t[2] for t in timings),
                     "baseline_median": statistics.median(t[3] for t in timings)})

    def paired(combine) -> tuple[float, float]:
        """Median over rounds of `combine(own time by shape)`, for wall and CPU."""
        return tuple(statistics.median(combine({shape: series[number][which] for shape, series in by_round.items()})
                                       for number in range(runs)) for which in (0, 1))

    breakdown, growth = {}, {}
    for length in lengths:
        by_round = {shape: own[(shape, length)] for shape in shapes}
        have = set(shapes)
        figures = {}
        if "empty" in have:
            figures["empty"] = paired(lambda t: t["empty"])
        if "agent" in have:
            figures["agent"] = paired(lambda t: t["agent"])
        if {"function", "empty"} <= have:
            figures["function_step"] = paired(lambda t: t["function"] - t["empty"])
        if {"condition", "empty"} <= have:
            figures["condition"] = paired(lambda t: t["condition"] - t["empty"])
        if {"workflow", "function", "condition", "empty"} <= have:
            figures["agent_step"] = paired(lambda t: t["workflow"] - t["function"] - t["condition"] + 2 * t["empty"])
            if "agent" in have:
                figures["agent_step_overhead"] = paired(
                    lambda t: t["workflow"] - t["function"] - t["condition"] + 2 * t["empty"] - t["agent"])
        if {"agent-step", "agent"} <= have:
            figures["agent_step_direct"] = paired(lambda t: t["agent-step"] - t["agent"])
        if {"team", "agent"} <= have:
            figures["team_overhead"] = paired(lambda t: t["team"] - t["agent"])
        breakdown[length] = figures
    for shape in shapes:
        first, last = own[(shape, lengths[0])], own[(shape, lengths[-1])]
        growth[shape] = tuple(statistics.median(b[which] - a[which] for a, b in zip(first, last, strict=True))
                              for which in (0, 1))
    return {"rows": rows, "breakdown": breakdown, "growth": growth}


def show_sql(shape: str, length: int) -> None:
    """The statements of one run of `shape` in a session of `length` earlier runs."""
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from sessions_core.llm import OpenAIChat

    server = _support.start_server(responder)
    component = make_components(OpenAIChat(id="bench-model", base_url=server.base_url, api_key="bench",
                                           max_retries=0))[shape]
    session_id = f"bench-sql-{shape}-{length}"
    try:
        prefill(component, session_id, length)
        component.run(PROMPT, session_id=session_id)
        with CaptureQueriesContext(connection) as captured:
            component.run(PROMPT, session_id=session_id)
    finally:
        server.stop()
        connections.close_all()
    print(f"{len(captured.captured_queries)} statements in one run of {shape} at {length:,} earlier runs:")
    for number, query in enumerate(captured.captured_queries, start=1):
        print(f"{number:3}. {query['sql'][:300]}")


def profile(shape: str, length: int, runs: int, warmup: int) -> None:
    """cProfile of `runs` sync runs of one shape (no baseline): each runs wholly on this thread."""
    from django.db import connections

    from sessions_core.llm import OpenAIChat

    server = _support.start_server(responder)
    component = make_components(OpenAIChat(id="bench-model", base_url=server.base_url, api_key="bench",
                                           max_retries=0))[shape]
    session_id = f"bench-profile-{shape}-{length}"
    try:
        prefill(component, session_id, length)
        _support.profile_runs(lambda: component.run(PROMPT, session_id=session_id), runs, warmup,
                              f"of {shape} at {length:,} earlier runs")
    finally:
        server.stop()
        connections.close_all()


if __name__ == "__main__":
    main()
