"""Rules for the Keras 2 idioms a Horovod script carries that Keras 3 rejects: optimizer
``lr``, ``opt.variables()``, ``reset_states()`` on metrics, ``K.set_value``, ``compile``'s
``experimental_run_tf_function``, ``fit``'s ``workers`` and the ``*_generator`` methods,
legacy optimizers, sessions. (Checkpoint and save paths: :mod:`.keras3_files`.)"""
from __future__ import annotations

import ast
from typing import Iterator

from hvdtrain.upgrade import calls
from hvdtrain.upgrade.names import Module, dotted, last_name
from hvdtrain.upgrade.source import Change, Edit, Note

_LOADER = ("max_queue_size", "workers", "use_multiprocessing")
#: Keras 2's ``*_generator`` methods: Keras 3's name and the old positional parameters.
_GENERATORS = {
    "fit_generator": ("fit", ["x", "steps_per_epoch", "epochs", "verbose", "callbacks",
                              "validation_data", "validation_steps", "validation_freq",
                              "class_weight", "max_queue_size", "workers",
                              "use_multiprocessing", "shuffle", "initial_epoch"]),
    "evaluate_generator": ("evaluate", ["x", "steps", "callbacks", "max_queue_size",
                                        "workers", "use_multiprocessing", "verbose"]),
    "predict_generator": ("predict", ["x", "steps", "callbacks", "max_queue_size", "workers",
                                      "use_multiprocessing", "verbose"]),
}
_SESSION = ("Keras 3 has no sessions: pin the GPU with gpus = tf.config.list_physical_devices"
            "('GPU'); tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU') (and "
            "tf.config.experimental.set_memory_growth(gpu, True) for allow_growth)")
_TF1 = {"Session", "InteractiveSession", "ConfigProto"}


def rules(mod: Module) -> Iterator[Change | Note]:
    """Every change and note about Keras 2 idioms in ``mod``."""
    for node in mod.nodes:
        if isinstance(node, ast.Call):
            yield from _call(mod, node)
        elif isinstance(node, ast.Attribute):
            yield from _attribute(mod, node)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and node.module.endswith("optimizers.legacy"):
            yield from _legacy_import(mod, node)


def _rename_attr(mod: Module, node: ast.Attribute, new: str, why: str, line=None) -> Change:
    """The change of ``node``'s attribute name to ``new``."""
    start, end = mod.source.span(node)
    return Change(line or node.end_lineno, start, end, why,
                  [Edit(end - len(node.attr), end, new)])


def _attribute(mod: Module, node: ast.Attribute) -> Iterator[Change | Note]:
    src = mod.source
    if node.attr == "lr" and mod.kind(node.value) == "optimizer" \
            and src.segment(node).endswith("lr"):
        yield _rename_attr(mod, node, "learning_rate",
                           "Keras 3 optimizers have no `lr`, only `learning_rate`")
    elif node.attr == "legacy" and (dotted(node.value) or "").endswith("optimizers"):
        start, end = src.span(node.value)[1], src.span(node)[1]
        if src.text[start:end] == ".legacy":
            yield Change(node.lineno, *src.span(node), "Keras 3 has no legacy optimizers "
                         "(hvdtrain's DistributedOptimizer takes Keras 3 ones)",
                         [Edit(start, end, "")])
    elif node.attr in _TF1 and mod.qualified(node) in {f"tensorflow.{n}" for n in _TF1}:
        made = mod.parent.get(node)
        outer = mod.parent.get(made) if isinstance(made, ast.Call) else None
        if not (isinstance(outer, ast.Call) and last_name(outer.func) == "set_session"):
            yield Note(node.lineno, src.segment(node), "TensorFlow 1 API, gone from TF 2 "
                       f"(tf_upgrade_v2 rewrites TF 1 code); for Horovod's GPU pinning: "
                       + _SESSION.split(": ", 1)[1])


def _call(mod: Module, call: ast.Call) -> Iterator[Change | Note]:
    func, src = call.func, mod.source
    name = last_name(func)
    if mod.is_optimizer_class(func):
        yield from _optimizer(mod, call)
    elif name in ("set_value", "get_value", "get_session", "set_session") \
            and _is_backend(mod, func):
        yield from _backend(mod, call, name)
    elif not isinstance(func, ast.Attribute):
        return
    elif name == "reset_states" and not call.args and not call.keywords:
        if mod.kind(func.value) == "metric":
            yield _rename_attr(mod, func, "reset_state",
                               "Keras 3 metrics have reset_state(), not reset_states()")
        else:
            yield Note(call.lineno, src.segment(call), "if this is a Keras metric, call "
                       "reset_state() (Keras 3 metrics have no reset_states); a stateful "
                       "RNN layer keeps reset_states()")
    elif name == "variables" and not call.args and not call.keywords:
        if mod.kind(func.value) == "optimizer" and src.text[src.span(func)[1]:
                                                            src.span(call)[1]] == "()":
            yield Change(call.lineno, *src.span(call), "Keras 3 optimizers' `variables` is "
                         "a property (a list)", [Edit(src.span(func)[1], src.span(call)[1], "")])
        else:
            yield Note(call.lineno, src.segment(call), "on Keras 3 optimizers, layers and "
                       "models `variables` is a property (a list): drop the () if this is "
                       "one")
    elif name == "compile":
        yield from calls.drop_keywords(
            src, call, ("experimental_run_tf_function",), "Keras 3's compile() rejects it; "
            "its fit calls the optimizer, distributed or not, without it")
    elif name in ("fit", "evaluate", "predict"):
        yield from calls.drop_keywords(
            src, call, _LOADER, "Keras 3's fit/evaluate/predict reject it; a keras.utils."
            "PyDataset takes workers/use_multiprocessing/max_queue_size in its "
            "super().__init__()")
    elif name in _GENERATORS:
        yield from _generator(mod, call)


def _legacy_import(mod: Module, node: ast.ImportFrom) -> Iterator[Change]:
    src = mod.source
    start = src.module_start(node)
    if start is not None:
        end = start + len(node.module)
        yield Change(node.lineno, *src.span(node), "Keras 3 has no legacy optimizers",
                     [Edit(end - len(".legacy"), end, "")])


def _is_backend(mod: Module, func: ast.AST) -> bool:
    parts = (mod.qualified(func) or "").split(".")
    return len(parts) > 2 and parts[-2] == "backend" and parts[0] in ("keras", "tensorflow")


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _optimizer(mod: Module, call: ast.Call) -> Iterator[Change | Note]:
    src = mod.source
    lr = _keyword(call, "lr")
    if lr is not None:
        start = src.span(lr)[0]
        if _keyword(call, "learning_rate") is not None:
            yield Note(lr.lineno, src.segment(lr), "given with learning_rate=: keep one")
        elif src.text.startswith("lr", start):
            yield Change(lr.lineno, *src.span(lr), "Keras 3 optimizers take learning_rate=, "
                         "not lr=", [Edit(start, start + 2, "learning_rate")])
    decay = _keyword(call, "decay")
    if decay is not None:
        yield Note(decay.lineno, src.segment(decay), "Keras 3 optimizers ignore decay= (a "
                   "warning only): the same lr / (1 + decay * step) is learning_rate="
                   "keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1, "
                   "decay_rate=decay) (then no LearningRate*Callback may set the rate)")


def _backend(mod: Module, call: ast.Call, name: str) -> Iterator[Change | Note]:
    src, text = mod.source, mod.source.text
    if name in ("get_session", "set_session"):
        yield Note(call.lineno, src.segment(call), _SESSION)
        return
    want = 2 if name == "set_value" else 1
    if len(call.args) != want or call.keywords or not all(
            isinstance(a, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
            for a in call.args[:1]):
        yield Note(call.lineno, src.segment(call), f"keras.backend.{name} is gone and "
                   "tf.keras.backend's fails on Keras 3 variables: use var.assign(value) / "
                   "var.numpy()")
        return
    start, end = src.span(call)
    target = src.span(call.args[0])
    if "#" in text[start:target[0]] + text[target[1]:end]:
        yield Note(call.lineno, src.segment(call), "comments inside: rewrite by hand as "
                   "var.assign(value) / var.numpy()")
        return
    if name == "set_value":
        value = src.span(call.args[1])
        edits = [Edit(start, target[0], ""), Edit(target[1], value[0], ".assign(")]
        why = "Keras 3 has no keras.backend.set_value (tf.keras.backend's fails on its "\
              "variables): a variable's assign()"
    else:
        edits = [Edit(start, target[0], ""), Edit(target[1], end, ".numpy()")]
        why = "Keras 3 has no keras.backend.get_value: a variable's numpy()"
    yield Change(call.lineno, start, end, why, edits)


def _realign(mod: Module, call: ast.Call, shift: int, skip) -> list[Edit]:
    """Edits that keep the arguments on the call's later lines under its "(" once the
    name before it is ``shift`` characters shorter (not the lines of ``skip``, which go)."""
    src, text = mod.source, mod.source.text
    opening = src.span(call.func)[1]
    column = opening - src.line_start(opening) + 1
    edits = []
    for start, _, node in calls.items(src, call):
        line_start = src.line_start(start)
        if node in skip:
            continue
        if line_start > opening and start - line_start == column \
                and text[line_start:start] == " " * column:
            edits.append(Edit(line_start, line_start + shift, ""))
    return edits


def _generator(mod: Module, call: ast.Call) -> Iterator[Change | Note]:
    src = mod.source
    new, params = _GENERATORS[call.func.attr]
    if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(params):
        yield Note(call.lineno, src.segment(call.func), f"rename to {new}() and pass its "
                   "arguments by name (Keras 3's parameters are in another order)")
        return
    renamed = _rename_attr(mod, call.func, new, f"Keras 3 has no {call.func.attr}: {new}() "
                           "takes generators and PyDatasets", line=call.func.end_lineno)
    loader = {node for i, node in enumerate(call.args) if i and params[i] in _LOADER}
    loader |= {k for k in call.keywords if k.arg in _LOADER}
    renamed.edits += _realign(mod, call, len(call.func.attr) - len(new), loader)
    yield renamed
    generator = _keyword(call, "generator")
    if generator is not None:
        start = src.span(generator)[0]
        yield Change(generator.lineno, *src.span(generator), f"{new}() calls it x",
                     [Edit(start, start + len("generator"), "x")])
    spans = calls.items(src, call)
    dropped = []
    for i, (_, _, node) in enumerate(spans):
        if node in call.args[1:]:
            param = params[call.args.index(node)]
            if param in _LOADER:
                dropped.append(i)
            else:
                yield Change(node.lineno, *src.span(node), f"{new}()'s positional "
                             "parameters differ: passed by name",
                             [calls.name_positional(src, call, node, param)],
                             new=f"{param}={src.segment(node)}")
    yield from calls.drop_keywords(src, call, _LOADER, f"Keras 3's {new}() rejects it; a "
                                   "keras.utils.PyDataset takes it in its super().__init__()",
                                   dropped)
    if new != "fit" and _keyword(call, "verbose") is None and len(call.args) < 7:
        edit = calls.append_keyword(src, call, "verbose=0")
        yield Change(call.lineno, edit.start, edit.start, f"{call.func.attr} was silent "
                     f"by default, {new}() prints a progress bar", [edit], old="(added)",
                     new="verbose=0")
