"""Serializer fields with the API's own rules."""

from rest_framework import serializers


class StrictBooleanField(serializers.BooleanField):
    """A JSON `true` or `false`, nothing else.

    DRF's BooleanField also takes "yes", "on", "1", 1 and their opposites. A
    decision must never turn on how a string happens to be spelled
    (`"approved": "no"` would be refused, but `"approved": "yes"` taken), so
    anything but a JSON boolean is a 400 naming the field.
    """

    default_error_messages = {"invalid": "Must be a JSON boolean: true or false."}

    def to_internal_value(self, data):
        if data is True or data is False:
            return data
        self.fail("invalid")


def query_flag(request, name: str, default: bool = False) -> bool:
    """A boolean query parameter: `true` or `false` (any case), or absent for
    `default`; anything else is a 400 naming the parameter."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise serializers.ValidationError({name: ["Must be true or false."]})
