"""Forms: a chat's first message, rename, state edit (sign-up uses Django's UserCreationForm)."""

from __future__ import annotations

import json

from django import forms
from django.conf import settings

from sessions_core import limits
from sessions_core.storable import replace_unstorable

from .assistants import ASSISTANTS


class MessageTextError(ValueError):
    """A message that cannot be sent; the text says why, for the user."""


def message_text(value) -> str:
    """A message as it is run: trimmed, its line ends LF (a form post sends CR LF; the socket and the page's
    character count have LF), stored as the engine stores it (NUL and lone surrogates become U+FFFD), 1 to
    CHAT_MAX_MESSAGE_CHARS characters. The socket's frames and the first message of a new chat are
    checked here alike."""
    if not isinstance(value, str) or not value.strip():
        raise MessageTextError("Type a message first.")
    text = replace_unstorable(value.replace("\r\n", "\n").strip())
    limit = settings.CHAT_MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise MessageTextError(f"The message is {len(text):,} characters long; the limit is {limit:,}.")
    return text


class FirstMessageForm(forms.Form):
    """A new chat: the assistant picked in the header and the first message (the chat is made with it)."""

    assistant = forms.ChoiceField(choices=[(a.id, a.name) for a in ASSISTANTS.values()],
                                  error_messages={"invalid_choice": "Choose one of the assistants.",
                                                  "required": "Choose one of the assistants."})
    text = forms.CharField(required=False, strip=False)

    def clean_text(self) -> str:
        try:
            return message_text(self.cleaned_data["text"])
        except MessageTextError as exc:
            raise forms.ValidationError(str(exc)) from None


class RenameForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, strip=True)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if not name:
            raise forms.ValidationError("A title cannot be empty.")
        return name


def json_error_in_words(exc: ValueError) -> str:
    """A JSON parse error as a user reads it (Python's own messages name parser internals)."""
    text = str(exc)
    if "integer string conversion" in text:
        return "a number in it is too long to read (more than 4,300 digits)"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg.lower()} at line {exc.lineno}, column {exc.colno}"
    return "it could not be read as text"


class StateEditForm(forms.Form):
    state = forms.CharField(widget=forms.Textarea, strip=False)
    version = forms.IntegerField(min_value=0, widget=forms.HiddenInput)

    def clean_state(self) -> dict:
        try:  # size and depth first (CHAT_MAX_JSON_BYTES, CHAT_MAX_JSON_DEPTH), before the parser recurses
            limits.check_text(self.cleaned_data["state"], "The state")
        except limits.LimitExceeded as exc:
            raise forms.ValidationError(str(exc)) from None
        try:
            value = json.loads(self.cleaned_data["state"])
        except ValueError as exc:
            raise forms.ValidationError(f"That is not valid JSON: {json_error_in_words(exc)}.") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("The state must be a JSON object ({…}), not a list or a single value.")
        return value
