"""HTML for the chat, as strings, each from its fragment template: used by the views and the live runs alike,
so a live update and a reload show exactly the same markup.

Out-of-band swaps are marked one way: the fragment's template renders `hx-swap-oob="{{ oob }}"` on its
own element when given `oob` (a fragment replacing itself by id: `oob="true"`), and `render_oob` wraps
fragments whose children go somewhere else (`oob="beforeend:#transcript"`).

Everything here is synchronous and may read the database: call it from a DB thread in async code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import nh3
from django.db.models import Case, Count, Exists, OuterRef, Prefetch, Q, Subquery, When, prefetch_related_objects
from django.template.loader import render_to_string
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from sessions_core.models import ChatSession, Message, Role, Run, RunStatus, StateChange
from sessions_core.run.base import cancelled_content
from sessions_core.summary import SessionSummary
from sessions_core.tools import DELEGATE_TOOL  # a team's delegations are shown as member rows, not tool calls

from . import memories, requirement_cards, state_view
from .assistants import assistant_defaults, assistant_keeps_summaries, assistant_name, workflow_step_names
from .sidebar import sidebar_page

TRANSCRIPT_RUNS = 50  # runs shown at once; older ones behind "Load earlier"
TIMELINE_CHANGES = 50  # state changes listed in the panel

# --- markdown ----------------------------------------------------------------------------------------

_FORMATTER = HtmlFormatter(nowrap=True)


def _fence(_renderer, tokens, idx, _options, _env) -> str:
    """A fenced code block: Pygments spans plus a bar with the language and a copy button. Rendered whole
    here (markdown-it would wrap a highlighter's output in a second <pre><code>). The label is the info
    string's first word when Pygments knows it, or a one-word info string; prose after the fence is no label."""
    token = tokens[idx]
    words = token.info.split()
    language = words[0] if words else ""
    try:
        lexer = get_lexer_by_name(language) if language else None
    except ClassNotFound:
        lexer = None
    if lexer is None and len(words) != 1:
        language = ""
    # Pygments escapes the code it wraps in spans; without a lexer the template escapes it.
    body = mark_safe(highlight(token.content, lexer, _FORMATTER)) if lexer else token.content  # noqa: S308
    return render_to_string("chatapp/_codeblock.html", {"language": language[:30], "body": body})


def _image(renderer, tokens, idx, options, env) -> str:
    """An image as a link to it, named by its alt text: a reply never loads a remote image unasked."""
    token = tokens[idx]
    alt = renderer.renderInlineAsText(token.children or [], options, env) or "no description"
    return render_to_string("chatapp/_image_link.html", {"src": token.attrGet("src") or "", "alt": alt})


_ALIGNS = {"left", "center", "right"}


def _cell(renderer, tokens, idx, options, env) -> str:
    """A table cell's alignment as a class (`align-right`): the Content-Security-Policy allows no style attribute."""
    token = tokens[idx]
    style = token.attrGet("style") or ""
    if style:
        token.attrs.pop("style")
        align = style.partition(":")[2].strip()
        if align in _ALIGNS:
            token.attrSet("class", f"align-{align}")
    return renderer.renderToken(tokens, idx, options, env)


# html=False: raw HTML in the text is shown as text, never passed through; nh3 below is the second line.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_MARKDOWN.add_render_rule("fence", _fence)
_MARKDOWN.add_render_rule("image", _image)
_MARKDOWN.add_render_rule("th_open", _cell)
_MARKDOWN.add_render_rule("td_open", _cell)

_TAGS = {
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "span", "div", "button",
}
_ATTRIBUTES = {
    "a": {"href", "title", "class"},
    "span": {"class"},
    "div": {"class"},
    "pre": {"class"},
    "code": {"class"},
    "button": {"class", "type"},
    "ol": {"start"},
}
_CELL_CLASSES = {f"align-{align}" for align in _ALIGNS}


# Built once (the policy is fixed): a third of what nh3.clean with the same arguments costs per call.
_CLEANER = nh3.Cleaner(tags=_TAGS, attributes=_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
                       link_rel="noopener noreferrer nofollow",
                       allowed_classes={"th": _CELL_CLASSES, "td": _CELL_CLASSES})


def markdown_tokens(text: str, env: dict) -> list:
    """The block and inline tokens of `text` (markdown-it's parse; reference definitions land in `env`)."""
    return _MARKDOWN.parse(text or "", env)


def render_markdown_tokens(tokens: list, env: dict) -> SafeString:
    """Tokens from `markdown_tokens` (all of them, or a run of whole top-level blocks) as sanitized HTML."""
    html = _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, env)
    return mark_safe(_CLEANER.clean(html))  # noqa: S308 - this is the sanitizer's output


def render_markdown(text: str) -> SafeString:
    """Markdown to sanitized HTML: no raw HTML, no scripts or event handlers, only http(s)/mailto links.
    A reply still streaming is drawn by the same two steps, a block at a time (chatapp/markdown_stream.py)."""
    env: dict = {}
    return render_markdown_tokens(markdown_tokens(text, env), env)


# --- the transcript ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCallView:
    """One tool call row: from the run's stored messages, or from the engine's tool events while it runs."""

    call_id: str
    name: str
    arguments: str
    result: str | None = None
    error: bool = False

    @property
    def pending(self) -> bool:
        return self.result is None

    @property
    def failed(self) -> bool:
        """The tool raised, or answered with an error (tools report refusals as "Error: ...")."""
        return self.error or (self.result or "").startswith("Error:")

    @property
    def summary(self) -> str:
        """The arguments in one line for the collapsed row: add_item · milk; fetch · id=3, full=true."""
        try:
            args = json.loads(self.arguments) if self.arguments else {}
        except ValueError:
            return _one_line(self.arguments)
        if not isinstance(args, dict):
            return _one_line(_argument(args))
        if len(args) == 1 and isinstance(value := next(iter(args.values())), (str, list)):
            return _one_line(_argument(value))  # add_item · milk; add_items · milk, eggs
        return _one_line(", ".join(f"{key}={_argument(value)}" for key, value in args.items()))


def _argument(value) -> str:
    """One argument as a reader writes it: a string bare, a list of plain values as "a, b", else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, (str, int, float, bool)) for item in value):
        return ", ".join(item if isinstance(item, str) else json.dumps(item) for item in value)
    return json.dumps(value, ensure_ascii=False)


def _one_line(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pretty_json(text) -> str:
    if not isinstance(text, str):
        return json.dumps(text, indent=2, ensure_ascii=False)
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return text




@dataclass
class StepView:
    """A workflow step's run or a team member's run, inside its parent's assistant turn (`run`: the stored
    row, or a step still running as its start event describes it, chatapp.live.fragments.StreamedRun)."""

    run: Run
    tool_calls: list[ToolCallView] = field(default_factory=list)
    steps: list[StepView] = field(default_factory=list)
    member: bool = False  # a team member's run: its input is the task it was given

    @property
    def name(self) -> str:
        return self.run.step_name or self.run.component_id or "step"

    @property
    def kind(self) -> str:
        return self.run.kind

    @property
    def duration(self) -> float | None:
        return (self.run.metrics or {}).get("duration")

    @property
    def content_html(self) -> str:
        content = self.run.content
        return render_markdown("" if content == cancelled_content(self.run.run_id) else content)


@dataclass(frozen=True)
class Usage:
    """What a finished turn used: its models, in the order they first answered, and its tokens (None:
    unknown, as when a model call was stopped before the server counted it). A workflow's turn (its own
    run calls no model) and a team's are summed over the runs of their steps and members; `summed` says so."""

    models: list[str]
    input_tokens: int | None
    output_tokens: int | None
    summed: bool = False


def _usage(runs: list[Run], summed: bool) -> Usage:
    models, totals, unknown = [], {"input_tokens": 0, "output_tokens": 0}, False
    counted = False
    for run in runs:
        metrics = run.metrics if isinstance(run.metrics, dict) else {}
        if run.model_id and run.model_id not in models:
            models.append(run.model_id)
        if "input_tokens" in metrics:
            counted = True
            for key in totals:
                value = metrics.get(key) or 0
                if isinstance(value, bool) or not isinstance(value, int):  # not a count (stored by other means)
                    unknown = True
                else:
                    totals[key] += value
        elif "model_calls" in metrics:  # a model answered, but its tokens were never counted
            unknown = True
    counted = counted and not unknown
    return Usage(models, totals["input_tokens"] if counted else None, totals["output_tokens"] if counted else None,
                 summed)


def _tree(steps: list[StepView]) -> list[Run]:
    return [run for step in steps for run in (step.run, *_tree(step.steps))]


@dataclass
class RunView:
    """What _run.html shows of a run (`run`: the stored row, or a run being streamed, as for StepView)."""

    run: Run
    user_text: str
    tool_calls: list[ToolCallView] = field(default_factory=list)
    steps: list[StepView] = field(default_factory=list)

    @property
    def has_steps(self) -> bool:
        """A workflow's or a team's turn: its steps or delegations are shown inside it."""
        return self.run.kind in ("workflow", "team")

    @property
    def reply_text(self) -> str:
        """The reply: the run's text; a stopped run's is what was written before the stop, never the engine's
        "Run … was cancelled" (a stopped workflow's or team's is its last step's words so far)."""
        if self.run.status != RunStatus.CANCELLED:
            return self.run.content
        if self.run.content != cancelled_content(self.run.run_id):
            return self.run.content
        for step in reversed(_tree(self.steps)):
            if step.content and step.content != cancelled_content(step.run_id):
                return step.content
        return ""

    @property
    def reply_html(self) -> str:
        """Sanitized markdown, finished or still streaming (the text so far, as the live frames draw it)."""
        return render_markdown(self.reply_text)

    @property
    def not_run(self) -> list[str]:
        """A stopped workflow's steps that never ran (its state may be left half-changed)."""
        if self.run.status != RunStatus.CANCELLED or self.run.kind != "workflow":
            return []
        ran = {step.name for step in self.steps}
        return [name for name in workflow_step_names(self.run.component_id) if name not in ran]

    @property
    def metrics(self) -> dict:
        return self.run.metrics or {}

    @property
    def memory_lines(self) -> list[str]:
        """What the reply remembered or forgot (memories.attach put its changes on the run)."""
        return memories.lines(getattr(self.run, "memory_changes", []))

    @property
    def memories_undone(self) -> bool:
        changes = getattr(self.run, "memory_changes", [])
        return bool(changes) and all(change.undone_at for change in changes)
    def requirement_cards(self) -> list:
        """A reply that waits (or waited) for the user: a card per request (requirement_cards.py)."""
        return requirement_cards.cards(getattr(self.run, "requirements", None))

    @property
    def waiting(self) -> bool:
        return requirement_cards.waiting(self.run)

    @property
    def usage(self) -> Usage:
        """The models and tokens of the turn: the run's own, with its steps' (or members') added."""
        steps = _tree(self.steps)
        return _usage([self.run, *steps], summed=bool(steps))


def run_view(run: Run) -> RunView:
    """What _run.html shows of a run, from its stored messages and step runs (prefetched or not)."""
    messages = _shown_messages(run)
    user_text = next((m.content for m in messages if m.role == Role.USER), run.input)
    steps = [step_view(child, member=run.kind == "team") for child in _children(run)]
    return RunView(run, user_text, _tool_calls(messages, run.kind), steps)


def step_view(run: Run, member: bool = False) -> StepView:
    return StepView(run, _tool_calls(_shown_messages(run), run.kind),
                    [step_view(child, member=run.kind == "team") for child in _children(run)], member)


def _shown_messages(run: Run) -> list[Message]:
    messages = getattr(run, "shown_messages", None)
    if messages is None:
        messages = list(run.messages.exclude(role=Role.SYSTEM).order_by("seq")) if run.pk else []
    return messages


def _children(run: Run) -> list[Run]:
    """A workflow's or team's step and member runs, oldest first (prefetched as `shown_children` or read)."""
    if run.kind not in ("workflow", "team"):
        return []
    children = getattr(run, "shown_children", None)
    if children is None:
        children = list(run.children.order_by("pk"))
    return children


def _tool_calls(messages: list[Message], kind: str) -> list[ToolCallView]:
    calls: dict[str, ToolCallView] = {}
    for message in messages:
        if message.role == Role.ASSISTANT and message.tool_calls:
            for call in message.tool_calls:
                calls[call.get("id", "")] = ToolCallView(
                    call.get("id", ""), call.get("name", ""), _pretty_json(call.get("arguments", "")))
        elif message.role == Role.TOOL:
            call = calls.get(message.tool_call_id) or ToolCallView(message.tool_call_id, message.tool_name, "")
            calls[message.tool_call_id] = replace(call, result=message.content, error=message.tool_error)
    return [call for call in calls.values() if not (kind == "team" and call.name == DELEGATE_TOOL)]


class RunPage(list):
    """A slice of a transcript, oldest first; `has_earlier` says whether older runs exist."""

    has_earlier = False

    @property
    def earliest_id(self) -> int | None:
        return self[0].pk if self else None


def transcript_runs(session: ChatSession, before: int | None = None, limit: int = TRANSCRIPT_RUNS) -> RunPage:
    """The last `limit` top-level runs of the session's current branch (older than run pk `before`), messages
    prefetched in seq order, each with its place among its siblings (`branches`, `branch_number`) and the
    memories its model was shown (for memories.attach)."""
    runs = Run.objects.begun().filter(session=session, parent_run__isnull=True, abandoned=False)
    if before is not None:
        runs = runs.filter(pk__lt=before)
    runs = runs.annotate(**BRANCHES, **memories.SHOWN)
    newest_first = list(runs.order_by("-pk").prefetch_related(_shown())[: limit + 1])
    with_steps = [run for run in newest_first if run.kind in ("workflow", "team")]
    if with_steps:  # only then: a page of agent runs stays at two queries
        prefetch_related_objects(with_steps, *_STEP_PREFETCH)
    page = RunPage(reversed(newest_first[:limit]))
    page.has_earlier = len(newest_first) > limit
    place_among_siblings(page)
    return page


def _count(queryset, group: str):
    return Subquery(queryset.order_by().values(group).annotate(n=Count("pk")).values("n")[:1])


# How many runs share a run's place in the tree (those that follow the same run; for a first run, the
# session's other first runs), in the page's own query: an index lookup per run, no query of its own.
BRANCHES = {"branches": Case(
    When(follows__isnull=True, then=_count(Run.objects.begun().filter(
        session_id=OuterRef("session_id"), follows__isnull=True, parent_run__isnull=True), "session_id")),
    default=_count(Run.objects.begun().filter(follows_id=OuterRef("follows_id"), parent_run__isnull=True),
                   "follows_id"),
)}


def place_among_siblings(page: list[Run]) -> None:
    """For runs with siblings: their number among them and the neighbours' run ids (one query, and only
    when the page has such runs)."""
    branched = [run for run in page if (run.branches or 1) > 1]
    if not branched:
        return
    session_id = branched[0].session_id
    parents = {run.follows_id for run in branched}
    rows = Run.objects.begun().filter(session_id=session_id, parent_run__isnull=True).filter(
        Q(follows_id__in=[pk for pk in parents if pk is not None]) | Q(follows__isnull=True)
    ).order_by("pk").values_list("follows_id", "run_id")
    by_parent: dict = {}
    for follows_id, run_id in rows:
        by_parent.setdefault(follows_id, []).append(run_id)
    for run in branched:
        siblings = by_parent.get(run.follows_id, [run.run_id])
        index = siblings.index(run.run_id)
        run.branch_number = index + 1
        run.previous_branch = siblings[index - 1] if index else ""
        run.next_branch = siblings[index + 1] if index + 1 < len(siblings) else ""


def _shown(prefix: str = "") -> Prefetch:
    return Prefetch(f"{prefix}messages", queryset=Message.objects.exclude(role=Role.SYSTEM).order_by("seq"),
                    to_attr="shown_messages")


def _child_runs(prefix: str = "") -> Prefetch:
    return Prefetch(f"{prefix}children", queryset=Run.objects.order_by("pk"), to_attr="shown_children")


# The steps (or members) of a page's workflow and team runs, and theirs (a team's members inside a
# workflow step): a fixed number of queries whatever the page holds.
_STEP_PREFETCH = (_child_runs(), _shown("shown_children__"), _child_runs("shown_children__"),
                  _shown("shown_children__shown_children__"))


def stored_run(**lookup) -> Run:
    """One run as stored, with its place among its siblings (for the 2/3 arrows), the memories its model was
    shown (for memories.attach) and whether its session has a run that waits for the user
    (`session_waiting`: this one or another), in the same query."""
    waiting = Exists(Run.objects.waiting().filter(session_id=OuterRef("session_id")))
    run = Run.objects.annotate(**BRANCHES, **memories.SHOWN, session_waiting=waiting).get(**lookup)
    place_among_siblings([run])
    return run


def render_transcript(session: ChatSession) -> str:
    """The whole transcript (its last page), replacing #transcript's content in every tab."""
    runs = transcript_runs(session)
    memories.attach(runs, session.owner_id)
    html = render_to_string("chatapp/_transcript_runs.html", {
        "session": session, "runs": runs, "run_views": [run_view(run) for run in runs]})
    return render_oob(html, "innerHTML:#transcript")


def render_run(run: Run, oob: str = "") -> str:
    return render_run_view(run_view(run), oob)


def render_run_view(view: RunView, oob: str = "") -> str:
    return render_to_string("chatapp/_run.html", {"view": view, "oob": oob})


def render_step(run: Run, oob: str = "", member: bool = False) -> str:
    return render_step_view(step_view(run, member=member), oob)


def render_step_view(view: StepView, oob: str = "") -> str:
    return render_to_string("chatapp/_step.html", {"step": view, "oob": oob})


def render_step_content(run_id: str, text: str) -> str:
    """A running step's or member's words so far, replacing what its row shows (out of band)."""
    return render_to_string("chatapp/_step_content.html",
                            {"run_id": run_id, "content_html": render_markdown(text), "oob": "true"})


def render_tool_call(run_id: str, call: ToolCallView, oob: str = "") -> str:
    """One tool call row (for a call seen live, before the run's messages are stored)."""
    return render_to_string("chatapp/_tool_call.html", {"run_id": run_id, "call": call, "oob": oob})


# --- out-of-band pieces --------------------------------------------------------------------------------

QUEUED_NOTE = "Queued: will run after the current reply"


def render_oob(html: str | list[str], oob: str) -> str:
    """`html` (one fragment or several) as the children of a wrapper swapped in where `oob` says, e.g.
    "beforeend:#transcript". Rendered fragments go in as they are; plain text is escaped."""
    return render_to_string("chatapp/_oob.html", {"parts": html if isinstance(html, list) else [html], "oob": oob})


def render_delete(tag: str, element_id: str) -> str:
    """A marker removing the element with this id from the page."""
    return render_to_string("chatapp/_oob_delete.html", {"tag": tag, "id": element_id})


def render_status(message: str, kind: str = "info") -> str:
    """The live status line (#run-status), replaced in place so screen readers announce it."""
    return render_to_string("chatapp/_run_status.html", {"message": message, "kind": kind})


def render_stream_frame(run_id: str, keep: int, html: str) -> str:
    """A streamed reply's update: static/chatapp/live.js keeps the first `keep` elements of #reply-<run_id>
    (its completed blocks) and puts `html` (new completed blocks, then the open one) after them. `html` is
    the sanitizer's output (chatapp/markdown_stream.py), also when it reaches here as a plain string
    from a token batch of the channel layer, which only this server writes to. (Formatted, not a template:
    it is made per socket per batch.)"""
    return format_html('<template data-stream-run="{}" data-keep="{}">{}</template>', run_id, int(keep),
                       mark_safe(html))  # noqa: S308


def render_composer_text(text: str) -> str:
    """The composer's text box holding `text` again (a message the server could not take), out of band."""
    return render_to_string("chatapp/_composer_text.html", {"text": text, "oob": "true"})


def render_queued(item) -> str:
    """One message waiting for its run (a queued Run, or the engine's RunQueued event: `run_id`, `input`)."""
    return render_to_string("chatapp/_queued.html", {"item": item, "note": QUEUED_NOTE})


def render_queue(rows) -> str:
    """The whole queue (#queue), replacing the page's."""
    return render_to_string("chatapp/_queue.html", {"rows": rows, "note": QUEUED_NOTE, "oob": "true"})


# --- the sidebar -------------------------------------------------------------------------------------


def render_session_item(session: ChatSession, current: bool = False, **extra) -> str:
    return render_to_string("chatapp/_session_item.html", {"s": session, "current": current, **extra})


def render_session_item_to_top(session: ChatSession) -> str:
    """Out-of-band HTML moving a session's row to the top of its group (pinned, else Today) in every tab."""
    return render_to_string("chatapp/_session_item_to_top.html", {
        "s": session, "item_id": f"session-item-{session.pk}",
        "anchor": "#group-pinned" if session.pinned_at else "#group-today",
    })


def render_session_list(user, current_session_id: str | None = None, oob: str = "") -> str:
    """The first page of the sidebar list (`#session-list`)."""
    return render_to_string("chatapp/_session_list.html", {
        "page": sidebar_page(user), "current_session_id": current_session_id, "oob": oob,
    })


# --- the state panel ---------------------------------------------------------------------------------


def panel_stamp(session: ChatSession) -> str:
    """What the state panel was drawn from (the state's version, the summary's time): a page's socket says
    the one it shows, and one that differs from the stored session's is sent the panel again."""
    summary = SessionSummary.from_dict(session.summary)
    return f"{session.state_version}:{summary.updated_at.isoformat() if summary and summary.updated_at else ''}"


def state_panel_context(session: ChatSession, changed_keys=(), *, edit_text: str | None = None,
                        edit_version=None, pending_changes=(), **extra) -> dict:
    """Context of _state_panel.html. `edit_text`/`edit_version` refill the JSON form after a refused edit;
    `pending_changes` are a running reply's changes, listed above the stored ones. A session still at
    version 0 has no changes to read (each change takes the next version)."""
    changes = []
    if session.state_version:
        changes = list(StateChange.objects.filter(session=session).on_current_branch().select_related("run")
                       .only("version", "patch", "inverse", "restores", "source", "created_at", "run__run_id")
                       .order_by("-version")[:TIMELINE_CHANGES])
    state_json = json.dumps(session.session_state, indent=2, ensure_ascii=False)
    defaults = list(assistant_defaults(session.component_id))
    summary = SessionSummary.from_dict(session.summary)
    return {
        "session": session,
        "stamp": panel_stamp(session),
        "tree": state_view.tree(session.session_state, changed_keys),
        "changed_keys": list(changed_keys),
        "timeline": [*pending_changes, *(state_view.describe_change(change) for change in changes)],
        "form_text": state_json if edit_text is None else edit_text,
        "form_version": session.state_version if edit_version in (None, "") else edit_version,
        "assistant_name": assistant_name(session.component_id),
        "default_keys": defaults,
        "summary": summary,
        # What the panel shows, from the page's first load on (so the chat's width never changes under a
        # reply): the state (an assistant that starts with state, or one that has some), else the summary
        # (an assistant that writes one), else nothing: the page shows no panel.
        "panel": "state" if defaults or session.session_state or changes else (
            "summary" if summary or assistant_keeps_summaries(session.component_id) else "none"),
        "read_only": session.deleted_at is not None,  # in the trash: no editor
        **extra,
    }


def render_state_panel(session: ChatSession, changed_keys=(), **extra) -> str:
    return render_to_string("chatapp/_state_panel.html", state_panel_context(session, changed_keys, **extra))


def render_session_summary(summary: dict) -> str:
    """A newer summary replacing the one the state panel shows (out of band)."""
    return render_to_string("chatapp/_session_summary.html",
                            {"summary": SessionSummary.from_dict(summary), "oob": "true"})
