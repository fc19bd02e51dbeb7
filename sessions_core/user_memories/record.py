"""`UserMemory`: one fact about a user, as the accessors, the manager and the events hand it out."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

MEMORY_MAX_CHARS = 2000  # a memory is one short fact; longer text is refused
TOPICS_MAX = 10


@dataclass
class UserMemory:
    """Agno's `UserMemory`, plus the run that made or last changed it (`run_id`, in `session_id`)."""

    memory: str
    memory_id: str | None = None
    topics: list[str] = field(default_factory=list)
    user_id: str | None = None
    input: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    feedback: str | None = None
    agent_id: str | None = None
    team_id: str | None = None
    run_id: str | None = None
    session_id: str | None = None

    def to_dict(self) -> dict:
        return {
            "memory_id": self.memory_id, "memory": self.memory, "topics": list(self.topics or []),
            "user_id": self.user_id, "input": self.input, "agent_id": self.agent_id, "team_id": self.team_id,
            "run_id": self.run_id, "session_id": self.session_id,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }

    @classmethod
    def from_row(cls, row, user_id: str | None) -> UserMemory:
        """A stored row (its run and the run's session selected with it)."""
        run = row.run if row.run_id else None
        return cls(
            memory=row.memory, memory_id=row.memory_id, topics=list(row.topics or []),
            user_id=user_id,
            input=row.input or None, created_at=row.created_at, updated_at=row.updated_at,
            agent_id=row.agent_id or None, team_id=row.team_id or None,
            run_id=run.run_id if run else None, session_id=run.session.session_id if run else None,
        )


def clean_text(text) -> str:
    """A memory's text as stored: stripped; empty or too long is a ValueError."""
    from ..storable import replace_unstorable

    if not isinstance(text, str) or not text.strip():
        raise ValueError("A memory needs some text.")
    text = replace_unstorable(text.strip())
    if len(text) > MEMORY_MAX_CHARS:
        raise ValueError(f"A memory is at most {MEMORY_MAX_CHARS} characters.")
    return text


def clean_topics(topics) -> list[str]:
    """Topics as stored: a list of short strings, blanks and repeats dropped."""
    if topics is None:
        return []
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, (list, tuple)):
        raise ValueError("Topics must be a list of strings.")
    cleaned = []
    for topic in topics:
        topic = str(topic).strip()[:64]
        if topic and topic not in cleaned:
            cleaned.append(topic)
    return cleaned[:TOPICS_MAX]
