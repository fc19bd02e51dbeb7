"""Job application tracker: structured extraction, then tools that keep the applications in the state.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/job_application_tracker.py
(SPEC.md B.2 #1). Step 1, an extraction agent with `output_schema=JobApplication`, turns the user's
message into a JobApplication; step 2, a tracker agent, receives it (as JSON) and calls
save_application, then list_applications. The session id is fixed, so every process that runs the
workflow adds to the same list: run the script three times and it grows 1 -> 2 -> 3.

    .venv/bin/python examples/workflows/job_application_tracker.py            # the next of the 3 applications
    .venv/bin/python examples/workflows/job_application_tracker.py 2          # the 2nd of the 3
    .venv/bin/python examples/workflows/job_application_tracker.py "Applied to ..."  # one of your own
    .venv/bin/python examples/workflows/job_application_tracker.py --reset    # forget every application

(The cookbook runs its three applications in one process; here each invocation is one of them, so
the list can be seen surviving the process.)
"""

import sys
from datetime import datetime
from typing import Optional

from _model import example_model  # puts the project on sys.path
from pydantic import BaseModel, Field

from sessions_core import Agent, RunContext, SessionNotFoundError, Step, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: SqliteDb(db_file="tmp/job_application_tracker.db"))
# ---------------------------------------------------------------------------
db = None

VALID_STATUSES = ["Applied", "Interview Scheduled", "Rejected", "Offer", "Withdrawn"]

APPLICATIONS = [
    "Applied to a Backend Engineer role at Acme Robotics via a job board, https://acme.example/careers/123",
    "Got an interview scheduled for a Python Developer position at Globex, found via a referral",
    "Submitted an application for a Data Scientist role at Initech",
]


# ---------------------------------------------------------------------------
# Structured model
# ---------------------------------------------------------------------------
class JobApplication(BaseModel):
    """Structured representation of a single job application."""

    company: str = Field(..., description="Company name")
    role: str = Field(..., description="Job title / role")
    url: Optional[str] = Field(None, description="Job posting URL")
    source: Optional[str] = Field(None, description="Where the job was found, e.g. a job board")
    status: str = Field(default="Applied", description=f"Application status, one of: {', '.join(VALID_STATUSES)}")
    notes: Optional[str] = Field(None, description="Any extra notes")


# ---------------------------------------------------------------------------
# Session-state tools
# ---------------------------------------------------------------------------
def save_application(
    run_context: RunContext,
    company: str,
    role: str,
    status: str = "Applied",
    url: str = "",
    source: str = "",
    notes: str = "",
) -> str:
    """Save one job application to the tracker."""
    if run_context.session_state is None:
        run_context.session_state = {}

    applications = run_context.session_state.setdefault("applications", [])
    record = {
        "id": len(applications) + 1,
        "company": company,
        "role": role,
        "status": status,
        "url": url,
        "source": source,
        "notes": notes,
        "applied_at": datetime.now().strftime("%Y-%m-%d"),
    }
    applications.append(record)
    return f"Saved application #{record['id']}: {role} at {company} ({status})."


def list_applications(run_context: RunContext) -> str:
    """List every tracked job application."""
    if run_context.session_state is None:
        run_context.session_state = {}

    applications = run_context.session_state.get("applications", [])
    if len(applications) == 0:
        return "No applications tracked yet."
    return "\n".join(f"#{app['id']} {app['role']} at {app['company']} - {app['status']}" for app in applications)


# ---------------------------------------------------------------------------
# Agents, steps and workflow
# ---------------------------------------------------------------------------
extractor_agent = Agent(
    name="Application Extractor",
    model=example_model(),
    output_schema=JobApplication,
    instructions=[
        "Extract a single job application from the user's message.",
        "Infer the company, role, URL and source when they are present.",
        f"Set status to one of: {', '.join(VALID_STATUSES)}. Default to 'Applied'.",
    ],
)

tracker_agent = Agent(
    name="Application Tracker",
    model=example_model(),
    tools=[save_application, list_applications],
    instructions=[
        "You receive a structured job application.",
        "Call save_application exactly once with its fields.",
        "Then call list_applications and show the full tracker to the user.",
    ],
)

extract_application_step = Step(
    name="extract_application",
    description="Extract a structured job application from the message",
    agent=extractor_agent,
)

save_application_step = Step(
    name="save_application",
    description="Save the application to the tracker and list all applications",
    agent=tracker_agent,
)

job_application_workflow = Workflow(
    name="Job Application Tracker",
    db=db,
    steps=[extract_application_step, save_application_step],
    session_state={"applications": []},
    # A fixed session id keeps the tracked applications across separate runs.
    session_id="job_tracker_demo",
)


def stored_applications() -> list:
    try:
        return job_application_workflow.get_session_state().get("applications", [])
    except SessionNotFoundError:
        return []


def main(argv: list[str]) -> dict:
    if argv == ["--reset"]:
        try:
            job_application_workflow.delete_session()
        except SessionNotFoundError:
            pass
        print("Forgot every tracked application.")
        return {}
    if argv and argv[0].isdigit() and 1 <= int(argv[0]) <= len(APPLICATIONS):
        number, text = int(argv[0]), APPLICATIONS[int(argv[0]) - 1]
    elif argv:
        number, text = None, " ".join(argv)
    else:
        number = len(stored_applications()) + 1
        if number > len(APPLICATIONS):
            print(f"All {len(APPLICATIONS)} example applications are tracked; run with --reset to start over,")
            print("or pass an application of your own as the argument.")
            print("Final workflow session state:", job_application_workflow.get_session_state())
            return job_application_workflow.get_session_state()
        text = APPLICATIONS[number - 1]

    print(f"=== Example {number}: {text} ===" if number else f"=== Your application: {text} ===")
    job_application_workflow.print_response(input=text)
    state = job_application_workflow.get_session_state()
    print(f"Applications tracked: {len(state.get('applications', []))}")
    print("Workflow session state:", state)
    return state


if __name__ == "__main__":
    main(sys.argv[1:])
