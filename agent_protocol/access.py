"""Who may call the Agent Protocol API: the same API keys as /api/v1.

LangGraph's SDKs send the key in the `x-api-key` header; `Authorization:
Bearer` works as well. Tenancy and scopes are /api/v1's: the request is bound
to the key's tenant, another tenant's object is a 404, and every view
declares the scope it needs. Searches and reads that LangGraph sends as POST
(`/threads/search`, `/threads/{id}/history`, ...) count as reads.
"""

from __future__ import annotations

from rest_framework import permissions
from rest_framework.authentication import SessionAuthentication

from runs.api.authentication import ApiKeyAuthentication
from runs.api.permissions import TenantScopePermission

API_KEY_HEADER = "HTTP_X_API_KEY"


class XApiKeyAuthentication(ApiKeyAuthentication):
    """The key from `x-api-key`, or from `Authorization: Bearer`."""

    def authenticate(self, request):
        secret = request.META.get(API_KEY_HEADER, "").strip()
        if not secret:
            return super().authenticate(request)
        return self.authenticate_secret(request, secret)


class ReadPostPermission(TenantScopePermission):
    """A view's `read_methods` (POST for searches) need the scope's read right."""

    def writes(self, request, view) -> bool:
        return request.method not in permissions.SAFE_METHODS and (
            request.method not in getattr(view, "read_methods", ())
        )


AUTHENTICATION = [XApiKeyAuthentication, SessionAuthentication]
PERMISSIONS = [ReadPostPermission]
