"""The Agno cookbook ports in examples/: each main() against the local test model server, plus the
real one-line commands on the offline model in subprocesses."""

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from sessions_core import PostgresDb, SqliteDb
from sessions_core.models import ChatSession, Run
from tests.support.example_support import EXAMPLES, example, examples_folder, offline_env  # noqa: F401  (fixture)
from tests.support.llm_server import Text, ToolCalls
from tests.support.store_support import db_access, pg_url  # noqa: F401  (fixtures)

# The examples name their own stores (SqliteDb, PostgresDb, InMemoryDb), made while the test runs:
# no Django test case around them, which would refuse databases it was not told about.
pytestmark = pytest.mark.usefixtures("db_access", "examples_folder")


def sessions_in(db_file: str):
    """The sessions of the example's SqliteDb (the same arguments name the same store)."""
    return ChatSession.objects.using(SqliteDb(db_file=db_file).alias)


@pytest.fixture
def pg_examples(pg_url, monkeypatch):
    """The PostgreSQL examples' PG_URL: a new database; its PostgresDb(session_table="sessions")."""
    monkeypatch.setenv("PG_URL", pg_url)
    return PostgresDb(db_url=pg_url, session_table="sessions")


def plan(turns: dict[str, list[tuple[str, dict]]], reply: str = "Done."):
    """A responder: the tool calls listed for the user's message, then `reply` after the tool results."""

    def responder(body):
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Text(reply)
        calls = turns.get(last["content"])
        return ToolCalls(calls) if calls else Text(f"You said: {last['content']}")

    return responder


def system_prompt(body: dict) -> str:
    return body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""


def tool_results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def adds(*items: str) -> list[tuple[str, dict]]:
    return [("add_item", {"item": item}) for item in items]


def printed_states(output: str, prefix: str = "Session state: ") -> list:
    return [ast.literal_eval(line[len(prefix):]) for line in output.splitlines() if line.startswith(prefix)]


def test_session_state_basic(served):
    served.responder = plan({"Add milk, eggs, and bread to the shopping list": adds("milk", "eggs", "bread")})

    state = example("session_state_basic").main()

    assert state == {"shopping_list": ["milk", "eggs", "bread"]}
    first = served.requests[0]
    assert system_prompt(first).startswith("Current state (shopping list) is: []")
    [tool] = first["tools"]
    assert tool["function"]["name"] == "add_item"
    assert list(tool["function"]["parameters"]["properties"]) == ["item"]  # run_context is hidden
    assert tool_results(served.requests[1])[-1] == "The shopping list is now ['milk', 'eggs', 'bread']"


def test_session_state_advanced_crud_with_idempotent_add(served, capsys):
    served.responder = plan({
        "Add milk, eggs, and bread to the shopping list": adds("milk", "eggs", "bread"),
        "I got bread": [("remove_item", {"item": "Bread"})],
        # "MILK" is already on the list in another case: the add is a no-op.
        "I need apples and oranges": adds("MILK", "apples", "oranges"),
        "whats on my list?": [("list_items", {})],
        "Clear everything from my list and start over with bananas and yogurt":
            [("clear_list", {}), *adds("bananas", "yogurt")],
    })

    state = example("session_state_advanced").main()

    assert state == {"shopping_list": ["bananas", "yogurt"]}
    assert printed_states(capsys.readouterr().out)[:5] == [
        {"shopping_list": ["milk", "eggs", "bread"]},
        {"shopping_list": ["milk", "eggs"]},
        {"shopping_list": ["milk", "eggs", "apples", "oranges"]},
        {"shopping_list": ["milk", "eggs", "apples", "oranges"]},
        {"shopping_list": ["bananas", "yogurt"]},
    ]
    results = [result for body in served.requests for result in tool_results(body)]
    assert "Removed 'bread' from the shopping list" in results
    assert "'MILK' is already in the shopping list" in results
    assert "Current shopping list:\n- milk\n- eggs\n- apples\n- oranges" in results
    # The instructions show the list as it was when each run started.
    last_turn = [body for body in served.requests if body["messages"][-1]["role"] == "user"][-1]
    assert "Current shopping list: ['milk', 'eggs', 'apples', 'oranges']" in system_prompt(last_turn)


def test_session_state_manual_update(served):
    served.responder = plan({"Add milk, eggs, and bread to the shopping list": adds("milk", "eggs", "bread")})

    state = example("session_state_manual_update").main()

    assert state == {"shopping_list": ["milk", "eggs", "bread", "chocolate"]}
    last = served.requests[-1]
    assert last["messages"][-1] == {"role": "user", "content": "What's on my list?"}
    assert system_prompt(last).startswith("Current state (shopping list) is: ['milk', 'eggs', 'bread', 'chocolate']")
    session = sessions_in("tmp/agents.db").get()
    assert list(session.state_changes.values_list("source", flat=True)) == [
        "defaults", "tool:add_item", "tool:add_item", "tool:add_item", "manual",
    ]


def test_session_state_events(served, capsys):
    served.responder = plan({"Add milk, eggs, and bread to the shopping list": adds("milk", "eggs", "bread")})

    state = example("session_state_events").main()

    assert state == {"shopping_list": ["milk", "eggs", "bread"]}
    out = capsys.readouterr().out
    assert out.count("State changed (tool:add_item)") == 3
    assert printed_states(out) == [{"shopping_list": ["milk", "eggs", "bread"]}]
    assert sessions_in("tmp/agents.db").get().session_state == state


def test_agentic_session_state(served):
    def update(items):
        return [("update_session_state", {"session_state_updates": {"shopping_list": items}})]

    served.responder = plan({
        "Add milk, eggs, and bread to the shopping list": update(["milk", "eggs", "bread"]),
        "I picked up the eggs, now what's on my list?": update(["milk", "bread"]),
    })

    state = example("agentic_session_state").main()

    assert state == {"shopping_list": ["milk", "bread"]}
    assert [tool["function"]["name"] for tool in served.requests[0]["tools"]] == ["update_session_state"]
    second_turn = served.requests[2]
    assert second_turn["messages"][-1]["content"] == "I picked up the eggs, now what's on my list?"
    assert '"shopping_list": ["milk", "eggs", "bread"]' in system_prompt(second_turn)
    assert set(Run.objects.using(SqliteDb(db_file="tmp/agents.db").alias).values_list("status", flat=True)) == {
        "completed"
    }


def test_dynamic_session_state_hook_short_circuits_the_tool(served):
    module = example("dynamic_session_state")
    served.add(
        ToolCalls([("process_customer_request", {"customer_id": "789", "action": "create", "name": "Tom"})]),
        ToolCalls([("process_customer_request", {"customer_id": "789", "action": "retrieve"})]),
        Text("Tom's profile: customer 789, named Tom."),
    )

    state = module.main()

    assert state == {"customer_profiles": {"123": {"name": "Jane Doe"}, "789": {"name": "Tom"}}}
    assert module.TOOL_BODY_CALLS == []  # the hook answered both calls
    assert len(served.requests) == 3
    assert tool_results(served.requests[2]) == [
        "Success! Customer 789 has been created.",
        'Profile for 789: {"name": "Tom"}',
    ]
    # The system prompt is built once per run: the last request still lists only customer 123.
    prompt = system_prompt(served.requests[2])
    assert "Your profiles: {'123': {'name': 'Jane Doe'}}." in prompt
    assert "789" not in prompt
    schema = served.requests[0]["tools"][0]["function"]["parameters"]
    assert schema["required"] == ["customer_id"] and "agent" not in schema["properties"]


def test_chat_history(served, pg_examples):
    served.responder = lambda body: Text(f"Fact number {len(body['messages'])}.")

    history = example("chat_history").main()

    assert [(m.role, m.content) for m in history] == [
        ("user", "Tell me a new interesting fact about space"),
        ("assistant", "Fact number 2."),
        ("user", "Tell me a new interesting fact about oceans"),
        ("assistant", "Fact number 4."),
    ]
    # History on: the second request carries the first turn between the system and the new message.
    assert [m["role"] for m in served.requests[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert ChatSession.objects.using(pg_examples.alias).get().session_id == "chat_history"


def test_persistent_session_continues_the_stored_session(served, pg_examples):
    served.responder = lambda body: Text(f"Fact after {len(body['messages']) - 1} earlier messages.")
    module = example("persistent_session")

    first = module.main()
    second = module.main()  # a new Agent on the same fixed session id, as a second process would

    assert len(first) == 2 and len(second) == 4
    assert [m["content"] for m in served.requests[1]["messages"]] == [
        "Tell me a new interesting fact about space",
        "Fact after 0 earlier messages.",
        "Tell me a new interesting fact about space",
    ]
    session = ChatSession.objects.using(pg_examples.alias).get(session_id="session_storage")
    assert session.runs.filter(status="completed").count() == 2


def test_session_options_history_used_not_stored(served, capsys):
    def responder(body):
        said = " ".join(m["content"] for m in body["messages"] if m["role"] == "user")
        if "What is my name" in said and "My name is Alice" in said:
            return Text("Your name is Alice and you love Python programming.")
        return Text("Nice to meet you!")

    served.responder = responder

    result = example("session_options").main()

    assert result == {"history_messages_sent": 2, "stored_messages": 2, "stored_history_messages": 0}
    assert "Your name is Alice and you love Python programming." in capsys.readouterr().out
    last_run = Run.objects.using(SqliteDb(db_file="tmp/example_no_history.db").alias).order_by("-id").first()
    assert list(last_run.messages.values_list("role", flat=True)) == ["user", "assistant"]
    assert last_run.history_seqs is None


def test_session_state_multiple_users(served):
    served.responder = plan({
        "Add milk, eggs, and bread to the shopping list": adds("milk", "eggs", "bread"),
        "Add tacos to the shopping list": adds("tacos"),
        "Add apples and grapes to the shopping list": adds("apples", "grapes"),
        "Remove milk from the shopping list": [("remove_item", {"item": "milk"})],
        "Add minced beef to the shopping list": adds("minced beef"),
        "What is on Mark Smith's shopping list?": [("get_shopping_list", {})],
        "Add chicken and soup to my list.": adds("chicken", "soup"),
    })

    result = example("session_state_multiple_users").main()

    assert result["shopping_lists"] == {
        "john_doe": {"user_1_session_1": ["eggs", "bread"]},
        "mark_smith": {"user_2_session_1": ["tacos", "minced beef"], "user_3_session_2": ["chicken", "soup"]},
        "carmen_sandiago": {"user_3_session_1": ["apples", "grapes"]},
    }
    assert result["session_states"] == {
        "john_doe/user_1_session_1": {},
        "mark_smith/user_2_session_1": {},
        "carmen_sandiago/user_3_session_1": {},
        "mark_smith/user_3_session_2": {},
    }
    owners = dict(sessions_in("tmp/data.db").values_list("session_id", "owner__username"))
    assert owners == {
        "user_1_session_1": "john_doe",
        "user_2_session_1": "mark_smith",
        "user_3_session_1": "carmen_sandiago",
        "user_3_session_2": "mark_smith",
    }
    assert system_prompt(served.requests[0]) == (
        "<instructions>\n- Current User ID: john_doe\n- Current Session ID: user_1_session_1\n</instructions>\n\n"
        "Use markdown to format your answers."
    )
    assert not sessions_in("tmp/data.db").exclude(session_state={}).exists()


# -- the documented commands, on the offline model -------------------------------------------------


def final_line(output: str, prefix: str):
    [line] = [line for line in output.splitlines() if line.startswith(prefix)]
    return ast.literal_eval(line[len(prefix):])


def test_example_commands_on_the_offline_model(tmp_path, pg_url):
    python = sys.executable
    scripts = ["session_state_advanced", "session_state_multiple_users"]
    processes = {
        name: subprocess.Popen([python, str(EXAMPLES / f"{name}.py")], cwd=tmp_path, env=offline_env(tmp_path, name),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in scripts
    }
    # Meanwhile: the persistent session, as two separate processes on one PostgreSQL database.
    runs = [
        subprocess.run([python, str(EXAMPLES / "persistent_session.py")], cwd=tmp_path,
                       env={**offline_env(tmp_path, "persist"), "PG_URL": pg_url}, capture_output=True, text=True,
                       timeout=120)
        for _ in range(2)
    ]
    outputs = {}
    for name, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs[name] = out

    assert final_line(outputs["session_state_advanced"], "Final session state: ") == {
        "shopping_list": ["bananas", "yogurt"]
    }
    users = outputs["session_state_multiple_users"]
    assert json.loads(users.split("Final shopping lists: \n", 1)[1]) == {
        "john_doe": {"user_1_session_1": ["eggs", "bread"]},
        "mark_smith": {"user_2_session_1": ["tacos", "minced beef"], "user_3_session_2": ["chicken", "soup"]},
        "carmen_sandiago": {"user_3_session_1": ["apples", "grapes"]},
    }
    assert final_line(users, "Stored session states: ") == {
        "john_doe/user_1_session_1": {},
        "mark_smith/user_2_session_1": {},
        "carmen_sandiago/user_3_session_1": {},
        "mark_smith/user_3_session_2": {},
    }
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr
    assert "Session 'session_storage' holds 1 runs and 2 chat messages" in runs[0].stdout
    assert "Session 'session_storage' holds 2 runs and 4 chat messages" in runs[1].stdout


SEQUENCE = """
    import os
    import runpy
    import sys

    sys.path.insert(0, os.path.dirname(sys.argv[1]))  # as a script's own folder is, for `_model`
    for path in sys.argv[1:]:
        runpy.run_path(path, run_name="__main__")
        print("@@ ran", os.path.basename(path), flush=True)
"""


def test_every_example_runs_in_sequence_against_one_set_of_databases(tmp_path, pg_url):
    """As someone trying them one after another: one folder (so one tmp/data.db, one tmp/agents.db), one
    PostgreSQL database and one Django database; no example meets another's sessions under another user.
    One process runs them all as scripts (each as __main__), which spares fourteen Django start-ups."""
    names = sorted(path.stem for path in EXAMPLES.glob("*.py") if not path.name.startswith("_"))
    assert len(names) == 15
    driver = tmp_path / "sequence.py"
    driver.write_text(textwrap.dedent(SEQUENCE))
    env = {**offline_env(tmp_path, "shared"), "PG_URL": pg_url}

    done = subprocess.run([sys.executable, str(driver), *(str(EXAMPLES / f"{name}.py") for name in names)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("@@ ran ")] == [
        f"@@ ran {name}.py" for name in names
    ]
    assert {path.name for path in (tmp_path / "tmp").glob("*.db")} == {
        "agents.db", "data.db", "example.db", "example_no_history.db", "agent_session_history.db",
    }
