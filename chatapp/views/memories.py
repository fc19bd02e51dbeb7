"""The Memories page: what the assistants remember about the signed-in user, to search, add, edit, delete
and forget altogether; whether they remember anything at all; and the undo of what one reply remembered.

Every lookup goes through the engine's one owner-scoped store (sessions_core/user_memories/store.py) with
the request's user: another user's memory id, or run id, is a 404. A GET writes nothing.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from sessions_core.models import ChatSession, Run
from sessions_core.user_memories import store

from .. import memories
from .common import HtmxHttpRequest

ALIAS = "default"
SEARCH_MAX = 200


def _topics(text: str) -> list[str]:
    return [topic.strip() for topic in (text or "").split(",") if topic.strip()]


def _item(request, memory, status: int = 200, error: str = "") -> HttpResponse:
    history = store.memory_history(request.user, memory.memory_id, ALIAS)
    html = render_to_string("chatapp/_memory_item.html", {"memory": memory, "history": history, "error": error},
                            request=request)
    return HttpResponse(html, status=status)


def _refused(request: HtmxHttpRequest, error: str, memory=None) -> HttpResponse:
    if request.htmx and memory is not None:
        return _item(request, memory, status=422, error=error)
    if request.htmx:
        return HttpResponse(render_to_string("chatapp/_memory_error.html", {"error": error}), status=422)
    messages.error(request, error)
    return redirect("chat:memories")


@login_required
@require_GET
def memories_page(request: HtmxHttpRequest) -> HttpResponse:
    search = request.GET.get("q", "").strip()[:SEARCH_MAX]
    listed = list(reversed(store.list_memories(request.user, ALIAS, search or None)))  # newest first
    history = store.histories(request.user, [memory.memory_id for memory in listed], ALIAS)
    return render(request, "chatapp/memories.html", {
        "items": [(memory, history.get(memory.memory_id, [])) for memory in listed], "search": search,
        "enabled": store.memories_enabled(request.user, ALIAS)})


@login_required
@require_POST
def memory_add(request: HtmxHttpRequest) -> HttpResponse:
    try:
        memory = store.add_memory(request.user, request.POST.get("memory", ""), _topics(request.POST.get("topics", "")),
                                  ALIAS, source=store.Source.USER)
    except ValueError as exc:
        return _refused(request, str(exc))
    if request.htmx:
        return _item(request, memory)
    return redirect("chat:memories")


def _owned(request, memory_id: str):
    memory = store.get_memory(request.user, memory_id, ALIAS)
    if memory is None:
        raise Http404("No such memory.")
    return memory


@login_required
@require_POST
def memory_edit(request: HtmxHttpRequest, memory_id: str) -> HttpResponse:
    memory = _owned(request, memory_id)
    try:
        memory = store.update_memory(request.user, memory_id, request.POST.get("memory", ""),
                                     _topics(request.POST.get("topics", "")), ALIAS, source=store.Source.USER)
    except ValueError as exc:
        return _refused(request, str(exc), memory)
    if memory is None:  # deleted a moment ago (another tab)
        raise Http404("No such memory.")
    if request.htmx:
        return _item(request, memory)
    return redirect("chat:memories")


@login_required
@require_POST
def memory_delete(request: HtmxHttpRequest, memory_id: str) -> HttpResponse:
    if not store.delete_memory(request.user, memory_id, ALIAS, source=store.Source.USER):
        raise Http404("No such memory.")
    if request.htmx:
        return HttpResponse("")
    messages.info(request, "Memory deleted.")
    return redirect("chat:memories")


@login_required
@require_http_methods(["GET", "POST"])
def memories_forget(request: HtmxHttpRequest) -> HttpResponse:
    """Forget everything: a page that asks first (GET), then the deletion (POST with confirm=yes)."""
    if request.method == "POST" and request.POST.get("confirm") == "yes":
        count = store.clear_memories(request.user, ALIAS, source=store.Source.USER)
        messages.info(request, f"Forgot {count} memor{'y' if count == 1 else 'ies'}.")
        return redirect("chat:memories")
    count = len(store.list_memories(request.user, ALIAS))
    return render(request, "chatapp/memories_forget.html", {"count": count},
                  status=400 if request.method == "POST" else 200)


@login_required
@require_POST
def memories_setting(request: HtmxHttpRequest) -> HttpResponse:
    enabled = request.POST.get("enabled") == "on"
    store.set_memories_enabled(request.user, enabled, ALIAS)
    messages.info(request, "Memories are on: assistants that use them learn and remember." if enabled else
                  "Memories are off: nothing is learnt about you and no memory is used.")
    return redirect("chat:memories")


@login_required
@require_POST
def memory_undo(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Undo what one reply (a run of one of the user's chats) remembered; its memory line, redrawn."""
    sessions = ChatSession.objects.for_user(request.user)
    run = get_object_or_404(Run.objects.filter(session__in=sessions).annotate(**memories.SHOWN), run_id=run_id)
    store.undo_run(request.user, run.run_id, ALIAS)
    memories.attach([run], request.user.pk)
    if request.htmx:
        return HttpResponse(memories.render_run_memories(run))
    session_id = sessions.filter(pk=run.session_id).values_list("session_id", flat=True).get()
    return redirect("chat:session", session_id=session_id)
