"""Writes one benchmark's section of docs/benchmarks.md, leaving the others."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by its script under `bench/` (run with the make "
    "target named in it); figures are from the last run on the machine named.\n"
)


def write_section(title: str, body: str) -> None:
    """Replace (or append) the section whose `## ` heading starts with `title`.

    `body` is the whole section, its `## ` heading included.
    """
    text = DOC.read_text() if DOC.exists() else HEADER
    pattern = re.compile(
        rf"^## {re.escape(title)}.*?(?=^## |\Z)", flags=re.MULTILINE | re.DOTALL
    )
    section = body.rstrip() + "\n\n"
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section
    DOC.write_text(text.rstrip() + "\n")


def cpu_model() -> str:
    """The processor's name (Linux), else its architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as a benchmark notes them."""
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())
