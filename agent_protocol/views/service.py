"""`/ok` and `/info`: what LangGraph's SDKs and UIs probe before anything."""

from __future__ import annotations

from importlib.metadata import version

from rest_framework.response import Response

from agent_protocol.views.base import ProtocolView


class OkView(ProtocolView):
    """Liveness, without credentials (like /healthz)."""

    authentication_classes = []
    permission_classes = []

    def get(self, request):
        return Response({"ok": True})


class InfoView(ProtocolView):
    """What this server supports, as LangGraph Studio and Agent Chat UI read it."""

    authentication_classes = []
    permission_classes = []

    def get(self, request):
        return Response(
            {
                "version": "gatehouse",
                "langgraph_py_version": version("langgraph"),
                "flags": {
                    "assistants": True,
                    "crons": False,
                    "store": False,
                    "langsmith": False,
                    "langsmith_tracing_replicas": False,
                },
                "host": {"kind": "self-hosted", "project_id": None, "tenant_id": None},
            }
        )
