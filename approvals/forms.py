"""The request page's forms: decide, approve with edited arguments, reassign."""

from __future__ import annotations

from typing import Any

from django import forms

NOTE_MAX = 2000
DENY_NEEDS_NOTE = "A denial needs a note that says why: the agent tells the customer."
EDIT_NEEDS_NOTE = "An edit needs a note that says why the arguments changed."
NOT_EDITABLE = "Not editable: the agent declares this argument fixed."


class DecisionForm(forms.Form):
    """Approve or deny; the button pressed is the verdict."""

    verdict = forms.ChoiceField(
        choices=[("approve", "Approve"), ("deny", "Deny")], widget=forms.HiddenInput
    )
    note = forms.CharField(
        required=False,
        max_length=NOTE_MAX,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Required to deny; the customer is told it.",
    )
    opening = forms.UUIDField(widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if data.get("verdict") == "deny" and not (data.get("note") or "").strip():
            self.add_error("note", DENY_NEEDS_NOTE)
        return data

    @property
    def approved(self) -> bool:
        return self.cleaned_data["verdict"] == "approve"


def _field_for(value: Any, label: str) -> forms.Field:
    """A form field that gives back a value of the original's JSON type."""
    if isinstance(value, bool):
        return forms.BooleanField(label=label, required=False)
    if isinstance(value, int):
        return forms.IntegerField(label=label)
    if isinstance(value, float):
        return forms.FloatField(label=label)
    if isinstance(value, str):
        return forms.CharField(
            label=label, required=bool(value), strip=False, max_length=10_000
        )
    return forms.JSONField(
        label=label,
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="JSON",
    )


class EditedArgsForm(forms.Form):
    """The action's arguments, prefilled, to approve a changed version of it
    (a smaller refund, say). Keys are fixed: an edit changes values, it does
    not make another action. Arguments the agent does not declare editable are
    read-only; the service refuses a changed one whatever the page sent, and
    its errors are shown on the argument's field (`add_args_errors`)."""

    note = forms.CharField(
        required=False,
        max_length=NOTE_MAX,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required: why the arguments were changed.",
    )
    opening = forms.UUIDField(widget=forms.HiddenInput)

    def __init__(self, *args, original: dict[str, Any], editable: list[str], **kwargs):
        self.original = original
        self.arg_names = {}
        initial = dict(kwargs.pop("initial", None) or {})
        for index, (key, value) in enumerate(original.items()):
            name = f"arg_{index}"
            self.arg_names[name] = key
            initial.setdefault(name, value)
        super().__init__(*args, initial=initial, **kwargs)
        for name, key in self.arg_names.items():
            field = _field_for(original[key], key)
            if key not in editable:
                field.widget.attrs["readonly"] = True
                field.help_text = NOT_EDITABLE
            self.fields[name] = field

    def arg_fields(self):
        return [self[name] for name in self.arg_names]

    def add_args_errors(self, errors: dict[str, str]) -> None:
        """The service's refusal of the edit, on the arguments it names."""
        fields = {key: name for name, key in self.arg_names.items()}
        for key, message in errors.items():
            self.add_error(fields.get(key), f"{key}: {message}" if key else message)

    def clean(self):
        data = super().clean()
        if not (data.get("note") or "").strip():
            self.add_error("note", EDIT_NEEDS_NOTE)
        if any(name in self.errors for name in self.arg_names):
            return data
        edited = {key: data.get(name) for name, key in self.arg_names.items()}
        if edited == self.original:
            raise forms.ValidationError(
                "The arguments are unchanged: use Approve to approve them as they are."
            )
        data["args"] = edited
        return data


class AssignForm(forms.Form):
    assignee = forms.ModelChoiceField(queryset=None, label="Assign to")

    def __init__(self, *args, choices, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["assignee"].queryset = choices
