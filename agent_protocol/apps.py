from django.apps import AppConfig


class AgentProtocolConfig(AppConfig):
    name = "agent_protocol"
    verbose_name = "LangGraph Agent Protocol"
