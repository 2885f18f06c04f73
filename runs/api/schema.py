"""The OpenAPI schema's conventions, in one place: the API key scheme, the
error responses every operation documents, and sane examples.

`GatehouseAutoSchema` (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS) adds to each
operation the error responses that apply to it, all with the one error body
(`runs.api.serializers.ErrorSerializer`, component `Error`), unless the view
documents that code itself with something more precise. `examples_hook`
(a drf-spectacular postprocessing hook) gives every property and parameter
named in FIELD_DOCS its description and example, so that Swagger UI's "Try it
out" starts from a plausible request rather than `0` and `"string"`.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse

from runs.api.serializers import ErrorSerializer

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}

ERRORS = {
    "400": "The body or a query parameter is invalid (`invalid`: `fields` "
    "names each field with its problems; a JSON boolean is `true` or `false`, "
    "never a string), or the body is not JSON (`parse_error`).",
    "401": "No credentials, or an unknown, wrong or revoked API key "
    "(`not_authenticated`, `authentication_failed`).",
    "403": "The key or the person's role lacks this operation's scope "
    "(`permission_denied`).",
    "404": "Nothing with this id in the caller's tenant (another tenant's "
    "object is not found either): `not_found`.",
    "409": "A conflict with the current state, or an `Idempotency-Key` reused "
    "with another body (`idempotency_key_reused`) or still being answered "
    "(`idempotency_in_progress`).",
    "413": "The body is larger than `GATEHOUSE_MAX_BODY_BYTES` "
    "(`payload_too_large`); nothing of it was read.",
    "415": "The body is not JSON in UTF-8: another media type, or a `charset` "
    "other than `utf-8` (`unsupported_media_type`); nothing of it was decoded.",
    "429": "Too many requests for this key or person (`throttled`): retry after "
    "the `Retry-After` seconds.",
    "503": "The database or the broker is briefly unavailable "
    "(`service_unavailable`): retry after the `Retry-After` seconds. An "
    "`Idempotency-Key` retry is safe.",
}
RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "example": 30},
        "description": "Seconds to wait before the next request.",
    }
}


class GatehouseAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(
            path, path_regex, path_prefix, method, registry
        )
        if operation is None:
            return None
        responses = operation["responses"]
        for code in self.error_codes(operation):
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=ERRORS[code]), code
                )
            if code in ("429", "503"):
                responses[code].setdefault("headers", {}).update(RETRY_AFTER)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def error_codes(self, operation: dict) -> list[str]:
        """The error responses this operation can give."""
        codes = []
        takes_input = "requestBody" in operation or any(
            parameter["in"] == "query" for parameter in operation.get("parameters", [])
        )
        if takes_input:
            codes.append("400")
        if operation.get("security"):
            codes += ["401", "403"]
        if "{" in self.path:
            codes.append("404")
        if self.method in UNSAFE and not getattr(self.view, "idempotency_exempt", ""):
            codes.append("409")
        if "requestBody" in operation:
            codes += ["413", "415"]
        if operation.get("security"):
            codes.append("429")
        codes.append("503")  # any operation, during an outage (runs.outages)
        return codes


# What a property or parameter means, and an example, by name: a name means
# the same thing wherever it appears (requests, responses, query and path
# parameters). A description written on the serializer field wins. Every
# request property, every parameter and every integer has both
# (tests/runs/test_api_schema.py).
FIELD_DOCS: dict[str, tuple[str, object]] = {
    "thread_id": ("The client's id of the thread, unique in the tenant.", "case-42"),
    "run_id": ("A run's id.", "0b6f7c1e-3d2a-4c55-9a51-8f0e2d4c6b7a"),
    "approval_id": (
        "An approval request's id.",
        "5d1c0a9e-7b3f-4e21-8c6d-2a4b9e0f1c3d",
    ),
    "request_id": ("A deletion request's id.", "9e2f4a6c-1b3d-4f5e-8a7c-0d2e4f6a8b1c"),
    "subscription_id": (
        "A webhook subscription's id.",
        "2c4e6a8b-0d1f-4a3b-9c5d-7e9f1a3b5c7d",
    ),
    "agent": ("A registered agent's name (GET /api/v1/agents).", "refund"),
    "agent_version": ("The agent version the thread is pinned to.", "1"),
    "metadata": (
        "Plaintext tags the agent declares safe; `subject` is stored only as "
        "its keyed hash, for deletion requests.",
        {"subject": "jane@example.com", "channel": "email"},
    ),
    "input": (
        "The run's input, as the agent's graph takes it (encrypted at rest).",
        {"messages": [{"role": "user", "content": "Refund order A-1001"}]},
    ),
    "checkpoint_id": (
        "A checkpoint of the thread (from its history).",
        "1ef5d3a8-0b8c-6f4e-8001-5f2b3c4d5e6f",
    ),
    "values": ("Channel values written into the fork before it runs.", {"amount": 40}),
    "as_node": ("The node the fork's values are written as.", "review"),
    "resume": (None, {"answer": "yes, the parcel arrived damaged"}),
    "approved": (None, True),
    "note": (None, "Order A-1001 checked: the customer was charged twice."),
    "reviewer": (None, "rita"),
    "args": (None, {"order_id": "A-1001", "amount": 40}),
    "subject": (
        "The data subject's identifier as the agent tags threads with it (an "
        "e-mail address, a customer number); never stored.",
        "jane@example.com",
    ),
    "url": (
        "Where deliveries are POSTed: https, a public address.",
        "https://hooks.example.com/gatehouse",
    ),
    "events": ("The event kinds delivered.", ["run.finished", "approval.requested"]),
    "include_content": (
        "Also send decrypted thread content (run outputs, approval arguments) "
        "with the events; off by default.",
        False,
    ),
    "limit": ("Items per page, 1 to 500 (default 50).", 50),
    "wait": (
        "A long poll: seconds, 0 to 30 (up to 3 decimals), to wait for a "
        "queued or running run to stop (interrupted, succeeded, failed or "
        "cancelled). The run is answered as soon as it stops, or as it is "
        "when the time runs out (200 either way); a run that already stopped "
        "at once. The server holds no database connection meanwhile.",
        10,
    ),
    "cursor": (
        "The `next` link's cursor, to read the following page.",
        "cD0yMDI2LTExLTMwKzA5JTNBMDAlM0EwMC4wMDAwMDAlMkIwMCUzQTAw",
    ),
    "action": ("A gated action's name.", "refund_order"),
    "tenant_id": ("The tenant's numeric id.", 3),
    "tenant": ("The tenant's slug.", "acme"),
    "head_seq": (None, 3380),
    "head_hash": (
        None,
        "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c2e4f6a8b0c1d3e5f7a9b1c3d5e7f9a0b",
    ),
    "signed_at": (None, "2026-11-30T09:00:00.000000Z"),
    "key_id": (None, "k2"),
    "signature": (
        None,
        "3b1f5d7e9a2c4e6f8a0b2d4f6a8c0e1f3a5b7d9f1c3e5a7b9d0f2a4c6e8b0d1f",
    ),
    "against": ("A head saved earlier (audit_anchor, GET /api/v1/audit/head).", None),
    "required_approvals": (None, 1),
    "escalation_level": (None, 0),
    "attempts": (None, 1),
    "last_status_code": (None, 200),
    "threads_in_flight": (None, 3),
    "against_seq": (None, 3380),
    "first_bad_seq": (None, 57),
    "blocks": (None, 12),
    "unsealed": (None, 20),
    "seq": (None, 3381),
    "last_seq": (None, 3390),
    "hidden": (None, 4),
    "step": (None, 2),
    "count": (None, 1),
    "actor": (None, "user:4"),
    "kind": (None, "run.started"),
    "date": (None, "2026-11-30"),
    "tz": (None, "Europe/Paris"),
    "since": (None, "2026-11-30T00:00:00Z"),
    "until": (None, "2026-12-01T00:00:00Z"),
    "before": (
        "A checkpoint id: the entries before it (the next page).",
        "1ef5d3a8-0b8c-6f4e-8001-5f2b3c4d5e6f",
    ),
}
# Integers named alike with different meanings, per component.
COMPONENT_EXAMPLES = {
    ("Timeline", "events"): 120,
    ("Verification", "events"): 3400,
    # A plan change (approvals.plans): steps removed, a step's arguments.
    ("PlanChangeRequest", "remove"): [3],
    ("PlanChangeRequest", "args"): {
        "2": {"order_id": "ORD-1", "amount": "40.00", "currency": "EUR"}
    },
}


def examples_hook(result, generator, request, public):
    """Fill in FIELD_DOCS' descriptions and examples where the schema has none.
    An example whose JSON type does not match the property is left out."""
    schemas = result.get("components", {}).get("schemas", {})
    for component_name, component in schemas.items():
        for name, prop in component.get("properties", {}).items():
            description, example = FIELD_DOCS.get(name, (None, None))
            example = COMPONENT_EXAMPLES.get((component_name, name), example)
            _document(prop, description, example)
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                description, example = FIELD_DOCS.get(parameter["name"], (None, None))
                if description and not parameter.get("description"):
                    parameter["description"] = description
                if example is not None and _fits(parameter["schema"], example):
                    parameter["schema"].setdefault("example", example)
    return result


def _document(prop: dict, description, example) -> None:
    if description and not prop.get("description"):
        prop["description"] = description
    if example is not None and "example" not in prop and _fits(prop, example):
        prop["example"] = example


def _fits(prop: dict, example) -> bool:
    kind = prop.get("type")
    if kind is None:
        return "$ref" not in prop and "allOf" not in prop  # any JSON value
    checks = {
        "integer": lambda: isinstance(example, int) and not isinstance(example, bool),
        "boolean": lambda: isinstance(example, bool),
        "string": lambda: isinstance(example, str),
        "object": lambda: isinstance(example, dict),
        "array": lambda: isinstance(example, list),
    }
    return checks.get(kind, lambda: True)()


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "runs.api.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: `Authorization: Bearer gh_xxxxxxxxx.<secret>`. "
            "A service key acts with its own scopes; a personal key acts as the "
            "member it belongs to, within their role (its approvals are theirs).",
        }
