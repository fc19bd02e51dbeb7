"""The user's memories in a run's system message (Agno's wording, in outline), and reading them back from
a stored system message (what the chat shows as the memories a reply had in its context)."""

from __future__ import annotations

import re

OPEN, CLOSE = "<memories_from_previous_interactions>", "</memories_from_previous_interactions>"
_BLOCK = re.compile(re.escape(OPEN) + r"\n(.*?)\n?" + re.escape(CLOSE), re.S)


def memories_block(memories: list[str]) -> str:
    """The text added to the system message: the memories, or the note that there are none yet."""
    if not memories:
        return ("You have the capability to retain memories from previous interactions with the user, "
                "but have not had any interactions with the user yet.")
    listed = "\n".join(f"- {' '.join(text.split())}" for text in memories)
    return ("You have access to user info and preferences from previous interactions that you can use to "
            f"personalize your response:\n\n{OPEN}\n{listed}\n{CLOSE}\n\n"
            "Note: this information is from previous interactions and may be updated in this conversation. "
            "You should always prefer information from this conversation over the past memories.")


AGENTIC_NOTE = ("<updating_user_memories>\n"
                "- You have access to the `update_user_memory` tool that you can use to add new memories, "
                "update existing memories, or delete memories about the user.\n"
                "- If the user's message includes information that should be captured as a memory, use the "
                "`update_user_memory` tool to update your memory database.\n"
                "- Memories should include details that could personalize ongoing interactions with the user.\n"
                "</updating_user_memories>")


def memories_in(system_message: str) -> list[str]:
    """The memories a stored system message showed the model, in order ([] when it showed none)."""
    match = _BLOCK.search(system_message or "")
    if match is None:
        return []
    return [line[2:] for line in match[1].splitlines() if line.startswith("- ")]
