"""Errors of the runs use cases, each with the API status and code it maps to."""

from rest_framework import exceptions, status

from runs.api.errors import ApiError


class InvalidRequest(exceptions.ValidationError):
    """Bad input that only a service can judge: answers 400 naming the field."""

    def __init__(self, message: str, *, field: str):
        super().__init__({field: [message]})


class StateConflict(ApiError):
    def __init__(self, message: str, *, code: str):
        super().__init__(message, code=code, status_code=status.HTTP_409_CONFLICT)


class VersionSkew(StateConflict):
    def __init__(self, message: str):
        super().__init__(message, code="version_skew")
