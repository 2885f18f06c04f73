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


class _EditForm(forms.Form):
    """An approval that changes what the agent asked: it needs a note."""

    note = forms.CharField(
        required=False,
        max_length=NOTE_MAX,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required: why you changed what the agent asked.",
    )
    opening = forms.UUIDField(widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if not (data.get("note") or "").strip():
            self.add_error("note", EDIT_NEEDS_NOTE)
        return data


class EditedArgsForm(_EditForm):
    """The action's arguments, prefilled, to approve a changed version of it
    (a smaller refund, say). Keys are fixed: an edit changes values, it does
    not make another action. Arguments the agent does not declare editable are
    read-only; the service refuses a changed one whatever the page sent, and
    its errors are shown on the argument's field (`add_args_errors`)."""

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


PLAN_UNCHANGED = (
    "The plan is unchanged: use Approve to approve it as it is, or keep fewer "
    "steps or change an argument."
)


class EditedPlanForm(_EditForm):
    """A plan's steps, each with a "keep" box and its arguments prefilled, to
    approve the plan changed: steps removed, arguments edited (approvals.
    plans). As in EditedArgsForm, arguments the step's action does not declare
    editable are read-only, and the service refuses a changed one whatever the
    page sent; its errors are shown on the step's fields (`add_plan_errors`)."""

    def __init__(
        self,
        *args,
        steps: list[dict[str, Any]],
        editable: dict[str, list[str]],
        **kwargs,
    ):
        self.steps = steps
        self.keep_names: dict[int, str] = {}
        self.arg_names: dict[str, tuple[int, str]] = {}
        initial = dict(kwargs.pop("initial", None) or {})
        for step in steps:
            number = step["step"]
            self.keep_names[number] = f"keep_{number}"
            initial.setdefault(f"keep_{number}", True)
            for index, (key, value) in enumerate(step["args"].items()):
                name = f"step_{number}_arg_{index}"
                self.arg_names[name] = (number, key)
                initial.setdefault(name, value)
        super().__init__(*args, initial=initial, **kwargs)
        for step in steps:
            self.fields[self.keep_names[step["step"]]] = forms.BooleanField(
                label=f"Keep step {step['step']}", required=False
            )
        for name, (number, key) in self.arg_names.items():
            step = next(step for step in steps if step["step"] == number)
            field = _field_for(step["args"][key], key)
            if key not in editable.get(str(number), []):
                field.widget.attrs["readonly"] = True
                field.help_text = NOT_EDITABLE
            self.fields[name] = field

    def step_rows(self):
        """(step, its keep box, its argument fields), in the plan's order."""
        return [
            (
                step,
                self[self.keep_names[step["step"]]],
                [
                    self[name]
                    for name, (number, _) in self.arg_names.items()
                    if number == step["step"]
                ],
            )
            for step in self.steps
        ]

    def add_plan_errors(self, errors: dict[tuple[str | None, str | None], str]):
        """The service's refusal of the change, on the fields it names."""
        fields = {
            (str(number), key): name for name, (number, key) in self.arg_names.items()
        }
        for (step, arg), message in errors.items():
            field = fields.get((step, arg)) if step is not None else None
            if field is None and step is not None and arg is None:
                field = self.keep_names.get(int(step)) if step.isdigit() else None
            where = f"step {step}: " if step is not None else ""
            self.add_error(
                field, f"{where}{arg}: {message}" if arg else where + message
            )

    def clean(self):
        data = super().clean()
        if any(name in self.errors for name in self.arg_names):
            return data
        remove = [
            number for number, name in self.keep_names.items() if not data.get(name)
        ]
        edited: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            number = step["step"]
            if number in remove:
                continue
            args = {
                key: data.get(name)
                for name, (at, key) in self.arg_names.items()
                if at == number
            }
            if args != step["args"]:
                edited[str(number)] = args
        if not remove and not edited:
            raise forms.ValidationError(PLAN_UNCHANGED)
        data["plan"] = {"remove": remove, "args": edited}
        return data
