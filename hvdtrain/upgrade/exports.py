"""The names ``hvdtrain.tensorflow`` and its submodules export, read from their source
(importing them would load TensorFlow), and which Horovod module each one replaces."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # hvdtrain/

#: Horovod's modules and the hvdtrain module with the same names on Keras 3.
#: ``horovod.keras`` (standalone Keras 2) maps to ``hvdtrain.tensorflow.keras``: on
#: TensorFlow 2.16+ ``keras`` is Keras 3, the Keras ``tf.keras`` is.
MODULES = {
    "horovod.tensorflow": "hvdtrain.tensorflow",
    "horovod.tensorflow.elastic": "hvdtrain.tensorflow.elastic",
    "horovod.tensorflow.keras": "hvdtrain.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks": "hvdtrain.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic": "hvdtrain.tensorflow.keras.elastic",
    "horovod.keras": "hvdtrain.tensorflow.keras",
    "horovod.keras.callbacks": "hvdtrain.tensorflow.keras.callbacks",
    "horovod.keras.elastic": "hvdtrain.tensorflow.keras.elastic",
}


def _names(path: Path) -> set[str]:
    """The names a module's top level binds."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return {n for n in names if not n.startswith("_") and n != "*"}


@functools.lru_cache(maxsize=None)
def exports() -> dict[str, frozenset[str]]:
    """hvdtrain module (``hvdtrain.tensorflow.keras``) -> the names it has."""
    found = {}
    for path in sorted((_PACKAGE / "tensorflow").rglob("*.py")):
        parts = list(path.relative_to(_PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = frozenset(_names(path))
    return found


def resolve(target: str, names: list[str]) -> tuple[str, list[str], str | None]:
    """Walk ``names`` (an attribute chain) from the hvdtrain module ``target`` through its
    submodules: (the module reached, the rest of the chain, the first missing name or
    None)."""
    modules = exports()
    module = target
    for i, name in enumerate(names):
        sub = f"{module}.{name}"
        if sub in modules:
            module = sub
            continue
        return module, names[i:], None if name in modules[module] else name
    return module, [], None
