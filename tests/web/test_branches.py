"""Branches in the web chat: regenerate, edit and rerun, the 2/3 arrows and fork, over the real socket."""

from __future__ import annotations

import json
import re

from asgiref.sync import sync_to_async
from django.test import Client, TransactionTestCase
from django.urls import reverse

from sessions_core.models import ChatSession, Run, StateChange
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import LiveTestMixin, frames_until, settle
from tests.support.llm_server import Text, ToolCalls

NUMBER = re.compile(r'<span class="branch-number">(\d+)/(\d+)</span>')


def adds(body):
    """The model adds the last word of the user's message, then says so."""
    messages = body["messages"]
    if "at most five words" in (messages[0].get("content") or ""):
        return Text("Shopping")
    if messages[-1]["role"] == "tool":
        return Text(f"ok: {messages[-1]['content']}")
    return ToolCalls([("add_item", {"item": messages[-1]["content"].split()[-1]})])


class BranchWebTests(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="shopping")

    async def frame(self, socket, **data):
        await socket.send_to(text_data=json.dumps({**data, "HEADERS": {"HX-Request": "true"}}))

    async def turn(self, socket, text: str) -> list[str]:
        await self.frame(socket, type="send", text=text)
        return await frames_until(socket, lambda f: "Reply complete." in f)

    async def state(self):
        return (await ChatSession.objects.aget(pk=self.session.pk)).session_state

    async def test_regenerate_edit_and_switch_keep_the_transcript_and_the_state_with_the_branch(self):
        self.llm.responder = adds
        socket = await self.socket(self.session.session_id, self.alice)
        await self.turn(socket, "add milk")
        await self.turn(socket, "add eggs")
        eggs = await Run.objects.filter(input="add eggs").afirst()

        await self.frame(socket, type="regenerate", run_id=eggs.run_id)
        frames = await frames_until(socket, lambda f: "Reply complete." in f)
        redrawn = next(f for f in frames if 'hx-swap-oob="innerHTML:#transcript"' in f)
        assert redrawn.count('class="run"') == 2 and f'id="run-{eggs.run_id}"' not in redrawn  # the old version left
        assert NUMBER.findall(frames[-1]) == [("2", "2")]
        assert await self.state() == {"shopping_list": ["milk", "eggs"]}  # eggs once, not twice

        await self.frame(socket, type="edit", run_id=eggs.run_id, text="add bread")
        frames = await frames_until(socket, lambda f: "Reply complete." in f)
        assert await self.state() == {"shopping_list": ["milk", "bread"]}
        assert NUMBER.findall(frames[-1]) == [("3", "3")]

        await self.frame(socket, type="branch", run_id=eggs.run_id)
        frames = await frames_until(socket, lambda f: 'id="state-panel"' in f)
        assert "add eggs" in frames[-1] and "add bread" not in frames[-1]
        assert NUMBER.findall(frames[-1]) == [("1", "3")]
        assert "branch:switch" in frames[-1] and await self.state() == {"shopping_list": ["milk", "eggs"]}
        # The timeline is the current branch's: one entry for the switch, no resets, no abandoned run's changes.
        timeline = frames[-1][frames[-1].index('id="state-timeline"'):]
        assert timeline.count('title="branch:switch">version switch<') == 1
        assert "branch:regenerate" not in timeline and "branch:edit" not in timeline
        assert "bread" not in timeline.split('title="branch:switch"')[1]  # the abandoned edit's change
        switch = await StateChange.objects.filter(source="branch:switch").aget()
        assert switch.restores is not None and f"the state as of <a href=\"/s/{self.session.session_id}/state/v{switch.restores}/\"" in frames[-1]
        await settle()

        client = Client()
        await sync_to_async(client.force_login)(self.alice)
        page = (await sync_to_async(client.get)(reverse("chat:session", args=[self.session.session_id]))).content.decode()
        assert "add eggs" in page and "add bread" not in page and NUMBER.findall(page) == [("1", "3")]
        await socket.disconnect()

    async def test_switches_of_version_count_against_their_limit(self):
        self.llm.responder = adds
        socket = await self.socket(self.session.session_id, self.alice)
        await self.turn(socket, "add milk")
        await self.turn(socket, "add eggs")
        eggs = await Run.objects.filter(input="add eggs").afirst()
        await self.frame(socket, type="edit", run_id=eggs.run_id, text="add bread")
        await frames_until(socket, lambda f: "Reply complete." in f)
        bread = await Run.objects.filter(input="add bread").afirst()
        with self.settings(CHAT_BRANCH_SWITCHES_PER_MINUTE=2):
            for run in (eggs, bread):
                await self.frame(socket, type="branch", run_id=run.run_id)
                await frames_until(socket, lambda f: 'id="state-panel"' in f)
            changes = await StateChange.objects.filter(session=self.session).acount()
            await self.frame(socket, type="branch", run_id=eggs.run_id)
            refused = await frames_until(socket, lambda f: "status-error" in f)
            assert "CHAT_BRANCH_SWITCHES_PER_MINUTE" in refused[-1]
        assert await StateChange.objects.filter(session=self.session).acount() == changes  # nothing written
        assert await self.state() == {"shopping_list": ["milk", "bread"]}
        await settle()
        await socket.disconnect()

    async def test_a_run_of_another_session_is_refused_and_nothing_runs(self):
        self.llm.responder = adds
        other = await sync_to_async(make_session)(await sync_to_async(make_user)("bob"), component_id="shopping")
        from chatapp.assistants import get_assistant

        foreign = await get_assistant("shopping").arun("add gin", session_id=other.session_id, user_id="bob")
        requests = len(self.llm.requests)
        socket = await self.socket(self.session.session_id, self.alice)
        for frame in ({"type": "regenerate", "run_id": foreign.run_id},
                      {"type": "edit", "run_id": foreign.run_id, "text": "add rum"},
                      {"type": "branch", "run_id": foreign.run_id}):
            await self.frame(socket, **frame)
            answer = await frames_until(socket, lambda f: 'class="run-status' in f or "run-status" in f)
            assert "error" in answer[-1]
        await settle()
        assert len(self.llm.requests) == requests and await Run.objects.filter(session=self.session).acount() == 0
        await socket.disconnect()


class ForkViewTests(LiveTestMixin, TransactionTestCase):
    def test_fork_opens_a_new_chat_with_the_runs_so_far_and_another_user_gets_a_404(self):
        self.llm.responder = adds
        alice, bob = make_user("alice"), make_user("bob")
        session = make_session(alice, component_id="shopping")
        from chatapp.assistants import get_assistant

        shop = get_assistant("shopping")
        milk = shop.run("add milk", session_id=session.session_id, user_id=alice)
        shop.run("add eggs", session_id=session.session_id, user_id=alice)
        client = Client()
        client.force_login(bob)
        assert client.post(reverse("chat:fork"), {"run_id": milk.run_id}).status_code == 404
        client.force_login(alice)
        response = client.post(reverse("chat:fork"), {"run_id": milk.run_id}, HTTP_HX_REQUEST="true")
        assert response.status_code == 200
        copy = ChatSession.objects.exclude(pk=session.pk).get(owner=alice)
        assert response["HX-Redirect"] == reverse("chat:session", args=[copy.session_id])
        plain = client.post(reverse("chat:fork"), {"run_id": milk.run_id})  # without JavaScript: a redirect
        assert plain.status_code == 302 and ChatSession.objects.filter(owner=alice).count() == 3
        assert copy.session_state == {"shopping_list": ["milk"]}
        assert list(copy.runs.values_list("input", flat=True)) == ["add milk"]

    def test_a_fork_is_marked_in_its_title_and_each_fork_numbered(self):
        alice = make_user("alice")
        session = make_session(alice, component_id="shopping", name="Groceries", name_source="user")
        run = make_run(session, "add milk", "Added milk.")
        client = Client()
        client.force_login(alice)
        for _ in range(3):
            client.post(reverse("chat:fork"), {"run_id": run.run_id})
        forks = ChatSession.objects.exclude(pk=session.pk).filter(owner=alice).order_by("pk")
        assert [fork.name for fork in forks] == ["Groceries (fork)", "Groceries (fork 2)", "Groceries (fork 3)"]
        again = make_run(forks[0], "add eggs", "Added eggs.")
        client.post(reverse("chat:fork"), {"run_id": again.run_id})  # a fork of a fork is marked once
        assert ChatSession.objects.filter(owner=alice).order_by("pk").last().name == "Groceries (fork 4)"


class SearchOpensTheBranchTests(LiveTestMixin, TransactionTestCase):
    def test_a_hit_on_another_branch_opens_that_branch_and_a_foreign_run_changes_nothing(self):
        self.llm.responder = adds
        alice, bob = make_user("alice"), make_user("bob")
        session = make_session(alice, component_id="shopping")
        from chatapp.assistants import get_assistant

        shop = get_assistant("shopping")
        shop.run("add milk", session_id=session.session_id, user_id=alice)
        eggs = shop.run("add eggs", session_id=session.session_id, user_id=alice)
        shop.edit_and_rerun(eggs.run_id, "add bread", session_id=session.session_id, user_id=alice)
        foreign = shop.run("add gin", session_id="bobs", user_id=bob)
        client = Client()
        client.force_login(alice)
        url = reverse("chat:session", args=[session.session_id])

        page = client.get(url, {"run": foreign.run_id}).content.decode()
        assert "add bread" in page and "another version" not in page and ChatSession.objects.get(
            pk=session.pk).session_state == {"shopping_list": ["milk", "bread"]}
        hits = client.get(reverse("chat:search_hx"), {"q": "eggs"}, HTTP_HX_REQUEST="true").content.decode()
        assert f"?run={eggs.run_id}" in hits  # search finds text on the abandoned branch

        # The page offers that version and changes nothing (a GET writes nothing); a POST shows it.
        page = client.get(url, {"run": eggs.run_id}).content.decode()
        assert "add bread" in page and "is in another version of this chat" in page and "add eggs" in page
        assert ChatSession.objects.get(pk=session.pk).session_state == {"shopping_list": ["milk", "bread"]}
        version = reverse("chat:session_version", args=[session.session_id])
        response = client.post(version, {"run_id": eggs.run_id})
        assert response["Location"] == f"{url}#run-{eggs.run_id}"
        page = client.get(url).content.decode()
        assert "add eggs" in page and "add bread" not in page
        assert ChatSession.objects.get(pk=session.pk).session_state == {"shopping_list": ["milk", "eggs"]}
        assert client.post(version, {"run_id": foreign.run_id}).status_code == 404  # another user's run
        assert client.get(version).status_code == 405
