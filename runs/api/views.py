from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import registry
from runs.api.serializers import AgentSerializer
from runs.models import Scope


class AgentListView(APIView):
    required_scope = Scope.RUNS

    @extend_schema(responses=AgentSerializer(many=True), summary="Registered agents")
    def get(self, request):
        specs = sorted(registry.agents().values(), key=lambda s: (s.name, s.version))
        rows = [
            {
                "name": spec.name,
                "version": spec.version,
                "description": spec.description,
                "draining": spec.draining,
            }
            for spec in specs
        ]
        return Response(AgentSerializer(rows, many=True).data)
