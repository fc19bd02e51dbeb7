"""Times as a person reads them: `ago` (how long ago: "just now", "5 minutes ago") and `seconds` (a run's
figures: "3 ms", "1.24 s")."""

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


@register.filter
def seconds(value) -> str:
    """A duration in seconds: under one second in milliseconds (a reply's first token 3 ms after its run
    began reads "3 ms", never "0.00 s"), else in seconds to two places."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):  # stored by other means: shown as it is
        return str(value)
    if value >= 1:
        return f"{value:.2f} s"
    milliseconds = round(value * 1000)
    return f"{milliseconds} ms" if milliseconds >= 1 else "under 1 ms"
