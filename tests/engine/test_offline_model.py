"""OfflineModel: the deterministic demo model that drives tools in the OpenAI wire format."""

import asyncio
import enum
import json

import pydantic
import pytest

from chatapp.assistants import add_item, clear_list, list_items, remove_item
from sessions_core import Agent, RunContext, Team
from sessions_core.llm import OfflineModel


def tool(name, **string_params):
    """A wire-format tool whose keyword arguments are required string parameters."""
    properties = {param: {"type": "string", "description": text} for param, text in string_params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


SHOPPING_TOOLS = [
    tool("add_item", item="What to add"),
    tool("remove_item", item="What to remove"),
    tool("get_list"),
    tool("clear_list"),
]
STATE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "update_session_state",
            "description": "Merge updates into the session state.",
            "parameters": {
                "type": "object",
                "properties": {"session_state_updates": {"type": "object"}},
                "required": ["session_state_updates"],
            },
        },
    }
]


def user(text):
    return {"role": "user", "content": text}


def stream(messages, tools=None):
    async def collect():
        return [chunk async for chunk in OfflineModel().astream(messages, tools)]

    return asyncio.run(collect())


def planned_calls(text, tools=SHOPPING_TOOLS, system=None):
    """The (name, arguments) pairs the model calls for one user message."""
    messages = ([{"role": "system", "content": system}] if system else []) + [user(text)]
    final = stream(messages, tools)[-1]
    assert final.finish_reason == "tool_calls"
    return [(call.name, json.loads(call.arguments)) for call in final.tool_calls]


def reply_text(chunks):
    return "".join(chunk.content for chunk in chunks)


def test_adds_each_item_in_one_turn():
    final = stream([user("Add milk, eggs and bread")], SHOPPING_TOOLS)[-1]

    assert [call.id for call in final.tool_calls] == ["call_1", "call_2", "call_3"]
    assert [(call.name, json.loads(call.arguments)) for call in final.tool_calls] == [
        ("add_item", {"item": "milk"}),
        ("add_item", {"item": "eggs"}),
        ("add_item", {"item": "bread"}),
    ]


def test_need_drops_articles_and_where_to_put_it():
    assert planned_calls("I need some apples and a loaf of bread on my list please") == [
        ("add_item", {"item": "apples"}),
        ("add_item", {"item": "loaf of bread"}),
    ]


def test_remove_and_got_call_the_remove_tool():
    assert planned_calls("Remove eggs") == [("remove_item", {"item": "eggs"})]
    assert planned_calls("I got the milk and the eggs") == [
        ("remove_item", {"item": "milk"}),
        ("remove_item", {"item": "eggs"}),
    ]


def test_question_about_the_list_calls_the_list_tool():
    assert planned_calls("What's on my list?") == [("get_list", {})]
    assert planned_calls("show me the list") == [("get_list", {})]


def test_clear_then_add_in_one_turn():
    assert planned_calls("Clear the list and start with rice and beans") == [
        ("clear_list", {}),
        ("add_item", {"item": "rice"}),
        ("add_item", {"item": "beans"}),
    ]


def test_agentic_state_gets_one_update_with_the_new_list():
    system = "You keep a shopping list.\n<session_state>\n{'shopping_list': ['milk', 'eggs']}\n</session_state>"

    assert planned_calls("add bread", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["milk", "eggs", "bread"]}})
    ]
    assert planned_calls("remove eggs", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["milk"]}})
    ]


def test_agentic_state_also_reads_json_and_clears():
    system = '<session_state>{"shopping_list": ["milk"], "done": false}</session_state>'

    assert planned_calls("clear it all and add tea", STATE_TOOLS, system) == [
        ("update_session_state", {"session_state_updates": {"shopping_list": ["tea"]}})
    ]


def test_plain_answer_says_it_is_the_offline_demo_model():
    chunks = stream([user("Tell me a joke")])

    text = reply_text(chunks)
    assert "offline demo model" in text
    assert '"Tell me a joke"' in text
    assert chunks[-1].tool_calls == []
    assert chunks[-1].finish_reason == "stop"


def test_request_without_a_fitting_tool_gets_the_plain_answer():
    chunks = stream([user("add milk")], [tool("get_weather", city="Where")])

    assert chunks[-1].tool_calls == []
    assert "offline demo model" in reply_text(chunks)


def test_reply_streams_word_by_word_and_counts_words_as_tokens():
    chunks = stream([user("hello there")])

    words = chunks[:-1]
    assert len(words) > 5
    assert all(chunk.content.strip() and " " not in chunk.content.strip() for chunk in words)
    assert chunks[-1].usage == {"input_tokens": 2, "output_tokens": len(words), "total_tokens": 2 + len(words)}


def test_after_tool_results_it_answers_in_words():
    calls = [("call_1", "add_item", {"item": "milk"}), ("call_2", "add_item", {"item": "eggs"}),
             ("call_3", "remove_item", {"item": "bread"}), ("call_4", "get_list", {})]
    messages = [
        user("add milk and eggs, remove bread and show my list"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, name, args in calls
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_4", "content": '["milk", "eggs"]'},
    ]

    chunks = stream(messages, SHOPPING_TOOLS)

    assert reply_text(chunks) == "Removed bread. Added milk and eggs to your list. Your list: milk and eggs."
    assert chunks[-1].tool_calls == []
    assert chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize(("result", "reply"), [
    ("Shopping list: milk, bread", "Your list: milk, bread."),
    ("The list is empty.", "The list is empty."),
    ("milk, bread", "Your list: milk, bread."),
    ('{"shopping_list": ["milk", "bread"]}', "Your list: milk and bread."),
    ("", "Your list is empty."),
])
def test_a_list_tool_result_in_words(result, reply):
    messages = [
        user("what's on my list"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_list", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]

    assert reply_text(stream(messages, SHOPPING_TOOLS)) == reply


def test_after_a_state_update_it_reports_the_new_list():
    messages = [
        user("clear my list"),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "update_session_state",
                    "arguments": '{"session_state_updates": {"shopping_list": []}}',
                },
            }],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Updated."},
    ]

    assert reply_text(stream(messages, STATE_TOOLS)) == "Your list is now empty."


def test_title_has_at_most_five_words_without_filler():
    prompt = [
        {"role": "system", "content": "Name this conversation in at most five words. No quotes."},
        {"role": "user", "content": "USER: Hi, can you please help me plan a birthday party?\nASSISTANT: Sure!"},
    ]

    title = asyncio.run(OfflineModel().acomplete(prompt))

    assert title == "Plan a birthday party"


@pytest.mark.parametrize(("said", "title"), [
    ("Hello! What can you do? Please answer with a list.", "What can you do"),
    ("Plan a trip to Rome. Then book it", "Plan a trip to Rome"),
    ("version 2.5 of the app crashes on start", "Version 2.5 of the app"),
    ("Plan a weekend trip to Lisbon in May", "Plan a weekend trip"),
    ("Add a step: design the homepage", "Add a step"),
])
def test_title_comes_from_the_first_sentence(said, title):
    prompt = [
        {"role": "system", "content": "Name this conversation in at most five words. No quotes."},
        {"role": "user", "content": f"USER: {said}\nASSISTANT: Sure!"},
    ]

    assert asyncio.run(OfflineModel().acomplete(prompt)) == title


def test_summary_follows_the_session_summary_schema():
    prompt = [{"role": "user", "content": "Summarise.\nUser: add oat milk\nAssistant: Added.\nUser: remove the milk"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "session_summary", "schema": {}}}

    summary = json.loads(asyncio.run(OfflineModel().acomplete(prompt, response_format)))

    assert summary == {"summary": 'The user said: "add oat milk" and "remove the milk".', "topics": ["milk", "oat"]}


def test_acomplete_otherwise_gives_the_plain_answer():
    text = asyncio.run(OfflineModel().acomplete([user("What is the capital of France?")]))

    assert text.startswith("I'm the offline demo model")


def test_identity():
    model = OfflineModel(delay=0.5)

    assert (model.id, model.provider, model.delay) == ("offline-demo", "offline", 0.5)


# -- teams: delegation ------------------------------------------------------------------------------

DELEGATE_TOOLS = [tool("delegate_task_to_member", member_id="Which member", task="What to do")]
ROSTER = """You lead a team.
<team_members>
- member_id: shopper | name: Shopper | role: Adds and removes items on the shopping list
- member_id: planner | name: Planner | role: Keeps the to-do tasks and their priorities
</team_members>"""


def team_messages(*rest, said="add milk"):
    return [{"role": "system", "content": ROSTER}, user(said), *rest]


def delegation_turn(member_id, result):
    arguments = json.dumps({"member_id": member_id, "task": "add milk"})
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "delegate_task_to_member", "arguments": arguments}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


@pytest.mark.parametrize(("said", "member_id"), [
    ("add milk", "shopper"),                            # "add" is in the shopper's role ("Adds")
    ("what are my tasks?", "planner"),                  # "tasks" is in the planner's role
    ("ask the planner about tomorrow", "planner"),      # by id or name
    ("remove eggs from the shopping list", "shopper"),  # three of the shopper's words
    ("tell me a joke", "shopper"),                      # no word matches: the first member
    ("list everything", "shopper"),                     # a tie (list / ...): the first listed
])
def test_a_team_delegates_the_request_to_the_member_it_names(said, member_id):
    final = stream([{"role": "system", "content": ROSTER}, user(said)], DELEGATE_TOOLS)[-1]

    assert [(call.name, json.loads(call.arguments)) for call in final.tool_calls] == [
        ("delegate_task_to_member", {"member_id": member_id, "task": said})
    ]


def test_a_word_of_a_members_name_outweighs_one_of_another_members_role():
    roster = ("<team_members>\n- member_id: planner | name: Planner | role: Adds and deletes project steps\n"
              "- member_id: status-tracker | name: Status tracker | role: Marks steps completed\n</team_members>")

    final = stream([{"role": "system", "content": roster}, user("what is the status of the project?")],
                   DELEGATE_TOOLS)[-1]

    assert json.loads(final.tool_calls[0].arguments)["member_id"] == "status-tracker"


def test_a_member_with_no_role_is_matched_by_its_name():
    roster = "<team_members>\n- member_id: web | name: Web Researcher\n- member_id: writer | name: Writer\n</team_members>"

    final = stream([{"role": "system", "content": roster}, user("Writer, draft a poem")], DELEGATE_TOOLS)[-1]

    assert json.loads(final.tool_calls[0].arguments)["member_id"] == "writer"


def test_the_team_reports_the_members_reply_as_given():
    chunks = stream(team_messages(*delegation_turn("shopper", "Milk is already on the list.")), DELEGATE_TOOLS)

    assert reply_text(chunks) == "Shopper: Milk is already on the list."
    assert chunks[-1].tool_calls == [] and chunks[-1].finish_reason == "stop"


def test_a_failed_delegation_is_reported_as_failed():
    result = "Error: there is no member 'ghost' in this team (members: shopper, planner)."

    text = reply_text(stream(team_messages(*delegation_turn("ghost", result)), DELEGATE_TOOLS))

    assert text == "I could not hand this to ghost: there is no member 'ghost' in this team (members: shopper, planner)."


# -- task tools -------------------------------------------------------------------------------------


def task_tool(name, required=(), optional=()):
    properties = {param: {"type": "string"} for param in (*required, *optional)}
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool",
        "parameters": {"type": "object", "properties": properties, "required": list(required)},
    }}


TASK_TOOLS = [
    task_tool("add_task", ["name"], ["priority"]),
    task_tool("complete_task", ["name"]),
    task_tool("list_tasks"),
    task_tool("clear_completed_tasks"),
]
STEP_TOOLS = [
    task_tool("add_step", ["step_name", "assignee", "priority"]),
    task_tool("delete_step", ["step_name"]),
    task_tool("update_step_status", ["step_name", "status"]),
    task_tool("get_steps"),
]


def test_one_request_adds_several_tasks_with_their_priorities():
    said = "add a task to review the project proposal with high priority, buy groceries (low) and call the dentist (medium)"

    assert planned_calls(said, TASK_TOOLS) == [
        ("add_task", {"name": "Review the project proposal", "priority": "high"}),
        ("add_task", {"name": "Buy groceries", "priority": "low"}),
        ("add_task", {"name": "Call the dentist", "priority": "medium"}),
    ]


def test_a_task_without_a_priority_gets_medium():
    assert planned_calls("Add a new task: water the plants", TASK_TOOLS) == [
        ("add_task", {"name": "Water the plants", "priority": "medium"}),
    ]


@pytest.mark.parametrize(("said", "calls"), [
    ("mark groceries as completed", [("complete_task", {"name": "groceries"})]),
    ("I finished the dentist task", [("complete_task", {"name": "dentist"})]),
    ("show my tasks", [("list_tasks", {})]),
    ("show pending tasks", [("list_tasks", {})]),
    ("show completed tasks", [("list_tasks", {})]),
    ("clean up completed tasks", [("clear_completed_tasks", {})]),
])
def test_task_requests_call_the_task_tools(said, calls):
    assert planned_calls(said, TASK_TOOLS) == calls


def test_a_name_said_in_part_is_the_task_in_the_state():
    system = '<session_state>{"task_list": [{"name": "Buy groceries", "priority": "low", "status": "pending"}]}' \
             "</session_state>"

    assert planned_calls("mark groceries as completed", TASK_TOOLS, system) == [
        ("complete_task", {"name": "Buy groceries"}),
    ]


@pytest.mark.parametrize(("said", "calls"), [
    ("delete the Write Tests step", [("delete_step", {"step_name": "Write Tests"})]),
    ("Mark Setup Database as completed", [("update_step_status", {"step_name": "Setup Database", "status": "completed"})]),
    ("set Create API to in progress", [("update_step_status", {"step_name": "Create API", "status": "in progress"})]),
    ("Add a step Deploy to Production assigned to Eve with high priority",
     [("add_step", {"step_name": "Deploy to Production", "priority": "high", "assignee": "Eve"})]),
    ("show the steps", [("get_steps", {})]),
    ("what is the status of the project?", [("get_steps", {})]),
    ("how is the project progressing", [("get_steps", {})]),
    ("set Create API as in progress", [("update_step_status", {"step_name": "Create API", "status": "in progress"})]),
])
def test_variants_of_the_task_tools_are_matched_by_name_and_parameters(said, calls):
    assert planned_calls(said, STEP_TOOLS) == calls


def test_remove_task_is_the_delete_tool_too():
    assert planned_calls("remove the task call the dentist", [task_tool("remove_task", ["task_name"])]) == [
        ("remove_task", {"task_name": "call the dentist"}),
    ]


def tool_turn(said, *calls):
    """The user's message, the assistant's calls and the tools' results: calls are (name, arguments, result)."""
    return [
        user(said),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for n, (name, arguments, _) in enumerate(calls, start=1)
        ]},
        *({"role": "tool", "tool_call_id": f"call_{n}", "content": result}
          for n, (_, _, result) in enumerate(calls, start=1)),
    ]


def test_after_task_tools_it_says_what_they_did():
    messages = tool_turn(
        "add two tasks and show them",
        ("add_task", {"name": "Buy groceries", "priority": "low"}, "Added task 'Buy groceries'."),
        ("add_task", {"name": "Call the dentist", "priority": "medium"}, "Added task 'Call the dentist'."),
        ("complete_task", {"name": "Buy groceries"}, "Marked 'Buy groceries' as completed."),
        ("list_tasks", {}, json.dumps([{"name": "Buy groceries", "priority": "low", "status": "completed"},
                                       {"name": "Call the dentist", "priority": "medium", "status": "pending"}])),
    )

    assert reply_text(stream(messages, TASK_TOOLS)) == (
        "Added Buy groceries (low priority) and Call the dentist (medium priority). "
        "Marked Buy groceries as completed. "
        "Your tasks: Buy groceries (low, completed) and Call the dentist (medium, pending).")


def test_a_priority_said_after_a_comma_is_the_tasks_not_a_task_of_its_own():
    # It was split off as a second task with no name: "add_task failed: The task name is empty".
    assert planned_calls("add a task: write the report, high priority", TASK_TOOLS) == [
        ("add_task", {"name": "Write the report", "priority": "high"}),
    ]
    assert planned_calls("add buy milk, low priority, and call mum", TASK_TOOLS) == [
        ("add_task", {"name": "Buy milk", "priority": "low"}),
        ("add_task", {"name": "Call mum", "priority": "medium"}),
    ]


@pytest.mark.parametrize("said", ["organize my tasks by priority", "tidy up my to-do list", "clean my tasks"])
def test_organizing_the_tasks_clears_the_completed_ones_and_shows_the_rest(said):
    assert planned_calls(said, TASK_TOOLS) == [("clear_completed_tasks", {}), ("list_tasks", {})]
    # With no tool to clear them (the task viewer's), they are shown.
    assert planned_calls(said, [task_tool("list_tasks")]) == [("list_tasks", {})]


def test_tasks_asked_for_by_priority_are_listed_highest_first():
    listed = "Tasks: Buy milk (low, pending); Deploy (high, pending); Write tests (medium, pending)"
    messages = tool_turn("organize my tasks by priority",
                         ("clear_completed_tasks", {}, "There were no completed tasks to remove."),
                         ("list_tasks", {}, listed))

    assert reply_text(stream(messages, TASK_TOOLS)) == (
        "There were no completed tasks to remove. "  # not "Cleared": there was nothing to clear
        "Your tasks: Deploy (high, pending); Write tests (medium, pending); Buy milk (low, pending).")
    as_json = json.dumps([{"name": "Buy milk", "priority": "low"}, {"name": "Deploy", "priority": "high"}])
    messages = tool_turn("show my tasks by priority", ("list_tasks", {}, as_json))
    assert reply_text(stream(messages, TASK_TOOLS)) == "Your tasks: Deploy (high) and Buy milk (low)."


# -- requests of several clauses, and work left for the next step (the workflow cookbook's) ------------

TEAM_STEP_TOOLS = [task_tool("add_step", ["step_name", "assignee"], ["priority"]), task_tool("delete_step", ["step_name"])]
STATUS_TOOLS = [task_tool("update_step_status", ["step_name", "new_status"], ["notes"]),
                task_tool("assign_step", ["step_name", "new_assignee"])]


def test_each_clause_is_done_by_the_tool_for_it_and_what_none_can_do_is_said_for_the_next_step():
    said = "Add a low priority step 'Write Tests' assigned to Dave, then mark 'Setup Database' as completed"

    assert planned_calls(said, TEAM_STEP_TOOLS) == [
        ("add_step", {"step_name": "Write Tests", "priority": "low", "assignee": "Dave"})]
    reply = reply_text(stream(tool_turn(said, ("add_step", {"step_name": "Write Tests"}, "Added Write Tests.")),
                              TEAM_STEP_TOOLS))
    assert reply == "Added Write Tests. I have no tool to mark 'Setup Database' as completed."
    # ...which the status step, given that reply, does.
    assert planned_calls(reply, STATUS_TOOLS) == [
        ("update_step_status", {"step_name": "Setup Database", "new_status": "completed"})]


def test_a_reassignment_then_a_status_change_of_it_with_notes():
    said = "Reassign 'Create API' to Charlie, then mark it as completed with notes 'API endpoints implemented and tested'"

    assert planned_calls(said, STATUS_TOOLS) == [
        ("assign_step", {"step_name": "Create API", "new_assignee": "Charlie"}),
        ("update_step_status", {"step_name": "Create API", "new_status": "completed",
                                "notes": "API endpoints implemented and tested"}),
    ]
    assert planned_calls("Mark 'Setup Database' as in_progress", STATUS_TOOLS) == [
        ("update_step_status", {"step_name": "Setup Database", "new_status": "in_progress"})]


def test_delete_one_and_add_another_in_one_request():
    said = "Delete the 'Write Tests' step and add a high priority 'Deploy to Production' step assigned to Eve"

    assert planned_calls(said, TEAM_STEP_TOOLS) == [
        ("delete_step", {"step_name": "Write Tests"}),
        ("add_step", {"step_name": "Deploy to Production", "priority": "high", "assignee": "Eve"}),
    ]


def test_a_team_uses_its_own_tools_before_handing_the_request_to_a_member():
    final = stream([{"role": "system", "content": ROSTER}, user("add a step called 'Setup Database' assigned to Alice")],
                   DELEGATE_TOOLS + TEAM_STEP_TOOLS)[-1]

    assert [(call.name, json.loads(call.arguments)) for call in final.tool_calls] == [
        ("add_step", {"step_name": "Setup Database", "priority": "medium", "assignee": "Alice"})]


def test_a_list_request_of_two_clauses_and_one_no_tool_can_do():
    tools = [tool("add_item", item="What to add"), tool("get_list")]

    assert planned_calls("Add apples and bananas to the list, then show me the complete list.", tools) == [
        ("add_item", {"item": "apples"}), ("add_item", {"item": "bananas"}), ("get_list", {})]
    # Nothing it can do: it says so, in words the next step (one with a clear tool) reads as a request.
    reply = reply_text(stream([user("Clear the entire shopping list and confirm it's empty.")], tools))
    assert reply == "I have no tool to clear the entire shopping list and confirm it's empty."
    assert planned_calls(reply, [tool("list_items"), task_tool("remove_all_items")]) == [("remove_all_items", {})]
    # A question its tools cannot answer is quoted rather than made a verb phrase.
    assert reply_text(stream([user("what is the status of the project?")], TEAM_STEP_TOOLS)) == (
        'I have no tool for "what is the status of the project?".')


def test_a_record_passed_on_by_a_step_is_saved_with_the_tool_that_takes_it():
    record = {"company": "Acme Robotics", "role": "Backend Engineer", "status": "Applied", "url": "", "notes": None}
    tools = [task_tool("list_applications"),
             task_tool("save_application", ["company", "role"], ["status", "url", "source", "notes"])]

    assert planned_calls(json.dumps(record), tools) == [
        ("save_application", {"company": "Acme Robotics", "role": "Backend Engineer", "status": "Applied"})]
    messages = tool_turn(json.dumps(record), ("save_application", {"company": "Acme Robotics"},
                                              "Saved application #1: Backend Engineer at Acme Robotics (Applied)."))
    assert reply_text(stream(messages, tools)) == "Saved application #1: Backend Engineer at Acme Robotics (Applied)."


# -- bug 5: never claim a change the tools did not make ------------------------------------------------


def test_an_item_already_on_the_list_is_not_reported_as_added():
    messages = tool_turn("add apples and pears",
                         ("add_item", {"item": "apples"}, "apples is already on the list."),
                         ("add_item", {"item": "pears"}, "Added pears. The list now has 2 item(s)."))

    text = reply_text(stream(messages, SHOPPING_TOOLS))

    assert text == "Added pears to your list. Apples is already on the list."
    assert "Added apples" not in text


def test_an_item_not_on_the_list_is_not_reported_as_removed():
    messages = tool_turn("remove eggs", ("remove_item", {"item": "eggs"}, "Error: eggs is not on the list."))

    assert reply_text(stream(messages, SHOPPING_TOOLS)) == "remove_item failed: Eggs is not on the list."


@pytest.mark.parametrize("result", ["Task 'Walk the dog' not found.", "Error: no such task", "Could not find it"])
def test_a_task_tool_that_found_nothing_is_reported_as_failed(result):
    messages = tool_turn("mark walk the dog as done", ("complete_task", {"name": "Walk the dog"}, result))

    text = reply_text(stream(messages, TASK_TOOLS))

    assert text.startswith("complete_task failed: ") and "Marked" not in text


def test_a_task_that_already_exists_is_reported_as_it_was():
    messages = tool_turn("add buy milk", ("add_task", {"name": "Buy milk"}, "Task 'Buy milk' already exists."))

    assert reply_text(stream(messages, TASK_TOOLS)) == "Task 'Buy milk' already exists."


# -- structured output ------------------------------------------------------------------------------


class Status(str, enum.Enum):
    applied = "applied"
    interview = "interview scheduled"
    offer = "offer"


class Contact(pydantic.BaseModel):
    email: str | None = None
    phone_number: str


class Application(pydantic.BaseModel):
    company: str
    role: str
    status: Status
    salary: float
    years: int
    remote: bool
    skills: list[str]
    contact: Contact
    notes: str


def json_format(model):
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": model.model_json_schema()}}


@pytest.mark.parametrize(("said", "company", "role", "status"), [
    ("I applied to Acme Robotics for a backend engineer role", "Acme Robotics", "backend engineer", Status.applied),
    ("I have an interview scheduled with Globex for a Python developer position", "Globex", "Python developer",
     Status.interview),
    ("Applied for a data scientist role at Initech", "Initech", "data scientist", Status.applied),
])
def test_structured_output_fills_the_schema_from_the_message(said, company, role, status):
    text = asyncio.run(OfflineModel().acomplete([user(said)], json_format(Application)))

    application = Application.model_validate_json(text)  # the schema's own validation
    assert (application.company, application.role, application.status) == (company, role, status)
    assert (application.salary, application.years, application.remote) == (0, 0, False)
    assert application.contact == Contact(email="", phone_number="")  # nothing in the message fits them
    assert "offline demo model" in application.notes and said in application.notes


def test_a_streamed_reply_under_a_schema_is_json_that_validates():
    class Ticket(pydantic.BaseModel):
        summary: str
        priority: str
        tags: list[str]
        urgent: bool

    async def collect():
        return [c async for c in OfflineModel().astream([user("The login page is down, high priority")], None,
                                                         json_format(Ticket))]

    chunks = asyncio.run(collect())

    ticket = Ticket.model_validate_json(reply_text(chunks))
    assert ticket.priority == "high" and ticket.urgent is False and "offline demo model" in ticket.summary
    assert ticket.tags == ["login", "page", "down"]
    assert chunks[-1].tool_calls == []


def test_after_tool_results_a_schema_still_gets_json():
    class Outcome(pydantic.BaseModel):
        status: str
        notes: str

    messages = tool_turn("add milk", ("add_item", {"item": "milk"}, "Added milk."))

    async def collect():
        return [c async for c in OfflineModel().astream(messages, SHOPPING_TOOLS, json_format(Outcome))]

    assert Outcome.model_validate_json(reply_text(asyncio.run(collect()))).status == ""


# -- through real agents and teams on the test database -------------------------------------------------


def _tasks(run_context: RunContext) -> list:
    return run_context.session_state.setdefault("task_list", [])


def add_task(run_context: RunContext, name: str, priority: str = "medium") -> str:
    """Add a task.

    Args:
        name: The task.
        priority: low, medium or high.
    """
    if any(task["name"].lower() == name.lower() for task in _tasks(run_context)):
        return f"Task '{name}' already exists."
    _tasks(run_context).append({"name": name, "priority": priority, "status": "pending"})
    return f"Added task '{name}'."


def complete_task(run_context: RunContext, name: str) -> str:
    """Mark a task as completed.

    Args:
        name: The task.
    """
    for task in _tasks(run_context):
        if task["name"].lower() == name.lower():
            task["status"] = "completed"
            return f"Marked '{task['name']}' as completed."
    return f"Task '{name}' not found."


def list_tasks(run_context: RunContext) -> str:
    """List the tasks."""
    return json.dumps(_tasks(run_context))


def clear_completed_tasks(run_context: RunContext) -> str:
    """Remove the completed tasks."""
    run_context.session_state["task_list"] = [t for t in _tasks(run_context) if t["status"] != "completed"]
    return "Cleared the completed tasks."


def task_agent(**options):
    return Agent(name="Planner", model=OfflineModel(), tools=[add_task, complete_task, list_tasks, clear_completed_tasks],
                 session_state={"task_list": []}, add_session_state_to_context=True, **options)


@pytest.mark.django_db
def test_the_task_router_turns_on_an_agent_leave_two_pending_tasks():
    agent = task_agent()
    run = lambda said: agent.run(said, session_id="tasks", user_id="ann")  # noqa: E731

    added = run("add a task to review the project proposal with high priority, buy groceries (low) and "
                "call the dentist (medium)")
    assert added.content == ("Added Review the project proposal (high priority), Buy groceries (low priority) and "
                             "Call the dentist (medium priority).")
    assert run("mark groceries as completed").content == "Marked Buy groceries as completed."
    assert run("clean up completed tasks").content == "Cleared the completed tasks."
    shown = run("show pending tasks")

    assert shown.content == ("Your tasks: Review the project proposal (high, pending) and "
                             "Call the dentist (medium, pending).")
    assert agent.get_session_state(session_id="tasks", user_id="ann") == {"task_list": [
        {"name": "Review the project proposal", "priority": "high", "status": "pending"},
        {"name": "Call the dentist", "priority": "medium", "status": "pending"},
    ]}


@pytest.mark.django_db
def test_a_missing_task_is_reported_missing_and_nothing_changes():
    agent = task_agent()
    output = agent.run("mark walk the dog as done", session_id="dog", user_id="ann")

    assert output.content == "complete_task failed: Task 'walk the dog' not found."
    assert agent.get_session_state(session_id="dog", user_id="ann") == {"task_list": []}


def shopping_team():
    shopper = Agent(name="Shopper", model=OfflineModel(), role="Adds and removes items on the shopping list",
                    tools=[add_item, remove_item, list_items, clear_list])
    planner = task_agent(role="Keeps the to-do tasks and their priorities")
    return Team(name="Household", model=OfflineModel(), members=[planner, shopper],
                session_state={"shopping_list": [], "task_list": []})


@pytest.mark.django_db
def test_a_team_hands_add_milk_to_the_shopping_member_and_the_state_changes():
    team = shopping_team()

    first = team.run("add milk", session_id="home", user_id="ann")
    again = team.run("add milk", session_id="home", user_id="ann")

    assert [t.tool_args for t in first.tools] == [{"member_id": "shopper", "task": "add milk"}]
    assert [m.tools[0].tool_name for m in first.member_responses] == ["add_item"]
    assert first.content == "Shopper: Added milk to your list."
    assert again.content == "Shopper: Milk is already on the list."  # the member's words, not "Added"
    assert team.get_session_state(session_id="home", user_id="ann") == {"shopping_list": ["milk"], "task_list": []}


@pytest.mark.django_db
def test_a_team_hands_a_task_request_to_the_task_member():
    output = shopping_team().run("add a task to call the dentist", session_id="home2", user_id="ann")

    assert output.content == "Planner: Added Call the dentist (medium priority)."
    assert output.session_state["task_list"] == [{"name": "Call the dentist", "priority": "medium", "status": "pending"}]


@pytest.mark.django_db
def test_an_agent_with_an_output_schema_gets_a_model_instance():
    output = Agent(model=OfflineModel(), output_schema=Application).run(
        "I applied to Acme Robotics for a backend engineer role", session_id="jobs", user_id="ann")

    assert isinstance(output.content, Application)
    assert (output.content.company, output.content.role, output.content.status) == (
        "Acme Robotics", "backend engineer", Status.applied)
