"""State in condition: a Condition reads the session state to greet a new user only once.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/state_in_condition.py
(SPEC.md B.2 #3). The evaluator asks whether the user has been greeted; if not, a greeter agent
greets and a function marks the user greeted and counts the greeting; a contextual agent then
answers. The second run, in the same session, skips the greeting: the state persisted (SPEC item 14:
state carries over with every store; Agno without a db starts each run from the defaults and greets
again). Both runs end with {"has_been_greeted": True, "greeting_count": 1}.

    .venv/bin/python examples/workflows/state_in_condition.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, Condition, RunContext, SessionNotFoundError, Step, StepInput, StepOutput, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: none)
# ---------------------------------------------------------------------------
db = None


# ---------------------------------------------------------------------------
# Session-state functions
# ---------------------------------------------------------------------------
def check_user_has_context(step_input: StepInput, run_context: RunContext) -> bool:
    print("\n=== Evaluating Condition ===")
    print(f"User ID: {run_context.session_state.get('current_user_id')}")
    print(f"Session ID: {run_context.session_state.get('current_session_id')}")
    print(f"Has been greeted: {run_context.session_state.get('has_been_greeted', False)}")

    return run_context.session_state.get("has_been_greeted", False)


def mark_user_as_greeted(step_input: StepInput, run_context: RunContext) -> StepOutput:
    print("\n=== Marking User as Greeted ===")
    run_context.session_state["has_been_greeted"] = True
    run_context.session_state["greeting_count"] = run_context.session_state.get("greeting_count", 0) + 1

    return StepOutput(content=f"User has been greeted. Total greetings: {run_context.session_state['greeting_count']}")


# ---------------------------------------------------------------------------
# Agents and workflow
# ---------------------------------------------------------------------------
greeter_agent = Agent(
    name="Greeter",
    model=example_model(),
    instructions="Greet the user warmly and introduce yourself.",
    markdown=True,
)

contextual_agent = Agent(
    name="Contextual Assistant",
    model=example_model(),
    instructions="Continue the conversation with context. You already know the user.",
    markdown=True,
)

workflow = Workflow(
    name="Conditional Greeting Workflow",
    db=db,
    steps=[
        Condition(
            name="Check If New User",
            description="Check if this is a new user who needs greeting",
            evaluator=lambda step_input, run_context: not check_user_has_context(step_input, run_context),
            steps=[
                Step(name="Greet User", description="Greet the new user", agent=greeter_agent),
                Step(name="Mark as Greeted", description="Mark user as greeted in session",
                     executor=mark_user_as_greeted),
            ],
        ),
        Step(
            name="Handle Query",
            description="Handle the user's query with or without greeting",
            agent=contextual_agent,
        ),
    ],
    session_state={
        "has_been_greeted": False,
        "greeting_count": 0,
    },
)


def run_example() -> dict:
    try:
        workflow.delete_session(session_id="user-123", user_id="user-123")  # start fresh each time
    except SessionNotFoundError:
        pass

    print("=" * 80)
    print("First Run - New User (Condition will be True, greeting will happen)")
    print("=" * 80)
    workflow.print_response(input="Hi, can you help me with something?", session_id="user-123",
                            user_id="user-123", stream=True)
    after_first = workflow.get_session_state(session_id="user-123", user_id="user-123")
    print("Session state after the first run:", after_first)

    print("\n" + "=" * 80)
    print("Second Run - Same Session (Skips greeting)")
    print("=" * 80)
    workflow.print_response(input="Tell me a joke", session_id="user-123", user_id="user-123", stream=True)
    final = workflow.get_session_state(session_id="user-123", user_id="user-123")
    print("Final session state:", final)
    return {"after_first": after_first, "final": final}


if __name__ == "__main__":
    run_example()
