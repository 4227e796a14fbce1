#!/usr/bin/env python
"""Runs Horovod TensorFlow 2 scripts written by others on 2 ranks, on hvdtrain.

The scripts are listed in ``scripts/corpus/manifest.toml`` (repository, path, commit, what to
pass). Nothing of theirs is in this repository: ``--snapshots DIR`` names a folder holding one
git directory per repository, ``DIR/owner+name`` (or ``DIR/owner+name/repo``), from which each
file is read at its commit. Each script runs in a temporary directory of its own under
``horovodrun -np 2 --gloo`` (this venv's), in one or both modes:

* ``a``: the script with only its ``horovod.tensorflow`` / ``horovod.tensorflow.keras`` import
  lines pointed at ``hvdtrain.tensorflow`` / ``hvdtrain.tensorflow.keras``;
* ``b``: the script as ``hvdtrain upgrade SCRIPT -o OUT`` rewrites it.

``tf.keras.datasets``' MNIST, Fashion-MNIST and CIFAR-10 are served offline by
``hvdtrain.datasets`` through the ``sitecustomize.py`` beside the manifest, copied into the
run's directory (never into the library); it also reports each rank's last ``fit`` metrics
and a digest of every model's weights at exit. One line is printed per script and mode: ran
(the final loss / accuracy found in the output, and whether both ranks ended with the same
weights) or failed (the last error line). ``--table FILE`` writes the results as a Markdown
table, ``--results FILE`` as JSON. It is slow (a minute or two a script) and not part of
``make test``.

    .venv/bin/python scripts/run_corpus.py --snapshots DIR [--mode a|b|ab] [--only ID ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
BIN = Path(sys.executable).parent
TAG = "[hvdtrain-corpus]"
MODES = {"a": "import line swapped", "b": "hvdtrain upgrade"}

_IMPORT = re.compile(r"^(\s*(?:import|from)\s+)horovod\.tensorflow\b", re.M)
_PREFIX = re.compile(r"^\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:(.*)$")
_METRIC = re.compile(r"(?<![\w])(loss|acc(?:uracy)?)\s*[:=]\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)",
                     re.I)
_ERROR = re.compile(r"^\s*((?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|"
                    r"Warning)|[\w.]*HorovodInternalError)(?::|$)")


# -- the scripts ---------------------------------------------------------------------------

def load_manifest(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        entries = tomllib.load(f)["script"]
    for e in entries:
        missing = {"id", "repository", "path", "commit", "style", "dataset"} - e.keys()
        if missing:
            raise SystemExit(f"{path}: entry {e.get('id', '?')} lacks {sorted(missing)}")
    return entries


def snapshot_dir(snapshots: Path, repository: str) -> Path:
    base = snapshots / repository.replace("/", "+")
    for d in (base / "repo", base):
        if (d / "HEAD").is_file() and (d / "objects").is_dir():
            return d
    raise FileNotFoundError(f"no snapshot of {repository} in {snapshots} "
                            f"(looked for {base.name}/repo and {base.name})")


def read_source(entry: dict, snapshots: Path) -> str:
    git_dir = snapshot_dir(snapshots, entry["repository"])
    proc = subprocess.run(["git", f"--git-dir={git_dir}", "show",
                           f"{entry['commit']}:{entry['path']}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise FileNotFoundError(f"{entry['repository']}@{entry['commit'][:10]}:{entry['path']}: "
                                f"{proc.stderr.strip()}")
    return proc.stdout


def extract(text: str, how: str | None) -> str:
    """The script itself; ``rst:NAME`` takes the code block whose ``:name:`` is NAME."""
    if not how:
        return text
    kind, _, name = how.partition(":")
    if kind != "rst":
        raise ValueError(f"unknown extract {how!r}")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == f":name: {name}":
            start = i + 1
            while start < len(lines) and (not lines[start].strip() or
                                          lines[start].strip().startswith(":")):
                start += 1
            indent = len(lines[start]) - len(lines[start].lstrip())
            end = start
            while end < len(lines) and (not lines[end].strip() or
                                        len(lines[end]) - len(lines[end].lstrip()) >= indent):
                end += 1
            return textwrap.dedent("\n".join(lines[start:end])) + "\n"
    raise ValueError(f"no code block named {name!r}")


def apply_replacements(text: str, entry: dict) -> str:
    for r in entry.get("replace", []):
        found, want = text.count(r["old"]), r.get("count", 1)
        if found != want:
            raise ValueError(f"replacement {r['old']!r} matches {found} times, expected {want}: "
                             f"the manifest is out of date for this commit")
        text = text.replace(r["old"], r["new"])
    return text


def swap_imports(text: str) -> str:
    """Mode a: ``horovod.tensorflow[.keras]`` -> ``hvdtrain.tensorflow[.keras]`` in import lines."""
    swapped, n = _IMPORT.subn(r"\1hvdtrain.tensorflow", text)
    if n == 0:
        raise ValueError("no `import horovod.tensorflow...` line to swap")
    return swapped


def prepare(entry: dict, mode: str, snapshots: Path, work: Path) -> Path:
    """Writes the script (and what its run needs) into ``work``; returns the script's path."""
    text = apply_replacements(extract(read_source(entry, snapshots), entry.get("extract")), entry)
    how = entry.get("extract") or ""
    name = how.partition(":")[2] if how else Path(entry["path"]).name
    script = work / (name if name.endswith(".py") else Path(name).stem + ".py")
    shutil.copy(CORPUS / "sitecustomize.py", work / "sitecustomize.py")
    for stub in entry.get("stubs", []):
        shutil.copy(CORPUS / "stubs" / f"{stub}.py", work / f"{stub}.py")
    if mode == "a":
        script.write_text(swap_imports(text))
        return script
    original = work / ("original_" + script.name)
    original.write_text(text)
    proc = subprocess.run([str(BIN / "hvdtrain"), "upgrade", str(original), "-o", str(script)],
                          capture_output=True, text=True, cwd=work, timeout=120)
    if proc.returncode != 0 or not script.is_file():
        out = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError("hvdtrain upgrade failed: " + (out[-1] if out else f"exit {proc.returncode}"))
    return script


# -- one run -------------------------------------------------------------------------------

def launch(entry: dict, script: Path, work: Path, np: int, timeout: float,
           data_dir: str | None) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           "HVDTRAIN_CORPUS": "1", "HVDTRAIN_NO_DOWNLOAD": "1",
           "KERAS_HOME": str(work / ".keras"), "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(work)] + ([os.environ["PYTHONPATH"]]
                                                         if os.environ.get("PYTHONPATH") else []))}
    if data_dir:
        env["HVDTRAIN_CORPUS_DATA_DIR"] = data_dir
    for k, v in entry.get("env", {}).items():
        env[k] = v
    cmd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           sys.executable, script.name, *entry.get("argv", [])]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        timed_out = True
    return {"returncode": proc.returncode, "timed_out": timed_out, "output": out,
            "seconds": round(time.monotonic() - start, 1)}


def per_rank_lines(output: str) -> dict[str, list[str]]:
    """Each rank's lines (``\\r``-separated progress updates split too); ``-`` the launcher's."""
    ranks: dict[str, list[str]] = {}
    for raw in output.splitlines():
        m = _PREFIX.match(raw)
        rank, text = (m.group(1), m.group(2)) if m else ("-", raw)
        for part in text.replace("\x08", "").split("\r"):
            if part.strip():
                ranks.setdefault(rank, []).append(part)
    return ranks


def analyse(run: dict, np: int) -> dict:
    ranks = per_rank_lines(run["output"])
    metrics, weights, fit = {}, {}, {}
    for rank, lines in ranks.items():
        for line in lines:
            if line.startswith(TAG):
                body = line[len(TAG):].split(None, 2)[-1]
                if body.startswith("weights "):
                    weights[rank] = body[len("weights "):]
                elif body.startswith("fit "):
                    fit[rank] = dict(kv.split("=", 1) for kv in body[4:].split())
                continue
            for name, value in _METRIC.findall(line):
                key = "loss" if name.lower() == "loss" else "accuracy"
                metrics.setdefault(rank, {})[key] = value
    result = {"seconds": run["seconds"], "returncode": run["returncode"]}
    if run["timed_out"] or run["returncode"] != 0:
        result["status"] = "failed"
        result["reason"] = (f"timed out after {run['seconds']:.0f} s" if run["timed_out"]
                            else last_error(run["output"]) or f"exit status {run['returncode']}")
        return result
    result["status"] = "ran"
    shown = {r: {**metrics.get(r, {}), **{k: fit[r][k] for k in ("loss", "accuracy")
                                         if k in fit.get(r, {})}}
             for r in sorted(set(metrics) | set(fit)) if r != "-"}
    result["final"] = shown
    digests = [weights.get(str(r)) for r in range(np)]
    if any(d is None or d == "none" or d.startswith("unavailable") for d in digests):
        result["weights_equal"] = None
    else:
        result["weights_equal"] = len(set(digests)) == 1
    stand_in = any("stands in for MNIST" in line for lines in ranks.values() for line in lines)
    result["data_note"] = "Fashion-MNIST standing in for MNIST" if stand_in else ""
    return result


def last_error(output: str) -> str | None:
    """The last exception line of the rank that failed first (warnings only where nothing
    else is): the ranks that fail after it fail because it did ("Horovod has been shut
    down")."""
    last: dict[str, tuple[int, str]] = {}
    warnings: dict[str, tuple[int, str]] = {}
    for i, raw in enumerate(output.splitlines()):
        m = _PREFIX.match(raw)
        rank, text = (m.group(1), m.group(2)) if m else ("-", raw)
        for part in text.replace("\x08", "").split("\r"):
            found = _ERROR.match(part)
            if not found or part.startswith(TAG):
                continue
            into = warnings if found.group(1).endswith("Warning") else last
            into[rank] = (i, part.strip())
    for seen in (last, warnings):
        ranked = {r: v for r, v in seen.items() if r != "-"} or seen
        if ranked:
            return min(ranked.values())[1]
    return None


def describe(result: dict) -> str:
    if result["status"] == "failed":
        return f"failed: {result['reason']}"
    finals = result.get("final", {})
    rank = "0" if "0" in finals else next(iter(finals), None)
    parts = []
    if rank is not None:
        vals = finals[rank]
        parts += [f"{k} {float(vals[k]):.4g}" for k in ("loss", "accuracy") if k in vals]
        others = {r: v for r, v in finals.items() if r != rank}
        if others:
            same = all(v.get("loss") == vals.get("loss") for v in others.values())
            parts.append("same on both ranks" if same else "per-rank values differ")
        else:
            parts.append(f"printed by rank {rank} only")
    equal = result.get("weights_equal")
    parts.append({True: "weights equal on all ranks", False: "WEIGHTS DIFFER between ranks",
                  None: "weights not compared"}[equal])
    if result.get("data_note"):
        parts.append(result["data_note"])
    return "ran: " + ", ".join(parts) + f" ({result['seconds']:.0f} s)"


# -- output --------------------------------------------------------------------------------

def markdown_table(entries: list[dict], results: dict, modes: str) -> str:
    head = ["Script (repository, path @ commit)", "Origin", "Style", "Data"]
    head += [f"({m}) {MODES[m]}" for m in modes]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        if e["id"] not in results:
            continue
        cells = [f"`{e['repository']}` `{e['path']}` @ `{e['commit'][:10]}`", e.get("origin", ""),
                 e["style"], e["dataset"]]
        cells += [results[e["id"]].get(m, {}).get("line", "not run") for m in modes]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--snapshots", type=Path, required=True,
                   help="folder holding the repositories' git directories (owner+name)")
    p.add_argument("--manifest", type=Path, default=CORPUS / "manifest.toml")
    p.add_argument("--mode", default="a", help="a, b or ab (default a)")
    p.add_argument("--only", nargs="*", help="ids of the scripts to run (default: all)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--timeout", type=float, default=420, help="seconds per run (default 420)")
    p.add_argument("--data-dir", help="folder with mnist/, fashion-mnist/, cifar10/ to serve "
                                      "instead of the places hvdtrain.datasets searches")
    p.add_argument("--keep", type=Path, help="keep each run's directory and output under here")
    p.add_argument("--table", type=Path, help="write the results as a Markdown table")
    p.add_argument("--results", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    if set(args.mode) - set(MODES):
        p.error(f"--mode {args.mode!r}: use a, b or ab")
    entries = load_manifest(args.manifest)
    if args.only:
        unknown = set(args.only) - {e["id"] for e in entries}
        if unknown:
            p.error(f"unknown ids {sorted(unknown)}")
        entries = [e for e in entries if e["id"] in args.only]
    results: dict = {}
    for e in entries:
        for mode in args.mode:
            work = Path(tempfile.mkdtemp(prefix=f"corpus-{e['id']}-{mode}-"))
            try:
                try:
                    script = prepare(e, mode, args.snapshots, work)
                except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as err:
                    res = {"status": "failed", "reason": f"not run: {err}", "seconds": 0}
                else:
                    run = launch(e, script, work, args.np, args.timeout, args.data_dir)
                    res = analyse(run, args.np)
                    if args.keep:
                        dest = args.keep / f"{e['id']}-{mode}"
                        shutil.rmtree(dest, ignore_errors=True)
                        shutil.copytree(work, dest, ignore=shutil.ignore_patterns("*.h5", "*.keras",
                                                                                  "ckpt*", "*.ckpt*"))
                        (dest / "output.txt").write_text(run["output"])
            finally:
                shutil.rmtree(work, ignore_errors=True)
            res["line"] = describe(res)
            results.setdefault(e["id"], {})[mode] = res
            print(f"{e['id']} ({mode}) {res['line']}", flush=True)
    if args.table:
        args.table.write_text(markdown_table(entries, results, args.mode))
    if args.results:
        args.results.write_text(json.dumps(results, indent=2) + "\n")
    ran = sum(r["status"] == "ran" for per in results.values() for r in per.values())
    total = sum(len(per) for per in results.values())
    print(f"{ran} of {total} runs ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
