"""The layers run one way and close no cycle (docs/architecture.md).

The import graph is built from the package's own source with `ast`, mapped as the package
installs (setup.py's folder → import name table), so it sees every `import` and `from … import`,
including those inside functions and `TYPE_CHECKING` blocks: a lazy import that runs up a layer
is still an arrow the wrong way.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setup_roots() -> dict[str, str]:
    """setup.py's `ROOTS` (import name → folder), the same table the wheel is built from."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROOTS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS table")


ROOTS = _setup_roots()

# Lowest first. A module may import its own layer or a lower one. The floor (errors, crash-safe
# writes, backoff, name suggestions, sync bridging, SVG charts, lazy package names) imports nothing
# of the package, so everything may import it; the sandboxes sit on it, below the authoring SDK that
# runs episodes in them. The registry sits above the built-in envs: it indexes their manifests (envs
# never import the registry). The integrations (other frameworks' adapters) need envs by id only, so
# they sit right above the registry; serving envs needs the catalog and nothing of the runner.
FLOOR = ("corral.errors", "corral.fileio", "corral.backoff", "corral.suggest", "corral.sync",
         "corral.charts", "corral.lazy")
LAYERS = ("corral.sandbox", "corral", "corral.envs", "corral.registry", "corral.integrations",
          "corral.serve", "corral.runner", "corral.trainer", "corral.cli")
# (importer, imported) pairs that may break the rule, each with its reason. Keep it empty.
ALLOWED: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    """The rank of `module`'s layer: 0 for the floor, else 1 + the index in LAYERS of the
    deepest layer prefix (`corral.sandbox` is deeper than `corral`, though below it)."""
    if module in FLOOR:
        return 0
    best, depth = LAYERS.index("corral"), 0
    for rank, prefix in enumerate(LAYERS):
        if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
            best, depth = rank, prefix.count(".")
    return best + 1


def is_private(module: str) -> bool:
    """Whether `module` or a package on its path is named `_x` (`corral.sandbox._procs`)."""
    return any(part.startswith("_") for part in module.split("."))


def package_modules() -> dict[str, Path]:
    """Every module of the distribution: import name → source file."""
    modules = {}
    for package, folder in ROOTS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


# The facade (`import corral as cr`) names upper layers by string for its lazy attributes, and
# imports them under `if TYPE_CHECKING:` so editors resolve `cr.make`; nothing of that runs.
FACADES = {"corral"}


def facade_type_imports(tree: ast.Module) -> set[int]:
    """Ids of the import nodes inside the module's top-level `if TYPE_CHECKING:` blocks."""
    found: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            found.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """importer → the package modules it imports (a name resolves to its longest module)."""
    graph: dict[str, set[str]] = defaultdict(set)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        hidden = facade_type_imports(tree) if module in FACADES else set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from pkg import sub` depends on the module pkg.sub when there is one, else
                # on pkg (a name defined in its __init__).
                names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem
                         for alias in node.names]
            for name in names:
                target = resolve(name) if name.split(".")[0] == "corral" else None
                if target and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(package_modules())


def test_graph_sees_the_package(graph: dict[str, set[str]]) -> None:
    # A broken walker would find nothing and pass everything: check known arrows are seen.
    assert "corral.catalog" in graph["corral.environment"]
    assert "corral.runner" in graph["corral.trainer.loop"] or any(
        t.startswith("corral.runner.") for t in graph["corral.trainer.loop"])
    assert len(package_modules()) > 100


def test_no_import_runs_up_a_layer(graph: dict[str, set[str]]) -> None:
    upward = sorted(f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                    if layer_of(dst) > layer_of(src) and (src, dst) not in ALLOWED)
    assert not upward, "imports running up a layer:\n" + "\n".join(upward)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    found = [c for c in cycles(graph)
             if not all((a, b) in ALLOWED for a in c for b in graph[a] if b in c)]
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_module_is_imported_from_another_layer(graph: dict[str, set[str]]) -> None:
    """A `_module` is its layer's own business: another layer that imports it ties itself to
    what its owners may change at will."""
    crossing = sorted(f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                      if is_private(dst) and layer_of(dst) != layer_of(src)
                      and (src, dst) not in ALLOWED)
    assert not crossing, "private modules imported from another layer:\n" + "\n".join(crossing)


def test_checker_catches_an_upward_import_and_a_cycle() -> None:
    graph = {"corral.env": {"corral.runner.pool"}, "corral.a": {"corral.b"},
             "corral.b": {"corral.a"}}
    assert layer_of("corral.runner.pool") > layer_of("corral.env")
    assert cycles(graph) == [["corral.a", "corral.b"]]
    # the sandboxes sit below the SDK, the floor below both, serving between registry and runner
    assert layer_of("corral.errors") < layer_of("corral.sandbox.docker") < layer_of("corral.env")
    assert layer_of("corral.registry.store") < layer_of("corral.serve.app") < layer_of(
        "corral.runner.runner")
    assert is_private("corral.sandbox._procs") and not is_private("corral.sandbox.procs")


def test_facade_is_lazy_and_complete() -> None:
    """`import corral` loads no upper layer beyond the catalog's sources; every facade name
    resolves; dir() lists them. (It reads the catalog once, through the registry's
    `corral.catalog` plugin, to put every env id in Gymnasium's registry; the registry's
    server, client and curation stay unloaded.)"""
    code = """
import sys, corral as cr
upper = [m for m in sys.modules if m.split('.')[:2] in (['corral', 'runner'],
         ['corral', 'trainer'], ['corral', 'cli'], ['corral', 'serve'],
         ['corral', 'integrations'])
         or m in ('corral.registry.server', 'corral.registry.client', 'corral.registry.curation')]
assert not upper, upper
for name in cr.__all__:
    getattr(cr, name)
assert {'mix', 'deprecate', 'make', 'runner', 'trainer'} <= set(dir(cr))
assert cr.runner.Runner.__name__ == 'Runner' and cr.trainer.TrainConfig.__name__ == 'TrainConfig'
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_cli_and_the_trainer_settings_load_without_torch() -> None:
    """`corral --help` (and every command that trains nothing) does not pay torch's import
    (2 of its 3 seconds): `corral train`'s flags come from `corral.trainer.config`, which
    imports without torch, and `corral.trainer`'s names load on first use."""
    code = """
import sys
import corral.cli
from corral.trainer import LoraConfig, StepConfig, TrainConfig
assert 'torch' not in sys.modules, 'torch was imported'
from corral.trainer import Trainer, train
assert 'torch' in sys.modules and Trainer.__name__ == 'Trainer' and callable(train)
from corral.trainer.loop import TrainConfig as again
from corral.trainer.lora import LoraConfig as lora_again
assert again is TrainConfig and lora_again is LoraConfig
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def public_classes(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Class name → the public modules that define a public class of that name at top level."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, path in modules.items():
        if is_private(module):
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(module)
    return found


# Class names two public modules may both define, each with its reason. Keep it short.
SHARED_CLASS_NAMES: dict[str, str] = {}


def test_no_two_public_classes_share_a_name() -> None:
    """One name per thing: two public classes of one name make every reader ask which is meant."""
    shared = sorted(f"{name}: {', '.join(sorted(where))}"
                    for name, where in public_classes(package_modules()).items()
                    if len(where) > 1 and name not in SHARED_CLASS_NAMES)
    assert not shared, "public classes sharing a name:\n" + "\n".join(shared)


def test_the_catalog_makes_a_built_in_env_in_a_fresh_interpreter() -> None:
    """`corral.catalog.make` finds the built-in envs without the registry imported first: the
    registry extends the default catalog through its `corral.catalog` entry point (the SDK
    itself imports no module of the registry: test_no_import_runs_up_a_layer)."""
    code = """
import sys
from corral.catalog import make
env = make('corral/arithmetic-v0')
obs, info = env.reset(seed=0)
assert isinstance(obs, str) and obs
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_every_public_module_declares_all() -> None:
    """A public module says what it exports (`__all__`), so `from m import *`, editors and the
    API reference agree on its public names; ruff checks that every listed name exists."""
    missing = []
    for module, path in package_modules().items():
        if is_private(module) or path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        public = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef))
                  and not n.name.startswith("_")]
        declares = any(isinstance(n, (ast.Assign, ast.AnnAssign)) and "__all__" in {
            getattr(t, "id", None) for t in (n.targets if isinstance(n, ast.Assign)
                                             else [n.target])} for n in tree.body)
        if public and not declares:
            missing.append(module)
    assert not missing, "public modules without __all__:\n" + "\n".join(sorted(missing))
