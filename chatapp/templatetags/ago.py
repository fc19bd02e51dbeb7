"""`ago`: how long ago a time was, as a person says it ("just now", "5 minutes ago", "2 days, 3 hours ago")."""

from datetime import timedelta

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def ago(value) -> str:
    """Within its first minute a time is "just now" (timesince would say "0 minutes")."""
    if not value:
        return ""
    if timezone.now() - value < timedelta(minutes=1):
        return "just now"
    return f"{timesince(value)} ago"
