"""Rules for the file names Keras 3 insists on: ``ModelCheckpoint`` writes ``.keras`` (or
``.weights.h5`` with ``save_weights_only``) and has no ``period``, ``save_weights`` writes
``.weights.h5``, ``save()`` has no ``save_format`` and no SavedModel. Weights that Keras 2
wrote as a TensorFlow checkpoint (``cp-{epoch}.ckpt`` with ``save_weights_only``, as in
TensorFlow's tutorials) go to ``.weights.h5``. A path literal that is rewritten is rewritten
wherever the script writes the same literal (the script that saves ``ckpt-{epoch}.h5``
usually loads it too)."""
from __future__ import annotations

import ast
import re
from typing import Iterator

from hvdtrain.upgrade import calls
from hvdtrain.upgrade.names import Module, last_name
from hvdtrain.upgrade.source import Change, Edit, Note

_EXT = re.compile(r"(\.weights)?\.(h5|hdf5|keras)(?=(?:'|\"|'''|\"\"\")$)")
# Keras 2 wrote weights to any other path as a TensorFlow checkpoint; these suffixes name one
_TF_CHECKPOINT = re.compile(r"\.(ckpt|tf)(?=(?:'|\"|'''|\"\"\")$)")
_LATEST = ("it was a TensorFlow checkpoint (.index and .data files) and Keras 3 writes one "
           "HDF5 file at this path: tf.train.latest_checkpoint does not find it; load it with "
           "model.load_weights(path)")
_CHECKPOINTS = ("ModelCheckpoint", "BestModelCheckpoint")
_SAVED_MODEL = ("Keras 3 saves only .keras (or legacy .h5) files: for a TensorFlow "
                "SavedModel call model.export(path) (inference only) or "
                "tf.saved_model.save(model, path)")
_PERIOD = ("it was every {n} epochs and Keras 3 has no every-N-epochs option: "
           "save_freq={n} * steps_per_epoch (an int counts batches, and a val_ monitor is "
           "then not available) or a callback that saves in on_epoch_end")


def rules(mod: Module) -> Iterator[Change | Note]:
    """Every change and note about checkpoint and save paths in ``mod``."""
    paths: list[tuple[ast.AST, Change]] = []
    for node in mod.nodes:
        if not isinstance(node, ast.Call):
            continue
        name = last_name(node.func)
        found: list = []
        if name in _CHECKPOINTS:
            found = list(_checkpoint(mod, node))
        elif name == "save_weights" and isinstance(node.func, ast.Attribute) and node.args:
            found = list(_path(mod, node, node.args[0], weights=True,
                               what="save_weights writes"))
        elif name in ("save", "save_model") and _is_keras_save(mod, node):
            found = list(_save(mod, node))
        for item in found:
            if isinstance(item, tuple):  # (a path literal, its change): seen again below
                paths.append(item)
                yield item[1]
            else:
                yield item
    yield from _same_literals(mod, paths)


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _is_keras_save(mod: Module, call: ast.Call) -> bool:
    """``model.save(path)``, ``keras.saving.save_model(model, path)`` (not numpy's or
    ``tf.saved_model``'s)."""
    name = mod.qualified(call.func) or ""
    if name.startswith(("numpy", "tensorflow.saved_model", "torch", "joblib", "pickle")):
        return False
    if last_name(call.func) == "save_model":
        return "keras" in name.split(".") and len(call.args) >= 2
    receiver = last_name(call.func.value) if isinstance(call.func, ast.Attribute) else None
    return bool(receiver and "model" in receiver.lower() and call.args)


def _checkpoint(mod: Module, call: ast.Call):
    src = mod.source
    period = _keyword(call, "period")
    if period is not None:
        if _keyword(call, "save_freq") is not None:
            yield Note(period.lineno, src.segment(period), "given with save_freq=: remove "
                       "period= (Keras 3 has no period)")
        else:
            value = period.value
            one = isinstance(value, ast.Constant) and value.value == 1
            quote = "'" if "'" in src.segment(call) and '"' not in src.segment(call) else '"'
            start, end = src.span(period)
            yield Change(period.lineno, start, end, "Keras 3's ModelCheckpoint has no "
                         "period; save_freq=\"epoch\" saves every epoch",
                         [Edit(start, end, f"save_freq={quote}epoch{quote}")],
                         check=None if one else _PERIOD.format(n=src.segment(value)))
    path = _keyword(call, "filepath")
    path = path.value if path is not None else (call.args[0] if call.args else None)
    if path is None:
        return
    only = _keyword(call, "save_weights_only")
    only = only.value if only is not None else (call.args[4] if len(call.args) > 4 else None)
    if only is not None and not isinstance(only, ast.Constant):
        yield Note(call.lineno, src.segment(only), "save_weights_only is not a literal: the "
                   "path must end in .weights.h5 when it is true, .keras when false")
        return
    weights = bool(only.value) if only is not None else False
    yield from _path(mod, call, path, weights=weights,
                     what=f"{last_name(call.func)}{' with save_weights_only' if weights else ''}"
                          " writes")


def _path(mod: Module, call: ast.Call, path: ast.AST, weights: bool, what: str):
    """The path ``path`` of ``call`` made to end in ``.weights.h5`` (``weights``) or
    ``.keras``; a (literal, change) pair, or a note."""
    src = mod.source
    want = ".weights.h5" if weights else ".keras"
    takes = "only .weights.h5" if weights else ".keras (or legacy .h5)"
    literal = mod.literal(path)
    if literal is None:
        yield Note(call.lineno, src.segment(path), f"Keras 3's {what} {takes} files: "
                   f"make sure this path ends in {want}")
        return
    text = src.segment(literal)
    found = _EXT.search(text)
    if found is None and weights:
        found = _TF_CHECKPOINT.search(text)
        if found is not None:
            latest = any(isinstance(n, ast.Call) and last_name(n.func) == "latest_checkpoint"
                         for n in mod.nodes)
            start = src.span(literal)[0] + found.start()
            why = (f"Keras 3's {what} only .weights.h5 files; Keras 2 wrote a TensorFlow "
                   f"checkpoint for {found.group(0)}")
            if literal.lineno != call.lineno:
                why += f"; the path of line {call.lineno}"
            yield literal, Change(literal.lineno, *src.span(literal), why,
                                  [Edit(start, start + len(found.group(0)), want)],
                                  check=_LATEST if latest else None)
            return
    if found is None:
        yield Note(literal.lineno, text, f"Keras 3's {what} {takes} files: end the path "
                   f"in {want}")
        return
    if found.group(0) == want or found.group(0) == ".weights.h5":
        return  # a full model under a .weights.h5 name: Keras 3 accepts it (as HDF5)
    start = src.span(literal)[0] + found.start()
    if weights:
        why = f"Keras 3's {what} only .weights.h5 files"
    elif found.group(0) == ".hdf5":
        why = f"Keras 3's {what} only .keras or .h5 files"
    else:
        why = ("Keras 3's own format is .keras: its .h5 is legacy HDF5, which load_model "
               "cannot always read back (hvd.load_model takes .keras)")
    if literal.lineno != call.lineno:
        why += f"; the path of line {call.lineno}"
    yield literal, Change(literal.lineno, *src.span(literal), why,
                          [Edit(start, start + len(found.group(0)), want)])


def _save(mod: Module, call: ast.Call):
    src = mod.source
    path = call.args[1] if last_name(call.func) == "save_model" else call.args[0]
    form = _keyword(call, "save_format")
    if form is None:
        literal = mod.literal(path)
        if literal is not None and isinstance(literal, ast.Constant) \
                and _EXT.search(src.segment(literal)) is None:
            yield Note(call.lineno, src.segment(path), _SAVED_MODEL + "; a Keras file "
                       "needs a .keras extension")
        return
    literal = mod.literal(path)
    found = _EXT.search(src.segment(literal)) if literal is not None else None
    value = form.value.value if isinstance(form.value, ast.Constant) else None
    if found is None or found.group(0) not in {"h5": (".h5", ".weights.h5"),
                                               "keras": (".keras",)}.get(value, ()):
        yield Note(form.lineno, src.segment(form), _SAVED_MODEL + "; remove save_format "
                   "and give the path the extension of the format")
        return
    yield from calls.drop_keywords(mod.source, call, ("save_format",), "Keras 3 infers "
                                   "the format from the path's extension and refuses "
                                   "save_format")


def _same_literals(mod: Module, paths) -> Iterator[Change]:
    """The same rewrite wherever the script writes a rewritten path literal again."""
    src = mod.source
    done = {id(literal) for literal, _ in paths}
    by_text = {}
    for literal, change in paths:
        by_text.setdefault(src.segment(literal), (literal, change))
    for node in mod.nodes:
        if id(node) in done or not isinstance(node, (ast.Constant, ast.JoinedStr)) \
                or isinstance(mod.parent.get(node), (ast.JoinedStr, ast.FormattedValue)):
            continue
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            continue
        text = src.segment(node)
        if text in by_text:
            literal, change = by_text[text]
            start = src.span(node)[0]
            offset = change.edits[0].start - src.span(literal)[0]
            edit = change.edits[0]
            done.add(id(node))
            yield Change(node.lineno, *src.span(node), f"the same path as line "
                         f"{literal.lineno}, rewritten there",
                         [Edit(start + offset, start + offset + edit.end - edit.start,
                               edit.new)])
