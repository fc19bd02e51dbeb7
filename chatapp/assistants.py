"""What users can chat with: each assistant is an Agent built once, on first use, with the configured model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sessions_core.agent import Agent
from sessions_core.llm import default_model
from sessions_core.tools import RunContext

# --- shopping-list tools ------------------------------------------------------------------------


def _shopping_list(run_context: RunContext) -> list:
    items = run_context.session_state.get("shopping_list")
    if not isinstance(items, list):
        items = run_context.session_state["shopping_list"] = []
    return items


def add_item(run_context: RunContext, item: str) -> str:
    """Add an item to the shopping list. Items already on the list (in any letter case) are not added twice.

    Args:
        item: The item to add, e.g. "milk".
    """
    item = item.strip()
    items = _shopping_list(run_context)
    if not item:
        return "Error: the item name is empty."
    if any(str(existing).lower() == item.lower() for existing in items):
        return f"{item} is already on the list."
    items.append(item)
    return f"Added {item}. The list now has {len(items)} item(s)."


def remove_item(run_context: RunContext, item: str) -> str:
    """Remove an item from the shopping list (matching in any letter case).

    Args:
        item: The item to remove.
    """
    items = _shopping_list(run_context)
    for index, existing in enumerate(items):
        if str(existing).lower() == item.strip().lower():
            del items[index]
            return f"Removed {existing}."
    return f"Error: {item} is not on the list."


def list_items(run_context: RunContext) -> str:
    """Show what is on the shopping list."""
    items = _shopping_list(run_context)
    return "The list is empty." if not items else "Shopping list: " + ", ".join(map(str, items))


def clear_list(run_context: RunContext) -> str:
    """Remove every item from the shopping list."""
    _shopping_list(run_context).clear()
    return "The list is now empty."


# --- the registry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assistant:
    id: str
    name: str
    description: str
    build: Callable[[], Agent]


def _general() -> Agent:
    return Agent(
        name="General assistant", id="general", model=default_model(), markdown=True,
        instructions="You are a helpful, concise assistant. Use Markdown where it helps.",
        add_history_to_context=True, num_history_runs=5,
        enable_session_summaries=True, search_past_sessions=True,
    )


def _shopping() -> Agent:
    return Agent(
        name="Shopping list", id="shopping", model=default_model(), markdown=True,
        instructions=("You keep the user's shopping list. Use the tools to add, remove, list and clear items; "
                      "never claim a change you did not make with a tool."),
        tools=[add_item, remove_item, list_items, clear_list],
        session_state={"shopping_list": []}, add_session_state_to_context=True,
        add_history_to_context=True, num_history_runs=3,
    )


def _notes() -> Agent:
    return Agent(
        name="Notes and list", id="notes", model=default_model(), markdown=True,
        instructions=("You keep a shopping list and notes for the user in the session state. "
                      "Update them with the update_session_state tool."),
        session_state={"shopping_list": [], "notes": []},
        enable_agentic_state=True, add_session_state_to_context=True,
        add_history_to_context=True, num_history_runs=3,
    )


ASSISTANTS: dict[str, Assistant] = {
    assistant.id: assistant
    for assistant in (
        Assistant("general", "General assistant",
                  "Answers questions, keeps a summary of the conversation and can look up your earlier chats with it.",
                  _general),
        Assistant("shopping", "Shopping list", "Keeps a shopping list with add, remove, list and clear tools.",
                  _shopping),
        Assistant("notes", "Notes and list", "Keeps notes and a list by editing its own state (agentic state).",
                  _notes),
    )
}
DEFAULT_ASSISTANT = "general"

_built: dict[str, Agent] = {}


def get_assistant(assistant_id: str) -> Agent:
    """The Agent for `assistant_id`, built once; unknown ids raise KeyError."""
    agent = _built.get(assistant_id)
    if agent is None:
        agent = _built[assistant_id] = ASSISTANTS[assistant_id].build()
    return agent


def assistant_name(assistant_id: str) -> str:
    assistant = ASSISTANTS.get(assistant_id)
    return assistant.name if assistant else assistant_id or "Assistant"


def reset_assistants() -> None:
    """Forget the built agents, so the next use picks up changed model settings (tests)."""
    _built.clear()
