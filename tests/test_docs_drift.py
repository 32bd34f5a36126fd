"""The manual cannot drift from the code: the built-in tables name exactly the registered plug-ins,
the contract pages name every member the contracts declare (and only members that exist), and the
architecture page names every module."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from resilience.core import registry
from resilience.core.capabilities import Capability
from resilience.faults.base import Fault
from resilience.strategies.base import CheckpointStrategy

DOCS = Path(__file__).resolve().parents[1] / "docs"
PACKAGE = Path(__file__).resolve().parents[1] / "resilience"


def first_column(page: str, heading: str) -> set[str]:
    """The backticked names in the first column of the first table under ``heading``."""
    text = (DOCS / page).read_text()
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    names: set[str] = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names |= {name.split("(")[0] for name in re.findall(r"`([^`]+)`", line.split("|")[1])}
    return names


def declared(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


@pytest.mark.parametrize("page, heading, registered", [
    ("strategies.md", "## Built-in strategies", registry.STRATEGIES),
    ("faults.md", "## Built-in faults", registry.FAULTS),
])
def test_the_built_in_tables_name_exactly_the_registered_plug_ins(page, heading, registered):
    assert first_column(page, heading) == set(registered)


def test_the_strategy_page_names_every_member_of_the_contract_and_no_other():
    page = (DOCS / "strategies.md").read_text()
    assert sorted(m for m in declared(CheckpointStrategy) if f"`{m}" not in page) == []
    table = first_column("strategies.md", "| member | what it is for |")
    assert sorted(table - declared(CheckpointStrategy)) == []


def test_the_capability_table_names_every_capability_and_its_methods():
    rows = first_column("strategies.md", "| capability | methods |")
    page = (DOCS / "strategies.md").read_text()
    assert rows == {capability.name for capability in Capability}
    for capability in Capability:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{capability.name}`"))
        assert all(f"`{method}(" in row for method in capability.methods), (capability, row)


def test_the_fault_page_names_every_member_of_the_contract():
    page = (DOCS / "faults.md").read_text()
    assert sorted(m for m in declared(Fault) if f"`{m}" not in page) == []


def test_the_architecture_page_names_every_module():
    page = (DOCS / "architecture.md").read_text()
    modules = [path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"]

    def named(module: Path) -> bool:  # by its name or by its path from any package above it
        return any(f"`{Path(*module.parts[start:])}`" in page for start in range(len(module.parts)))

    assert sorted(str(module) for module in modules if not named(module)) == []
