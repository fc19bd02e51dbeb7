"""Sidebar search: the results fragment for the search field (title hits, then message hits)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from sessions_core.search import MAX_QUERY_CHARS, InvalidCursor, search_sessions

from .common import HtmxHttpRequest

PAGE_SIZE = 20


@login_required
@require_GET
def search_hx(request: HtmxHttpRequest) -> HttpResponse:
    """First page (the whole results box) or, with `cursor`, the next rows to replace the "more" row."""
    text = request.GET.get("q", "").strip()[:MAX_QUERY_CHARS]
    try:
        page = search_sessions(request.user, text, limit=PAGE_SIZE, cursor=request.GET.get("cursor") or None,
                               one_per_session=True)
    except InvalidCursor:
        return HttpResponseBadRequest("Invalid cursor.")
    more_url = ""
    if page.next_cursor:
        more_url = f"{reverse('chat:search_hx')}?{urlencode({'q': text, 'cursor': page.next_cursor})}"
    return render(request, "chatapp/_search_results.html", {"q": text, "page": page, "more_url": more_url})
