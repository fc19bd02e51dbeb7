from django.contrib import admin

from .models import ChatSession, Message, Run, StateChange


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "component_id", "kind", "state_version", "last_activity_at", "deleted_at"]
    list_filter = ["kind", "component_id", "name_source"]
    list_select_related = ["owner"]
    search_fields = ["session_id", "name", "owner__username"]
    raw_id_fields = ["owner"]
    readonly_fields = ["session_id", "session_state", "state_version", "summary", "created_at", "last_seq"]
    date_hierarchy = "last_activity_at"
    show_full_result_count = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["run_id", "session", "status", "model_id", "created_at", "finished_at"]
    list_filter = ["status"]
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
