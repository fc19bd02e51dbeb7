"""State in function: executor functions read and change the workflow session state.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/state_in_function.py
(SPEC.md B.2 #4). Steps: a research team, a planning function (counts the plans, asks a planner
agent for one, keeps it in the state) and a summary function (marks the session summarized). Two
runs leave plan_counter 2, two content_plans and total_plans_summarized 2. The streaming twin does
the same with generator executors: the planning one yields the planner agent's own events as they
come, then its StepOutput; its summary function takes the legacy `session_state` parameter.

    .venv/bin/python examples/workflows/state_in_function.py
"""

from collections.abc import Iterator
from typing import Union

from _model import example_model  # puts the project on sys.path

from sessions_core import (
    Agent,
    InMemoryDb,
    RunContext,
    SessionNotFoundError,
    Step,
    StepInput,
    StepOutput,
    Team,
    Workflow,
)
from sessions_core.events import BaseRunEvent

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: SqliteDb(session_table="workflow_session",
# db_file="tmp/workflow.db"))
# ---------------------------------------------------------------------------
db = None

# ---------------------------------------------------------------------------
# Agents (the cookbook gives the researchers HackerNewsTools and WebSearchTools; we have neither)
# ---------------------------------------------------------------------------
hackernews_agent = Agent(
    name="Hackernews Agent",
    model=example_model(),
    instructions="Extract key insights and content from Hackernews posts",
)

web_agent = Agent(
    name="Web Agent",
    model=example_model(),
    instructions="Search the web for the latest news and trends",
)

PLANNER_INSTRUCTIONS = [
    "Plan a content schedule over 4 weeks for the provided topic and research content",
    "Ensure that I have posts for 3 posts per week",
]

# The planners run on their own, outside the workflow's session: InMemoryDb keeps their sessions out of
# the database (the cookbook's non-streaming planner has no db at all).
content_planner = Agent(name="Content Planner", model=example_model(), instructions=PLANNER_INSTRUCTIONS,
                        db=InMemoryDb())

streaming_content_planner = Agent(name="Content Planner", model=example_model(), instructions=PLANNER_INSTRUCTIONS,
                                  db=InMemoryDb())

research_team = Team(
    name="Research Team",
    model=example_model(),
    members=[hackernews_agent, web_agent],
    instructions="Analyze content and create comprehensive social media strategy",
)


# ---------------------------------------------------------------------------
# Function executors
# ---------------------------------------------------------------------------
def planning_prompt(message, plan_id: int, research, plans_so_far: int) -> str:
    return f"""
        STRATEGIC CONTENT PLANNING REQUEST:

        Core Topic: {message}
        Plan ID: #{plan_id}

        Research Results: {research[:500] if research else "No research results"}

        Previous Plans Count: {plans_so_far}

        Planning Requirements:
        1. Create a comprehensive content strategy based on the research
        2. Leverage the research findings effectively
        3. Identify content formats and channels
        4. Provide timeline and priority recommendations
        5. Include engagement and distribution strategies

        Please create a detailed, actionable content plan.
    """


def plan_report(plan_id: int, message, research, plans: list, strategy) -> str:
    return f"""
## Strategic Content Plan #{plan_id}

**Planning Topic:** {message}

**Research Integration:** {"[PASS] Research-based" if research else "[FAIL] No research foundation"}
**Total Plans Created:** {len(plans)}

**Content Strategy:**
{strategy}

**Custom Planning Enhancements:**
- Research Integration: {"High" if research else "Baseline"}
- Strategic Alignment: Optimized for multi-channel distribution
- Execution Ready: Detailed action items included
- Session History: {len(plans)} plans stored

**Plan ID:** #{plan_id}
    """.strip()


def next_plan_id(session_state: dict) -> int:
    """Count one more plan in the state (the keys are made on first use)."""
    if "content_plans" not in session_state:
        session_state["content_plans"] = []
    if "plan_counter" not in session_state:
        session_state["plan_counter"] = 0

    session_state["plan_counter"] += 1
    return session_state["plan_counter"]


def keep_plan(session_state: dict, plan_id: int, message, content, research) -> None:
    session_state["content_plans"].append({
        "id": plan_id,
        "topic": message,
        "content": content,
        "timestamp": f"Plan #{plan_id}",
        "has_research": bool(research),
    })


def custom_content_planning_function(step_input: StepInput, run_context: RunContext) -> StepOutput:
    session_state = run_context.session_state
    message = step_input.input
    previous_step_content = step_input.previous_step_content

    current_plan_id = next_plan_id(session_state)

    try:
        response = content_planner.run(
            planning_prompt(message, current_plan_id, previous_step_content, len(session_state["content_plans"]))
        )
        keep_plan(session_state, current_plan_id, message, response.content, previous_step_content)
        return StepOutput(content=plan_report(current_plan_id, message, previous_step_content,
                                              session_state["content_plans"], response.content))
    except Exception as e:
        return StepOutput(content=f"Custom content planning failed: {str(e)}", success=False)


def content_summary_function(step_input: StepInput, run_context: RunContext) -> StepOutput:
    session_state = run_context.session_state
    if "content_plans" not in session_state or not session_state["content_plans"]:
        return StepOutput(content="No content plans found in session state.", success=False)

    plans = session_state["content_plans"]
    session_state["session_summarized"] = True
    session_state["total_plans_summarized"] = len(plans)
    return StepOutput(content=plans_summary(plans))


def plans_summary(plans: list) -> str:
    summary = f"""
## Content Planning Session Summary

**Total Plans Created:** {len(plans)}
**Session Statistics:**
- Plans with research: {len([p for p in plans if p["has_research"]])}
- Plans without research: {len([p for p in plans if not p["has_research"]])}

**Plan Overview:**
"""
    for plan in plans:
        summary += f"""
### Plan #{plan["id"]} - {plan["topic"]}
- Research Available: {"[PASS]" if plan["has_research"] else "[FAIL]"}
- Status: Completed
"""
    return summary.strip()


def custom_content_planning_function_stream(
    step_input: StepInput, run_context: RunContext
) -> Iterator[Union[BaseRunEvent, StepOutput]]:
    session_state = run_context.session_state
    message = step_input.input
    previous_step_content = step_input.previous_step_content

    current_plan_id = next_plan_id(session_state)

    try:
        response_iterator = streaming_content_planner.run(
            planning_prompt(message, current_plan_id, previous_step_content, len(session_state["content_plans"])),
            stream=True,
            stream_events=True,
        )
        for event in response_iterator:
            yield event

        response = streaming_content_planner.get_last_run_output()
        strategy = response.content if response else "Content generation failed"
        keep_plan(session_state, current_plan_id, message, response.content if response else "No content generated",
                  previous_step_content)
        yield StepOutput(content=plan_report(current_plan_id, message, previous_step_content,
                                             session_state["content_plans"], strategy))
    except Exception as e:
        yield StepOutput(content=f"Custom content planning failed: {str(e)}", success=False)


def content_summary_function_stream(step_input: StepInput, session_state: dict) -> Iterator[StepOutput]:
    plans = session_state["content_plans"]
    session_state["session_summarized"] = True
    session_state["total_plans_summarized"] = len(plans)
    yield StepOutput(content=plans_summary(plans))


# ---------------------------------------------------------------------------
# Steps and workflows
# ---------------------------------------------------------------------------
research_step = Step(name="Research Step", team=research_team)
content_planning_step = Step(name="Content Planning Step", executor=custom_content_planning_function)
content_summary_step = Step(name="Content Summary Step", executor=content_summary_function)
stream_content_planning_step = Step(name="Content Planning Step", executor=custom_content_planning_function_stream)
stream_content_summary_step = Step(name="Content Summary Step", executor=content_summary_function_stream)

content_creation_workflow = Workflow(
    name="Content Creation Workflow",
    description="Automated content creation with custom execution options and session state",
    db=db,
    steps=[research_step, content_planning_step, content_summary_step],
    session_state={"content_plans": [], "plan_counter": 0},
    session_id="workflow_state_in_function",
)

streaming_content_workflow = Workflow(
    name="Streaming Content Creation Workflow",
    description="Automated content creation with streaming custom execution functions and session state",
    db=db,
    steps=[research_step, stream_content_planning_step, stream_content_summary_step],
    session_state={"content_plans": [], "plan_counter": 0},
    session_id="workflow_state_in_function_stream",
)


def main() -> dict:
    for workflow in (content_creation_workflow, streaming_content_workflow):
        try:
            workflow.delete_session()  # start fresh each time the script runs
        except SessionNotFoundError:
            pass

    print("=== First Workflow Run ===")
    content_creation_workflow.print_response(input="AI trends in 2024")
    print(f"\nSession State After First Run: {content_creation_workflow.get_session_state()}")
    print("\n" + "=" * 60 + "\n")
    print("=== Second Workflow Run (Same Session) ===")
    content_creation_workflow.print_response(input="Machine Learning automation tools")
    final = content_creation_workflow.get_session_state()
    print(f"\nFinal Session State: {final}")

    print("\n=== First Streaming Workflow Run ===")
    streaming_content_workflow.print_response(input="AI trends in 2024", stream=True)
    print(f"\nSession State After First Run: {streaming_content_workflow.get_session_state()}")
    print("\n" + "=" * 60 + "\n")
    print("=== Second Streaming Workflow Run (Same Session) ===")
    streaming_content_workflow.print_response(input="Machine Learning automation tools", stream=True)
    final_streaming = streaming_content_workflow.get_session_state()
    print(f"\nFinal Session State: {final_streaming}")
    return {"workflow": final, "streaming": final_streaming}


if __name__ == "__main__":
    main()
