"""The package's shape, checked from its source: no import cycles between hvdtrain's modules
(imports inside function bodies included), Horovod imported only under
``hvdtrain/horovod/``, the benchmarks (``hvdtrain_bench``, a tool shipped beside the
library) imported only by the ``hvdtrain`` command and tied to no checkout, no class whose
methods are spread over mixins in other files, and no library module over about 400 lines
(the Trainer, one concern, may take more)."""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hvdtrain"
BENCH = PACKAGE.parent / "hvdtrain_bench"
MAX_LINES = 400
#: Modules that may be longer, and why: one concern that splitting would scatter.
LONGER = {"hvdtrain.trainer.trainer": (600, "the Trainer's loop, its lifecycle (start, elastic "
                                    "membership, finish) and the public faces of its parts")}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The hvdtrain module that defines ``name`` (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(hvdtrain modules, top-level outside packages) that ``module`` imports anywhere."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                     for alias in node.names]
            names.append(base)  # ``from pkg import sub`` runs ``pkg/__init__`` first
        else:
            continue
        for name in names:
            if name.split(".")[0] == "hvdtrain":
                owner = _owner(name)
                if owner and owner != module:
                    inside.add(owner)
            else:
                outside.add(name.split(".")[0])
    return inside, outside


GRAPH = {module: _imports(module) for module in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle between hvdtrain's modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for target in sorted(GRAPH[module][0]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path + [target])
                if found:
                    return found
        state[module] = 2
        return None

    for module in sorted(MODULES):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_the_checks_see_the_package():
    assert len(MODULES) > 40 and "hvdtrain.trainer.trainer" in MODULES
    assert "hvdtrain.backends" in GRAPH["hvdtrain.trainer.trainer"][0]
    assert "horovod" in GRAPH["hvdtrain.horovod.runtime"][1]


def test_no_import_cycles_between_modules():
    """A package's ``__init__`` counts: ``from pkg import sub`` imports ``pkg`` first."""
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def test_only_the_horovod_backend_imports_horovod():
    """(The benchmarks' baselines, the plain Horovod loops users write, import it too:
    they are ``hvdtrain_bench``'s, outside the library.)"""
    users = sorted(m for m, (_, outside) in GRAPH.items() if "horovod" in outside)
    assert "hvdtrain.horovod.runtime" in users
    strays = [m for m in users if not m.startswith("hvdtrain.horovod.")]
    assert not strays, f"only hvdtrain/horovod/ may import horovod: {strays}"


def test_only_the_command_imports_the_benchmarks():
    users = sorted(m for m, (_, outside) in GRAPH.items() if "hvdtrain_bench" in outside)
    assert users == ["hvdtrain.cli"], users


def test_the_benchmarks_ship_beside_the_library_and_know_no_checkout():
    """``hvdtrain bench`` works from a wheel: ``hvdtrain_bench`` and its helper scripts
    (links to ``scripts/``) are in the distribution, and no module finds a file from where
    it sits in a checkout (``parents[N]``, a path into ``scripts/``): the scripts come from
    ``jobs.script``, out of ``$HVDTRAIN_BENCH_SCRIPTS`` or the package's own folder."""
    setuptools = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "hvdtrain_bench" in setuptools["packages"]["find"]["include"]
    assert setuptools["package-data"]["hvdtrain_bench"] == ["scripts/*"]
    for link in (BENCH / "scripts").iterdir():
        assert link.is_symlink() and link.resolve() == PACKAGE.parent / "scripts" / link.name
    tied = [f"{path.name}:{i}" for path in BENCH.glob("*.py")
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"parents\[[2-9]\]|[\"'/]scripts[\"'/]", line.split("#")[0])
            and not line.startswith("PACKAGE_SCRIPTS = Path(__file__).resolve().parent /")
            and "<ssh=scripts/" not in line]
    assert not tied, tied


def test_no_module_is_over_the_size_limit():
    """The benchmarks' modules too."""
    sizes = {m: len(path.read_text().splitlines()) for m, (path, _) in MODULES.items()}
    sizes.update({f"hvdtrain_bench.{p.stem}": len(p.read_text().splitlines())
                  for p in BENCH.glob("*.py")})
    over = {m: n for m, n in sizes.items() if n > LONGER.get(m, (MAX_LINES,))[0]}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Class name -> [(module, its definition)] over the whole package."""
    found: dict[str, list] = {}
    for module, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((module, node))
    return found


def _private_state_it_lacks(cls: ast.ClassDef) -> set[str]:
    """``self._x`` names a class reads but neither assigns nor defines as a method."""
    reads, own = set(), {n.name for n in cls.body if isinstance(n, (ast.FunctionDef,
                                                                     ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            (own if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
    return reads - own


def test_no_class_is_spread_over_mixins_in_other_files():
    """A base class from another module that reads private state it never sets is a
    mixin: the class's methods are spread over files that share attributes with no
    interface. Compose parts instead, each given what it needs."""
    classes = _classes()
    mixins = []
    for module, (path, _) in MODULES.items():
        imported = {}
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hvdtrain"):
                imported.update({a.asname or a.name: node.module for a in node.names})
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else None
                for where, definition in classes.get(name, []) if name in imported else []:
                    lacks = _private_state_it_lacks(definition)
                    if where == imported[name] and lacks:
                        mixins.append(f"{module}.{node.name} <- {where}.{name} "
                                      f"(reads {sorted(lacks)})")
    assert not mixins, mixins


def test_the_checks_see_a_mixin():
    mixin = ast.parse("class View:\n    def size(self):\n        return self._backend.size\n")
    part = ast.parse("class Part:\n    def __init__(self, b):\n        self._backend = b\n"
                     "    def size(self):\n        return self._backend.size\n")
    assert _private_state_it_lacks(mixin.body[0]) == {"_backend"}
    assert _private_state_it_lacks(part.body[0]) == set()


def test_the_trainer_is_composed_not_mixed():
    trainer = next(node for module, node in _classes()["Trainer"]
                   if module == "hvdtrain.trainer.trainer")
    assert trainer.bases == [], "Trainer's parts are attributes, not base classes"


def test_test_files_have_unique_names():
    """pytest imports test files by base name (the test folders are no packages): two
    files of one name make the second fail to collect in a whole-suite run."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_nothing_below_the_trainer_imports_it():
    """The Trainer is the top layer: the backends, ``horovod/``, the shared pieces and the
    public faces never import ``hvdtrain.trainer`` (the package's lazy front door and the
    command do)."""
    users = sorted(m for m, (inside, _) in GRAPH.items()
                   if not m.startswith("hvdtrain.trainer")
                   and any(t.startswith("hvdtrain.trainer") for t in inside))
    assert set(users) <= {"hvdtrain", "hvdtrain.cli", "hvdtrain.ray"}, users


def test_the_trainer_reaches_horovod_only_through_its_backend():
    """``trainer/`` never imports ``horovod/``: the Horovod backend
    (``backends/horovod.py``) is its one way there, chosen by name at run time."""
    users = sorted(m for m, (inside, _) in GRAPH.items() if m.startswith("hvdtrain.trainer")
                   and any(t.startswith("hvdtrain.horovod") for t in inside))
    assert not users, users
    assert "hvdtrain.horovod.step" in GRAPH["hvdtrain.backends.horovod"][0]
    assert "hvdtrain.horovod.step" in GRAPH["hvdtrain.horovod.keras_steps"][0]
