"""chatapp.views.search.search_hx: the sidebar search results fragment, and the `marked` filter it shows snippets with."""

import re

from django.contrib.auth import get_user_model
from django.test import TestCase
from django.urls import reverse

from chatapp.templatetags.search_snippets import marked
from sessions_core.search import Snippet
from tests.support.factories import make_run, make_session

HX = {"HX-Request": "true"}


class TestSearchHx(TestCase):
    def setUp(self):
        # No passwords: hashing them costs more than the test (force_login does not need one).
        self.alice = get_user_model().objects.create_user("alice")
        self.bob = get_user_model().objects.create_user("bob")
        self.client.force_login(self.alice)
        self.url = reverse("chat:search_hx")

    def get(self, **params):
        return self.client.get(self.url, params, headers=HX)

    def test_it_requires_login(self):
        self.client.logout()
        response = self.get(q="anything")
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))

    def test_it_is_mounted_at_search(self):
        assert self.url == "/search/"

    def test_title_hits_then_message_hits_linking_to_the_run(self):
        session = make_session(self.alice, name="Paella night")
        run = make_run(session, "How much saffron for paella?", "A pinch.")
        make_session(self.alice, name="Unrelated")
        response = self.get(q="paella")
        html = response.content.decode()
        assert response.status_code == 200
        assert "<html" not in html and 'id="session-filter-results"' in html
        assert html.index("<h3>Chats</h3>") < html.index("<h3>Messages</h3>")
        assert f'href="/s/{session.session_id}/"' in html
        assert f'href="/s/{session.session_id}/?run={run.run_id}#run-{run.run_id}"' in html  # opens its branch
        assert "How much saffron for <mark>paella</mark>?" in html
        assert "<mark>Paella</mark> night" in html
        assert "Unrelated" not in html

    def test_a_plain_request_gets_the_same_fragment(self):
        make_session(self.alice, name="Paella night")
        htmx = self.get(q="paella").content
        plain = self.client.get(self.url, {"q": "paella"})
        assert plain.status_code == 200 and plain.content == htmx

    def test_no_results_state(self):
        make_session(self.alice, name="Paella night")
        html = self.get(q="zebra").content.decode()
        assert "No chats or messages match “zebra”." in html
        assert "search-hit" not in html

    def test_an_empty_query_renders_an_empty_closed_box(self):
        html = self.get(q="  ").content.decode()
        assert 'class="session-filter-results search-results"' in html
        assert "<li" not in html and "No chats" not in html

    def test_another_users_sessions_are_not_shown(self):
        make_run(make_session(self.bob, name="Bob paella"), "bob's paella", None)
        html = self.get(q="paella").content.decode()
        assert "No chats or messages match" in html and "Bob" not in html

    def test_html_in_a_message_is_escaped(self):
        make_run(make_session(self.alice, name="X"), "<script>alert(1)</script> xsstoken", None)
        html = self.get(q="xsstoken").content.decode()
        assert "<script>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt; <mark>xsstoken</mark>" in html

    def test_the_query_is_escaped_in_the_no_results_message(self):
        html = self.get(q='<img src=x onerror="alert(1)">').content.decode()
        assert "<img" not in html and "&lt;img" in html

    def test_more_results_load_when_scrolled_into_view_and_continue_without_repeating_the_wrapper(self):
        for i in range(25):  # a chat is one hit, however many of its messages match
            make_run(make_session(self.alice, name=f"Log {i}"), f"entry {i} mentions wombat", None)
        first = self.get(q="wombat").content.decode()
        assert first.count('class="search-hit message-hit"') == 20
        pattern = r'<li class="search-more" hx-get="([^"]+)" hx-trigger="intersect once" hx-swap="outerHTML">'
        [more] = re.findall(pattern, first)
        more = more.replace("&amp;", "&")
        assert f'<a href="{more.replace("&", "&amp;")}">More results</a>' in first
        second = self.client.get(more, headers=HX).content.decode()
        assert second.count('class="search-hit message-hit"') == 5
        assert "session-filter-results" not in second and "<h3>" not in second and "search-more" not in second
        assert "entry 0 mentions" in second and "entry 24 mentions" in first

    def test_a_bad_cursor_is_a_400(self):
        response = self.get(q="wombat", cursor="nonsense")
        assert response.status_code == 400

    def test_post_is_not_allowed(self):
        assert self.client.post(self.url, {"q": "x"}).status_code == 405


def test_marked_escapes_the_text_and_marks_each_span():
    snippet = Snippet('a<b "c" & d', ((0, 1), (1, 2), (8, 9)))
    assert marked(snippet) == "<mark>a</mark><mark>&lt;</mark>b &quot;c&quot; <mark>&amp;</mark> d"
    assert marked(Snippet("plain")) == "plain" and marked(Snippet("")) == ""
