"""The state panel: reading the state, earlier versions, and JSON edits with a version check."""

from __future__ import annotations

import json
import re

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from chatapp.state_edits import StaleStateError, replace_state
from sessions_core.models import ChatSession, StateChange
from tests.support.factories import make_run, make_session
from tests.support.web_helpers import GroupListener, WebTestCase


class StateTestCase(WebTestCase):
    def setUp(self):
        super().setUp()
        self.run = make_run(self.session, user_text="add milk and eggs")
        with transaction.atomic():
            session = ChatSession.objects.select_for_update().get(pk=self.session.pk)
            session.apply_state_change({"shopping_list": []}, "defaults")
            session.apply_state_change({"shopping_list": ["milk"]}, "tool:add_item", run=self.run)
            session.apply_state_change({"shopping_list": ["milk", "eggs"], "meta": {"store": "Aldi"}},
                                       "tool:add_item", run=self.run)
        self.session.refresh_from_db()

    def url(self, name, *args):
        return reverse(name, args=[self.session.session_id, *args])

    def edit(self, state, version, htmx=True):
        data = {"state": state if isinstance(state, str) else json.dumps(state), "version": version}
        post = self.hx_post if htmx else self.client.post
        return post(self.url("chat:state_edit_hx"), data)


class TestPanel(StateTestCase):
    def test_the_panel_shows_the_tree_version_and_timeline(self):
        response = self.hx_get(self.url("chat:state_panel_hx"))
        html = response.content.decode()
        assert html.strip().startswith('<section id="state-panel"') and "<html" not in html
        assert '<span id="state-version" class="state-version" data-version="3"' in html
        assert '<ol class="state-list" start="0"><li><span class="json-string">milk</span></li>' in html
        assert '<details class="state-object" open><summary>1 key</summary>' in html  # nested dict collapsible
        timeline = html.split('id="state-timeline"')[1]
        assert [int(v) for v in re.findall(r'<li class="state-change" data-version="(\d+)"', timeline)] == [3, 2, 1]
        assert "tool:add_item" in timeline and "defaults" in timeline
        assert f'href="#run-{self.run.run_id}"' in timeline
        assert '<code>shopping_list[1]</code> = <code class="diff-value">&quot;eggs&quot;</code>' in timeline
        assert '<code>meta</code> = <code class="diff-value">{&quot;store&quot;: &quot;Aldi&quot;}</code>' in timeline
        assert 'name="version" value="3"' in html
        for version in (1, 2, 3):
            assert f'hx-get="{self.url("chat:state_version_hx", version)}"' in timeline

    def test_a_removal_in_the_timeline_shows_the_value_it_removed(self):
        with transaction.atomic():
            session = ChatSession.objects.select_for_update().get(pk=self.session.pk)
            session.apply_state_change({"shopping_list": ["milk"]}, "tool:remove_item")
        timeline = self.hx_get(self.url("chat:state_panel_hx")).content.decode().split('id="state-timeline"')[1]
        assert '<code>shopping_list[1]</code> (was <code class="diff-value">&quot;eggs&quot;</code>)' in timeline

    def test_a_long_key_keeps_its_value_readable(self):
        with transaction.atomic():
            session = ChatSession.objects.select_for_update().get(pk=self.session.pk)
            session.apply_state_change({"preferred_delivery_time_window": "weekday evenings"}, "manual")
        html = self.hx_get(self.url("chat:state_panel_hx")).content.decode()
        # The key may break after an underscore, never mid-word (the browser test measures the value's width).
        assert ('<div class="state-entry" data-key="preferred_delivery_time_window"><dt>preferred_<wbr>delivery_<wbr>'
                'time_<wbr>window</dt><dd><span class="json-string">weekday evenings</span></dd></div>') in html

    def test_a_key_with_markup_is_escaped_between_its_break_points(self):
        with transaction.atomic():
            session = ChatSession.objects.select_for_update().get(pk=self.session.pk)
            session.apply_state_change({"<b>bold</b>_key": 1}, "manual")
        html = self.hx_get(self.url("chat:state_panel_hx")).content.decode()
        assert "<dt>&lt;b&gt;bold&lt;/b&gt;_<wbr>key</dt>" in html and "<b>bold</b>" not in html

    def test_a_plain_request_gets_the_whole_page(self):
        html = self.client.get(self.url("chat:state_panel_hx")).content.decode()
        assert "<html" in html and 'id="state-panel"' in html

    def test_the_state_as_of_an_earlier_version_is_read_only(self):
        html = self.hx_get(self.url("chat:state_version_hx", 2)).content.decode()
        assert "Version 2 of 3, read-only." in html
        tree = html.split('id="state-tree"')[1].split("</div>")[0]
        assert "milk" in tree and "eggs" not in tree and "Aldi" not in tree
        assert 'name="state"' not in html  # no edit form on an old version
        assert '<li class="state-change viewing" data-version="2">' in html
        assert "The state is empty." in self.hx_get(self.url("chat:state_version_hx", 0)).content.decode()

    def test_a_version_that_does_not_exist_is_a_404(self):
        assert self.hx_get(self.url("chat:state_version_hx", 4)).status_code == 404

    def test_as_of_works_as_a_plain_page_too(self):
        html = self.client.get(self.url("chat:state_version_hx", 1)).content.decode()
        assert "<html" in html and "Version 1 of 3, read-only." in html


class TestEdit(StateTestCase):
    def test_a_valid_edit_is_recorded_as_a_manual_change_and_pushed_to_the_session(self):
        listener = GroupListener(f"session.{self.session.pk}")
        response = self.edit({"shopping_list": ["bread"], "meta": {"store": "Aldi"}}, 3)
        assert response.status_code == 200
        self.session.refresh_from_db()
        assert self.session.session_state == {"shopping_list": ["bread"], "meta": {"store": "Aldi"}}
        assert self.session.state_version == 4
        change = StateChange.objects.get(session=self.session, version=4)
        assert change.source == "manual" and change.run is None
        html = response.content.decode()
        assert '<div class="state-entry changed" data-key="shopping_list">' in html
        assert '<div class="state-entry" data-key="meta">' in html
        assert 'data-version="4"' in html
        (pushed,) = listener.html()
        assert '<section id="state-panel"' in pushed and 'hx-swap-oob="true"' in pushed and "bread" in pushed

    def test_a_plain_edit_redirects_to_the_chat(self):
        response = self.edit({"shopping_list": []}, 3, htmx=False)
        assert response["Location"] == reverse("chat:session", args=[self.session.session_id])
        assert ChatSession.objects.get(pk=self.session.pk).state_version == 4

    def test_saving_the_same_state_records_nothing(self):
        self.edit(self.session.session_state, 3)
        assert ChatSession.objects.get(pk=self.session.pk).state_version == 3

    def assert_refused(self, response, status, message):
        assert response.status_code == status
        html = response.content.decode()
        assert message in html and 'role="alert"' in html
        assert "<details class=\"state-edit\" id=\"state-edit\" open>" in html
        session = ChatSession.objects.get(pk=self.session.pk)
        assert session.state_version == 3 and session.session_state["shopping_list"] == ["milk", "eggs"]
        assert StateChange.objects.filter(session=self.session).count() == 3
        return html

    def test_invalid_json_is_refused_and_the_text_kept(self):
        html = self.assert_refused(self.edit('{"shopping_list": [milk]}', 3), 422, "That is not valid JSON")
        assert "{&quot;shopping_list&quot;: [milk]}</textarea>" in html

    def test_a_json_error_is_said_in_a_users_words(self):
        html = self.assert_refused(self.edit('{"n": ' + "9" * 5000 + "}", 3), 422,
                                   "That is not valid JSON: a number in it is too long to read (more than 4,300 digits).")
        assert "set_int_max_str_digits" not in html
        self.assert_refused(self.edit('{"a": 1,}', 3), 422, "That is not valid JSON: expecting property name enclosed "
                            "in double quotes at line 1, column 9.")

    def test_a_json_value_that_is_not_an_object_is_refused(self):
        self.assert_refused(self.edit('["milk"]', 3), 422, "The state must be a JSON object")

    def test_values_json_cannot_store_are_refused(self):
        self.assert_refused(self.edit('{"n": NaN}', 3), 422, "cannot be stored as JSON")

    def test_a_stale_edit_is_refused_with_409_and_nothing_written(self):
        listener = GroupListener(f"session.{self.session.pk}")
        html = self.assert_refused(self.edit({"shopping_list": ["only mine"]}, 2), 409,
                                   "the state changed since you opened it (it is now at version 3)")
        assert "only mine" in html.split("<textarea")[1]  # the user's text is kept
        assert 'name="version" value="3"' in html  # saving again is a deliberate overwrite
        assert listener.html() == []

    def test_a_plain_stale_edit_gets_the_page_with_the_message(self):
        response = self.edit({"shopping_list": []}, 1, htmx=False)
        assert response.status_code == 409 and b"<html" in response.content
        assert b"Not saved: the state changed" in response.content

    def test_a_missing_version_is_refused(self):
        response = self.hx_post(self.url("chat:state_edit_hx"), {"state": "{}"})
        self.assert_refused(response, 422, "This field is required.")

    def test_a_chat_in_the_trash_is_refused_with_409_and_its_panel_has_no_editor(self):
        ChatSession.objects.filter(pk=self.session.pk).update(deleted_at=timezone.now())
        listener = GroupListener(f"session.{self.session.pk}")
        for htmx in (True, False):
            response = self.edit({"shopping_list": ["sneaked in"]}, 3, htmx=htmx)
            html = response.content.decode()
            assert response.status_code == 409
            assert "This chat is in the trash: restore it to edit its state." in html
            assert 'id="state-edit"' not in html and "Edit as JSON" not in html
        session = ChatSession.objects.get(pk=self.session.pk)
        assert (session.state_version, session.session_state["shopping_list"]) == (3, ["milk", "eggs"])
        assert listener.html() == []
        panel = self.hx_get(self.url("chat:state_panel_hx")).content.decode()  # read, as any panel
        assert "Edit as JSON" not in panel and "This chat is in the trash" in panel and "eggs" in panel

    def test_injected_keys_are_not_stored(self):
        self.edit({"shopping_list": [], "current_user_id": "mallory"}, 3)
        assert ChatSession.objects.get(pk=self.session.pk).session_state == {"shopping_list": []}


class TestReplaceState(StateTestCase):
    def test_it_checks_the_version_under_the_row_lock(self):
        session, changed = replace_state(self.alice, self.session.session_id, {"a": 1}, 3)
        assert session.state_version == 4 and sorted(changed) == ["a", "meta", "shopping_list"]
        try:
            replace_state(self.alice, self.session.session_id, {"b": 2}, 3)
        except StaleStateError as exc:
            assert exc.current_version == 4
        else:
            raise AssertionError("a stale version was accepted")
        assert ChatSession.objects.get(pk=self.session.pk).session_state == {"a": 1}

    def test_it_only_finds_the_users_own_session(self):
        try:
            replace_state(self.bob, self.session.session_id, {"a": 1}, 3)
        except ChatSession.DoesNotExist:
            pass
        else:
            raise AssertionError("another user's session was written")
        assert ChatSession.objects.get(pk=self.session.pk).state_version == 3


class TestStatePanelPresence(WebTestCase):
    def test_the_panel_shows_state_or_a_summary_from_the_first_load_and_is_absent_without_either(self):
        pages = {}
        for assistant in ("general", "shopping"):
            self.client.post(reverse("chat:new"), {"assistant": assistant, "text": "hello"})
            session = ChatSession.objects.for_user(self.alice).latest("id")
            pages[assistant] = self.client.get(reverse("chat:session", args=[session.session_id])).content.decode()
        # The general assistant keeps no state but writes summaries: its panel is the summary's, there before
        # the first reply ends (the chat's width never changes under it), with no "State v0" and no editor.
        assert 'data-panel="summary"' in pages["general"] and "appears here once" in pages["general"]
        assert "state-version" not in pages["general"] and "Edit as JSON" not in pages["general"]
        assert 'data-panel="state"' in pages["shopping"] and "Edit as JSON" in pages["shopping"]
        bare = make_session(self.alice, component_id="gone-assistant", name="Old")
        page = self.client.get(reverse("chat:session", args=[bare.session_id])).content.decode()
        assert 'data-panel="none"' in page
