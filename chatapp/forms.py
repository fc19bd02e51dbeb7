"""Forms: new session, rename, state edit (sign-up uses Django's UserCreationForm)."""

from __future__ import annotations

import json

from django import forms

from sessions_core import limits

from .assistants import ASSISTANTS


class NewSessionForm(forms.Form):
    assistant = forms.ChoiceField(choices=[(a.id, a.name) for a in ASSISTANTS.values()], widget=forms.RadioSelect)


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
