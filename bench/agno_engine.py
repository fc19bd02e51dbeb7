"""The Agno side of `bench/engine.py --agno PYTHON`: the same agents and scenarios on Agno with SqliteDb.

Run only by engine.py, with the Python of a separate virtual environment that has `agno` (and openai,
sqlalchemy) installed; the project itself never depends on or imports Agno. See bench/README.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

os.environ["AGNO_TELEMETRY"] = "false"  # nothing leaves the machine

import _support  # noqa: E402 - after the telemetry switch
import engine  # noqa: E402 - the scenarios' prompt, instructions and model replies


def append_item(run_context, item: str) -> str:
    """Append an item to the list.

    Args:
        item: What to append.
    """
    run_context.session_state["items"].append(item)
    return f"Appended {item}; the list has {len(run_context.session_state['items'])} items."


def main() -> None:
    sys.path.insert(0, str(_support.ROOT))
    from agno.agent import Agent
    from agno.db.sqlite import SqliteDb
    from agno.models.openai import OpenAIChat
    from agno.run import RunContext
    from sqlalchemy import event

    append_item.__annotations__["run_context"] = RunContext  # Agno injects the context by this annotation
    long_runs = int(sys.argv[1])
    server = _support.start_server(engine.compare_responder)
    loop = asyncio.new_event_loop()
    baseline = _support.Baseline(server.base_url)
    with tempfile.TemporaryDirectory() as tmp:
        db = SqliteDb(db_file=f"{tmp}/agno.sqlite3")

        def agent(history: bool, tool: bool):
            return Agent(
                name="bench", model=OpenAIChat(id="bench-model", base_url=server.base_url, api_key="bench",
                                               max_retries=0),
                db=db, tools=[append_item] if tool else [], session_state={"items": []},
                instructions=engine.INSTRUCTIONS, add_history_to_context=history, num_history_runs=3,
                telemetry=False,
            )

        agents = {name: agent(*shape) for name, shape in engine.COMPARE_SHAPES.items()}
        scenarios = {name: ((lambda session_id, agent=agents[name]: agent.run(engine.PROMPT, session_id=session_id)),
                            engine.COMPARE_CALLS[name]) for name in agents}

        def completed(output) -> bool:
            return getattr(output.status, "value", output.status) == "COMPLETED"

        for _ in range(5):  # warm-up on throwaway sessions
            for name, (run, _calls) in scenarios.items():
                assert completed(run(f"warmup-{name}-{_}"))
        _support.serve_rounds(scenarios, server, baseline, loop, completed, long_runs)
        # The statements of one more run of each scenario, as SQLAlchemy hands them to the driver.
        statements: list[str] = []
        event.listen(db.db_engine, "before_cursor_execute",
                     lambda conn, cursor, sql, params, context, many: statements.append(sql))
        event.listen(db.db_engine, "commit", lambda conn: statements.append("COMMIT"))
        counts, listed = {}, {}
        for name, (run, _calls) in scenarios.items():
            del statements[:]
            run("compare-fresh-sql" if name == "fresh" else f"compare-{name}")
            counts[name], listed[name] = len(statements), [" ".join(sql.split())[:160] for sql in statements]
        loop.run_until_complete(baseline.close())
        server.stop()
    print(json.dumps({"queries": counts, "statements": listed}))


if __name__ == "__main__":
    main()
