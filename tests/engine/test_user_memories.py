"""User memories in the engine (SPEC Part 1, items 27-28): made after a run by the manager's model call,
by the model's own tool, shown in later runs' system message, read and changed through the accessors;
each user's own, on every path."""

import asyncio
import re

import pytest

from sessions_core import Agent, MemoryManager, RunEvent, Team, UserMemory, UserMemoryNotFoundError
from sessions_core.models import Run, UserMemoryChange, UserMemoryRecord
from tests.support.engine_helpers import make_users, stream_all
from tests.support.llm_server import Error, Text, ToolCalls
from tests.support.memory_support import memory_requests, memory_responder

pytestmark = pytest.mark.django_db


def add(text, topics=("personal",)):
    return ("add_memory", {"memory": text, "topics": list(topics)})


def ids_in(system_prompt: str) -> dict[str, str]:
    """{memory text: id} of the manager's <existing_memories>."""
    return {text: memory_id for memory_id, text in re.findall(r"ID: (\S+)\nMemory: (.*)", system_prompt)}


def test_a_run_makes_a_memory_after_its_reply_and_the_next_run_sees_it(openai_model, llm_server):
    llm_server.side_responder = memory_responder(lambda said, _: [add("The user's name is Ana", ["name"])])
    agent = Agent(model=openai_model, update_memory_on_run=True)
    llm_server.add(Text("Nice to meet you."))
    out = agent.run("My name is Ana", session_id="s1", user_id="ana")

    assert out.status == "completed" and out.content == "Nice to meet you."
    [memory] = agent.get_user_memories(user_id="ana")
    assert (memory.memory, memory.topics, memory.user_id) == ("The user's name is Ana", ["name"], "ana")
    assert (memory.run_id, memory.session_id, memory.input) == (out.run_id, "s1", "My name is Ana")
    assert memory.agent_id == agent.id and memory.created_at == memory.updated_at
    # The manager read the run's own message and the memories (none yet), after the reply.
    first, follow_up = memory_requests(llm_server)  # its tool call, then the results back to it
    assert follow_up["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                         "content": "Memory added successfully"}
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "My name is Ana"
    assert llm_server.requests.index(first) == 1
    assert {tool["function"]["name"] for tool in first["tools"]} == {"add_memory", "update_memory", "delete_memory"}

    llm_server.side_responder = memory_responder(lambda said, _: [])
    llm_server.add(Text("You are Ana."))
    agent.run("What's my name?", session_id="another", user_id="ana")
    system = llm_server.requests[-2]["messages"][0]["content"]
    assert "<memories_from_previous_interactions>\n- The user's name is Ana\n</memories_from_previous_interactions>" in system


def test_the_manager_reads_only_the_runs_own_message_never_the_history(openai_model, llm_server):
    llm_server.side_responder = memory_responder(lambda said, _: [])
    agent = Agent(model=openai_model, update_memory_on_run=True, add_history_to_context=True)
    for text in ("first", "second", "third"):
        llm_server.add(Text(f"reply to {text}"))
        agent.run(text, session_id="s", user_id="ana")
    last = memory_requests(llm_server)[-1]
    assert [(m["role"], m["content"]) for m in last["messages"][1:]] == [("user", "third")]


def test_the_manager_updates_and_deletes_and_every_change_is_kept(openai_model, llm_server):
    agent = Agent(model=openai_model, update_memory_on_run=True)
    lyon = agent.add_user_memory(UserMemory(memory="The user lives in Lyon", topics=["home"]), user_id="ana")
    olives = agent.add_user_memory("The user likes olives", user_id="ana")

    def calls(said, system):
        known = ids_in(system)
        return [("update_memory", {"memory_id": known["The user lives in Lyon"], "memory": "The user lives in Paris",
                                   "topics": ["home"]}),
                ("delete_memory", {"memory_id": known["The user likes olives"]})]

    llm_server.side_responder = memory_responder(calls)
    llm_server.add(Text("Noted."))
    out = agent.run("I moved to Paris, and I no longer like olives", session_id="s", user_id="ana")

    [memory] = agent.get_user_memories(user_id="ana")
    assert (memory.memory_id, memory.memory, memory.run_id) == (lyon.memory_id, "The user lives in Paris", out.run_id)
    assert memory.updated_at > memory.created_at
    history = agent.get_user_memory_history(lyon.memory_id, user_id="ana")
    assert [(c.action, c.memory, c.previous, c.source, c.run_id) for c in history] == [
        ("added", "The user lives in Lyon", "", "user", None),
        ("updated", "The user lives in Paris", "The user lives in Lyon", "run", out.run_id)]
    deleted = agent.get_user_memory_history(olives.memory_id, user_id="ana")
    assert [(c.action, c.memory, c.source) for c in deleted] == [
        ("added", "The user likes olives", "user"), ("deleted", "The user likes olives", "run")]
    assert [c.action for c in agent.get_run_memory_changes(out.run_id, user_id="ana")] == ["updated", "deleted"]


def test_undo_puts_back_what_a_run_did(openai_model, llm_server):
    agent = Agent(model=openai_model, update_memory_on_run=True)
    kept = agent.add_user_memory("The user lives in Lyon", user_id="ana")
    llm_server.side_responder = memory_responder(lambda said, system: [
        add("The user is vegetarian"),
        ("update_memory", {"memory_id": ids_in(system)["The user lives in Lyon"], "memory": "The user lives in Nice",
                           "topics": []})])
    llm_server.add(Text("Noted."))
    out = agent.run("I'm vegetarian and I live in Nice", session_id="s", user_id="ana")
    assert sorted(m.memory for m in agent.get_user_memories(user_id="ana")) == [
        "The user is vegetarian", "The user lives in Nice"]

    assert agent.undo_run_memory_changes(out.run_id, user_id="ana") == 2
    assert [(m.memory_id, m.memory) for m in agent.get_user_memories(user_id="ana")] == [
        (kept.memory_id, "The user lives in Lyon")]
    assert all(change.undone for change in agent.get_run_memory_changes(out.run_id, user_id="ana"))
    assert agent.undo_run_memory_changes(out.run_id, user_id="ana") == 0  # once only
    assert agent.undo_run_memory_changes(out.run_id, user_id="bob") == 0  # not bob's run


def test_events_come_after_the_reply_and_run_returns_after_the_memory_work(openai_model, llm_server):
    llm_server.side_responder = memory_responder(lambda said, _: [add("The user is vegetarian")])
    agent = Agent(model=openai_model, update_memory_on_run=True)
    llm_server.add(Text("Noted, no meat."))
    events = stream_all(agent, "I am vegetarian", session_id="s", user_id="ana")
    kinds = [event.event for event in events]
    assert kinds[-3:] == [RunEvent.run_completed, RunEvent.memory_update_started, RunEvent.memory_update_completed]
    assert kinds.index(RunEvent.run_content) < kinds.index(RunEvent.memory_update_started)
    assert [m.memory for m in events[-1].memories] == ["The user is vegetarian"] and events[-1].error == ""
    # The reply was stored (and the session freed) before the memory call.
    assert Run.objects.get(run_id=events[-1].run_id).status == "completed"


def test_a_failing_memory_call_keeps_the_reply_and_is_reported_on_the_run(openai_model, llm_server, caplog):
    agent = Agent(model=openai_model, update_memory_on_run=True)
    agent.add_user_memory("The user lives in Lyon", user_id="ana")
    llm_server.add(Text("Noted."), Error(400, "bad request"))
    events = stream_all(agent, "I am vegetarian", session_id="s", user_id="ana")
    done = events[-1]
    assert done.event == RunEvent.memory_update_completed and "could not be updated" in done.error
    run = Run.objects.get(run_id=done.run_id)
    assert (run.status, run.content) == ("completed", "Noted.")
    assert "could not be updated" in run.metrics["memory_error"]
    assert [m.memory for m in agent.get_user_memories(user_id="ana")] == ["The user lives in Lyon"]
    assert any("Memory update failed" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")

    llm_server.add(Text("Noted."), Error(400, "bad request"))
    out = agent.run("I am vegan", session_id="s", user_id="ana")
    assert out.status == "completed" and "could not be updated" in out.metrics["memory_error"]


def test_a_run_without_a_user_makes_and_sees_no_memories(openai_model, llm_server):
    agent = Agent(model=openai_model, update_memory_on_run=True, instructions="Be brief.")
    llm_server.add(Text("Hi."))
    agent.run("My name is Ana", session_id="anon")
    assert len(llm_server.requests) == 1 and memory_requests(llm_server) == []
    assert "memories" not in llm_server.requests[0]["messages"][0]["content"]
    assert agent.get_user_memories() == [] and UserMemoryRecord.objects.count() == 0
    with pytest.raises(ValueError, match="user_id"):
        agent.add_user_memory("The user is nobody")


def test_a_user_with_memories_off_is_neither_learnt_about_nor_shown_any(openai_model, llm_server):
    agent = Agent(model=openai_model, update_memory_on_run=True)
    agent.add_user_memory("The user lives in Lyon", user_id="ana")
    agent.set_user_memories_enabled(False, user_id="ana")
    assert agent.get_user_memories_enabled(user_id="ana") is False
    llm_server.add(Text("Hi."))
    agent.run("I am vegetarian", session_id="s", user_id="ana")
    assert memory_requests(llm_server) == []
    assert "Lyon" not in llm_server.requests[0]["messages"][0]["content"]
    agent.set_user_memories_enabled(True, user_id="ana")
    llm_server.side_responder = memory_responder(lambda said, _: [])
    llm_server.add(Text("Hi."))
    agent.run("hello", session_id="s", user_id="ana")
    assert "- The user lives in Lyon" in llm_server.requests[-2]["messages"][0]["content"]


def test_a_user_with_no_memories_is_told_so_and_add_memories_to_context_alone_makes_none(openai_model, llm_server):
    agent = Agent(model=openai_model, add_memories_to_context=True)
    llm_server.add(Text("Hi."))
    agent.run("hello", session_id="s", user_id="ana")
    assert "have not had any interactions with the user yet" in llm_server.requests[0]["messages"][0]["content"]
    assert len(llm_server.requests) == 1


def test_options_resolve_as_agnos(openai_model):
    assert Agent(model=openai_model, enable_user_memories=True).update_memory_on_run is True
    plain = Agent(model=openai_model)
    assert (plain.memory_manager, plain.add_memories_to_context) == (None, False)
    on = Agent(model=openai_model, update_memory_on_run=True)
    assert isinstance(on.memory_manager, MemoryManager) and on.add_memories_to_context is True
    assert Agent(model=openai_model, update_memory_on_run=True, add_memories_to_context=False).add_memories_to_context \
        is False
    assert Agent(model=openai_model, memory_manager=MemoryManager()).add_memories_to_context is True


def test_the_managers_own_model_and_instructions(openai_model, llm_server):
    from sessions_core.llm import OpenAIChat

    other = OpenAIChat(id="memory-model", base_url=openai_model.base_url, api_key="test")
    manager = MemoryManager(model=other, memory_capture_instructions="Only food preferences.",
                            additional_instructions="Never store names.")
    agent = Agent(model=openai_model, memory_manager=manager, update_memory_on_run=True)
    llm_server.side_responder = memory_responder(lambda said, _: [])
    llm_server.add(Text("Hi."))
    agent.run("I am vegetarian", session_id="s", user_id="ana")
    [request] = memory_requests(llm_server)
    system = request["messages"][0]["content"]
    assert request["model"] == "memory-model"
    assert "<memories_to_capture>\nOnly food preferences.\n</memories_to_capture>" in system
    assert system.endswith("Never store names.")


def test_agentic_memory_is_the_models_tool_and_replaces_the_automatic_path(openai_model, llm_server):
    llm_server.side_responder = memory_responder(lambda said, _: [add("The user is vegetarian", ["food"])])
    agent = Agent(model=openai_model, enable_agentic_memory=True, update_memory_on_run=True)
    llm_server.add(ToolCalls([("update_user_memory", {"task": "The user is vegetarian"})]), Text("Remembered."))
    out = agent.run("I am vegetarian", session_id="s", user_id="ana")

    assert out.content == "Remembered." and [t.tool_name for t in out.tools] == ["update_user_memory"]
    assert out.tools[0].result == "Done."
    request, _ = memory_requests(llm_server)  # the tool's call only (and its follow-up): none after the run
    assert request["messages"][1]["content"] == "The user is vegetarian"
    assert {tool["function"]["name"] for tool in request["tools"]} == {"add_memory", "update_memory"}
    assert "<updating_user_memories>" in llm_server.requests[0]["messages"][0]["content"]
    [memory] = agent.get_user_memories(user_id="ana")
    assert (memory.memory, memory.run_id, memory.input) == ("The user is vegetarian", out.run_id, "The user is vegetarian")
    assert [c.source for c in agent.get_user_memory_history(memory.memory_id, user_id="ana")] == ["agentic"]


def test_a_team_takes_the_same_options(openai_model, llm_server):
    llm_server.side_responder = memory_responder(lambda said, _: [add("The user lives in Lyon")])
    member = Agent(name="Helper", model=openai_model)
    team = Team(members=[member], name="Crew", model=openai_model, update_memory_on_run=True)
    llm_server.add(Text("Hello from the team."))
    team.run("I live in Lyon", session_id="t", user_id="ana")
    [memory] = team.get_user_memories(user_id="ana")
    assert (memory.team_id, memory.agent_id) == (team.id, None)
    llm_server.side_responder = memory_responder(lambda said, _: [])
    llm_server.add(Text("Hi."))
    team.run("hello", session_id="t", user_id="ana")
    assert "- The user lives in Lyon" in llm_server.requests[-2]["messages"][0]["content"]


# -- isolation ------------------------------------------------------------------------------------------


def test_the_managers_tools_refuse_another_users_memory_id(openai_model, llm_server):
    agent = Agent(model=openai_model, update_memory_on_run=True)
    bobs = agent.add_user_memory("Bob likes jazz", user_id="bob")
    llm_server.side_responder = memory_responder(lambda said, _: [
        ("update_memory", {"memory_id": bobs.memory_id, "memory": "Taken over", "topics": []}),
        ("delete_memory", {"memory_id": bobs.memory_id})])
    llm_server.add(Text("Hi."))
    agent.run("hello", session_id="s", user_id="ana")
    results = [m["content"] for m in memory_requests(llm_server)[-1]["messages"] if m["role"] == "tool"]
    assert results == ["Memory not found", "Memory not found"]
    assert [(m.memory, m.user_id) for m in agent.get_user_memories(user_id="bob")] == [("Bob likes jazz", "bob")]
    assert agent.get_user_memories(user_id="ana") == []


def test_the_agentic_clear_tool_clears_one_users_memories(openai_model, llm_server):
    manager = MemoryManager(clear_memories=True, delete_memories=True)
    agent = Agent(model=openai_model, enable_agentic_memory=True, memory_manager=manager)
    agent.add_user_memory("Ana likes tea", user_id="ana")
    agent.add_user_memory("Bob likes jazz", user_id="bob")
    llm_server.side_responder = memory_responder(lambda said, _: [("clear_memory", {})])
    llm_server.add(ToolCalls([("update_user_memory", {"task": "Forget everything about me"})]), Text("Forgotten."))
    agent.run("Forget everything about me", session_id="s", user_id="bob")
    assert {tool["function"]["name"] for tool in memory_requests(llm_server)[0]["tools"]} == {
        "add_memory", "update_memory", "delete_memory", "clear_memory"}
    assert agent.get_user_memories(user_id="bob") == []
    assert [m.memory for m in agent.get_user_memories(user_id="ana")] == ["Ana likes tea"]


@pytest.fixture
def memories_of_two_users(openai_model):
    make_users("ana", "bob")
    agent = Agent(model=openai_model)
    return agent, agent.add_user_memory("Ana likes tea", user_id="ana"), agent.add_user_memory("Bob likes jazz",
                                                                                              user_id="bob")


def test_every_accessor_treats_another_users_memory_id_as_not_found(memories_of_two_users):
    agent, anas, bobs = memories_of_two_users
    assert agent.get_user_memory(bobs.memory_id, user_id="ana") is None
    assert agent.get_user_memory(anas.memory_id, user_id="ana").memory == "Ana likes tea"
    with pytest.raises(UserMemoryNotFoundError):
        agent.update_user_memory(bobs.memory_id, "Taken over", user_id="ana")
    assert agent.delete_user_memory(bobs.memory_id, user_id="ana") is False
    assert agent.get_user_memory_history(bobs.memory_id, user_id="ana") == []
    assert agent.get_user_memory(bobs.memory_id, user_id="nobody") is None
    # A memory given with another user's id is a new memory of the caller's, never a takeover.
    mine = agent.add_user_memory(UserMemory(memory="Mine", memory_id=bobs.memory_id), user_id="ana")
    assert mine.memory_id != bobs.memory_id and mine.user_id == "ana"
    assert agent.get_user_memory(bobs.memory_id, user_id="bob").memory == "Bob likes jazz"
    assert agent.get_user_memory(bobs.memory_id) is None  # no user: none


def test_clearing_clears_one_users_memories(memories_of_two_users):
    agent, _, _ = memories_of_two_users
    agent.add_user_memory("Ana likes cake", user_id="ana")
    assert agent.clear_user_memories(user_id="ana") == 2
    assert agent.get_user_memories(user_id="ana") == []
    assert [m.memory for m in agent.get_user_memories(user_id="bob")] == ["Bob likes jazz"]
    assert UserMemoryChange.objects.filter(action="deleted").count() == 2


def test_update_by_the_owner_with_a_user_memory_and_bad_input_is_refused(memories_of_two_users):
    agent, anas, _ = memories_of_two_users
    changed = agent.update_user_memory(memory=UserMemory(memory="Ana likes green tea", memory_id=anas.memory_id,
                                                         topics=["drinks"]), user_id="ana")
    assert (changed.memory, changed.topics, changed.run_id) == ("Ana likes green tea", ["drinks"], None)
    with pytest.raises(ValueError, match="text"):
        agent.update_user_memory(anas.memory_id, "   ", user_id="ana")
    with pytest.raises(ValueError, match="at most"):
        agent.add_user_memory("x" * 5000, user_id="ana")
    assert agent.get_user_memories(user_id="ana", search="green")[0].memory_id == anas.memory_id


@pytest.mark.django_db(transaction=True)
def test_the_async_twins(openai_model):
    agent = Agent(model=openai_model)

    async def main():
        memory = await agent.aadd_user_memory("Ana likes tea", user_id="ana")
        listed = [m.memory for m in await agent.aget_user_memories(user_id="ana")]
        changed = (await agent.aupdate_user_memory(memory.memory_id, "Ana likes coffee", user_id="ana")).memory
        deleted = await agent.adelete_user_memory(memory.memory_id, user_id="ana")
        return listed, changed, deleted, await agent.aclear_user_memories(user_id="ana")

    assert asyncio.run(main()) == (["Ana likes tea"], "Ana likes coffee", True, 0)
