import pytest
from django.core.exceptions import ImproperlyConfigured

from runs import registry


def test_environment_agents_are_added_to_builtin_ones(settings):
    settings.GATEHOUSE_BUILTIN_AGENTS = {"echo@1": "tests.agents:echo_graph"}
    settings.GATEHOUSE_AGENTS = (
        "mine@7=tests.agents:echo_graph, echo@2=tests.agents:echo_graph"
    )
    assert set(registry.agents()) == {"echo@1", "echo@2", "mine@7"}
    assert registry.latest("echo").version == "2"


def test_malformed_agent_entry_is_refused(settings):
    settings.GATEHOUSE_AGENTS = "nameonly=tests.agents:echo_graph"
    with pytest.raises(ImproperlyConfigured, match="name@version"):
        registry.agents()


def test_draining_version_is_skipped_for_new_threads(settings):
    settings.GATEHOUSE_AGENTS = (
        "echo@1=tests.agents:echo_graph,echo@2=tests.agents:echo_graph"
    )
    settings.GATEHOUSE_DRAINING_AGENTS = ["echo@2"]
    assert registry.latest("echo", for_new_threads=True).version == "1"
    assert registry.latest("echo").version == "2"


def test_factory_builds_an_uncompiled_state_graph(settings):
    from langgraph.graph import StateGraph

    graph = registry.get("echo", "1").build_graph()
    assert isinstance(graph, StateGraph)
    result = graph.compile().invoke({"text": "hi"})
    assert result["echoed"] == "hi"
