"""The session sidebar: keyset pages on (last_activity_at, id) with date-group headings.

Pinned sessions come first, in their own group, on the first page only; the rest are paged by a
cursor, never by offset, so a page costs the same however far down it is and rows that share a
timestamp are neither skipped nor repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime

from django.db.models import Q
from django.utils import timezone

from sessions_core.models import ChatSession
from sessions_core.search import decode_cursor, encode_cursor

PAGE_SIZE = 30
PINNED_LIMIT = 100  # pinned sessions shown (they are few; this only bounds the query)


def date_group(moment: datetime, today: date) -> str:
    """Today / Yesterday / Previous 7 days / Previous 30 days / 'March 2026', in the current time zone."""
    days = (today - timezone.localtime(moment).date()).days
    if days <= 0:
        return "Today"
    if days == 1:
        return "Yesterday"
    if days <= 7:
        return "Previous 7 days"
    if days <= 30:
        return "Previous 30 days"
    return timezone.localtime(moment).strftime("%B %Y")


@dataclass
class SidebarRow:
    session: ChatSession
    heading: str | None = None  # set on the first row of a new date group


@dataclass
class SidebarPage:
    rows: list[SidebarRow]
    pinned: list[ChatSession] = field(default_factory=list)
    next_cursor: str | None = None
    first: bool = True

    @property
    def has_today_rows(self) -> bool:
        return bool(self.rows) and self.rows[0].heading == "Today"


def _after(cursor: str) -> tuple[datetime, int]:
    """(last_activity_at, id) of the last row shown; InvalidCursor for a malformed cursor."""
    return decode_cursor(cursor, datetime, int)


def sidebar_page(user, cursor: str | None = None, page_size: int = PAGE_SIZE) -> SidebarPage:
    """One page of the user's live, unpinned sessions after `cursor` (plus the pinned ones on page one)."""
    # for_sidebar() orders by (-last_activity_at, -id): the partial indexes session_sidebar_idx and
    # session_pinned_idx (live sessions only) serve it in that order.
    sessions = ChatSession.objects.for_user(user).alive().for_sidebar()
    today = timezone.localdate()
    after = _after(cursor) if cursor else None
    unpinned = sessions.filter(pinned_at__isnull=True)
    previous_group = None
    if after:
        stamp, pk = after
        # The redundant <= bound is what an index can seek to; the OR then settles ties on id.
        unpinned = unpinned.filter(last_activity_at__lte=stamp).filter(
            Q(last_activity_at__lt=stamp) | Q(last_activity_at=stamp, pk__lt=pk))
        previous_group = date_group(stamp, today)
    found = list(unpinned[: page_size + 1])
    rows = []
    for session in found[:page_size]:
        group = date_group(session.last_activity_at, today)
        rows.append(SidebarRow(session, group if group != previous_group else None))
        previous_group = group
    page = SidebarPage(rows, first=after is None)
    if len(found) > page_size:
        last = found[page_size - 1]
        page.next_cursor = encode_cursor(last.last_activity_at, last.pk)
    if page.first:
        page.pinned = list(sessions.filter(pinned_at__isnull=False)[:PINNED_LIMIT])
    return page


def trashed_sessions(user, limit: int = 200) -> list[ChatSession]:
    return list(ChatSession.objects.for_user(user).trashed().for_sidebar().order_by("-deleted_at", "-id")[:limit])
