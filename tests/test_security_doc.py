"""docs/security.md names, for each guarantee, the tests that show it: every
test it names must exist, so the page cannot promise what no test checks any
more (a renamed or removed test fails here, naming the section)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
TOKEN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^tests/[\w/]*?(?:[\w]+\.py)?/?(?:::(\w+))?$")
BARE_FILE = re.compile(r"^test_\w+\.py$")
BARE_TEST = re.compile(r"^test_\w+$")


@cache
def defined_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


def sections() -> list[tuple[str, str]]:
    parts = re.split(r"^## ", DOC.read_text(), flags=re.MULTILINE)
    return [(part.splitlines()[0], part) for part in parts[1:]]


def named_in(section: str) -> tuple[list[str], set[Path], list[str]]:
    """What a section names: problems with its paths, the test files it
    names (a folder: every test file in it), and the bare test names."""
    problems: list[str] = []
    files: set[Path] = set()
    folders: list[Path] = []
    bare_files: list[str] = []
    bare_tests: list[str] = []
    for token in TOKEN.findall(section):
        if token.startswith("tests/") and PATH.match(token):
            where, _, name = token.partition("::")
            path = ROOT / where
            if not path.exists():
                problems.append(f"{token}: no such file or folder")
            elif path.is_dir():
                folders.append(path)
                files.update(path.rglob("test_*.py"))
            else:
                files.add(path)
                if name and name not in defined_in(path):
                    problems.append(f"{token}: no such test in {where}")
        elif BARE_FILE.match(token):
            bare_files.append(token)
        elif BARE_TEST.match(token):
            bare_tests.append(token)
    for name in bare_files:
        found = [folder / name for folder in folders if (folder / name).exists()]
        if not found:
            problems.append(f"{name}: not in any folder the section names")
        files.update(found)
    return problems, files, bare_tests


def test_every_test_that_security_md_names_exists():
    problems = []
    for title, text in sections():
        section_problems, files, bare_tests = named_in(text)
        defined = set().union(*(defined_in(path) for path in files)) if files else set()
        for name in bare_tests:
            if name not in defined:
                section_problems.append(
                    f"{name}: not defined in the test files the section names"
                )
        problems += [f"{title}: {problem}" for problem in section_problems]
    assert not problems, "\n".join(problems)


def test_every_guarantee_names_its_tests():
    """Each section that states a guarantee says which tests show it."""
    missing = [
        title
        for title, text in sections()
        if "**Guarantee.**" in text and not named_in(text)[1]
    ]
    assert not missing, missing
