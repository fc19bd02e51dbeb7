"""Work after a reply that calls the model (user memories, the session summary) waits until no run of the
process is waiting for its model's first words (sessions_core/run/background.py)."""

import asyncio
import threading

import pytest

from sessions_core import Agent
from sessions_core.run import background
from tests.support.llm_server import Text, is_memory_request, is_summary_request
from tests.support.memory_support import memory_responder

pytestmark = pytest.mark.django_db(transaction=True)


async def until(condition, timeout: float = 10) -> None:
    """Wait (in the loop, so the runs go on) until `condition()` holds; fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def background_requests(llm_server) -> list[int]:
    return [index for index, body in enumerate(llm_server.requests)
            if is_memory_request(body) or is_summary_request(body)]


@pytest.mark.parametrize("option", ["update_memory_on_run", "enable_session_summaries"])
def test_work_after_a_reply_waits_for_the_first_words_of_a_reply_in_flight(openai_model, llm_server, option):
    memories = memory_responder(lambda said, _: [])
    llm_server.side_responder = lambda body: (
        memories(body) or (Text('{"summary": "A chat.", "topics": []}') if is_summary_request(body) else None))
    agent = Agent(model=openai_model, **{option: True})
    first_words = threading.Event()
    llm_server.add(Text("slow reply", wait_event=first_words, hold_after=0), Text("quick reply"))

    async def main():
        slow = asyncio.create_task(agent.arun("slow", session_id="a", user_id="ana"))
        await until(lambda: len(llm_server.requests) == 1)  # its model call is made, no word back yet
        quick = asyncio.create_task(agent.arun("quick", session_id="b", user_id="bob"))
        await until(lambda: background.waiting() == 1)  # the quick reply is done; its work waits
        asked_before = len(background_requests(llm_server))
        first_words.set()
        outs = await asyncio.gather(slow, quick)
        return asked_before, outs

    asked_before, (slow, quick) = asyncio.run(main())

    assert asked_before == 0 and quick.content == "quick reply" and slow.content == "slow reply"
    assert len(background_requests(llm_server)) == 2  # each run's work was done, after the slow run's words
    assert background.waiting() == 0


def test_the_work_goes_ahead_when_the_reply_in_flight_never_answers(openai_model, llm_server, monkeypatch):
    monkeypatch.setattr(background, "FIRST_WORDS_WAIT", 0.05)
    llm_server.side_responder = memory_responder(lambda said, _: [])
    agent = Agent(model=openai_model, update_memory_on_run=True)
    never = threading.Event()
    llm_server.add(Text("stuck", wait_event=never, hold_after=0), Text("quick reply"))

    async def main():
        stuck = asyncio.create_task(agent.arun("stuck", session_id="a", user_id="ana"))
        await until(lambda: len(llm_server.requests) == 1)
        quick = await agent.arun("quick", session_id="b", user_id="bob")
        asked = len(background_requests(llm_server))
        assert not stuck.done()  # its model still has not answered
        never.set()
        await stuck
        return quick, asked

    quick, asked = asyncio.run(main())
    assert quick.content == "quick reply" and asked == 1
