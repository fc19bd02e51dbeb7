"""The chat's memories: the Memories page (list, search, add, edit, delete, forget everything, the on/off
setting, history), the reply's "Remembered" line with its undo (live, over the socket), and another user's
memory or run id a 404."""

from __future__ import annotations

import json

import pytest
from django.test import TransactionTestCase
from django.urls import reverse

from chatapp.assistants import ASSISTANTS
from sessions_core.models import Run, UserMemoryChange, UserMemoryRecord
from sessions_core.user_memories import store
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import LiveTestMixin, frames_until
from tests.support.llm_server import Text
from tests.support.memory_support import memory_responder

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client):
    user = make_user("alice")
    client.force_login(user)
    return user


def remember(user, text, topics=(), run=None):
    return store.add_memory(user, text, list(topics), "default", source=store.Source.RUN if run else store.Source.USER,
                            run_pk=run.pk if run else None)


def test_the_page_lists_memories_with_topics_source_and_history_and_writes_nothing(client, alice):
    session = make_session(alice, component_id="general")
    run = make_run(session, "I am vegetarian", "Noted.")
    memory = remember(alice, "The user is vegetarian", ["food"], run=run)
    store.update_memory(alice, memory.memory_id, "The user is vegan", ["food"], "default", source=store.Source.USER)
    remember(make_user("bob", "pw-bob-123"), "Bob likes jazz")
    before = UserMemoryChange.objects.count()
    page = client.get(reverse("chat:memories")).content.decode()
    assert "The user is vegan" in page and '<span class="memory-topic">food</span>' in page
    assert "Bob likes jazz" not in page
    assert "from this reply" not in page  # changed by hand since; the history still names the reply that added it
    assert f'{reverse("chat:session", args=[session.session_id])}#run-{run.run_id}">a reply</a>' in page
    assert "changed from “The user is vegetarian” to “The user is vegan”" in page and "History (2)" in page
    assert UserMemoryChange.objects.count() == before
    assert "Memories are <strong>on</strong>" in page


def test_a_memory_learnt_in_a_reply_links_to_it(client, alice):
    session = make_session(alice, component_id="general")
    run = make_run(session, "I live in Lyon", "Noted.")
    remember(alice, "The user lives in Lyon", run=run)
    page = client.get(reverse("chat:memories")).content.decode()
    assert f'href="{reverse("chat:session", args=[session.session_id])}#run-{run.run_id}">from this reply' in page


def test_search_keeps_the_matching_memories(client, alice):
    remember(alice, "The user lives in Lyon", ["home"])
    remember(alice, "The user likes jazz", ["music"])
    page = client.get(reverse("chat:memories"), {"q": "music"}).content.decode()
    assert "likes jazz" in page and "Lyon" not in page
    assert "No memory matches" in client.get(reverse("chat:memories"), {"q": "olives"}).content.decode()


def test_add_edit_and_delete_inline_and_without_javascript(client, alice):
    added = client.post(reverse("chat:memory_add"), {"memory": "I am vegetarian", "topics": "food, diet"},
                        HTTP_HX_REQUEST="true")
    assert added.status_code == 200 and "I am vegetarian" in added.content.decode()
    [row] = UserMemoryRecord.objects.filter(user=alice)
    assert row.topics == ["food", "diet"]
    edited = client.post(reverse("chat:memory_edit", args=[row.memory_id]), {"memory": "I am vegan", "topics": "food"},
                         HTTP_HX_REQUEST="true")
    assert edited.status_code == 200 and "I am vegan" in edited.content.decode() and "History (2)" in edited.content.decode()
    refused = client.post(reverse("chat:memory_edit", args=[row.memory_id]), {"memory": "  "}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 422 and "needs some text" in refused.content.decode()
    assert client.post(reverse("chat:memory_delete", args=[row.memory_id]), HTTP_HX_REQUEST="true").content == b""
    assert not UserMemoryRecord.objects.filter(user=alice).exists()
    plain = client.post(reverse("chat:memory_add"), {"memory": "I like tea"})
    assert plain.status_code == 302 and plain["Location"] == reverse("chat:memories")
    assert client.post(reverse("chat:memory_add"), {"memory": ""}, follow=True).status_code == 200
    assert list(UserMemoryRecord.objects.filter(user=alice).values_list("memory", flat=True)) == ["I like tea"]


def test_another_users_memory_or_run_is_a_404(client, alice):
    bob = make_user("bob", "pw-bob-123")
    bobs = remember(bob, "Bob likes jazz")
    bobs_run = make_run(make_session(bob), "hi", "hello")
    assert client.post(reverse("chat:memory_edit", args=[bobs.memory_id]), {"memory": "Taken"}).status_code == 404
    assert client.post(reverse("chat:memory_delete", args=[bobs.memory_id])).status_code == 404
    assert client.post(reverse("chat:memory_undo", args=[bobs_run.run_id])).status_code == 404
    assert client.get(reverse("chat:memory_delete", args=[bobs.memory_id])).status_code == 405
    assert UserMemoryRecord.objects.get(memory_id=bobs.memory_id).memory == "Bob likes jazz"


def test_the_page_needs_a_sign_in(client):
    assert client.get(reverse("chat:memories")).status_code == 302


def test_forget_everything_asks_first_and_clears_only_this_user(client, alice):
    remember(alice, "The user lives in Lyon")
    remember(alice, "The user likes jazz")
    remember(make_user("bob", "pw-bob-123"), "Bob likes jazz")
    asking = client.get(reverse("chat:memories_forget"))
    assert "deletes all 2 of your memories" in asking.content.decode()
    assert client.post(reverse("chat:memories_forget")).status_code == 400  # no confirmation: nothing deleted
    assert UserMemoryRecord.objects.filter(user=alice).count() == 2
    done = client.post(reverse("chat:memories_forget"), {"confirm": "yes"}, follow=True)
    assert "Forgot 2 memories." in done.content.decode()
    assert not UserMemoryRecord.objects.filter(user=alice).exists()
    assert UserMemoryRecord.objects.count() == 1


def test_the_setting_turns_memories_off_and_on(client, alice):
    client.post(reverse("chat:memories_setting"), {"enabled": "off"})
    assert store.memories_enabled(alice, "default") is False
    assert "Memories are <strong>off</strong>" in client.get(reverse("chat:memories")).content.decode()
    client.post(reverse("chat:memories_setting"), {"enabled": "on"})
    assert store.memories_enabled(alice, "default") is True


def test_the_sidebar_links_to_the_page_and_assistants_say_whether_they_use_memories(client, alice):
    page = client.get(reverse("chat:new")).content.decode()
    assert f'href="{reverse("chat:memories")}" class="memories-link"' in page
    assert {a.id for a in ASSISTANTS.values() if a.uses_memories} == {"general", "shopping"}
    assert "Remembers what you tell it about yourself" in ASSISTANTS["general"].described


def test_the_transcript_shows_what_a_reply_remembered_and_what_it_was_shown(client, alice):
    session = make_session(alice, component_id="general")
    run = make_run(session, "I am vegetarian", "Noted.")
    remember(alice, "The user is vegetarian", run=run)
    run.messages.create(session=session, seq=99, role="system",
                        content="Be brief.\n\n<memories_from_previous_interactions>\n- The user lives in Lyon\n"
                                "</memories_from_previous_interactions>\n\nNote: ...")
    page = client.get(reverse("chat:session", args=[session.session_id])).content.decode()
    assert '<span class="memory-change">Remembered: The user is vegetarian</span>' in page
    assert reverse("chat:memory_undo", args=[run.run_id]) in page
    assert "Memories in this reply's context (1)" in page and "<li>The user lives in Lyon</li>" in page

    undone = client.post(reverse("chat:memory_undo", args=[run.run_id]), HTTP_HX_REQUEST="true").content.decode()
    assert 'class="memory-line undone"' in undone and "(undone)" in undone
    assert "<li>The user lives in Lyon</li>" in undone  # what it was shown stays listed
    assert not UserMemoryRecord.objects.filter(user=alice).exists()


def _section(page: str) -> str:
    """The memories-in-context section beside the state panel ("" when the page has none)."""
    start = page.find('id="context-memories"')
    return page[start:page.index("</section>", start)] if start >= 0 else ""


def _shown(run, *memories):
    listed = "".join(f"- {memory}\n" for memory in memories)
    run.messages.create(session=run.session, seq=run.pk * 10, role="system",
                        content=f"Be brief.\n\n<memories_from_previous_interactions>\n{listed}"
                                "</memories_from_previous_interactions>")


def test_beside_the_state_panel_the_memories_the_latest_reply_was_shown(client, alice):
    session = make_session(alice, component_id="general")
    url = reverse("chat:session", args=[session.session_id])
    assert "with your next message appear here" in _section(client.get(url).content.decode())
    _shown(make_run(session, "Where do I live?", "Lyon."), "The user lives in Lyon")
    _shown(make_run(session, "And now?", "Paris."), "The user lives in Paris", "The user likes jazz")
    section = _section(client.get(url).content.decode())
    assert "shown 2 of your memories" in section and "<li>The user lives in Paris</li>" in section
    assert "Lyon" not in section  # an earlier reply's context is under that reply, not here
    abandoned = make_run(session, "Regenerated", "Gone.")
    _shown(abandoned, "The user lives in Rome")
    Run.objects.filter(pk=abandoned.pk).update(abandoned=True)
    assert "Rome" not in _section(client.get(url).content.decode())

    store.set_memories_enabled(alice, False, "default")
    section = _section(client.get(url).content.decode())
    assert "Memories are off" in section and "Paris" not in section


def test_an_assistant_without_memories_has_no_memories_section(client, alice):
    session = make_session(alice, component_id="notes")
    assert _section(client.get(reverse("chat:session", args=[session.session_id])).content.decode()) == ""


class TestRememberedLive(LiveTestMixin, TransactionTestCase):
    async def test_the_section_beside_the_panel_shows_what_the_reply_was_shown_when_it_ends(self):
        from asgiref.sync import sync_to_async

        alice = await sync_to_async(make_user)("alice")
        await sync_to_async(remember)(alice, "The user lives in Lyon")
        session = await sync_to_async(make_session)(alice, component_id="general")
        self.llm.side_responder = memory_responder(lambda said, _: [])
        self.llm.add(Text("You live in Lyon."))
        socket = await self.socket(session.session_id, alice)
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "Where do I live?"}))
        frames = await frames_until(socket, lambda frame: 'id="context-memories"' in frame)
        section = _section(frames[-1])
        assert 'hx-swap-oob="true"' in section and "<li>The user lives in Lyon</li>" in section
        assert "shown 1 of your memories" in section
        await socket.disconnect()

    async def test_the_remembered_line_arrives_after_the_reply(self):
        from asgiref.sync import sync_to_async

        alice = await sync_to_async(make_user)("alice")
        session = await sync_to_async(make_session)(alice, component_id="shopping")
        self.llm.side_responder = memory_responder(
            lambda said, _: [("add_memory", {"memory": "The user is vegetarian", "topics": ["food"]})])
        self.llm.add(Text("Noted."))
        socket = await self.socket(session.session_id, alice)
        await socket.send_to(text_data=json.dumps({"type": "send", "text": "I am vegetarian"}))
        frames = await frames_until(socket, lambda frame: "Remembered: The user is vegetarian" in frame)
        assert 'id="memories-' in frames[-1] and 'hx-swap-oob="true"' in frames[-1]
        assert any("chat.run_done" in frame or "Noted." in frame for frame in frames[:-1])
        run = await Run.objects.aget(session=session)
        assert [m.run_id for m in await sync_to_async(store.list_memories)(alice, "default")] == [run.run_id]
        await socket.disconnect()


# -- admin --------------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.login(username="root", password="pw-root-123")
    return client


def test_the_admin_shows_memories_and_their_history_read_only_and_records_each_look(admin_client):
    from sessions_core.models import AdminAccess

    ana = make_user("ana", "pw-ana-123")
    memory = remember(ana, "The user lives in Lyon", ["home"])
    store.update_memory(ana, memory.memory_id, "The user lives in Paris", None, "default", source=store.Source.USER)
    row = UserMemoryRecord.objects.get(memory_id=memory.memory_id)
    listing = admin_client.get(reverse("admin:sessions_core_usermemoryrecord_changelist"), {"q": "ana"})
    assert listing.status_code == 200 and "The user lives in Paris" in listing.content.decode()
    page = admin_client.get(reverse("admin:sessions_core_usermemoryrecord_change", args=[row.pk])).content.decode()
    assert "updated by user: The user lives in Paris (was: The user lives in Lyon)" in page
    assert [(a.session_label, a.view) for a in AdminAccess.objects.order_by("id")] == [
        ("memories: ana", "user memory records list"), ("memories: ana", f"user memory record {memory.memory_id}")]
    assert admin_client.post(reverse("admin:sessions_core_usermemoryrecord_change", args=[row.pk]),
                             {"memory": "Taken"}).status_code == 403
    assert admin_client.get(reverse("admin:sessions_core_usermemoryrecord_add")).status_code == 403
    assert admin_client.get(reverse("admin:sessions_core_usermemorychange_changelist")).status_code == 200
    assert UserMemoryRecord.objects.get(pk=row.pk).memory == "The user lives in Paris"


def test_the_memory_admin_is_for_staff_only(client, alice):
    assert client.get(reverse("admin:sessions_core_usermemoryrecord_changelist")).status_code == 302


# -- export and import --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the export and the import run in processes of their own
def test_the_whole_account_export_carries_the_memories_and_their_history_and_import_restores_them(client, alice):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.engine.test_export import export_all
    from tests.support.web_helpers import finished

    session = make_session(alice, component_id="general", name="Chat")
    run = make_run(session, "I live in Lyon", "Noted.")
    lyon = remember(alice, "The user lives in Lyon", ["home"], run=run)
    store.update_memory(alice, lyon.memory_id, "The user lives in Paris", None, "default", source=store.Source.USER)
    remember(alice, "The user likes jazz", ["music"])
    remember(make_user("bob", "pw-bob-123"), "Bob likes tea")
    _, body = export_all(alice)
    data = json.loads(body)
    assert [(m["memory"], m["topics"]) for m in data["memories"]] == [
        ("The user lives in Paris", ["home"]), ("The user likes jazz", ["music"])]
    assert [(c["action"], c["previous"]) for c in data["memories"][0]["history"]] == [
        ("added", ""), ("updated", "The user lives in Lyon")]
    assert data["memories"][0]["history"][0]["run_id"] == run.run_id

    carol = make_user("carol", "pw-carol-123")
    remember(carol, "The user likes jazz")
    client.force_login(carol)
    upload = SimpleUploadedFile("chats.json", body.encode(), content_type="application/json")
    transfer = finished(client.post(reverse("chat:import"), {"file": upload}))
    page = client.get(reverse("chat:transfer", args=[transfer.transfer_id])).content.decode()
    assert "Imported 1 chat and 1 memory." in page
    restored = store.list_memories(carol, "default")
    # Oldest first: the imported one keeps the time it was first learnt.
    assert [(m.memory, m.topics) for m in restored] == [("The user lives in Paris", ["home"]), ("The user likes jazz", [])]
    assert restored[0].created_at.isoformat() == data["memories"][0]["created_at"]
    assert [c.source for c in store.memory_history(carol, restored[0].memory_id, "default")] == ["import"]
    assert len(store.list_memories(alice, "default")) == 2  # the exporter's are untouched
