"""Teaches drf-spectacular about Gatehouse's Bearer API keys."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
