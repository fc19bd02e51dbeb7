"""What users can chat with: agents, workflows and a team, each built once, on first use, with the configured model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sessions_core.agent import Agent
from sessions_core.component import Component
from sessions_core.llm import default_model
from sessions_core.review import HumanReview
from sessions_core.steps import Router, Step, StepInput, StepOutput
from sessions_core.summary import SessionSummaryManager
from sessions_core.team import Team
from sessions_core.tools import RunContext
from sessions_core.workflow import Workflow

from .demo_tools import (  # noqa: F401  (the shopping tools are also known by this module's name)
    add_item,
    add_step,
    add_task,
    clear_completed_tasks,
    clear_list,
    clear_list_approved,
    complete_task,
    delete_step,
    list_items,
    list_steps,
    list_tasks,
    place_order,
    remove_item,
    remove_item_approved,
    schedule_delivery_asking,
    update_step_status,
)

# --- the registry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assistant:
    id: str
    name: str
    description: str
    build: Callable[[], Component]
    uses_memories: bool = False  # learns about the user and uses what it learnt (the user may turn it off)

    @property
    def described(self) -> str:
        """The description the picker shows, saying whether it uses the user's memories."""
        if self.uses_memories:
            return f"{self.description} Remembers what you tell it about yourself (see Memories)."
        return self.description


SUMMARY_RUNS = 6  # the general assistant's summary: these last runs, and the summary before them


def _general() -> Agent:
    return Agent(
        name="General assistant", id="general", model=default_model(), markdown=True,
        instructions="You are a helpful, concise assistant. Use Markdown where it helps.",
        add_history_to_context=True, num_history_runs=5,
        # The summary is made after every reply: from the last runs and the summary so far, so its request
        # (and its cost) stays the same however long the chat grows.
        session_summary_manager=SessionSummaryManager(last_n_runs=SUMMARY_RUNS, include_previous_summary=True),
        search_past_sessions=True, update_memory_on_run=True,
    )


def _shopping() -> Agent:
    return Agent(
        name="Shopping list", id="shopping", model=default_model(), markdown=True,
        instructions=("You keep the user's shopping list. Use the tools to add, remove, list and clear items; "
                      "never claim a change you did not make with a tool."),
        tools=[add_item, remove_item, list_items, clear_list],
        session_state={"shopping_list": []}, add_session_state_to_context=True,
        add_history_to_context=True, num_history_runs=3, update_memory_on_run=True,
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


def tally(step_input: StepInput, run_context: RunContext) -> StepOutput:
    """The shopping workflow's second step: count the list and remember when it last changed."""
    items = run_context.session_state.get("shopping_list") or []
    run_context.session_state["item_count"] = len(items)
    listed = ", ".join(map(str, items)) if items else "nothing yet"
    return StepOutput(content=f"{step_input.previous_step_content}\n\nYour list has {len(items)} item(s): {listed}.")


def _shopping_workflow() -> Workflow:
    shopper = Agent(
        name="Shopping assistant", id="shopping-assistant", model=default_model(), markdown=True,
        instructions=("You keep the user's shopping list. Use the tools to add, remove, list and clear items; "
                      "never claim a change you did not make with a tool."),
        tools=[add_item, remove_item, list_items, clear_list], add_session_state_to_context=True,
    )
    return Workflow(
        name="Shopping workflow", id="shopping-workflow",
        description="A shopping assistant step, then a function step that counts the list.",
        steps=[shopper, Step(name="Tally", executor=tally)],
        session_state={"shopping_list": [], "item_count": 0},
    )


def _approvals() -> Agent:
    return Agent(
        name="Shopping with approval", id="approvals", model=default_model(), markdown=True,
        instructions=("You keep the user's shopping list and schedule its delivery. Removing an item or clearing "
                      "the list waits for the user's approval; the delivery asks the user for its date."),
        tools=[add_item, remove_item_approved, list_items, clear_list_approved, schedule_delivery_asking],
        session_state={"shopping_list": []}, add_session_state_to_context=True,
        add_history_to_context=True, num_history_runs=3,
    )


def _reviewed_order() -> Workflow:
    shopper = Agent(
        name="Order assistant", id="order-assistant", model=default_model(), markdown=True,
        instructions="You keep the user's shopping list with the tools.",
        tools=[add_item, remove_item, list_items, clear_list], add_session_state_to_context=True,
    )
    review = HumanReview(requires_confirmation=True, confirmation_message="Place the order for the items on the list?",
                         on_reject="skip")
    return Workflow(
        name="Reviewed order", id="reviewed-order",
        description="A shopping step, a step that counts the list, then an order that waits for your approval.",
        steps=[shopper, Step(name="Tally", executor=tally),
               Step(name="Place order", executor=place_order, description="Order the items on the list.",
                    human_review=review)],
        session_state={"shopping_list": [], "item_count": 0},
    )


def route_task_request(step_input: StepInput) -> str:
    """Organize words win over manage words, which win over view words (the cookbook's precedence)."""
    words = set(step_input.get_input_as_string().lower().replace(",", " ").split())
    if words & {"clean", "cleanup", "organize", "clear", "tidy", "archive"}:
        return "Task organizer"
    if words & {"add", "create", "new", "mark", "complete", "completed", "finish", "done", "update"}:
        return "Task manager"
    return "Task viewer"


def _task_router() -> Workflow:
    def task_agent(name, instructions, tools):
        return Agent(name=name, model=default_model(), markdown=True, instructions=instructions, tools=tools,
                     add_session_state_to_context=True)

    choices = [
        Step(name="Task manager", agent=task_agent(
            "Task manager", "You add tasks and mark them completed with the tools.", [add_task, complete_task])),
        Step(name="Task viewer", agent=task_agent(
            "Task viewer", "You show the user's tasks with the list tool.", [list_tasks])),
        Step(name="Task organizer", agent=task_agent(
            "Task organizer", "You clean up the task list: remove completed tasks.",
            [clear_completed_tasks, list_tasks])),
    ]
    return Workflow(
        name="Task router", id="task-router",
        description="Routes each request to a task manager, viewer or organizer by its words.",
        steps=[Router(name="Route by keywords", selector=route_task_request, choices=choices)],
        session_state={"task_list": []},
    )


def _project_team() -> Team:
    planner = Agent(name="Planner", role="Adds and deletes project steps", model=default_model(),
                    tools=[add_step, delete_step], add_session_state_to_context=True,
                    instructions="You add and delete the project's steps with the tools.")
    tracker = Agent(name="Status tracker", role="Marks steps completed, in progress or pending; reports the status",
                    model=default_model(), tools=[update_step_status, list_steps], add_session_state_to_context=True,
                    instructions="You update the status of the project's steps, and report it, with the tools.")
    return Team(
        name="Project team", id="project-team", model=default_model(), members=[planner, tracker], markdown=True,
        instructions=("Delegate adding and deleting steps to the Planner and status changes to the Status "
                      "tracker; report what they did."),
        session_state={"steps": []}, add_session_state_to_context=True, add_history_to_context=True,
    )


ASSISTANTS: dict[str, Assistant] = {
    assistant.id: assistant
    for assistant in (
        Assistant("general", "General assistant",
                  "Answers questions, keeps a summary of the conversation and can look up your earlier chats with it.",
                  _general, uses_memories=True),
        Assistant("shopping", "Shopping list", "Keeps a shopping list with add, remove, list and clear tools.",
                  _shopping, uses_memories=True),
        Assistant("notes", "Notes and list", "Keeps notes and a list by editing its own state (agentic state).",
                  _notes),
        Assistant("shopping-workflow", "Shopping workflow",
                  "A workflow: a shopping assistant step, then a step that counts the list.", _shopping_workflow),
        Assistant("task-router", "Task router",
                  "A workflow that sends each request to a task manager, viewer or organizer.", _task_router),
        Assistant("project-team", "Project team",
                  "A team: a planner adds and deletes project steps, a status tracker updates them.", _project_team),
        Assistant("approvals", "Shopping with approval",
                  "A shopping list whose removals wait for your approval, and a delivery that asks you for its date.",
                  _approvals),
        Assistant("reviewed-order", "Reviewed order",
                  "A workflow: a shopping step, a count, then an order that waits for your approval.", _reviewed_order),
    )
}
# A new user's first chat (later ones start on the assistant last used): the one README's first example
# ("add milk, eggs and bread") needs, which the offline model answers with its tools and the state panel shows.
DEFAULT_ASSISTANT = "shopping"

_built: dict[str, Component] = {}


def get_assistant(assistant_id: str) -> Component:
    """The Agent, Team or Workflow for `assistant_id`, built once; unknown ids raise KeyError."""
    agent = _built.get(assistant_id)
    if agent is None:
        agent = _built[assistant_id] = ASSISTANTS[assistant_id].build()
    return agent


def assistant_name(assistant_id: str) -> str:
    assistant = ASSISTANTS.get(assistant_id)
    return assistant.name if assistant else assistant_id or "Assistant"


def assistant_defaults(assistant_id: str) -> dict:
    """The state an assistant starts with; the engine merges these keys back in on every run."""
    if assistant_id not in ASSISTANTS:
        return {}
    return dict(getattr(get_assistant(assistant_id), "session_state", None) or {})


def assistant_keeps_summaries(assistant_id: str) -> bool:
    """Whether the assistant writes a summary of its chats (shown in the state panel)."""
    if assistant_id not in ASSISTANTS:
        return False
    component = get_assistant(assistant_id)
    return bool(getattr(component, "session_summary_manager", None) or getattr(component, "enable_session_summaries", None))


def assistant_uses_memories(assistant_id: str) -> bool:
    """Whether the assistant learns about its user and is shown what it learnt (unless the user turned it off)."""
    assistant = ASSISTANTS.get(assistant_id)
    return bool(assistant and assistant.uses_memories)


def workflow_step_names(assistant_id: str) -> list[str]:
    """The names of a workflow assistant's steps, in order ([] for another assistant)."""
    if assistant_id not in ASSISTANTS:
        return []
    component = get_assistant(assistant_id)
    return [step.name for step in getattr(component, "steps", None) or [] if getattr(step, "name", None)]


def reset_assistants() -> None:
    """Forget the built agents, so the next use picks up changed model settings (tests)."""
    _built.clear()
