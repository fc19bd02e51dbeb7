"""Rename session: a workflow session named from the workflow's description, with no model call.

Port of Agno's cookbook/04_workflows/06_advanced_concepts/session_state/rename_session.py
(SPEC.md B.2 #2). A `Steps` group (a research agent, then a writing agent) runs once; then
`set_session_name(autogenerate=True)` names the session "<description[:40]>- - YYYY-MM-DD HH:MM"
(SPEC item 22): "Automated article creation from research- - " and the session's creation time.

    .venv/bin/python examples/workflows/rename_session.py
"""

from _model import example_model  # puts the project on sys.path

from sessions_core import Agent, SessionNotFoundError, Step, Steps, Workflow

# ---------------------------------------------------------------------------
# Database: the engine's default one (the cookbook: SqliteDb(db_file="tmp/workflows.db"))
# ---------------------------------------------------------------------------
db = None

# ---------------------------------------------------------------------------
# Agents (the cookbook's researcher has WebSearchTools; we have no web search tool)
# ---------------------------------------------------------------------------
researcher = Agent(
    name="Research Agent",
    model=example_model(),
    instructions="Research the given topic and provide key facts and insights.",
)

writer = Agent(
    name="Writing Agent",
    model=example_model(),
    instructions="Write a comprehensive article based on the research provided. Make it engaging and well-structured.",
)

research_step = Step(name="research", agent=researcher, description="Research the topic and gather information")
writing_step = Step(name="writing", agent=writer, description="Write an article based on the research")

article_creation_sequence = Steps(
    name="article_creation",
    description="Complete article creation workflow from research to writing",
    steps=[research_step, writing_step],
)


def main() -> str:
    article_workflow = Workflow(
        description="Automated article creation from research to writing",
        steps=[article_creation_sequence],
        db=db,
        session_id="workflow_rename_session",
    )
    try:
        article_workflow.delete_session()  # start fresh each time the script runs
    except SessionNotFoundError:
        pass

    article_workflow.print_response(input="Write an article about the benefits of renewable energy")

    article_workflow.set_session_name(autogenerate=True)
    name = article_workflow.get_session_name()
    print(f"New session name: {name}")
    return name


if __name__ == "__main__":
    main()
