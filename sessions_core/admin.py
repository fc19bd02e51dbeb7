"""Admin: browse every session, its transcript (paginated by seq, never one giant inline) and its state timeline."""

import json

from django.contrib import admin
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .models import ChatSession, Message, Run, StateChange

TRANSCRIPT_PAGE = 50


def pretty_json(value) -> str:
    return format_html("<pre style='white-space:pre-wrap;max-width:60em'>{}</pre>",
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
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "component_id", "state_version", "last_activity_at", "is_running", "transcript"]
    list_filter = ["kind", "component_id", "name_source", DeletedFilter]
    list_select_related = ["owner"]
    search_fields = ["session_id", "name", "owner__username"]
    raw_id_fields = ["owner"]
    fields = ["session_id", "owner", "kind", "component_id", "name", "name_source", "state", "state_version",
              "summary_text", "metadata", "created_at", "last_activity_at", "pinned_at", "archived_at",
              "deleted_at", "last_seq", "transcript"]
    readonly_fields = ["session_id", "kind", "component_id", "state", "state_version", "summary_text", "created_at",
                       "last_activity_at", "last_seq", "transcript"]
    date_hierarchy = "last_activity_at"
    show_full_result_count = False

    @admin.display(boolean=True, description="running")
    def is_running(self, session):
        return session.is_running

    @admin.display(description="session state")
    def state(self, session):
        return pretty_json(session.session_state)

    @admin.display(description="summary")
    def summary_text(self, session):
        if not session.summary:
            return "-"
        topics = ", ".join(session.summary.get("topics") or [])
        return format_html("{}<br><small>Topics: {} · updated {}</small>", session.summary.get("summary", ""),
                           topics or "-", session.summary.get("updated_at") or "-")

    @admin.display(description="transcript")
    def transcript(self, session):
        if not session.pk:
            return "-"
        url = reverse("admin:sessions_core_chatsession_transcript", args=[session.pk])
        return format_html('<a href="{}">Transcript and state timeline</a>', url)

    def get_urls(self):
        view = self.admin_site.admin_view(self.transcript_view)
        return [path("<int:pk>/transcript/", view, name="sessions_core_chatsession_transcript"), *super().get_urls()]

    def transcript_view(self, request, pk):
        session = get_object_or_404(ChatSession.objects.select_related("owner"), pk=pk)
        messages = Paginator(session.messages.select_related("run").order_by("seq"), TRANSCRIPT_PAGE)
        page = messages.get_page(request.GET.get("page"))
        changes = session.state_changes.select_related("run").order_by("-version")[:100]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "session": session, "page": page, "changes": changes,
            "title": f"Transcript of {session}",
        }
        return TemplateResponse(request, "admin/sessions_core/transcript.html", context)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["run_id", "session", "status", "model_id", "created_at", "finished_at"]
    list_filter = ["status", "component_id"]
    list_select_related = ["session"]
    search_fields = ["run_id", "session__session_id"]
    raw_id_fields = ["session", "parent_run"]
    readonly_fields = ["run_id", "metrics", "history_seqs"]
    show_full_result_count = False


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["session", "seq", "role", "tool_name", "created_at"]
    list_filter = ["role"]
    list_select_related = ["session"]
    search_fields = ["session__session_id"]
    raw_id_fields = ["session", "run"]
    show_full_result_count = False


@admin.register(StateChange)
class StateChangeAdmin(admin.ModelAdmin):
    list_display = ["session", "version", "source", "run", "created_at"]
    list_select_related = ["session", "run"]
    search_fields = ["session__session_id", "source"]
    raw_id_fields = ["session", "run"]
    readonly_fields = ["patch", "inverse"]
    show_full_result_count = False
