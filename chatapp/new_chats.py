"""A new chat, made with its first message: from the landing page's socket (the page becomes the chat's page
in place, while the reply streams), or from its form posted without a socket (a redirect to the chat's page,
whose socket runs the message). Both check the same limits and make the chat the same way.

    refusal(user) -> (why, seconds to wait) | None   CHAT_NEW_CHATS_PER_MINUTE and the message limits
    start_chat(user, assistant_id, text) -> (ChatSession, Run)   the chat, its first message queued
    started_html(session) -> str                     what turns the landing into the chat's page (out of band)
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.template.loader import render_to_string

from sessions_core.models import ChatSession, NameSource, Run

from . import memories, rendering
from .assistants import assistant_name, get_assistant
from .live.queue import store_first_message
from .ratelimits import NEW_CHATS, message_refusal, over_limit, refusal as rate_refusal
from .titles import fallback_title


def refusal(user) -> tuple[str, int] | None:
    """A new chat counts against CHAT_NEW_CHATS_PER_MINUTE and its first message against the message limits
    (as any message does): (why, seconds to wait) when either refuses it, else None (and counted)."""
    if (wait := over_limit(NEW_CHATS, f"user:{user.pk}")) is not None:
        return rate_refusal(NEW_CHATS, wait), wait
    if refused := message_refusal(user):
        return refused, 60
    return None


def start_chat(user, assistant_id: str, text: str) -> tuple[ChatSession, Run]:
    """The chat, with the assistant's starting state (version 1) and its first message waiting in the stored
    queue, for the socket that runs it (`live.run_queued`, or the chat page's catch-up, which takes over a
    queue no process is working through)."""
    with transaction.atomic():
        assistant = get_assistant(assistant_id)
        session = ChatSession.objects.new(owner=user, component_id=assistant_id, kind=assistant.kind,
                                          metadata=assistant.metadata, name=fallback_title(text),
                                          name_source=NameSource.FALLBACK)
        session.apply_state_change(assistant.session_state, "defaults")
        run = store_first_message(session, text)
    return session, run


def started_html(session: ChatSession) -> str:
    """The parts of the chat's page the landing lacks, out of band: the chat's header (carrying its id and
    URL, which static/chatapp/chat.js takes for the page's own), the composer of a chat with its queue and
    actions, and the state pane. The transcript is left alone: the reply streams into it meanwhile."""
    return render_to_string("chatapp/_chat_started.html", {
        "session": session,
        "assistant_name": assistant_name(session.component_id),
        "state_panel": rendering.render_state_panel(session),
        "context_memories": memories.render_context_memories(memories.context_memories(session, [])),
        "max_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        "read_only": False,
    })
