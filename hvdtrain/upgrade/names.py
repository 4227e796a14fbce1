"""What a script's names stand for, read from its syntax tree alone (no import runs): the
modules its imports bind, what assignments made of a name (an optimizer, a metric), the
literal a path argument comes from. Scopes are not tracked: a script's names are taken to
mean one thing throughout, which is how training scripts are written."""
from __future__ import annotations

import ast

from hvdtrain.upgrade.source import Source

#: Keras optimizer classes, for names imported bare (``from keras.optimizers import Adam``
#: reads as ``keras.optimizers.Adam`` anyway; this covers star imports).
OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "Nadam",
                        "RMSprop", "Ftrl", "Lion", "Adafactor", "Lamb", "Muon"})


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_name(node: ast.AST) -> str | None:
    """The last part of a name or attribute chain (``Adam`` of ``tf.keras.optimizers.Adam``)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


class Module:
    """One parsed script: its source, tree, parents, import bindings and assignments."""

    def __init__(self, source: Source, tree: ast.Module) -> None:
        self.source = source
        self.tree = tree
        self.nodes = list(ast.walk(tree))
        self.parent: dict[ast.AST, ast.AST] = {}
        self.bindings: dict[str, str] = {}    # local name -> what it imports, dotted
        self.stars: list[str] = []            # modules imported with ``*``
        self.assigned: dict[str, list[ast.AST]] = {}  # dotted target -> assigned values
        self.loops: dict[str, list[ast.AST]] = {}     # for-loop target -> iterables
        self.argparse: dict[str, ast.AST] = {}        # args attribute -> its default
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            self._read(node)

    def _read(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.bindings[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.bindings[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                if alias.name == "*":
                    self.stars.append(node.module)
                else:
                    self.bindings[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                name = dotted(target)
                if name:
                    self.assigned.setdefault(name, []).append(node.value)
        elif isinstance(node, ast.For):
            name = dotted(node.target)
            if name:
                self.loops.setdefault(name, []).append(node.iter)
        elif (isinstance(node, ast.Call) and last_name(node.func) == "add_argument"
              and node.args):
            self._read_argument(node)

    def _read_argument(self, call: ast.Call) -> None:
        """``parser.add_argument('--checkpoint-format', default=...)``: ``args.X``'s value."""
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if "default" not in keywords:
            return
        dest = keywords.get("dest")
        if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
            self.argparse[dest.value] = keywords["default"]
            return
        flags = [a.value for a in call.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [f for f in flags if f.startswith("--")] or flags
        if longs:
            self.argparse[longs[0].lstrip("-").replace("-", "_")] = keywords["default"]

    def qualified(self, node: ast.AST) -> str | None:
        """A chain with its first name replaced by what the script imported under it:
        ``tf.keras.optimizers.Adam`` -> ``tensorflow.keras.optimizers.Adam``."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head in self.bindings:
            head = self.bindings[head]
        elif head == "tf":  # a snippet's or a star import's ``tf`` is TensorFlow
            head = "tensorflow"
        elif head in OPTIMIZERS and any("optimizers" in m.split(".") for m in self.stars):
            head = next(m for m in self.stars if "optimizers" in m.split(".")) + "." + head
        return f"{head}.{rest}" if rest else head

    def is_optimizer_class(self, func: ast.AST) -> bool:
        """Whether ``func`` names a Keras optimizer class (``keras.optimizers.Adam``, ``tf.
        optimizers.SGD``, ``keras.optimizers.legacy.Adam``), not a schedule."""
        name = self.qualified(func) or ""
        parts = name.split(".")
        return ("optimizers" in parts[:-1] and "schedules" not in parts
                and parts[-1][:1].isupper() and parts[-1] != "Optimizer")

    def kind(self, node: ast.AST) -> str | None:
        """``"optimizer"``, ``"metric"`` or None: what ``node`` plausibly holds, from what
        was assigned to it, the loop it comes from, or its name."""
        if isinstance(node, ast.Call):
            return self._made_by(node)
        if isinstance(node, ast.Subscript):
            inner = last_name(node.value) or ""
            return "metric" if inner == "metrics" else None
        name = dotted(node)
        if name is None:
            return None
        for value in self.assigned.get(name, []):
            made = self._made_by(value) if isinstance(value, ast.Call) else None
            if made:
                return made
        if any(last_name(it) == "metrics" for it in self.loops.get(name, [])):
            return "metric"
        word = name.rpartition(".")[2].lower()
        if ("optimizer" in word or "optimiser" in word or word in ("opt", "optim")
                or word.startswith("opt_") or word.endswith("_opt")):
            return "optimizer"
        return "metric" if "metric" in word else None

    def _made_by(self, call: ast.Call) -> str | None:
        if self.is_optimizer_class(call.func) or last_name(call.func) == "DistributedOptimizer":
            return "optimizer"
        parts = (self.qualified(call.func) or "").split(".")
        if "metrics" in parts[:-1] and parts[-1][:1].isupper():
            return "metric"
        return None

    def literal(self, node: ast.AST, depth: int = 0) -> ast.AST | None:
        """The string literal that ends the path ``node`` makes, followed through
        ``os.path.join``, ``+``, ``%``, ``.format``, a name assigned once and an argparse
        default; None when there is none to follow."""
        if depth > 6 or node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node
        if isinstance(node, ast.JoinedStr):
            return node
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "format":
                return self.literal(node.func.value, depth + 1)
            if node.func.attr == "join" and (dotted(node.func) or "").endswith("path.join"):
                return self.literal(node.args[-1], depth + 1) if node.args else None
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Add):
                return self.literal(node.right, depth + 1)
            if isinstance(node.op, ast.Mod):
                return self.literal(node.left, depth + 1)
        if isinstance(node, ast.Name):
            values = self.assigned.get(node.id, [])
            return self.literal(values[0], depth + 1) if len(values) == 1 else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.literal(self.argparse.get(node.attr), depth + 1)
        return None
