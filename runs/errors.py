"""Errors of the runs use cases, each with the API status and code it maps to."""

from rest_framework import exceptions, status


class ApiError(exceptions.APIException):
    """An error a service raises with a stable machine code, e.g. version_skew.

    `extra` holds further members of the error body (say, the ids a client
    needs to act on the error), beside code and message."""

    extra: dict | None = None

    def __init__(self, message: str, *, code: str, status_code: int) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code


class InvalidRequest(exceptions.ValidationError):
    """Bad input that only a service can judge: answers 400 naming the field."""

    def __init__(self, message: str, *, field: str):
        super().__init__({field: [message]})


class StateConflict(ApiError):
    def __init__(self, message: str, *, code: str):
        super().__init__(message, code=code, status_code=status.HTTP_409_CONFLICT)


class ApprovalRequired(StateConflict):
    """The change would continue a thread past an approval gate without a
    decision on its request (runs.gates). `approval_ids` names the requests
    open on the thread, if any; the API's error body carries them as
    `pending_approvals`."""

    def __init__(self, message: str, *, approval_ids: list[str] | None = None):
        super().__init__(message, code="approval_required")
        self.approval_ids = [str(pk) for pk in approval_ids or []]
        self.extra = {"pending_approvals": self.approval_ids}


class VersionSkew(StateConflict):
    def __init__(self, message: str):
        super().__init__(message, code="version_skew")
