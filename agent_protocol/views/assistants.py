"""Assistants: the registered agent versions, read-only (agent_protocol.catalog)."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.response import Response

from agent_protocol import catalog
from agent_protocol.requests import AssistantCount, AssistantSearch, validated
from agent_protocol.views.base import NotSupported, ProtocolView
from runs.api.fields import query_flag
from runs.graphs import compiled
from runs.registry import AgentSpec

READ_ONLY = (
    "assistants are the registered agent versions (GATEHOUSE_AGENTS); they are "
    "not created, changed or deleted over the API"
)


def _spec(reference: str) -> AgentSpec:
    resolved = catalog.resolve(reference)
    if resolved is None:
        raise exceptions.NotFound(f"Assistant {reference} not found.")
    return resolved.spec


def _selected(item: dict, select: list[str] | None) -> dict:
    return {key: item[key] for key in select if key in item} if select else item


SORT_KEYS = {
    "assistant_id": lambda item: item["assistant_id"],
    "graph_id": lambda item: (item["graph_id"], item["version"]),
    "name": lambda item: item["name"],
    "created_at": lambda item: item["created_at"],
    "updated_at": lambda item: item["updated_at"],
}


class AssistantCreateView(ProtocolView):
    def post(self, request):
        """Refused, except LangGraph's "make sure the graph's assistant
        exists" (a graph id and if_exists=do_nothing, nothing else), which
        answers the newest version's assistant."""
        body = request.data if isinstance(request.data, dict) else {}
        extra = set(body) - {"graph_id", "assistant_id", "if_exists", "name"}
        resolved = catalog.resolve(body.get("graph_id") or "")
        if body.get("if_exists") == "do_nothing" and resolved and not extra:
            return Response(catalog.assistant(resolved.spec))
        raise NotSupported(READ_ONLY)


class AssistantSearchView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request):
        body = validated(AssistantSearch, request.data)
        items = [
            catalog.assistant(spec)
            for spec in catalog.search(
                graph_id=body.get("graph_id"),
                name=body.get("name"),
                metadata=body.get("metadata"),
            )
        ]
        sort_by = body.get("sort_by")
        if sort_by:
            items.sort(key=SORT_KEYS[sort_by], reverse=body.get("sort_order") == "desc")
        start, end = body["offset"], body["offset"] + body["limit"]
        headers = {}
        if end < len(items):
            headers["X-Pagination-Next"] = str(end)
        page = [_selected(item, body.get("select")) for item in items[start:end]]
        return Response(page, headers=headers)


class AssistantCountView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request):
        body = validated(AssistantCount, request.data)
        return Response(
            len(
                catalog.search(
                    graph_id=body.get("graph_id"),
                    name=body.get("name"),
                    metadata=body.get("metadata"),
                )
            )
        )


class AssistantDetailView(ProtocolView):
    def get(self, request, assistant_id):
        return Response(catalog.assistant(_spec(assistant_id)))

    def patch(self, request, assistant_id):
        _spec(assistant_id)
        raise NotSupported(READ_ONLY)

    def delete(self, request, assistant_id):
        _spec(assistant_id)
        raise NotSupported(READ_ONLY)


class AssistantVersionsView(ProtocolView):
    read_methods = ("POST",)

    def post(self, request, assistant_id):
        """An assistant is one agent version: its only version is itself."""
        return Response([catalog.assistant(_spec(assistant_id))])


class AssistantLatestView(ProtocolView):
    def post(self, request, assistant_id):
        _spec(assistant_id)
        raise NotSupported(READ_ONLY)


def _graph(request, assistant_id):
    return compiled(_spec(assistant_id), request.principal.tenant)


class AssistantGraphView(ProtocolView):
    def get(self, request, assistant_id):
        raw = request.query_params.get("xray", "false").lower()
        if raw in ("true", "false"):
            xray: bool | int = raw == "true"
        elif raw.isdigit():
            xray = int(raw)
        else:
            raise exceptions.ValidationError({"xray": ["a boolean or a depth"]})
        return Response(_graph(request, assistant_id).get_graph(xray=xray).to_json())


def _schema(make) -> dict | None:
    """A JSON schema, or None when LangGraph cannot derive one from the
    agent's types (LangGraph's API answers None too)."""
    try:
        return make()
    except Exception:  # noqa: BLE001  pydantic refuses some state types
        return None


def _state_schema(graph) -> dict | None:
    from pydantic import TypeAdapter

    state_type = getattr(getattr(graph, "builder", None), "state_schema", None)
    if state_type is None:
        return None
    return _schema(lambda: TypeAdapter(state_type).json_schema())


def _schemas(spec: AgentSpec, graph) -> dict:
    return {
        "graph_id": spec.name,
        "input_schema": _schema(graph.get_input_jsonschema),
        "output_schema": _schema(graph.get_output_jsonschema),
        "state_schema": _state_schema(graph),
        "config_schema": _schema(graph.get_config_jsonschema),
        "context_schema": _schema(graph.get_context_jsonschema),
    }


class AssistantSchemasView(ProtocolView):
    def get(self, request, assistant_id):
        spec = _spec(assistant_id)
        return Response(_schemas(spec, compiled(spec, request.principal.tenant)))


class AssistantSubgraphsView(ProtocolView):
    def get(self, request, assistant_id, namespace=None):
        spec = _spec(assistant_id)
        graph = compiled(spec, request.principal.tenant)
        recurse = query_flag(request, "recurse")
        return Response(
            {
                name: _schemas(spec, subgraph)
                for name, subgraph in graph.get_subgraphs(
                    namespace=namespace, recurse=recurse
                )
            }
        )
