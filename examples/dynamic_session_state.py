"""Tool hooks taking over a tool: customer profiles kept in the session state.

Port of Agno's cookbook dynamic_session_state.py (SPEC.md B.1 #3). The toolkit's
`process_customer_request` must never run: a tool hook intercepts every call and implements "create"
and "retrieve" itself against `session_state["customer_profiles"]` (default: customer 123, Jane Doe).
The instructions embed {customer_profiles}. One prompt creates customer 789 ("Tom") and retrieves
the profile: both calls are short-circuited by the hook, the final state holds 123 and 789, and the
system prompt of that run still lists only 123 (it is built once, at the start of the run).

Change from the original besides the model line: the hook reads the state from `run_context`
(the current Agno API) instead of an old `session_state` hook parameter.

The offline demo model does not know this tool, so with it the state stays at its default; run it
with OPENAI_API_KEY / OPENAI_BASE_URL set (the tests drive it through a scripted local model server).

    .venv/bin/python examples/dynamic_session_state.py
"""

import json
from collections.abc import Callable
from typing import Any

from _model import example_model, is_offline  # puts the project on sys.path

from sessions_core import Agent, InMemoryDb, RunContext, Toolkit

# Every time the real tool body ran (it never should).
TOOL_BODY_CALLS: list[dict] = []


class CustomerDBTools(Toolkit):
    def __init__(self, **kwargs):
        super().__init__(name="customer_db", tools=[self.process_customer_request], **kwargs)

    def process_customer_request(self, agent: Agent, customer_id: str, action: str = "retrieve",
                                 name: str = "John Doe") -> str:
        """Create or retrieve a customer profile.

        Args:
            customer_id: The customer's id.
            action: "create" or "retrieve".
            name: The customer's name (for "create").
        """
        TOOL_BODY_CALLS.append({"customer_id": customer_id, "action": action, "name": name})
        return "This should not be seen."


def customer_management_hook(run_context: RunContext, function_name: str, function_call: Callable,
                             arguments: dict[str, Any]):
    """Answers every call of process_customer_request from the session state; never calls the tool."""
    action = arguments.get("action", "retrieve")
    customer_id = arguments.get("customer_id")
    name = arguments.get("name")
    if not customer_id:
        raise ValueError("customer_id is required.")
    profiles = run_context.session_state.setdefault("customer_profiles", {})
    if action == "create":
        profiles[customer_id] = {"name": name}
        return f"Success! Customer {customer_id} has been created."
    if action == "retrieve":
        profile = profiles.get(customer_id)
        if profile is None:
            raise ValueError(f"Customer '{customer_id}' not found.")
        return f"Profile for {customer_id}: {json.dumps(profile)}"
    raise ValueError(f"Unknown action {action!r}: use create or retrieve.")


def main() -> dict:
    TOOL_BODY_CALLS.clear()
    model = example_model()
    agent = Agent(
        model=model,
        db=InMemoryDb(),
        tools=[CustomerDBTools()],
        tool_hooks=[customer_management_hook],
        session_state={"customer_profiles": {"123": {"name": "Jane Doe"}}},
        instructions="Your profiles: {customer_profiles}. Use `process_customer_request`. "
        "Use either create or retrieve as action for the tool.",
    )
    if is_offline(model):
        print("(The offline demo model cannot call process_customer_request: the state stays at its "
              "default. Set OPENAI_API_KEY or OPENAI_BASE_URL to see the hook at work.)")
    prompt = "First, create customer 789 named 'Tom'. Then, retrieve Tom's profile. Step by step."
    agent.print_response(prompt, stream=False)

    system_prompt = agent.get_last_run_output().messages[0].content
    print(f"System prompt of that run: {system_prompt.splitlines()[0]}")
    print(f"Tool body ran {len(TOOL_BODY_CALLS)} times")
    state = agent.get_session_state()
    print(f"Final session state: {state}")
    return state


if __name__ == "__main__":
    main()
