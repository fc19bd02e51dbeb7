"""What a run sends the model before the user's message: the system message and the history.

The system message is made of developer-written text only (description, instructions or an
explicit system message, with `{key}` placeholders resolved from the state, dependencies, metadata
and user id), then the optional state block and the optional summary of earlier interactions. The
user's own text is never templated. History is read by `history.history` in one bounded query.
"""

from __future__ import annotations

import json

from . import state as state_module
from .config import RunConfig
from .user_memories.context import AGENTIC_NOTE, memories_block


def system_message(config: RunConfig, state: dict, user_id: str | None, summary: dict | None,
                   memories: list[str] | None = None) -> str:
    """The system message of a run whose working state (injected keys included) is `state`; `memories`
    (None: not shown) are the user's memories' texts."""
    sources = (state, config.dependencies, config.metadata, {"user_id": user_id} if user_id else {})
    if config.system_message is not None:
        text = str(config.system_message)
        return state_module.render(text, *sources) if config.resolve_in_context else text
    parts = []
    if config.description:
        parts.append(config.description)
    instructions = config.instructions
    if callable(instructions):
        instructions = instructions()
    if isinstance(instructions, (list, tuple)):
        instructions = [str(line) for line in instructions]
        if len(instructions) == 1:
            parts.append(instructions[0])
        elif instructions:
            parts.append("<instructions>\n" + "\n".join(f"- {line}" for line in instructions) + "\n</instructions>")
    elif instructions:
        parts.append(str(instructions))
    if config.output_schema is None and config.markdown:
        parts.append("Use markdown to format your answers.")
    text = "\n\n".join(parts)
    if config.resolve_in_context:
        text = state_module.render(text, *sources)
    if config.add_session_state_to_context:
        block = json.dumps(state, ensure_ascii=False, default=str)
        text += f"\n\n<session_state>\n{block}\n</session_state>"
    summary = summary or {}
    if config.add_session_summary_to_context and summary.get("summary"):
        text += (
            "\n\nHere is a brief summary of your previous interactions:\n\n"
            f"<summary_of_previous_interactions>\n{summary['summary']}\n</summary_of_previous_interactions>\n\n"
            "Note: this information is from previous interactions and may be outdated. "
            "You should ALWAYS prefer information from this conversation over the past summary."
        )
    if memories is not None:
        text += "\n\n" + memories_block(memories)
    if config.enable_agentic_memory and memories is not None:
        text += "\n\n" + AGENTIC_NOTE
    return text.strip()


def response_format(config: RunConfig) -> dict | None:
    """The structured-output request for the config's output schema (a pydantic model), if any."""
    schema = config.output_schema
    if schema is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()}}
