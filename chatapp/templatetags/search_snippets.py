"""The `marked` filter: a search snippet (`sessions_core.search.Snippet`) as HTML, its matches in <mark>."""

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

register = template.Library()


@register.filter
def marked(snippet) -> SafeString:
    """The snippet's text escaped, each part that matched the query inside <mark>."""
    return format_html_join("", "{}", (
        (format_html("<mark>{}</mark>", text) if matched else text,) for text, matched in snippet.segments()
    ))
