"""Session summaries: a rolling summary of the conversation, regenerated after successful runs."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from .bridge import call_sync
from .history import ChatMessage, completed_messages
from .models import ChatSession
from .model_api import Model, ModelError

logger = logging.getLogger("sessions_core")

DEFAULT_PROMPT = (
    "Analyse the conversation between the user and the assistant below and write a concise summary of "
    "what will be useful in later interactions: facts about the user, their goals, decisions made and "
    "open questions. Also list a few short topics. Keep it brief and relevant, and do not invent anything."
)
SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "topics": {"type": "array", "items": {"type": "string"}}},
    "required": ["summary"],
}


@dataclass
class SessionSummary:
    summary: str
    topics: list[str] = field(default_factory=list)
    updated_at: datetime | None = None

    def to_dict(self) -> dict:
        return {
            "summary": self.summary,
            "topics": self.topics,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }

    @classmethod
    def from_dict(cls, data: dict | None) -> SessionSummary | None:
        """The summary stored on a session, whatever was stored (a damaged value reads as text, or as none)."""
        if not isinstance(data, dict) or not data.get("summary"):
            return None
        topics = data.get("topics")
        return cls(summary=str(data["summary"]),
                   topics=[str(topic) for topic in topics] if isinstance(topics, list) else [],
                   updated_at=_time(data.get("updated_at")))


def _time(value) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


class SessionSummaryManager:
    """Makes a session's summary with one model call (by default the agent's model)."""

    summary_request_message = "Provide the summary of the conversation."

    def __init__(self, model: Model | None = None, session_summary_prompt: str | None = None,
                 last_n_runs: int | None = None, conversation_limit: int | None = None,
                 include_previous_summary: bool = False):
        for name, value in (("last_n_runs", last_n_runs), ("conversation_limit", conversation_limit)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number, not {value}.")
        self.model = model
        self.session_summary_prompt = session_summary_prompt
        self.last_n_runs = last_n_runs
        self.conversation_limit = conversation_limit
        # With a window (last_n_runs, conversation_limit), the summary so far goes with it, so what fell
        # out of the window is kept and the request stays the same size however long the session grows.
        # Agno has no such option: its windowed summary forgets what is outside the window.
        self.include_previous_summary = include_previous_summary

    def build_request(self, messages: list[ChatMessage], previous: SessionSummary | None = None) -> list[dict]:
        conversation = [m for m in messages if m.role in ("user", "assistant") and m.content]
        if self.conversation_limit is not None:
            conversation = conversation[-self.conversation_limit:]
        transcript = "\n".join(f"{m.role.capitalize()}: {m.content}" for m in conversation)
        system = self.session_summary_prompt or DEFAULT_PROMPT
        if previous is not None and self.include_previous_summary:
            system += ("\n\nThe summary of the conversation so far, which the part below continues; keep what "
                       f"still holds:\n<previous_summary>\n{previous.summary}\n</previous_summary>")
        system += f"\n\n<conversation>\n{transcript}\n</conversation>"
        return [{"role": "system", "content": system}, {"role": "user", "content": self.summary_request_message}]

    async def acreate(self, model: Model, messages: list[ChatMessage],
                      previous: SessionSummary | None = None) -> SessionSummary:
        """Ask the model; raises ModelError when it fails or answers with nothing usable."""
        response_format = {"type": "json_schema", "json_schema": {"name": "session_summary", "schema": SUMMARY_SCHEMA}}
        text = await (self.model or model).acomplete(self.build_request(messages, previous), response_format)
        try:
            data = json.loads(text)
        except ValueError:
            data = {"summary": text.strip()}  # a model without structured output answered in prose
        if not isinstance(data, dict) or not str(data.get("summary") or "").strip():
            raise ModelError("The model returned no summary.")
        topics = [str(topic) for topic in data.get("topics") or [] if str(topic).strip()]
        return SessionSummary(summary=str(data["summary"]).strip(), topics=topics, updated_at=timezone.now())


async def aupdate_session_summary(config, session_pk: int, session_id: str,
                                  stored: dict | None = None) -> SessionSummary | None:
    """Regenerate the summary after a successful run. A failure keeps the previous one and is logged.
    `stored` is the summary as the run's start read it (the run held the session since): the previous
    summary a manager with `include_previous_summary` sends on, read no second time."""
    manager = config.session_summary_manager or SessionSummaryManager()
    alias = config.alias
    messages = await call_sync(completed_messages, session_pk, alias, manager.last_n_runs)
    previous = SessionSummary.from_dict(stored) if manager.include_previous_summary else None
    try:
        summary = await manager.acreate(config.model, messages, previous)
    except Exception:
        logger.exception("Session summary failed for session %s; the previous summary is kept", session_id)
        return None
    await call_sync(
        lambda: ChatSession.objects.using(alias).filter(pk=session_pk).update(summary=summary.to_dict())
    )
    return summary
