"""Client CPU per streamed token on the model path: the HTTP bytes to the events a run yields.

    .venv/bin/python bench/model_stream.py                         # this checkout: 200 tokens, 0 and 2 ms apart
    .venv/bin/python bench/model_stream.py --compare /path/to/other/checkout   # that one and this one, in turn
    .venv/bin/python bench/model_stream.py --tokens 1000 --delays 0,1 --rounds 20

Setup: a local OpenAI-compatible model (`_support.serve_fake_model`) in a process of its own per delay,
streaming `--tokens` words ("word17 "), one every `--delays` ms (0: as fast as it writes them, so reads
carry many SSE events and the figure is the Python path alone; 5 ms: one event per read, as a real model
streams, and a single stream's figure is then mostly the cost of waking the process up for each read,
which this VM makes high; `many` shares those wake-ups between 50 streams). Each checkout measured
runs in its own child process on a throwaway SQLite database, and the children take turns round by
round, each doing every measure once per round, so all see the same moments of the machine. Figures
are the child's process CPU (`time.process_time`: every thread, the engine's database thread
included; the server is elsewhere), the median over the rounds:

  astream   `OpenAIChat.astream` alone: CPU from its first content chunk to its end, per token after
            the first (what each further token costs; the request is not in it), and the whole call.
  agent     `Agent.arun(stream=True)`, no tools, one session: CPU from the first content event to the
            last, per token after the first (the engine's per-token path on top of `astream`).
  many      `--streams` (50) `astream` calls at once against the server of the last delay, as a busy
            server process reads its chats' replies: the whole CPU per token (requests included).
  acomplete non-streamed `OpenAIChat.acomplete` (a title request, answered with three words): the mean
            CPU of 10 calls in a row, each whole.
  sdk lines the bare `openai` client's `with_streaming_response` read with `iter_lines()` and nothing
            parsed, for scale: the same in every checkout (so it also shows the noise between them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _support

TITLE_REQUEST = [{"role": "system", "content": "Name this chat in at most five words."},
                 {"role": "user", "content": "What is the boiling point of water?"}]
PROMPT = [{"role": "user", "content": "Write a long answer."}]


# -- the parent -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=200, help="words per streamed reply")
    parser.add_argument("--delays", default="0,5", help="ms between the streamed words, one server each")
    parser.add_argument("--streams", type=int, default=50, help="concurrent astream calls for the 'many' measure "
                        "(against the server of the last delay)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (each child measures all per round)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--compare", metavar="CHECKOUT", action="append", default=[],
                        help="also measure another checkout of the project (repeatable)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: the SQLite URL of a child
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    delays = [float(value) for value in args.delays.split(",") if value]
    if args.child:
        child(args, delays)
        return

    servers, ports = [], []
    for delay in delays:
        process, port = start_model(args.tokens, delay / 1000)
        servers.append(process)
        ports.append(port)
    checkouts = [(Path(path).resolve().name or path, Path(path).resolve()) for path in args.compare]
    checkouts.append(("this", _support.ROOT))
    children = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for number, (name, root) in enumerate(checkouts):
                url = f"sqlite:///{tmp}/bench{number}.sqlite3"
                command = [sys.executable, __file__, "--child", url, "--root", str(root), "--tokens",
                           str(args.tokens), "--delays", args.delays, "--streams", str(args.streams),
                           "--ports", ",".join(map(str, ports))]
                children[f"{name} ({root})" if name != "this" else "this checkout"] = command, _support.child_env(url)
            results, _ = _support.drive_rounds(children, args.warmup + args.rounds)
        finally:
            for process in servers:
                process.terminate()
                process.join()
    print_table(results, delays, args)
    print(_support.load_line())


def start_model(tokens: int, delay: float) -> tuple[multiprocessing.Process, int]:
    """`serve_fake_model` in a process of its own; returns it and its port."""
    ready = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(tokens, delay, ready), daemon=True)
    process.start()
    return process, ready.get(timeout=30)


def _serve(tokens: int, delay: float, ready) -> None:
    sys.path.insert(0, str(_support.ROOT))
    asyncio.run(_support.serve_fake_model(0, tokens, delay, ready.put))


def print_table(results: dict, delays: list[float], args) -> None:
    print(f"\nClient CPU per streamed token (us), median of {args.rounds} rounds after {args.warmup} untimed; "
          f"{args.tokens} tokens per reply; the checkouts take turns in each round")
    rows = [("checkout", "measure", *[f"{delay:g} ms apart" for delay in delays])]
    measures = [("astream", "astream per token"), ("astream_call", "astream whole call (ms)"),
                ("agent", "Agent.arun per token"), ("sdk", "sdk iter_lines per token")]
    for name, rounds in results.items():
        timed = rounds["figures"][args.warmup:]
        for key, label in measures:
            cells = []
            for delay in delays:
                value = statistics.median(figures[f"{key}@{delay:g}"] for figures in timed)
                cells.append(f"{value:.2f}" if key.endswith("call") else f"{value:.1f}")
            rows.append((name, label, *cells))
        value = statistics.median(figures["many"] for figures in timed)
        rows.append((name, f"astream, {args.streams} at once, per token", *[""] * (len(delays) - 1), f"{value:.1f}"))
        value = statistics.median(figures["acomplete"] for figures in timed)
        rows.append((name, "acomplete, one call (ms)", f"{value:.2f}", *[""] * (len(delays) - 1)))
    _support.print_table(rows)


# -- a child: one checkout's code -------------------------------------------------------------------


def child(args, delays: list[float]) -> None:
    root = Path(args.root)
    sys.path.insert(0, str(root))
    _support.ROOT = root  # throwaway_database sets Django up from this checkout
    ports = [int(port) for port in args.ports.split(",")]
    with _support.throwaway_database("bench_model_stream"):
        import openai

        from sessions_core import Agent
        from sessions_core.llm import OpenAIChat

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        models = {delay: OpenAIChat(id="bench-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="bench",
                                    max_retries=0) for delay, port in zip(delays, ports, strict=True)}
        clients = {delay: openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0)
                   for delay, port in zip(delays, ports, strict=True)}
        agents = {delay: Agent(name="bench", model=model) for delay, model in models.items()}
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "round":
                break
            figures = {}
            for delay in delays:
                key = f"{delay:g}"
                figures[f"astream@{key}"], figures[f"astream_call@{key}"] = loop.run_until_complete(
                    measure_astream(models[delay], args.tokens))
                figures[f"agent@{key}"] = loop.run_until_complete(measure_agent(agents[delay], args.tokens))
                figures[f"sdk@{key}"] = loop.run_until_complete(measure_sdk(clients[delay], args.tokens))
            figures["many"] = loop.run_until_complete(measure_many(models[delays[-1]], args.tokens, args.streams))
            figures["acomplete"] = loop.run_until_complete(measure_acomplete(models[delays[0]]))
            print(json.dumps({"figures": figures}), flush=True)
        for client in clients.values():
            loop.run_until_complete(client.close())
        loop.close()
    print(json.dumps({}))


def _words(text: str) -> int:
    return text.count(" ")


async def measure_astream(model, tokens: int) -> tuple[float, float]:
    """(CPU us per token after the first content chunk, the whole call's CPU in ms)."""
    started = time.process_time()
    first = first_words = None
    words = 0
    async for chunk in model.astream(PROMPT):
        if chunk.content:
            words += _words(chunk.content)
            if first is None:
                first, first_words = time.process_time(), words
    ended = time.process_time()
    assert words == tokens, (words, tokens)
    return (ended - first) * 1e6 / (tokens - first_words), (ended - started) * 1000


async def measure_agent(agent, tokens: int) -> float:
    """CPU us per token from the first content event to the last."""
    first = last = first_words = None
    words = 0
    async for event in agent.arun("Write a long answer.", session_id="bench", stream=True):
        if getattr(event, "content", None) and event.event == "RunContent":
            words += _words(event.content)
            last = time.process_time()
            if first is None:
                first, first_words = last, words
    assert words == tokens, (words, tokens)
    return (last - first) * 1e6 / (tokens - first_words)


async def measure_sdk(client, tokens: int) -> float:
    """The bare client's lines, unparsed: CPU us per line after the first content line."""
    first = None
    lines = 0
    async with client.chat.completions.with_streaming_response.create(
        model="bench-model", messages=PROMPT, stream=True, stream_options={"include_usage": True}
    ) as response:
        async for line in response.iter_lines():
            if '"content": "word' in line:
                lines += 1
                if first is None:
                    first = time.process_time()
    ended = time.process_time()
    assert lines == tokens, (lines, tokens)
    return (ended - first) * 1e6 / (tokens - 1)


async def measure_many(model, tokens: int, streams: int) -> float:
    """`streams` astream calls at once, as a busy server process reads them: whole CPU per token."""

    async def one() -> int:
        return sum([_words(chunk.content) async for chunk in model.astream(PROMPT)])

    started = time.process_time()
    words = await asyncio.gather(*[one() for _ in range(streams)])
    ended = time.process_time()
    assert words == [tokens] * streams, words
    return (ended - started) * 1e6 / (tokens * streams)


async def measure_acomplete(model, calls: int = 10) -> float:
    """The mean CPU of `calls` acomplete calls, one after another, in ms."""
    started = time.process_time()
    for _ in range(calls):
        text = await model.acomplete(TITLE_REQUEST)
        assert text == "Load test chat", text
    return (time.process_time() - started) * 1000 / calls


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
