"""The chat pages and sidebar actions, each as a plain and as an htmx request."""

from __future__ import annotations

import asyncio
import re
from html import escape as html_escape
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.messages import get_messages
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatapp.assistants import reset_assistants
from sessions_core.models import ChatSession, Message, NameSource, Run, RunStatus, StateChange
from tests.support.factories import make_run, make_session, make_user
from tests.support.live_support import layer_listener, settle
from tests.support.llm_server import Text
from tests.support.web_helpers import HX, GroupListener, WebTestCase, item_ids


@pytest.fixture(autouse=True)
def _fast_hashers(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class TestIndexAndNewSession(WebTestCase):
    def test_index_opens_the_newest_live_session(self):
        newer = make_session(owner=self.alice, name="Newer")
        make_session(owner=self.alice, name="Trashed", deleted_at=timezone.now())
        make_session(owner=self.bob, name="Bob's")
        response = self.client.get(reverse("chat:index"))
        assert response["Location"] == reverse("chat:session", args=[newer.session_id])

    def test_index_without_sessions_opens_a_new_chat(self):
        ChatSession.objects.all().delete()
        assert self.client.get(reverse("chat:index"))["Location"] == reverse("chat:new")

    def test_a_new_chat_is_the_chat_page_and_stores_nothing(self):
        before = (ChatSession.objects.count(), Run.objects.count())
        html = self.client.get(reverse("chat:new")).content.decode()
        assert (ChatSession.objects.count(), Run.objects.count()) == before
        assert 'id="sidebar"' in html and 'id="session-filter"' in html  # the sidebar, with its search
        # The first message goes over the landing's own socket, or is posted when there is none.
        assert re.search(r'<form id="composer" class="composer" method="post" action="/new/" ws-send', html)
        assert 'id="composer-text"' in html and 'ws-connect="/ws/new/"' in html
        assert f'id="session-item-{self.session.pk}"' in html  # the existing chats, and no "New chat" row
        assert html.count('<li id="session-item-') == ChatSession.objects.for_user(self.alice).alive().count()
        assert 'class="skip-link" href="#composer-text"' in html
        assert '<dialog id="shortcuts"' in html

    def test_the_assistant_is_picked_in_the_header_defaulting_to_the_last_used(self):
        make_session(owner=self.alice, component_id="notes")
        make_session(owner=self.bob, component_id="general")  # Bob's choice is not Alice's default
        html = self.client.get(reverse("chat:new")).content.decode()
        header = html[html.index('class="chat-header"'):html.index('id="transcript"')]
        assert '<select id="assistant-picker" name="assistant" form="composer"' in header
        assert re.search(r'<option value="notes" [^>]*selected>Notes and list</option>', header)
        assert header.count(" selected") == 1
        for label in ("General assistant", "Shopping list", "Notes and list", "Project team"):
            assert f">{label}</option>" in header

    def test_a_first_chat_starts_on_the_assistant_readmes_first_example_needs(self):
        ChatSession.objects.all().delete()
        html = self.client.get(reverse("chat:new")).content.decode()
        assert re.search(r'<option value="shopping" [^>]*selected>Shopping list</option>', html)
        assert html.count(" selected") == 1

    def test_the_first_message_creates_the_chat_with_the_picked_assistant_and_queues_the_message(self):
        listener = GroupListener(f"user.{self.alice.pk}")
        response = self.client.post(reverse("chat:new"), {"assistant": "shopping", "text": "  add milk please  "})
        session = ChatSession.objects.for_user(self.alice).latest("id")
        assert response["Location"] == reverse("chat:session", args=[session.session_id])
        assert (session.component_id, session.session_state, session.state_version) == (
            "shopping", {"shopping_list": []}, 1)
        assert (session.name, session.name_source) == ("add milk please", NameSource.FALLBACK)
        assert StateChange.objects.get(session=session).source == "defaults"
        # The message waits as a queued run no process waits for; the chat page's socket runs it when it connects.
        queued = Run.objects.get(session=session)
        assert (queued.status, queued.input, queued.claimed_until) == (RunStatus.QUEUED, "add milk please", None)
        (pushed,) = listener.html()
        assert f'<li id="session-item-{session.pk}" hx-swap-oob="delete">' in pushed
        assert f'<div hx-swap-oob="afterend:#group-today"><li id="session-item-{session.pk}"' in pushed
        assert "add milk please" in pushed

    def test_a_refused_first_message_creates_nothing_and_comes_back_in_the_composer(self):
        before = ChatSession.objects.count()
        cases = [({"assistant": "general", "text": "   "}, "Type a message first."),
                 ({"assistant": "hacker", "text": "hello <there>"}, "Choose one of the assistants."),
                 ({"assistant": "general", "text": "x" * 20}, "the limit is 10")]
        with override_settings(CHAT_MAX_MESSAGE_CHARS=10):
            for data, error in cases:
                response = self.client.post(reverse("chat:new"), data)
                html = response.content.decode()
                assert response.status_code == 400
                assert error in html
                composer = html[html.index('id="composer-text"'):]
                assert composer[composer.index(">") + 1:].startswith(html_escape(data["text"]) + "</textarea>")
        assert ChatSession.objects.count() == before
        assert not Run.objects.filter(status=RunStatus.QUEUED).exists()

    def test_the_limit_counts_line_ends_as_the_page_does(self):
        """A form post sends each line end as CR LF; the page's count (and the socket) have LF: one character."""
        text = "\r\n".join(["line"] * 4)  # 22 characters as posted, 19 as typed
        with override_settings(CHAT_MAX_MESSAGE_CHARS=19):
            response = self.client.post(reverse("chat:new"), {"assistant": "shopping", "text": text})
            page = self.client.get(reverse("chat:new")).content.decode()
        assert response.status_code == 302
        assert Run.objects.get(status=RunStatus.QUEUED).input == "line\nline\nline\nline"
        assert 'id="composer-count" class="composer-count" data-max="19"' in page  # the limit, given to the page

    def test_a_deleted_chat_with_no_chat_left_shows_its_undo_on_a_new_chat(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        ChatSession.objects.for_user(self.alice).exclude(pk=self.session.pk).delete()
        response = self.client.get(reverse("chat:index"), {"deleted": self.session.session_id})
        assert response["Location"] == f"{reverse('chat:new')}?deleted={self.session.session_id}"
        html = self.client.get(response["Location"]).content.decode()
        assert f'id="toast-{self.session.pk}"' in html
        assert f'data-draft-from="{self.session.session_id}"' in html
        bobs = make_session(owner=self.bob, name="Bob's", deleted_at=timezone.now())
        html = self.client.get(reverse("chat:new"), {"deleted": bobs.session_id}).content.decode()
        assert f'id="toast-{bobs.pk}"' not in html and "Bob&#x27;s" not in html  # only the user's own


class TestChatPage(WebTestCase):
    def test_the_page_has_three_panes_the_socket_and_the_composer(self):
        make_run(self.session, user_text="add milk", reply="Added **milk**.")
        html = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert f'ws-connect="/ws/sessions/{self.session.session_id}/"' in html
        assert 'hx-ext="ws, oob-if-present"' in html
        assert 'id="sidebar"' in html and 'id="state-panel"' in html and 'id="transcript"' in html
        assert 'role="log"' in html and 'aria-busy="false"' in html
        assert 'id="run-status"' in html and 'role="status"' in html
        assert '<form id="composer"' in html and 'name="text"' in html
        assert "<strong>milk</strong>" in html
        link = rf'<a class="session-link" href="[^"]+{self.session.session_id}/"[^>]*aria-current="page"'
        assert re.search(link, html)

    def test_a_run_left_by_a_stopped_process_shows_interrupted_and_one_started_since_the_session_was_read_runs(self):
        run = make_run(self.session, user_text="hi", reply=None, status=RunStatus.RUNNING)
        url = reverse("chat:session", args=[self.session.session_id])
        # No lease on the row: the run started after the page read it (a new chat's first run) and runs.
        assert f'id="run-{run.run_id}" class="run" data-status="running"' in self.client.get(url).content.decode()
        ChatSession.objects.filter(pk=self.session.pk).update(
            lease_token="gone", lease_expires_at=timezone.now() - timedelta(seconds=1))
        html = self.client.get(url).content.decode()
        assert f'id="run-{run.run_id}" class="run" data-status="interrupted"' in html
        assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING  # the page writes nothing

    def test_a_running_reply_shows_its_text_so_far_as_sanitized_markdown_and_marks_the_log_busy(self):
        run = make_run(self.session, user_text="hi", reply=None, status=RunStatus.RUNNING)
        Run.objects.filter(pk=run.pk).update(content="partial **bold** <b>text")
        html = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert 'aria-busy="true"' in html
        assert (f'<div class="reply streaming" id="reply-{run.run_id}"><p>partial <strong>bold</strong> '
                "&lt;b&gt;text</p>\n</div>") in html

    def test_long_transcripts_show_the_last_50_runs_and_load_earlier_ones(self):
        runs = [make_run(self.session, user_text=f"question {n}", reply=f"answer {n}") for n in range(53)]
        html = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert "question 2<" not in html and "question 3<" in html and "question 52<" in html
        earlier = reverse("chat:transcript_hx", args=[self.session.session_id]) + f"?before={runs[3].pk}"
        assert f'hx-get="{earlier}"' in html
        fragment = self.hx_get(earlier).content.decode()
        assert "<html" not in fragment
        assert [f"question {n}" for n in range(3)] == re.findall(r"question \d+", fragment)
        assert "Load earlier" not in fragment
        plain = self.client.get(earlier).content.decode()
        assert "<html" in plain and "question 0" in plain

    def test_a_trashed_session_is_read_only_with_restore_to_continue(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        html = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert "This chat is in the trash." in html and "Restore to continue" in html
        assert reverse("chat:session_restore_hx", args=[self.session.session_id]) in html
        # No socket (it would be refused, and retried forever), and a composer that says why it is off.
        assert "ws-connect" not in html
        assert re.search(r'<textarea id="composer-text"[^>]* disabled', html)
        assert re.search(r'<button type="submit" id="send-button"[^>]* disabled', html)

    def test_a_trashed_sessions_runs_have_no_actions_and_its_earlier_runs_neither(self):
        runs = [make_run(self.session, user_text=f"question {n}", reply=f"answer {n}") for n in range(51)]
        make_run(self.session, user_text="broken", reply=None, status=RunStatus.ERROR)
        live = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        assert all(f'class="{name}' in live for name in ("edit-run", "regenerate", "fork", "retry"))
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        trashed = self.client.get(reverse("chat:session", args=[self.session.session_id])).content.decode()
        earlier = self.hx_get(reverse("chat:transcript_hx", args=[self.session.session_id]) + (
            f"?before={runs[2].pk}")).content.decode()
        for html, question in ((trashed, "question 50"), (earlier, "question 1")):
            assert question in html
            assert not re.search(r'class="[^"]*\b(edit-run|edit-form|regenerate|fork|retry|branch-switch)\b', html)
        assert "Back to the trash" in trashed and "Edit as JSON" not in trashed

    def test_deleting_the_open_chat_goes_on_to_the_next_with_its_undo(self):
        other = make_session(owner=self.alice, name="Other chat")
        page = reverse("chat:session", args=[self.session.session_id])
        response = self.hx_post(reverse("chat:session_delete_hx", args=[self.session.session_id]),
                                headers={"HX-Current-URL": f"http://testserver{page}"})
        assert response["HX-Redirect"] == f"{reverse('chat:index')}?deleted={self.session.session_id}"
        landing = self.client.get(response["HX-Redirect"])
        assert landing["Location"] == reverse("chat:session", args=[other.session_id]) + (
            f"?deleted={self.session.session_id}")
        html = self.client.get(landing["Location"]).content.decode()
        assert f'id="toast-{self.session.pk}"' in html and "Moved “Groceries” to the trash." in html
        assert f'data-draft-from="{self.session.session_id}"' in html  # chat.js carries the unsent text over
        # Another user's id (or a chat not in the trash) brings nothing.
        bobs = make_session(owner=self.bob, name="Bob's", deleted_at=timezone.now())
        html = self.client.get(reverse("chat:session", args=[other.session_id]) + f"?deleted={bobs.session_id}")
        assert "toast-" not in html.content.decode()

    def test_the_page_costs_the_same_queries_however_long_the_history(self):
        def page_queries():
            with CaptureQueriesContext(connection) as queries:
                assert self.client.get(reverse("chat:session", args=[self.session.session_id])).status_code == 200
            return len(queries)

        make_run(self.session)
        few = page_queries()
        for n in range(60):
            make_run(self.session, user_text=f"q{n}")
            make_session(owner=self.alice, name=f"s{n}")
        assert page_queries() == few <= 8  # (one of them: whether the owner has memories on)

    def test_session_ids_outside_the_url_alphabet_do_not_route(self):
        assert self.client.get("/s/bad%20id/").status_code == 404


class TestRename(WebTestCase):
    def url(self, session=None):
        return reverse("chat:session_rename_hx", args=[(session or self.session).session_id])

    def test_htmx_rename_returns_the_row_and_tells_other_tabs(self):
        listener = GroupListener(f"user.{self.alice.pk}")
        page = reverse("chat:session", args=[self.session.session_id])
        response = self.hx_post(self.url(), {"name": "  Weekly shop  "},
                                headers={"HX-Current-URL": f"http://testserver{page}"})
        assert response.status_code == 200
        html = response.content.decode()
        assert html.strip().startswith(f'<li id="session-item-{self.session.pk}"') and "<html" not in html
        assert "Weekly shop" in html and 'aria-current="page"' in html
        self.session.refresh_from_db()
        assert (self.session.name, self.session.name_source) == ("Weekly shop", NameSource.USER)
        (pushed,) = listener.html()
        assert 'hx-swap-oob="true"' in pushed and "Weekly shop" in pushed and "aria-current" not in pushed

    def test_plain_rename_redirects_back(self):
        response = self.client.post(self.url(), {"name": "Plain", "next": "/trash/"})
        assert response["Location"] == "/trash/"
        assert ChatSession.objects.get(pk=self.session.pk).name == "Plain"

    def test_an_offsite_next_is_ignored(self):
        response = self.client.post(self.url(), {"name": "Plain", "next": "https://evil.example/"})
        assert response["Location"] == reverse("chat:session", args=[self.session.session_id])

    def test_an_empty_title_is_refused_with_a_message(self):
        listener = GroupListener(f"user.{self.alice.pk}")
        for blank in ("", "   "):
            response = self.hx_post(self.url(), {"name": blank})
            assert response.status_code == 422
            html = response.content.decode()
            assert "A title cannot be empty." in html and 'role="alert"' in html
            assert "editing" in html and "hidden" not in html.split('class="rename-form"')[1].split(">")[0]
        assert ChatSession.objects.get(pk=self.session.pk).name == "Groceries"
        assert listener.html() == []

    def test_a_plain_empty_rename_redirects_with_the_message(self):
        response = self.client.post(self.url(), {"name": ""})
        assert response.status_code == 302
        assert [str(m) for m in get_messages(response.wsgi_request)] == ["A title cannot be empty."]

    def test_an_overlong_title_is_refused(self):
        assert self.hx_post(self.url(), {"name": "x" * 201}).status_code == 422

    def test_a_title_with_html_is_shown_as_text(self):
        self.hx_post(self.url(), {"name": "<img src=x onerror=alert(1)>"})
        html = self.hx_get(reverse("chat:session_list_hx")).content.decode()
        assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html


class TestPin(WebTestCase):
    def test_pinning_moves_a_session_to_the_top_and_unpinning_back(self):
        newer = make_session(owner=self.alice, name="Newer")
        listener = GroupListener(f"user.{self.alice.pk}")
        url = reverse("chat:session_pin_hx", args=[self.session.session_id])
        html = self.hx_post(url, {"pinned": "1"}).content.decode()
        assert item_ids(html) == [self.session.pk, newer.pk]
        assert html.strip().startswith('<ul id="session-list"')
        assert ChatSession.objects.get(pk=self.session.pk).pinned_at is not None
        (pushed,) = listener.html()
        assert pushed.strip().startswith('<ul id="session-list" class="session-list" hx-swap-oob="outerHTML"')
        html = self.hx_post(url, {"pinned": "0"}).content.decode()
        assert item_ids(html) == [newer.pk, self.session.pk]
        assert ChatSession.objects.get(pk=self.session.pk).pinned_at is None

    def test_pinning_twice_keeps_it_pinned(self):
        url = reverse("chat:session_pin_hx", args=[self.session.session_id])
        self.hx_post(url, {"pinned": "1"})
        self.hx_post(url, {"pinned": "1"})
        assert ChatSession.objects.get(pk=self.session.pk).pinned_at is not None

    def test_plain_pin_redirects_back(self):
        response = self.client.post(reverse("chat:session_pin_hx", args=[self.session.session_id]), {"pinned": "1"})
        assert response.status_code == 302
        assert ChatSession.objects.get(pk=self.session.pk).pinned_at is not None


class TestDeleteUndoTrash(WebTestCase):
    def test_delete_moves_to_the_trash_with_an_undo_toast(self):
        listener = GroupListener(f"user.{self.alice.pk}")
        response = self.hx_post(reverse("chat:session_delete_hx", args=[self.session.session_id]))
        html = response.content.decode()
        assert response.status_code == 200
        assert '<div id="toasts" hx-swap-oob="beforeend">' in html
        assert f'hx-post="{reverse("chat:session_restore_hx", args=[self.session.session_id])}"' in html
        assert ">Undo<" in html
        assert ChatSession.objects.get(pk=self.session.pk).deleted_at is not None
        assert listener.html() == [f'<li id="session-item-{self.session.pk}" hx-swap-oob="delete"></li>']
        assert item_ids(self.hx_get(reverse("chat:session_list_hx")).content.decode()) == []

    def test_undo_restores_it_into_the_list(self):
        self.hx_post(reverse("chat:session_delete_hx", args=[self.session.session_id]))
        listener = GroupListener(f"user.{self.alice.pk}")
        response = self.hx_post(reverse("chat:session_restore_hx", args=[self.session.session_id]),
                                headers={"HX-Target": "session-list"})
        html = response.content.decode()
        assert item_ids(html) == [self.session.pk]
        assert f'<div id="toast-{self.session.pk}" hx-swap-oob="delete">' in html
        assert ChatSession.objects.get(pk=self.session.pk).deleted_at is None
        (pushed,) = listener.html()
        assert item_ids(pushed) == [self.session.pk]

    def test_the_trash_lists_trashed_sessions_and_restores_them(self):
        live = make_session(owner=self.alice, name="Still here")
        make_session(owner=self.bob, name="Bob's trash", deleted_at=timezone.now())
        self.client.post(reverse("chat:session_delete_hx", args=[self.session.session_id]))
        html = self.client.get(reverse("chat:trash")).content.decode()
        assert "Groceries" in html and "Still here" not in html and "Bob's trash" not in html
        assert "hx-confirm=" in html and "Delete forever" in html
        response = self.hx_post(reverse("chat:session_restore_hx", args=[self.session.session_id]),
                                headers={"HX-Target": f"trash-item-{self.session.pk}"})
        assert 'id="session-list"' not in response.content.decode()
        assert "toast-" not in response.content.decode()  # the Trash page has no toast: no oob target missing
        assert ChatSession.objects.alive().filter(pk__in=[self.session.pk, live.pk]).count() == 2

    def test_plain_delete_and_restore(self):
        response = self.client.post(reverse("chat:session_delete_hx", args=[self.session.session_id]))
        assert response["Location"] == reverse("chat:index")
        assert ChatSession.objects.trashed().filter(pk=self.session.pk).exists()
        response = self.client.post(reverse("chat:session_restore_hx", args=[self.session.session_id]),
                                    {"next": reverse("chat:trash")})
        assert response["Location"] == reverse("chat:trash")
        assert ChatSession.objects.alive().filter(pk=self.session.pk).exists()

    def test_delete_forever_removes_the_session_and_everything_in_it(self):
        make_run(self.session)
        self.client.post(reverse("chat:session_delete_hx", args=[self.session.session_id]))
        response = self.hx_post(reverse("chat:session_destroy_hx", args=[self.session.session_id]))
        assert response.status_code == 200 and response.content == b""
        assert not ChatSession.objects.filter(pk=self.session.pk).exists()
        assert not Run.objects.filter(session_id=self.session.pk).exists()
        assert not Message.objects.filter(session_id=self.session.pk).exists()

    def test_delete_forever_needs_the_trash_first(self):
        response = self.hx_post(reverse("chat:session_destroy_hx", args=[self.session.session_id]))
        assert response.status_code == 409
        assert ChatSession.objects.filter(pk=self.session.pk).exists()

    def test_trash_titles_open_the_chat_and_times_read_well(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now() - timedelta(seconds=20))
        older = make_session(owner=self.alice, name="Older", deleted_at=timezone.now() - timedelta(hours=3))
        html = self.client.get(reverse("chat:trash")).content.decode()
        chat = reverse("chat:session", args=[self.session.session_id])
        assert f'<a class="trash-title" href="{chat}">Groceries</a>' in html
        assert "deleted just now" in html and "0 minutes" not in html
        assert "deleted 3\xa0hours ago" in html and older.session_id in html

    def test_empty_trash_deletes_the_users_trashed_chats_the_page_listed(self):
        make_run(self.session)
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now() - timedelta(minutes=5))
        older = make_session(owner=self.alice, name="Older", deleted_at=timezone.now() - timedelta(days=3))
        live = make_session(owner=self.alice, name="Still here")
        bobs = make_session(owner=self.bob, name="Bob's trash", deleted_at=timezone.now())
        page = self.client.get(reverse("chat:trash")).content.decode()
        upto = re.search(r'name="upto" value="([^"]+)"', page).group(1)
        assert 'hx-confirm="Empty the trash? Every chat in it will be deleted for good.' in page
        later = make_session(owner=self.alice, name="Trashed since", deleted_at=timezone.now())  # another tab
        assert self.client.get(reverse("chat:trash_empty_hx")).status_code == 405  # a GET never deletes
        response = self.hx_post(reverse("chat:trash_empty_hx"), {"upto": upto})
        html = response.content.decode()
        assert response.status_code == 200 and html.startswith('<section id="trash"')
        assert "Deleted 2 chats for good." in html and "Trashed since" in html
        left = set(ChatSession.objects.values_list("pk", flat=True))
        assert left == {live.pk, bobs.pk, later.pk} and self.session.pk not in left and older.pk not in left
        assert not Run.objects.filter(session_id=self.session.pk).exists()
        response = self.client.post(reverse("chat:trash_empty_hx"), {"upto": timezone.now().isoformat()})
        assert response["Location"] == reverse("chat:trash")
        assert set(ChatSession.objects.values_list("pk", flat=True)) == {live.pk, bobs.pk}
        assert self.hx_post(reverse("chat:trash_empty_hx"), {"upto": "yesterday"}).status_code == 400

    def test_a_trashed_chat_cannot_be_renamed_pinned_or_retitled(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        for name, data in (("chat:session_rename_hx", {"name": "Renamed"}), ("chat:session_pin_hx", {"pinned": "1"}),
                           ("chat:session_retitle_hx", {})):
            assert self.hx_post(reverse(name, args=[self.session.session_id]), data).status_code == 404, name
        session = ChatSession.objects.get(pk=self.session.pk)
        assert (session.name, session.pinned_at) == ("Groceries", None)

    def test_plain_delete_forever_goes_back_to_the_trash(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        response = self.client.post(reverse("chat:session_destroy_hx", args=[self.session.session_id]))
        assert response["Location"] == reverse("chat:trash")
        assert not ChatSession.objects.filter(pk=self.session.pk).exists()


class TestRegenerateTitle(WebTestCase):
    """The view starts the title job and returns; the title reaches the user's tabs when it arrives."""

    @pytest.fixture(autouse=True)
    def _model(self, llm_server):
        self.llm = llm_server
        with override_settings(OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test", OPENAI_MAX_RETRIES=0):
            reset_assistants()
            yield
        reset_assistants()

    async def retitle(self, **headers):
        await self.async_client.aforce_login(self.alice)
        return await self.async_client.post(reverse("chat:session_retitle_hx", args=[self.session.session_id]),
                                            headers=headers)

    async def test_it_asks_the_model_for_a_title_even_over_a_user_title(self):
        await sync_to_async(make_run)(self.session, user_text="we need milk", reply="Added milk.")
        await ChatSession.objects.filter(pk=self.session.pk).aupdate(name_source=NameSource.USER)
        channel = await layer_listener(f"user.{self.alice.pk}")
        self.llm.add(Text("Milk run"))
        response = await self.retitle(**HX)
        # The row as it is now: the view does not wait for the model.
        assert response.status_code == 200 and f'id="session-item-{self.session.pk}"' in response.content.decode()
        pushed = await asyncio.wait_for(get_channel_layer().receive(channel), 10)
        await settle()
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert (session.name, session.name_source) == ("Milk run", NameSource.AUTO)
        assert "we need milk" in str(self.llm.requests[-1]["messages"])
        assert "Milk run" in pushed["html"]

    async def test_retitling_does_not_move_the_session_up(self):
        run = await sync_to_async(make_run)(self.session, user_text="we need milk", reply="ok")
        before = (await ChatSession.objects.aget(pk=self.session.pk)).last_activity_at
        self.llm.add(Text("Milk"))
        await self.retitle()
        await settle()
        session = await ChatSession.objects.aget(pk=self.session.pk)
        assert session.name == "Milk"  # the job ran
        assert session.last_activity_at == before == run.finished_at


def test_the_favicon_is_found_from_pages_without_the_icon_link(client):
    response = client.get("/favicon.ico")  # the admin's login page, for one: not a 404
    assert (response.status_code, response["Location"]) == (301, "/static/chatapp/favicon.svg")


# Every URL parameter that carries a number: a crafted value is a 400 with a message, never a 500.
CRAFTED_NUMBERS = ["nonsense", "-1", "1.5", "\u00b2", "9" * 20, "9223372036854775808", "1" * 5000, "", " 1", "0x10"]


@pytest.mark.django_db
@pytest.mark.parametrize("value", CRAFTED_NUMBERS)
def test_a_crafted_number_in_any_url_is_a_400_with_a_message(client, value):
    alice = make_user("alice")
    session = make_session(owner=alice)
    make_run(session, user_text="hello", reply="hi")
    client.force_login(alice)
    urls = [
        (reverse("chat:session_list_hx"), {"cursor": f"1.{value}"}),
        (reverse("chat:session_list_hx"), {"cursor": f"{value}.1"}),
        (reverse("chat:search_hx"), {"q": "a", "cursor": f"m.1.{value}.1"}),
        (reverse("chat:search_hx"), {"q": "a", "cursor": f"t.1.1.{value}"}),
        (reverse("chat:transcript_hx", args=[session.session_id]), {"before": value}),
    ]
    for url, query in urls:
        response = client.get(url, query, HTTP_HX_REQUEST="true")
        assert response.status_code == 400, (url, query, response.status_code)
        assert response.content.strip(), (url, query)
