"""Server CPU per streamed token: the live reply drawn as markdown (now) beside escaped text (before).

    .venv/bin/python bench/stream_render.py                 # the defaults below
    .venv/bin/python bench/stream_render.py --rounds 5 --sockets 1,3 --batch-ms 0,30 --whole

For each reply shape, batch setting and number of sockets on the session, one reply is streamed through the
code the server runs per batch, in this process, with Django's in-memory channel layer. Tokens (the words
of the reply with their spaces and newlines, as tests/support/llm_server.py sends them) arrive every --token-ms on
a simulated clock; a batch is sent when the path's own rule says it is due:

  now      chatapp.live.runner's rule (CHAT_STREAM_BATCH_SECONDS, and the drawing's share of a core,
           CHAT_STREAM_DRAW_SHARE, 0.05 unless set in the environment),
           chatapp.live.runner._flush (the reply drawn once per batch: its completed blocks once, its open
           block again), the group send, and each socket's live.Follower.tokens turning the batch into its frame;
  before   what the same steps did before the markdown stream (a copy of the old code, below): every
           CHAT_STREAM_BATCH_SECONDS, the new text escaped into an out-of-band fragment per socket;
  whole    (--whole; slow) for scale: the whole reply re-rendered with rendering.render_markdown at each of
           the old batches (rendering only, no sockets).

Figures are process CPU time (time.process_time) per streamed token in microseconds, the median over the
rounds, with the number of frames a socket got; the paths take turns within each round (the host's busy
moments fall on all of them alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
os.environ.pop("REDIS_URL", None)  # the in-memory layer: the layer's own cost is not the subject

import django  # noqa: E402

django.setup()

from channels.layers import get_channel_layer  # noqa: E402

from chatapp import live, rendering  # noqa: E402
from chatapp.broadcast import session_group  # noqa: E402
from chatapp.live import fragments, runner  # noqa: E402
from sessions_core.models import ChatSession  # noqa: E402
from tests.support.llm_server import _words  # noqa: E402

SECTION = """## Part {n}

Some **bold {n}** text, a [link](https://example.com/{n}) and `code {n}`, then a longer sentence that goes on
for a while so that the paragraph has the length of a real one in a reply of a model.

- first point of {n}, with a few words
- second point of {n}, with a few more words

```python
def part_{n}(items):
    return [item * {n} for item in items if item]
```

| step | what |
|------|------|
| {n} | done |
"""
REPLIES = {
    "mixed": "\n".join(SECTION.format(n=n) for n in range(25)),  # ~2,100 tokens of prose, lists, code, tables
    "one code block": "```python\n" + "\n".join(f"value_{n} = compute({n}, 'x')  # line {n}" for n in range(300))
                      + "\n```\n",  # the worst case: one open block that grows to ~1,500 tokens
    "one long list": "\n".join(f"- item {n} with a few words in it" for n in range(250)),
}
PK = 1  # the session the fake run belongs to (never read from the database)


async def _sockets(count: int) -> tuple[list[str], list[live.Follower], list[list[str]]]:
    layer = get_channel_layer()
    channels, followers, sent = [], [], []
    session = ChatSession(pk=PK, session_id="bench")
    for _ in range(count):
        channel = await layer.new_channel()
        await layer.group_add(session_group(PK), channel)
        out: list[str] = []

        async def send(html: str, out=out) -> None:
            out.append(html)

        channels.append(channel)
        followers.append(live.Follower(session, channel, send))
        sent.append(out)
    return channels, followers, sent


async def _drop(channels: list[str]) -> None:
    for channel in channels:
        await get_channel_layer().group_discard(session_group(PK), channel)


def _due_batches(text: str, batch: float, token: float, rule) -> list[str]:
    """The reply's tokens grouped as the batches a rule sends: rule(clock, last_sent) says a batch is due."""
    batches, pending, last = [], "", -1e9
    for number, word in enumerate(_words(text)):
        pending += word
        clock = number * token
        if rule(clock, last):
            batches.append(pending)
            pending, last = "", clock
    return batches + ([pending] if pending else [])


async def now(text: str, batch: float, token: float, sockets: int) -> tuple[float, int]:
    layer = get_channel_layer()
    channels, followers, sent = await _sockets(sockets)
    run = runner.LiveRun(fragments.StreamedRun("bench-run"))
    runner._live[PK] = run
    start = time.process_time()
    for number, word in enumerate(_words(text)):
        run.add(word)
        clock = number * token
        if run.flush_wait(batch, clock) <= 0:
            await runner._flush(PK, run)
            run.last_flush = clock  # the simulated clock, not the real one
            for channel, follower in zip(channels, followers):
                await follower.tokens(await layer.receive(channel))
    sent_before = run.seq
    await runner._flush(PK, run)  # the end: what is left
    if run.seq > sent_before:
        for channel, follower in zip(channels, followers):
            await follower.tokens(await layer.receive(channel))
    spent = time.process_time() - start
    del runner._live[PK]
    await _drop(channels)
    return spent, len(sent[0])


def _old_rule(batch: float):
    return lambda clock, last: clock >= last + batch


async def before(text: str, batch: float, token: float, sockets: int) -> tuple[float, int]:
    """The code of the same steps before the markdown stream (chatapp/live.py as it was then)."""
    layer = get_channel_layer()
    channels, _, sent = await _sockets(sockets)
    offsets = [{} for _ in channels]
    parts, flushed = [], 0
    chunks = _due_batches(text, batch, token, _old_rule(batch))
    start = time.process_time()
    for chunk in chunks:
        parts.append(chunk)
        whole = "".join(parts)  # LiveRun.text
        parts[:] = [whole]
        batch_event = {"type": "chat.tokens", "run_id": "bench-run", "start": flushed, "text": whole[flushed:]}
        flushed = len(whole)
        await layer.group_send(session_group(PK), batch_event)
        for channel, have, out in zip(channels, offsets, sent):
            event = await layer.receive(channel)
            shown, piece = have.get(event["run_id"]), event["text"]
            if shown is not None:
                piece = piece[max(0, shown - event["start"]):]
            out.append(rendering.render_oob(piece, f"beforeend:#reply-{event['run_id']}"))
    spent = time.process_time() - start
    await _drop(channels)
    return spent, len(sent[0])


async def whole(text: str, batch: float, token: float, sockets: int) -> tuple[float, int]:
    chunks = _due_batches(text, batch, token, _old_rule(batch))
    shown = ""
    start = time.process_time()
    for chunk in chunks:
        shown += chunk
        rendering.render_markdown(shown)
    return time.process_time() - start, len(chunks)


PATHS = {"before": before, "now": now, "whole": whole}


async def main(rounds: int, sockets_list: list[int], batches: list[float], token: float, replies: list[str],
               with_whole: bool) -> None:
    paths = {name: PATHS[name] for name in PATHS if with_whole or name != "whole"}
    figures: dict[tuple, list[tuple[float, int]]] = {}
    for round_number in range(rounds):
        order = list(paths) if round_number % 2 == 0 else list(reversed(paths))
        for name in replies:
            text, tokens = REPLIES[name], len(_words(REPLIES[name]))
            for batch in batches:
                for sockets in sockets_list:
                    for path in order:
                        if path == "whole" and sockets != sockets_list[0]:
                            continue  # rendering only: the same for any number of sockets
                        spent, frames = await paths[path](text, batch, token, sockets)
                        figures.setdefault((name, batch, sockets, path), []).append((spent / tokens * 1e6, frames))
    print(f"CPU per streamed token, microseconds (median of {rounds} rounds; process_time; in-memory layer;"
          f" a token every {token * 1000:g} ms); frames = frames one socket got")
    print(f"{'reply':<16}{'tokens':>7}{'batch ms':>9}{'sockets':>8}{'before':>9}{'frames':>7}{'now':>9}{'frames':>7}"
          f"{'now/before':>11}{'whole':>10}")
    for name in replies:
        for batch in batches:
            for sockets in sockets_list:
                row = {path: (statistics.median(f[0] for f in figures[key]), figures[key][0][1])
                       for path in paths if (key := (name, batch, sockets, path)) in figures}
                whole_cell = f"{row['whole'][0]:>10.1f}" if "whole" in row else f"{'':>10}"
                print(f"{name:<16}{len(_words(REPLIES[name])):>7}{batch * 1000:>9g}{sockets:>8}"
                      f"{row['before'][0]:>9.1f}{row['before'][1]:>7}{row['now'][0]:>9.1f}{row['now'][1]:>7}"
                      f"{row['now'][0] / row['before'][0]:>10.1f}x{whole_cell}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sockets", default="1,3", help="sockets per session, comma-separated")
    parser.add_argument("--batch-ms", default="0,30", help="CHAT_STREAM_BATCH_SECONDS in ms, comma-separated")
    parser.add_argument("--token-ms", type=float, default=5.0, help="time between tokens (simulated)")
    parser.add_argument("--replies", default=",".join(REPLIES), help="comma-separated: " + ", ".join(REPLIES))
    parser.add_argument("--whole", action="store_true", help="also time re-rendering the whole reply per batch")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, [int(n) for n in args.sockets.split(",")],
                     [float(n) / 1000 for n in args.batch_ms.split(",")], args.token_ms / 1000,
                     args.replies.split(","), args.whole))
