"""The tools the demo assistants use on the session state: a shopping list, tasks and a project's steps.

Every tool answers in words that say exactly what it did (or why it did nothing): the offline demo model
passes those words on as its reply, and a real model reads them, so neither reports a change that did not
happen.
"""

from __future__ import annotations

from sessions_core.tools import RunContext, tool

PRIORITIES = ("low", "medium", "high")


# --- the shopping list --------------------------------------------------------------------------------


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


# --- the same list with a person in the loop (the "Shopping with approval" assistant) -------------------

# The calls that remove something wait for the user's approval; the delivery asks the user for its date.
remove_item_approved = tool(requires_confirmation=True)(remove_item)
clear_list_approved = tool(requires_confirmation=True)(clear_list)


def schedule_delivery(run_context: RunContext, date: str) -> str:
    """Schedule the delivery of the shopping list; the user gives the date.

    Args:
        date: The delivery date, as YYYY-MM-DD.
    """
    items = _shopping_list(run_context)
    if not items:
        return "Error: the list is empty, so there is nothing to deliver."
    run_context.session_state["delivery"] = {"date": str(date).strip(), "items": len(items)}
    return f"Delivery of {len(items)} item(s) scheduled for {str(date).strip()}."


schedule_delivery_asking = tool(requires_user_input=True, user_input_fields=["date"])(schedule_delivery)


def place_order(step_input, run_context: RunContext) -> str:
    """The reviewed workflow's last step (it runs once the user approves it): the order is placed."""
    items = _shopping_list(run_context)
    if not items:
        return "There is nothing to order: the list is empty."
    orders = run_context.session_state.setdefault("orders", [])
    orders.append(list(items))
    return f"Order {len(orders)} placed: {', '.join(map(str, items))}."


# --- named records (tasks, project steps) -------------------------------------------------------------


def _records(run_context: RunContext, key: str) -> list:
    records = run_context.session_state.get(key)
    if not isinstance(records, list):
        records = run_context.session_state[key] = []
    return records


def _find(records: list, name: str) -> dict | None:
    wanted = name.strip().lower()
    exact = [r for r in records if isinstance(r, dict) and str(r.get("name", "")).lower() == wanted]
    partial = [r for r in records if isinstance(r, dict) and wanted and wanted in str(r.get("name", "")).lower()]
    found = exact or (partial if len(partial) == 1 else [])
    return found[0] if found else None


def _priority(priority: str) -> str | None:
    priority = (priority or "medium").strip().lower()
    return priority if priority in PRIORITIES else None


def add_task(run_context: RunContext, name: str, priority: str = "medium") -> str:
    """Add a task to the task list.

    Args:
        name: What has to be done, e.g. "Call the dentist".
        priority: low, medium or high.
    """
    tasks, name = _records(run_context, "task_list"), name.strip()
    if not name:
        return "Error: the task name is empty."
    if _priority(priority) is None:
        return f"Error: the priority must be low, medium or high, not {priority!r}."
    if _find(tasks, name) is not None and _find(tasks, name)["name"].lower() == name.lower():
        return f"{name} is already on the task list."
    tasks.append({"name": name, "priority": _priority(priority), "status": "pending"})
    return f"Added task {name} ({_priority(priority)} priority)."


def complete_task(run_context: RunContext, name: str) -> str:
    """Mark a task as completed.

    Args:
        name: The task's name (or a part of it that names one task).
    """
    task = _find(_records(run_context, "task_list"), name)
    if task is None:
        return f"Error: there is no task named {name!r}."
    task["status"] = "completed"
    return f"Marked {task['name']} as completed."


def list_tasks(run_context: RunContext) -> str:
    """Show every task with its priority and status."""
    tasks = _records(run_context, "task_list")
    if not tasks:
        return "There are no tasks."
    return "Tasks: " + "; ".join(f"{t.get('name')} ({t.get('priority')}, {t.get('status')})" for t in tasks)


def clear_completed_tasks(run_context: RunContext) -> str:
    """Remove every completed task from the task list."""
    tasks = _records(run_context, "task_list")
    done = [t for t in tasks if t.get("status") == "completed"]
    tasks[:] = [t for t in tasks if t.get("status") != "completed"]
    return f"Removed {len(done)} completed task(s)." if done else "There were no completed tasks to remove."


def add_step(run_context: RunContext, name: str, priority: str = "medium") -> str:
    """Add a step to the project plan.

    Args:
        name: The step, e.g. "Setup Database".
        priority: low, medium or high.
    """
    steps, name = _records(run_context, "steps"), name.strip()
    if not name:
        return "Error: the step name is empty."
    if _priority(priority) is None:
        return f"Error: the priority must be low, medium or high, not {priority!r}."
    if any(str(s.get("name", "")).lower() == name.lower() for s in steps if isinstance(s, dict)):
        return f"{name} is already a step of the project."
    steps.append({"name": name, "priority": _priority(priority), "status": "pending"})
    return f"Added step {name} ({_priority(priority)} priority)."


def delete_step(run_context: RunContext, name: str) -> str:
    """Delete a step from the project plan.

    Args:
        name: The step's name.
    """
    steps = _records(run_context, "steps")
    step = _find(steps, name)
    if step is None:
        return f"Error: there is no step named {name!r}."
    steps.remove(step)
    return f"Deleted step {step['name']}."


def update_step_status(run_context: RunContext, name: str, status: str) -> str:
    """Set a project step's status.

    Args:
        name: The step's name.
        status: pending, in progress or completed.
    """
    step = _find(_records(run_context, "steps"), name)
    if step is None:
        return f"Error: there is no step named {name!r}."
    step["status"] = status.strip().lower() or "pending"
    return f"{step['name']} is now {step['status']}."


def list_steps(run_context: RunContext) -> str:
    """Show every step of the project plan with its priority and status."""
    steps = _records(run_context, "steps")
    if not steps:
        return "The project has no steps yet."
    return "Steps: " + "; ".join(f"{s.get('name')} ({s.get('priority')}, {s.get('status')})" for s in steps)
