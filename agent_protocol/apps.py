from django.apps import AppConfig


class AgentProtocolConfig(AppConfig):
    name = "agent_protocol"
    verbose_name = "LangGraph Agent Protocol"

    def ready(self) -> None:
        from agent_protocol import run_webhooks  # noqa: F401  connects its receiver
