"""The example modules of docs/writing-agents.md, importable by the suite.

Each ```python block of the page that starts with `# writing_agents/<name>.py`
is a complete module. `pytest_configure` (tests/conftest.py) writes them into a
temporary `writing_agents` package on the path of the test process and of the
workers it starts, and tests/settings.py registers each as `doc-<name>@1`, so
the page's text is exactly what tests/durable/test_writing_agents.py runs.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "writing-agents.md"
BLOCK = re.compile(r"```python\n# writing_agents/(\w+)\.py\n(.*?)```", re.S)
# The agent each example module defines: module -> its factory or entrypoint.
AGENTS = {
    "functional": "shipping",
    "gated": "build_graph",
    "replay": "build_graph",
    "patching": "build_graph",
    "migration": "build_graph",
    "retries": "build_graph",
    "saga": "build_graph",
    "plan": "build_graph",  # run by tests/approvals/test_plan_review.py
}
# Modules that are a later version of another example's agent: module ->
# (agent, version).
VERSIONS = {"migration": ("doc-replay", "2")}


def examples() -> dict[str, str]:
    return dict(BLOCK.findall(PAGE.read_text()))


def write_package(root: Path) -> None:
    package = root / "writing_agents"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in examples().items():
        (package / f"{name}.py").write_text(source)


def registrations() -> list[str]:
    entries = []
    for name, attr in AGENTS.items():
        agent, version = VERSIONS.get(name, (f"doc-{name}", "1"))
        entries.append(f"{agent}@{version}=writing_agents.{name}:{attr}")
    return entries
