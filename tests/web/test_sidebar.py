"""The sidebar's list of chats (chatapp/sidebar.py) through its htmx view: keyset pages, pinned chats first,
date-group headings, and what one page costs."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatapp import rendering
from sessions_core.models import ChatSession
from tests.support.factories import make_run, make_session
from tests.support.web_helpers import WebTestCase, headings, item_ids


class TestSidebarList(WebTestCase):
    def _sessions(self, count, at, step=timedelta(0), **fields):
        return [make_session(owner=self.alice, name=f"s{n}", last_activity_at=at - step * n, **fields)
                for n in range(count)]

    def test_keyset_pages_have_no_duplicates_or_gaps_when_timestamps_tie(self):
        ChatSession.objects.all().delete()
        now = timezone.now()
        # 75 sessions in 15 runs of 5 that share one timestamp, so page edges fall inside ties.
        created = [make_session(owner=self.alice, name=f"s{n}", last_activity_at=now - timedelta(minutes=n // 5))
                   for n in range(75)]
        make_session(owner=self.bob, last_activity_at=now)
        expected = [s.pk for s in sorted(created, key=lambda s: (s.last_activity_at, s.pk), reverse=True)]
        seen, url, sizes = [], reverse("chat:session_list_hx"), []
        while url:
            html = self.hx_get(url).content.decode()
            ids = item_ids(html)
            sizes.append(len(ids))
            seen += ids
            more = re.search(r'hx-get="([^"]+cursor=[^"]+)" hx-trigger="intersect once"', html)
            url = more and more.group(1).replace("&amp;", "&")
        assert seen == expected
        assert sizes == [30, 30, 15]

    def test_pinned_sessions_come_first_on_the_first_page_only(self):
        ChatSession.objects.all().delete()
        now = timezone.now()
        old_pinned = make_session(owner=self.alice, name="old pinned", last_activity_at=now - timedelta(days=90),
                                  pinned_at=now)
        rest = self._sessions(35, now, timedelta(seconds=1))
        html = self.hx_get(reverse("chat:session_list_hx")).content.decode()
        ids = item_ids(html)
        assert ids[0] == old_pinned.pk
        assert ids[1:4] == [rest[0].pk, rest[1].pk, rest[2].pk]
        cursor = re.search(r"cursor=([^\"&]+)", html).group(1)
        second = self.hx_get(reverse("chat:session_list_hx") + f"?cursor={cursor}").content.decode()
        assert old_pinned.pk not in item_ids(second)
        assert 'id="session-list"' not in second  # a continuation is rows only

    def test_rows_are_grouped_by_date(self):
        ChatSession.objects.all().delete()
        now = timezone.now()
        for days in (0, 1, 3, 20, 70):
            make_session(owner=self.alice, name=f"{days} days", last_activity_at=now - timedelta(days=days))
        html = self.hx_get(reverse("chat:session_list_hx")).content.decode()
        month = timezone.localtime(now - timedelta(days=70)).strftime("%B %Y")
        assert headings(html) == ["Pinned", "Today", "Yesterday", "Previous 7 days", "Previous 30 days", month]
        assert html.index("0 days") < html.index('Yesterday') < html.index("1 days")

    def test_a_heading_is_not_repeated_across_pages(self):
        ChatSession.objects.all().delete()
        self._sessions(40, timezone.now(), timedelta(seconds=1))
        first = self.hx_get(reverse("chat:session_list_hx")).content.decode()
        cursor = re.search(r"cursor=([^\"&]+)", first).group(1)
        second = self.hx_get(reverse("chat:session_list_hx") + f"?cursor={cursor}").content.decode()
        assert headings(first) == ["Pinned", "Today"] and headings(second) == []

    def test_the_list_query_reads_only_sidebar_columns(self):
        ChatSession.objects.all().delete()
        for session in self._sessions(40, timezone.now(), timedelta(seconds=1)):
            make_run(session)
        ChatSession.objects.filter(owner=self.alice).update(session_state={"big": "x" * 1000})
        with CaptureQueriesContext(connection) as queries:
            response = self.hx_get(reverse("chat:session_list_hx"))
        assert len(item_ids(response.content.decode())) == 30
        listing = [q["sql"] for q in queries.captured_queries if "sessions_core_chatsession" in q["sql"]]
        assert len(listing) == 2  # unpinned page + pinned
        for sql in listing:
            assert "session_state" not in sql and "summary" not in sql and "metadata" not in sql
        # No query of its own on runs or messages: a row's "waits for you" mark is an EXISTS on the runs'
        # (session, status) index inside the listing's own query.
        assert not any("sessions_core_message" in q["sql"] for q in queries.captured_queries)
        assert not any("sessions_core_run" in q["sql"] and "sessions_core_chatsession" not in q["sql"]
                       for q in queries.captured_queries)
        assert all("EXISTS" in sql.upper() for sql in listing if "sessions_core_run" in sql)
        assert len(queries.captured_queries) <= 4  # + the auth session and user

    def test_running_sessions_show_an_indicator(self):
        ChatSession.objects.filter(pk=self.session.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=30))
        idle = make_session(owner=self.alice, name="Idle")
        html = self.hx_get(reverse("chat:session_list_hx")).content.decode()
        rows = {int(chunk.split('"')[0]): chunk for chunk in html.split('<li id="session-item-')[1:]}
        assert 'class="running"' in rows[self.session.pk]
        assert 'class="running"' not in rows[idle.pk]

    def test_row_actions_point_at_their_views(self):
        # A row carries its URL; the page's menu and rename templates name each action's path under it.
        row = rendering.render_session_item(self.session)
        base = re.search(r'data-url="([^"]+)"', row).group(1)
        assert base == reverse("chat:session", args=[self.session.session_id]) and f'href="{base}"' in row
        page = self.client.get(base).content.decode()
        actions = set(re.findall(r'data-action="([^"]+)"', page.split('id="row-menu-template"')[1]))
        expected = {reverse(name, args=[self.session.session_id]) for name in (
            "chat:session_rename_hx", "chat:session_pin_hx", "chat:session_delete_hx", "chat:session_retitle_hx",
            "chat:session_export_markdown", "chat:session_export_json")}
        assert {base + action for action in actions} == expected

    def test_a_row_holds_no_menu_or_form_of_its_own_so_a_long_sidebar_stays_small(self):
        row = rendering.render_session_item(self.session)
        assert "<form" not in row and 'role="menu"' not in row and len(row) < 1200

    def test_a_bad_cursor_is_a_400(self):
        response = self.hx_get(reverse("chat:session_list_hx") + "?cursor=nonsense")
        assert response.status_code == 400 and b"Invalid cursor." in response.content
