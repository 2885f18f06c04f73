from rest_framework import serializers


class AgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.CharField()
    description = serializers.CharField()
    draining = serializers.BooleanField()
