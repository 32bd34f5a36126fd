"""The package's structure, read from its source with `ast` (nothing of it is imported): no import
circle, no import of another module's private name, imports only downward in the layer order of
docs/architecture.md, no module over 300 lines. Every import counts: module level, inside
functions, under ``TYPE_CHECKING``."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "resilience"
MAX_LINES = 300

# Bottom to top: a module may import its own layer and the layers below it, never above.
LAYERS = (
    ("errors", "core"),
    ("disk", "objectstore"),
    ("scenario",),
    ("workloads",),
    ("strategies",),
    ("faults",),
    ("oracle",),
    ("rank",),
    ("launch",),
    ("run",),
    ("measure",),
    ("report",),
    ("fuzz",),
    ("planted",),
    ("commands",),
    ("__init__", "__main__", "workload"),  # the public API and the stable re-export of the workload
)
LEVEL = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module
    name: str | None  # the imported name (``from target import name``), if any
    line: int

    def __str__(self) -> str:
        what = f"from {self.target} import {self.name}" if self.name else f"import {self.target}"
        return f"{self.module} (line {self.line}): {what}"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import of a module of the package by another, resolved to the module it names."""
    found = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append((submodule, None) if submodule in known else (base, alias.name))
            for target, name in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != module and target.split(".")[0] == PACKAGE.name:
                    found.append(Import(module, target, name, node.lineno))
    return found


def room(module: str) -> str:
    """The layer a module belongs to: its first package below ``resilience`` (or its own name)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


KNOWN = modules()
IMPORTS = imports(KNOWN)


def test_every_module_belongs_to_a_layer():
    unknown = sorted({room(m) for m in KNOWN} - set(LEVEL))
    assert not unknown, f"packages or top-level modules with no place in LAYERS: {unknown}"


def test_no_import_circle():
    edges: dict[str, set[str]] = {module: set() for module in KNOWN}
    for found in IMPORTS:
        edges[found.module].add(found.target)
    cycles = circles(edges)
    detail = [" <-> ".join(cycle) + ":\n    " + "\n    ".join(
        str(i) for i in IMPORTS if i.module in cycle and i.target in cycle) for cycle in cycles]
    assert not cycles, "import circles:\n" + "\n".join(detail)


def test_no_import_of_another_modules_private_name():
    private = [str(i) for i in IMPORTS
               if i.name and i.name.startswith("_") and not i.name.startswith("__")]
    assert not private, "imports of another module's private name:\n" + "\n".join(private)


def test_imports_only_go_down_the_layers():
    upward = [f"{i}   ({room(i.module)} may not import {room(i.target)})" for i in IMPORTS
              if room(i.module) in LEVEL and room(i.target) in LEVEL and LEVEL[room(i.target)] > LEVEL[room(i.module)]]
    assert not upward, "imports that go up the layers:\n" + "\n".join(upward)


def test_no_module_over_300_lines():
    long = [f"{module}: {lines} lines" for module, path in KNOWN.items()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split where the responsibilities part):\n" + "\n".join(long)


def test_the_checks_see_what_they_check():
    """The reader itself: it resolves relative imports, and a circle it is shown is one it finds."""
    assert any(i.module == "resilience.run.local_case" and i.target == "resilience.oracle.judge" for i in IMPORTS)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert room("resilience.rank.worker") == "rank" and room("resilience.errors") == "errors"


# -- the plug-in rooms -----------------------------------------------------------------------------
#: third-party training libraries: only their stack package (and the plug-ins) may name them
TRAINING_LIBRARIES = ("deepspeed", "megatron", "pytorch_lightning", "lightning", "accelerate", "transformers",
                      "torchtitan", "dlrover", "DS_")
#: layers that must not know any stack: a new stack touches its own package, not these
STACK_BLIND = ("rank", "launch", "measure")
#: the contract modules whose classes declare every capability a plug-in may offer
CONTRACTS = ("resilience.strategies.base", "resilience.workloads.base", "resilience.faults.base")


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (a module's, a class's, a function's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def named_libraries(path: Path) -> list[str]:
    """Where a module names a training library: in an import or a string (docstrings and comments aside)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            names = [node.value]
        for name in names:
            hit = next((lib for lib in TRAINING_LIBRARIES if name == lib or name.startswith(
                (f"{lib}.", lib if lib.endswith("_") else f"{lib}-"))), None)
            if hit:
                found.append(f"{path.name}:{node.lineno}: {name!r}")
    return found


def declared_capabilities() -> set[str]:
    """Every public name a contract class declares (its methods, attributes and class attributes),
    in the contract modules and the modules they re-export from."""
    declared: set[str] = set()
    contract_modules = {KNOWN[name] for name in CONTRACTS}
    plugin_packages = ("resilience.faults", "resilience.strategies", "resilience.workloads")
    contract_modules |= {KNOWN[i.target] for i in IMPORTS
                         if i.module in CONTRACTS and i.target.startswith(plugin_packages)}
    for path in contract_modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    declared.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    declared.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    declared |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return {name for name in declared if not name.startswith("_")}


def capability_reads_by_name(declared: set[str]) -> list[str]:
    """``getattr(x, "name")`` / ``hasattr(x, "name")`` with a declared capability's name: a plug-in
    capability found by name instead of read from its declaration."""
    found = []
    for module, path in KNOWN.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in declared):
                found.append(f"{module} (line {node.lineno}): {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_rank_launch_and_measure_name_no_training_library():
    found = [hit for module, path in KNOWN.items() if room(module) in STACK_BLIND for hit in named_libraries(path)]
    assert not found, ("a library named outside its stack package (declare it in the stack's STACK, "
                       "resilience/strategies/stack.py):\n" + "\n".join(found))


def test_no_fault_imports_a_strategy():
    found = [str(i) for i in IMPORTS if room(i.module) == "faults" and room(i.target) == "strategies"]
    assert not found, ("faults importing strategies (what both need lives in core/, e.g. "
                       "core/preemption.py, core/capabilities.py):\n" + "\n".join(found))


def test_no_plugin_capability_is_read_by_name():
    found = capability_reads_by_name(declared_capabilities())
    assert not found, ("plug-in capabilities read with getattr/hasattr (declare them on the contract "
                       "class with a default and read them directly):\n" + "\n".join(found))


def test_the_room_checks_see_what_they_check(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""deepspeed in a docstring is fine."""\nimport deepspeed.runtime\n'
                      'x = "megatron.core.dist_checkpointing"\ny = getattr(s, "tag_for", None)\n')
    assert [line.split(": ", 1)[1] for line in named_libraries(sample)] == [
        "'deepspeed.runtime'", "'megatron.core.dist_checkpointing'"]
    assert {"save", "load", "supervise", "check_options"} <= declared_capabilities()
