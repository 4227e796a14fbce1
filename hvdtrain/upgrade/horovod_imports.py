"""Rules for Horovod's imports: ``horovod.tensorflow[.keras]`` becomes
``hvdtrain.tensorflow[.keras]`` in import statements and in the attribute chains that use
a bare ``import horovod``; every name the script takes from them is checked against what
hvdtrain's modules export."""
from __future__ import annotations

import ast
from typing import Iterator

from hvdtrain.upgrade.exports import MODULES, exports, resolve
from hvdtrain.upgrade.names import Module, dotted
from hvdtrain.upgrade.source import Change, Edit, Note

#: ``horovod.X`` uses that stay Horovod's and work as they are (the launcher).
_KEPT = ("horovod.run", "horovod.runner", "horovod.ray")
_WHY = "{new} has {old}'s names on Keras 3"
_MISSING = ("{module} has no `{name}` (the README's table lists what hvdtrain supports): "
            "rewrite that use by hand")
_GRAPH_ONLY = ("broadcast_global_variables works in TensorFlow 1 graph mode only (it raises "
               "in eager TF 2): broadcast with hvd.callbacks.BroadcastGlobalVariablesCallback(0)"
               " in fit, or hvd.broadcast_variables(model.variables, root_rank=0) and "
               "(opt.variables, root_rank=0) after the first step of a tape loop")


def mapped(dotted_name: str) -> tuple[str, str, list[str]] | None:
    """(Horovod module, its hvdtrain module, the rest of the chain) for the longest
    Horovod module ``dotted_name`` starts with, or None."""
    parts = dotted_name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in MODULES:
            return prefix, MODULES[prefix], parts[n:]
    return None


def usable(dotted_name: str) -> str | None:
    """The hvdtrain module that has everything ``dotted_name`` (a Horovod chain) names,
    or None."""
    here = mapped(dotted_name)
    return here[1] if here and not resolve(here[1], here[2])[2] else None


def rules(mod: Module) -> Iterator[Change | Note]:
    """Every change and note about Horovod's imports in ``mod``."""
    chains = _chains(mod)
    for node in mod.nodes:
        if isinstance(node, ast.Import):
            yield from _import(mod, node, chains)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] == "horovod":
            yield from _import_from(mod, node)
    yield from _uses(mod, chains)


def _chains(mod: Module) -> dict[str, list[tuple[ast.AST, str]]]:
    """Bound name -> [(the longest attribute chain that starts with it, its full
    dotted Horovod name)] for every name bound to ``horovod`` or a module hvdtrain
    replaces (names imported from modules it does not replace are noted at the import)."""
    bound = {name: target for name, target in mod.bindings.items()
             if target == "horovod" or (mapped(target) is not None and not mapped(target)[2])}
    found: dict[str, list] = {}
    for node in mod.nodes:
        if isinstance(node, ast.Name) and node.id in bound and isinstance(node.ctx, ast.Load):
            top = node
            while isinstance(mod.parent.get(top), ast.Attribute):
                top = mod.parent[top]
            name = dotted(top)
            found.setdefault(node.id, []).append((top, bound[node.id] + name[len(node.id):]))
    return found


def _import(mod: Module, node: ast.Import, chains) -> Iterator[Change | Note]:
    src = mod.source
    for alias in node.names:
        if alias.name.split(".")[0] != "horovod":
            continue
        here = mapped(alias.name)
        if alias.asname:
            if here and not here[2]:
                start, _ = src.span(alias)
                yield _rename(mod, node, start, alias.name, here[1])
            elif alias.name.startswith("horovod.tensorflow"):
                yield Note(node.lineno, src.segment(alias),
                           f"{alias.name} is not one of Horovod's public modules hvdtrain "
                           "replaces; take its names from hvdtrain.tensorflow")
            continue
        yield from _bare_import(mod, node, alias, chains.get("horovod", []))


def _bare_import(mod: Module, node: ast.Import, alias: ast.alias, uses) -> Iterator[Change]:
    """``import horovod[.tensorflow]``, which binds ``horovod``: the first becomes the
    import of what the ``horovod.tensorflow...`` chains now name, later ones go."""
    src = mod.source
    targets = [usable(name) for _, name in uses if usable(name)]
    own = usable(alias.name)
    targets += [own] if own else []
    if not targets:
        return  # ``import horovod`` for horovod.run: it stays
    new = ("hvdtrain.tensorflow.keras" if any(".keras" in t for t in targets)
           else "hvdtrain.tensorflow")
    still = [name for _, name in uses if not usable(name)]
    if not own and alias.name != "horovod":
        still.append(alias.name)
    start, end = src.span(alias)
    lines = sorted({top.lineno for top, name in uses if usable(name)})
    why = f"the horovod.tensorflow uses{_lines(lines)} are {new}'s now"
    if still:
        why += "; `horovod` stays imported for " + ", ".join(sorted(set(still)))
        yield Change(node.lineno, *src.span(node), why, [Edit(start, end,
                                                               f"{alias.name}, {new}")])
        return
    first = min((n for n in mod.nodes if isinstance(n, ast.Import) and any(
        not a.asname and a.name.split(".")[0] == "horovod" for a in n.names)),
        key=lambda n: (n.lineno, n.col_offset))
    if first is node or len(node.names) > 1 or src.segment(node) != f"import {alias.name}":
        yield Change(node.lineno, *src.span(node), why, [Edit(start, end, new)])
        return
    statement = src.span(node)
    line_start, line_end = src.line_start(statement[0]), src.line_end(statement[1])
    if src.text[line_start:statement[0]].strip() or src.text[statement[1]:line_end].strip():
        yield Change(node.lineno, *statement, why, [Edit(start, end, new)])
        return
    yield Change(node.lineno, *statement, f"line {first.lineno} imports {new} already",
                 [Edit(line_start, line_end, "")], new="(removed)")


def _lines(lines: list[int]) -> str:
    if not lines:
        return ""
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    return f" (line{'s' * (len(lines) > 1)} {shown})"


def _rename(mod: Module, node: ast.AST, start: int, old: str, new: str) -> Change:
    """The change of the module name ``old`` written at ``start`` in an import."""
    return Change(node.lineno, *mod.source.span(node), _WHY.format(new=new, old=old),
                  [Edit(start, start + len(old), new)])


def _import_from(mod: Module, node: ast.ImportFrom) -> Iterator[Change | Note]:
    src = mod.source
    text = src.segment(node)
    start = src.module_start(node)
    if start is None:
        yield Note(node.lineno, text, "split over lines: rewrite the module name by hand")
        return
    names = [a.name for a in node.names]
    here = mapped(node.module)
    if here is None and node.module == "horovod":
        targets = [usable(f"horovod.{n}") for n in names]
        parents = [t.rpartition(".") if t else None for t in targets]
        if None in parents or len({p[0] for p in parents}) != 1 \
                or any(p[2] != n for p, n in zip(parents, names)):
            if any(targets):
                yield Note(node.lineno, text, "import the Horovod TensorFlow modules and "
                           "Horovod's other names in separate statements, then rerun")
            return
        yield _rename(mod, node, start, node.module, parents[0][0])
        return
    if here is None:
        if node.module.startswith("horovod.spark.keras"):
            yield Note(node.lineno, text, "horovod.spark's KerasEstimator goes through "
                       "horovod.tensorflow.keras, which fails on Keras 3")
        if not node.module.startswith("horovod.tensorflow."):
            return
        missing = [n for n in names if n == "*" or n not in exports()["hvdtrain.tensorflow"]]
        if missing:
            yield Note(node.lineno, text, _MISSING.format(module="hvdtrain.tensorflow",
                                                         name=", ".join(missing)))
            return
        yield _rename(mod, node, start, node.module, "hvdtrain.tensorflow")
        return
    target = here[1]
    missing = [n for n in names if n != "*" and resolve(target, [n])[2]]
    if missing:
        yield Note(node.lineno, text, _MISSING.format(module=target, name=", ".join(missing))
                   + "; this import is left as it is")
        return
    yield _rename(mod, node, start, node.module, target)


def _uses(mod: Module, chains) -> Iterator[Change | Note]:
    """Chains through a bound Horovod module: each name checked, ``horovod.tensorflow.X``
    rewritten to ``hvdtrain.tensorflow.X`` where ``import horovod`` bound it."""
    src = mod.source
    for bound, uses in chains.items():
        for top, name in uses:
            here = mapped(name)
            if here is None:
                if bound == "horovod" and not name.startswith(_KEPT) and name != "horovod":
                    yield Note(top.lineno, src.segment(top),
                               "Horovod's own, with no hvdtrain equivalent (`import horovod` "
                               "is kept for it); check it still means what the script needs")
                continue
            module, rest, missing = resolve(here[1], here[2])
            if missing:
                yield Note(top.lineno, src.segment(top),
                           _MISSING.format(module=module, name=missing))
                continue
            if rest[:1] == ["broadcast_global_variables"]:
                yield Note(top.lineno, src.segment(top), _GRAPH_ONLY)
            if bound != "horovod":
                continue
            prefix = top
            for _ in range(len(here[2])):
                prefix = prefix.value
            start, end = src.span(prefix)
            if src.text[start:end] != here[0]:
                yield Note(top.lineno, src.segment(top),
                           f"rewrite {here[0]} as {here[1]} here by hand")
                continue
            yield Change(top.lineno, *src.span(top), _WHY.format(new=here[1], old=here[0]),
                         [Edit(start, end, here[1])])
