from django.contrib import admin

from .models import QueuedMessage


@admin.register(QueuedMessage)
class QueuedMessageAdmin(admin.ModelAdmin):
    """Messages waiting for their run: normally there for seconds; older ones wait on a stopped process."""

    list_display = ["queued_id", "session", "user", "created_at"]
    list_select_related = ["session", "user"]
    search_fields = ["queued_id", "session__session_id", "user__username"]
    raw_id_fields = ["session", "user"]
    readonly_fields = ["queued_id", "created_at"]
    show_full_result_count = False
