"""Admin: browse every session, its transcript (paginated by seq, never one giant inline), its state timeline,
and what the model calls cost: tokens per session, and per user over the last days; and each user's memories
with their history, read-only. Every page that shows a conversation's content or state, or a user's
memories, records who looked (AdminAccess), in a list nobody can edit here."""

import json
from datetime import timedelta

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.db.models import Count
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .models import (OPEN_STATUSES, USAGE_SUMS, AdminAccess, ChatSession, Message, Run, StateChange, UserMemoryChange,
                     UserMemoryRecord)
from .component import Component
from .decisions import decisions as told

TRANSCRIPT_PAGE = 50
USAGE_DAYS = 30


def record_access(request, session: ChatSession, view: str) -> None:
    """Note that the requesting admin was shown `view` of `session` (see AdminAccess)."""
    AdminAccess.objects.create(viewer=request.user, viewer_name=request.user.get_username(), session=session,
                               session_label=session.session_id, view=view)


class RecordsAccess:
    """A ModelAdmin whose change page shows a conversation's content: each look at one is recorded."""

    def access_of(self, obj) -> tuple[ChatSession, str]:
        raise NotImplementedError

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if change and obj is not None and request.method == "GET":
            record_access(request, *self.access_of(obj))
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


def usage_text(usage: dict) -> str:
    return (f"{usage['runs']:,} run{'' if usage['runs'] == 1 else 's'} · {usage['input_tokens']:,} input / "
            f"{usage['output_tokens']:,} output tokens"
            + (f" ({usage['unknown_usage']:,} with unknown usage)" if usage.get("unknown_usage") else ""))


def pretty_json(value) -> str:
    return format_html('<pre class="pretty-json">{}</pre>',  # styled by sessions_core/admin.css (no inline style: CSP)
                       json.dumps(value, indent=2, ensure_ascii=False))


class DeletedFilter(admin.SimpleListFilter):
    title = "deleted"
    parameter_name = "deleted"

    def lookups(self, request, model_admin):
        return [("no", "Not deleted"), ("yes", "In trash")]

    def queryset(self, request, queryset):
        if self.value() == "no":
            return queryset.filter(deleted_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(deleted_at__isnull=False)
        return queryset


@admin.register(ChatSession)
class ChatSessionAdmin(RecordsAccess, admin.ModelAdmin):
    class Media:
        css = {"all": ["sessions_core/admin.css"]}

    list_display = ["__str__", "owner", "component_id", "state_version", "last_activity_at", "is_running", "transcript"]
    list_filter = ["kind", "component_id", "name_source", DeletedFilter]
    list_select_related = ["owner"]
    search_fields = ["session_id", "name", "owner__username"]
    raw_id_fields = ["owner"]
    fields = ["session_id", "owner", "kind", "component_id", "name", "name_source", "state", "state_version",
              "summary_text", "usage", "metadata", "created_at", "last_activity_at", "pinned_at", "archived_at",
              "deleted_at", "last_seq", "transcript"]
    readonly_fields = ["session_id", "kind", "component_id", "state", "state_version", "summary_text", "usage",
                       "created_at", "last_activity_at", "last_seq", "transcript"]
    date_hierarchy = "last_activity_at"
    show_full_result_count = False

    def access_of(self, session):
        return session, "session (state, summary)"

    def has_add_permission(self, request):
        return False  # a chat begins with its first message, in the chat or through the engine

    @admin.display(boolean=True, description="running")
    def is_running(self, session):
        return session.is_running

    @admin.display(description="session state")
    def state(self, session):
        return pretty_json(session.session_state)

    @admin.display(description="summary")
    def summary_text(self, session):
        summary = session.summary
        if not summary:
            return "-"
        if not isinstance(summary, dict):  # whatever is stored is shown, as it is
            return pretty_json(summary)
        topics = summary.get("topics")
        topics = ", ".join(str(topic) for topic in topics) if isinstance(topics, list) else topics
        return format_html("{}<br><small>Topics: {} · updated {}</small>", summary.get("summary", ""),
                           topics or "-", summary.get("updated_at") or "-")

    @admin.display(description="usage")
    def usage(self, session):
        return usage_text(session.runs.usage()) if session.pk else "-"

    @admin.display(description="transcript")
    def transcript(self, session):
        if not session.pk:
            return "-"
        url = reverse("admin:sessions_core_chatsession_transcript", args=[session.pk])
        return format_html('<a href="{}">Transcript and state timeline</a>', url)

    def get_urls(self):
        view = self.admin_site.admin_view(self.transcript_view)
        usage = self.admin_site.admin_view(self.usage_view)
        return [path("<int:pk>/transcript/", view, name="sessions_core_chatsession_transcript"),
                path("usage/", usage, name="sessions_core_chatsession_usage"), *super().get_urls()]

    def usage_view(self, request):
        """Runs and tokens per user over the last `days` days (30 unless ?days=N), heaviest first."""
        try:
            days = max(1, min(int(request.GET.get("days", USAGE_DAYS)), 3650))
        except ValueError:
            days = USAGE_DAYS
        since = timezone.now() - timedelta(days=days)
        rows = (Run.objects.filter(created_at__gte=since).values("session__owner__username")
                .annotate(runs=Count("pk"), sessions=Count("session", distinct=True), **USAGE_SUMS)
                .order_by("-input_tokens", "session__owner__username"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "rows": rows, "days": days, "title": f"Usage over the last {days} days",
            "total": Run.objects.filter(created_at__gte=since).usage(),
        }
        return TemplateResponse(request, "admin/sessions_core/usage.html", context)

    def transcript_view(self, request, pk):
        session = get_object_or_404(ChatSession.objects.select_related("owner"), pk=pk)
        messages = Paginator(session.messages.select_related("run", "run__parent_run").order_by("seq"),
                             TRANSCRIPT_PAGE)
        page = messages.get_page(request.GET.get("page"))
        record_access(request, session, f"transcript, page {page.number}")
        changes = session.state_changes.select_related("run").order_by("-version")[:100]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "session": session, "page": page, "changes": changes,
            "title": f"Transcript of {session}", "usage": usage_text(session.runs.usage()),
        }
        return TemplateResponse(request, "admin/sessions_core/transcript.html", context)


class WrittenByTheEngine(RecordsAccess, admin.ModelAdmin):
    """Runs, messages and state changes are what happened: shown, never added or edited here (an edited
    reply or patch would no longer be what the model said or the tools did, and the state's history
    would no longer rebuild the state). A session is deleted whole, with all of them, from its page."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(WrittenByTheEngine):
    list_display = ["run_id", "session", "kind", "step_name", "status", "model_id", "created_at", "finished_at"]
    list_filter = ["status", "kind", "component_id"]
    list_select_related = ["session"]
    search_fields = ["run_id", "session__session_id", "step_name"]
    raw_id_fields = ["session", "parent_run"]
    readonly_fields = ["run_id", "metrics", "history_seqs", "decisions", "requirements", "step_runs"]
    show_full_result_count = False
    actions = ["stop_runs"]

    def access_of(self, run):
        return run.session, f"run {run.run_id}"

    @admin.action(description="Stop the selected running or queued runs")
    def stop_runs(self, request, queryset):
        """As the chat's Stop does: a queued run is dropped, a run of this process stops at once, one of
        another process at its next checkpoint (within about a second). A step's or member's run is
        stopped through its root's."""
        running = queryset.filter(status__in=OPEN_STATUSES)
        roots = set(running.filter(parent_run__isnull=True).values_list("run_id", flat=True))
        roots |= {_root_run_id(run) for run in running.filter(parent_run__isnull=False)}
        stopped = sum(Component.cancel_run(run_id) for run_id in sorted(roots))
        if stopped:
            self.message_user(request, f"Asked {stopped} run(s) to stop.", messages.SUCCESS)
        else:
            self.message_user(request, "None of the selected runs is running or queued.", messages.WARNING)

    @admin.display(description="What it waited for")
    def decisions(self, run):
        """Each requirement of a run that waited for a person: what was asked, who answered, when, how."""
        lines = [(item.summary, ", ".join(f"{key}={value}" for key, value in item.arguments.items()))
                 for item in told(run.requirements)]
        if not lines:
            return "-"
        return format_html("<ul class=\"decisions\">{}</ul>",
                           format_html_join("", "<li>{} <small>{}</small></li>", lines))

    @admin.display(description="Step and member runs")
    def step_runs(self, run):
        """The runs under this one (a workflow's steps, a team's members, theirs), as a tree of links."""
        by_parent: dict[int, list[Run]] = {}
        fields = ("pk", "run_id", "parent_run_id", "kind", "step_name", "status", "metrics")
        level = [run.pk]
        while level:  # a query per level of the tree (a team's members inside a workflow step: three)
            children = list(Run.objects.filter(parent_run_id__in=level).only(*fields).order_by("pk"))
            for child in children:
                by_parent.setdefault(child.parent_run_id, []).append(child)
            level = [child.pk for child in children]
        return _run_tree(by_parent, run.pk) or "-"


def _root_run_id(run: Run) -> str:
    """The run id of the top-level run that `run` is part of (a query per level above it)."""
    while run.parent_run_id is not None:
        run = Run.objects.only("run_id", "parent_run_id").get(pk=run.parent_run_id)
    return run.run_id


def _duration(metrics) -> str:
    duration = metrics.get("duration") if isinstance(metrics, dict) else None
    return f" · {duration:.2f} s" if isinstance(duration, int | float) and duration else ""


def _run_tree(by_parent: dict, parent_pk: int) -> str:
    children = by_parent.get(parent_pk, [])
    if not children:
        return ""
    items = format_html_join("", "<li><a href=\"{}\">{}</a> {} · {}{}{}</li>", (
        (reverse("admin:sessions_core_run_change", args=[child.pk]), child.step_name or child.run_id, child.kind,
         child.status, _duration(child.metrics),
         _run_tree(by_parent, child.pk))
        for child in children))
    return format_html("<ul class=\"step-runs\">{}</ul>", items)


@admin.register(Message)
class MessageAdmin(WrittenByTheEngine):
    list_display = ["session", "seq", "role", "tool_name", "created_at"]
    list_filter = ["role"]
    list_select_related = ["session"]
    search_fields = ["session__session_id"]
    raw_id_fields = ["session", "run"]
    show_full_result_count = False

    def access_of(self, message):
        return message.session, f"message #{message.seq}"


@admin.register(StateChange)
class StateChangeAdmin(WrittenByTheEngine):
    list_display = ["session", "version", "source", "run", "created_at"]
    list_select_related = ["session", "run"]
    search_fields = ["session__session_id", "source"]
    raw_id_fields = ["session", "run"]
    readonly_fields = ["patch", "inverse"]
    show_full_result_count = False

    def access_of(self, change):
        return change.session, f"state change v{change.version}"


def record_memory_access(request, label: str, view: str) -> None:
    """Note that the requesting admin was shown `view` of a user's memories (no session: `label` names them)."""
    AdminAccess.objects.create(viewer=request.user, viewer_name=request.user.get_username(), session=None,
                               session_label=label[:128], view=view[:100])


class ReadOnly:
    """A ModelAdmin that only shows: nothing is added, edited or deleted through it."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MemoriesReadOnly(ReadOnly, admin.ModelAdmin):
    """A user's memories and their history: shown, never added, edited or deleted here (the user does that
    on their Memories page); every list and page shown is recorded."""

    list_select_related = ["user", "run__session"]
    search_fields = ["user__username", "memory"]
    show_full_result_count = False

    def changelist_view(self, request, extra_context=None):
        if request.method == "GET":
            label = request.GET.get("q") or "all users"
            record_memory_access(request, f"memories: {label}", f"{self.model._meta.verbose_name_plural} list")
        return super().changelist_view(request, extra_context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None and request.method == "GET":
            record_memory_access(request, f"memories: {obj.user.get_username()}",
                                 f"{self.model._meta.verbose_name} {obj.memory_id}")
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    @admin.display(description="from run")
    def source_run(self, obj):
        if obj.run_id is None:
            return "-"
        return format_html('<a href="{}">{}</a> in {}', reverse("admin:sessions_core_run_change", args=[obj.run_id]),
                           obj.run.run_id, obj.run.session.session_id)


@admin.register(UserMemoryRecord)
class UserMemoryAdmin(MemoriesReadOnly):
    list_display = ["memory", "user", "topics", "source_run", "created_at", "updated_at"]
    fields = ["memory_id", "user", "memory", "topics", "input", "agent_id", "team_id", "source_run", "created_at",
              "updated_at", "history"]
    readonly_fields = fields

    @admin.display(description="history")
    def history(self, memory):
        changes = UserMemoryChange.objects.for_user(memory.user_id).filter(memory_id=memory.memory_id)
        rows = format_html_join("", "<li>{} · {} by {}: {}{}</li>", (
            (change.created_at, change.action, change.source, change.memory,
             f" (was: {change.previous})" if change.previous else "") for change in changes))
        return format_html("<ol>{}</ol>", rows) if changes else "-"


@admin.register(UserMemoryChange)
class UserMemoryChangeAdmin(MemoriesReadOnly):
    list_display = ["memory_id", "user", "action", "memory", "previous", "source", "source_run", "created_at"]
    list_filter = ["action", "source"]
    search_fields = ["user__username", "memory_id", "memory"]


@admin.register(AdminAccess)
class AdminAccessAdmin(ReadOnly, admin.ModelAdmin):
    """The record of who read which conversation: read-only here, so nobody tidies it from the admin."""

    list_display = ["at", "viewer_name", "session_label", "view"]
    list_filter = ["viewer_name"]
    search_fields = ["viewer_name", "session_label", "view"]
    date_hierarchy = "at"
    show_full_result_count = False
