"""Benchmark of the sidebar search: time to the first page with 10,000 sessions and 200,000 messages.

    .venv/bin/python bench/search.py --pg-url postgres://app:app@127.0.0.1:55432/app
    .venv/bin/python bench/search.py --no-pg            # SQLite only (file var/bench_search.sqlite3)

One user ("bench_main") gets 10,000 sessions of 10 runs each (a user and an assistant message per run:
200,000 messages); three other users get 1,000 sessions each, so scoping has something to skip. The
data is made once per database and reused (--rebuild makes it again); PostgreSQL gets ANALYZE after
loading, as autovacuum would. Then each query runs --runs times after warm-up and the p50/p95 of
search_sessions() (every query of the first page, snippets included) is printed. Target: p95 under
100 ms on PostgreSQL.

The PostgreSQL URL comes from --pg-url or BENCH_PG_URL; use a throwaway server, as scripts/test does:

    PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1); D=$(mktemp -d); chown postgres "$D"
    runuser -u postgres -- $PGBIN/initdb -D $D/data -U postgres --auth=trust -E UTF8 --locale=C.UTF-8
    runuser -u postgres -- $PGBIN/pg_ctl -D $D/data -l $D/log -w -o "-p 55432 -k $D" start
    psql -h 127.0.0.1 -p 55432 -U postgres -c "CREATE ROLE app LOGIN PASSWORD 'app' SUPERUSER" \\
         -c "CREATE DATABASE app OWNER app"
    # afterwards: runuser -u postgres -- $PGBIN/pg_ctl -D $D/data stop; rm -rf $D

Only bench_* users' rows are ever deleted (with --rebuild).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SESSIONS, RUNS_PER_SESSION = 10_000, 10
OTHER_USERS, OTHER_SESSIONS = 3, 1_000
RARE_WORD, RARE_COUNT = "zyxquartz", 20
PHRASE, PHRASE_COUNT = ("quantum", "lasagna"), 400
TITLE_WORD, TITLE_TYPO = "itinerary", "itinerery"
ASSISTANTS = ["general", "shopping", "notes"]


def words(rng: random.Random, n: int, prefix: str = "") -> list[str]:
    """n pronounceable made-up words (distinct), so stemming and stop words play no favourites."""
    onsets = "b c d f g h k l m n p r s t v w z br ch cl dr gr pl sh st tr".split()
    vowels, codas = "aeiou", ["", "n", "r", "s", "l", "m"]
    seen: dict[str, None] = {}
    while len(seen) < n:
        word = prefix + "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                                for _ in range(rng.randint(2, 3)))
        seen[word] = None
    return list(seen)


class Corpus:
    def __init__(self, seed: int = 7):
        self.rng = random.Random(seed)
        self.vocab = words(self.rng, 20_000)
        # Zipf-like weights: the first word is in most messages, the tail words in a handful.
        self.cum = list(self._cumulative([1 / (rank + 1) for rank in range(len(self.vocab))]))
        self.title_vocab = words(self.rng, 2_000, prefix="")
        self.title_vocab[7] = TITLE_WORD

    @staticmethod
    def _cumulative(weights):
        total = 0.0
        for w in weights:
            total += w
            yield total

    def text(self, n: int) -> str:
        return " ".join(self.rng.choices(self.vocab, cum_weights=self.cum, k=n))

    def title(self) -> str:
        picks = self.rng.choices(self.title_vocab, k=self.rng.randint(2, 5))
        if self.rng.random() < 0.005:
            picks[0] = TITLE_WORD
        return " ".join(picks).capitalize()

    @property
    def common_word(self) -> str:
        return self.vocab[0]

    @property
    def medium_word(self) -> str:
        return self.vocab[300]


def populate(corpus: Corpus) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from sessions_core.models import ChatSession, Message, Run

    User = get_user_model()
    rng, now = corpus.rng, timezone.now()
    usernames = ["bench_main", *[f"bench_other{i}" for i in range(OTHER_USERS)]]
    users = [User.objects.create_user(name) for name in usernames]
    plan = [(users[0], SESSIONS)] + [(u, OTHER_SESSIONS) for u in users[1:]]
    special = {"rare": set(rng.sample(range(SESSIONS * RUNS_PER_SESSION * 2), RARE_COUNT)),
               "phrase": set(rng.sample(range(SESSIONS * RUNS_PER_SESSION * 2), PHRASE_COUNT))}
    started = time.perf_counter()
    for user, count in plan:
        main = user is users[0]
        message_no = 0
        for chunk in range(0, count, 500):
            with transaction.atomic():
                sessions = []
                for i in range(chunk, min(count, chunk + 500)):
                    when = now - timedelta(minutes=(count - i) * 50)  # oldest first: ids grow with time
                    sessions.append(ChatSession(
                        owner=user, component_id=rng.choice(ASSISTANTS), name=corpus.title(), name_source="auto",
                        created_at=when, last_activity_at=when + timedelta(minutes=RUNS_PER_SESSION),
                        pinned_at=when if rng.random() < 0.01 else None, last_seq=RUNS_PER_SESSION * 2,
                    ))
                ChatSession.objects.bulk_create(sessions)
                runs = [Run(session=s, component_id=s.component_id, status="completed",
                            created_at=s.created_at + timedelta(minutes=r),
                            finished_at=s.created_at + timedelta(minutes=r))
                        for s in sessions for r in range(RUNS_PER_SESSION)]
                Run.objects.bulk_create(runs, batch_size=5000)
                messages = []
                for run_no, run in enumerate(runs):
                    for role, length in (("user", rng.randint(6, 20)), ("assistant", rng.randint(20, 60))):
                        content = corpus.text(length)
                        if main and message_no in special["rare"]:
                            content += f" {RARE_WORD}"
                        if main and message_no in special["phrase"]:
                            content = f"{' '.join(PHRASE)} {content}"
                        seq = (run_no % RUNS_PER_SESSION) * 2 + (1 if role == "user" else 2)
                        messages.append(Message(session=run.session, run=run, seq=seq, role=role, content=content,
                                                created_at=run.created_at))
                        message_no += 1
                Message.objects.bulk_create(messages, batch_size=5000)
        print(f"  {user.username}: {count} sessions, {message_no} messages", file=sys.stderr, flush=True)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE sessions_core_message")
            cursor.execute("VACUUM ANALYZE sessions_core_chatsession")
            cursor.execute("VACUUM ANALYZE sessions_core_run")
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return {"load_seconds": round(time.perf_counter() - started, 1)}


def delete_bench_rows() -> None:
    from django.db import connection

    bench_sessions = ("SELECT s.id FROM sessions_core_chatsession s JOIN auth_user u ON u.id = s.owner_id "
                      "WHERE u.username LIKE 'bench\\_%' ESCAPE '\\'")
    with connection.cursor() as cursor:
        for table in ("sessions_core_message", "sessions_core_statechange", "sessions_core_run"):
            cursor.execute(f"DELETE FROM {table} WHERE session_id IN ({bench_sessions})")
        cursor.execute(f"DELETE FROM sessions_core_chatsession WHERE id IN ({bench_sessions})")
        cursor.execute("DELETE FROM auth_user WHERE username LIKE 'bench\\_%' ESCAPE '\\'")


def child(rebuild: bool, runs: int) -> dict:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from sessions_core.models import ChatSession, Message
    from sessions_core.search import search_sessions

    call_command("migrate", verbosity=0)
    corpus = Corpus()
    info = {"vendor": connection.vendor}
    user = get_user_model().objects.filter(username="bench_main").first()
    if rebuild or user is None or ChatSession.objects.filter(owner=user).count() != SESSIONS:
        delete_bench_rows()
        info |= populate(corpus)
        user = get_user_model().objects.get(username="bench_main")
    info["sessions"] = ChatSession.objects.filter(owner=user).count()
    info["messages"] = Message.objects.filter(session__owner=user).count()
    info["all_messages"] = Message.objects.count()

    queries = {
        "common word": corpus.common_word,
        "medium word": corpus.medium_word,
        "rare word": RARE_WORD,
        "phrase": '"{} {}"'.format(*PHRASE),
        "two words": f"{corpus.medium_word} {corpus.vocab[40]}",
        "title word": TITLE_WORD,
        "title typo": TITLE_TYPO,
        "filter assistant": f"assistant:shopping {corpus.medium_word}",
        "filter pinned": f"pinned: {corpus.common_word}",
        "no match": "qqqzzzxxx",
    }
    results = {}
    for label, query in queries.items():
        for _ in range(3):
            page = search_sessions(user, query)
        timings = []
        for _ in range(runs):
            started = time.perf_counter()
            page = search_sessions(user, query)
            timings.append((time.perf_counter() - started) * 1000)
        timings.sort()
        results[label] = {
            "query": query, "titles": len(page.title_hits), "messages": len(page.message_hits),
            "p50": statistics.median(timings), "p95": timings[min(len(timings) - 1, int(len(timings) * 0.95))],
        }
    info["results"] = results
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", ""))
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--sqlite-path", default=str(ROOT / "var" / "bench_search.sqlite3"))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rebuild", action="store_true", help="delete and re-create the bench users' data")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.rebuild, args.runs)))
        return

    targets = []
    if not args.no_pg:
        if not args.pg_url:
            parser.error("give --pg-url (or set BENCH_PG_URL), or pass --no-pg")
        targets.append(("PostgreSQL", args.pg_url))
    if not args.no_sqlite:
        Path(args.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
        targets.append(("SQLite", f"sqlite:///{Path(args.sqlite_path).resolve()}"))
    reports = {}
    for name, url in targets:
        print(f"== {name}: loading data if needed, then {args.runs} runs per query", file=sys.stderr, flush=True)
        env = {**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "ERROR"}
        command = [sys.executable, __file__, "--child", "--runs", str(args.runs)]
        command += ["--rebuild"] if args.rebuild else []
        out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd=ROOT)
        sys.stderr.write(out.stderr)
        reports[name] = json.loads(out.stdout.strip().splitlines()[-1])

    for name, report in reports.items():
        print(f"\n{name}: {report['sessions']:,} sessions / {report['messages']:,} messages for the user, "
              f"{report['all_messages']:,} messages in all"
              + (f" (loaded in {report['load_seconds']} s)" if "load_seconds" in report else ""))
        print(f"{'query':18} {'text':32} {'titles':>6} {'msgs':>5} {'p50 ms':>8} {'p95 ms':>8}")
        for label, r in report["results"].items():
            print(f"{label:18} {r['query'][:32]:32} {r['titles']:>6} {r['messages']:>5}"
                  f" {r['p50']:>8.1f} {r['p95']:>8.1f}")


if __name__ == "__main__":
    main()
