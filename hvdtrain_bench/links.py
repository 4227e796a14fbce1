"""``hvdtrain bench --hosts N --link RATE ...``: the loops on an emulated cluster, against
the wire's limit and the cost model.

Each host is a Linux network namespace (:mod:`hvdtrain_bench.netns`) whose link is shaped
with ``tc tbf`` on both ends of its veth pair, so compute (one core's threads per host)
and the wire are separate resources, as on a GPU cluster. The bench:

1. measures each loop's one-rank compute, unshaped: one rank alone on one core (the
   wire's limit), and ``N`` one-rank jobs at once, each on its host's core (the cost
   model's compute; it checks the premise that the hosts' computations do not slow
   each other down through the caches and memory they share);
2. brings up the hosts, and for each rate shapes every link, times Horovod's all-reduce
   between the hosts (the probe: the cost model's exchange time per size) and runs every
   loop with one rank per host, each host pinned to a core of its own
   (``HVDT_NETNS_PIN``; ``horovodrun --gloo`` by default, or ``mpirun`` over ``hvdt0``;
   MultiWorkerMirrored workers through ``TF_CONFIG`` on the hosts' addresses),
   alternating the order of the loops between repeats; with the optimizer state sharded
   (``shard_optimizer``), the Trainer runs both unsharded (``trainer``) and sharded
   (``trainer_sharded``), back to back (:func:`link_loops`);
3. reports per rate the wire's limit, each loop's samples/s, its ratio to the limit and
   to the Trainer, and the cost model's prediction, and the sharded Trainer's samples/s
   over the unsharded one's (:mod:`hvdtrain_bench.link_figures`, which also formats the
   report).

Needs root (network namespaces, ``tc``). TensorFlow loads in this process only for
the default bucket size (``hvdtrain.options``); the jobs run in their own processes.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from hvdtrain.threads import usable_cpu_ids
from hvdtrain_bench import perf_model
from hvdtrain_bench.jobs import Process, run_job, shown_command
from hvdtrain_bench.launch import worker_command
from hvdtrain_bench.link_figures import (SHARDED_TRAINER, figures, parse_rate, predict,
                                         sharded_ratio, wire_limit)
from hvdtrain_bench.netns import (DEFAULT_BURST, DEFAULT_LATENCY, IFACE, PREFIX, SUBNET,
                                  namespace_hosts, rsh_agent, set_link, veth_bytes)
from hvdtrain_bench.settings import (BASELINE_MODES, DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLES,
                                     DEFAULT_MODEL, DEFAULT_SEED, DEFAULT_STEPS,
                                     DEFAULT_TIMEOUT, DEFAULT_WARMUP, LAUNCHERS, MODELS,
                                     check_job_arguments, param_counts)

#: The loops ``--hosts`` runs, all by default.
LINK_MODES = ("trainer", "plain", "pertensor", "fit", "mwms")
#: Each emulated host has one core: every loop's ranks get one TensorFlow intra-op
#: thread (the baselines keep these, which are the user's settings, not hvdtrain's).
HOST_ENV = {"HVDTRAIN_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "2"}
#: netns_rsh.sh pins what runs on host i to a core of its own (the emulation's premise).
PIN_ENV = {"HVDT_NETNS_PIN": "1"}
#: Horovod's launcher across the hosts: Gloo's all-reduce of the MLP's 5.1 MB reached 0.96
#: of a 500 Mbit/s link where Open MPI's default (ring) reached 0.69 (docs/performance.md).
DEFAULT_HOSTS_LAUNCHER = "horovodrun"
MWMS_PORT = 23456


# --------------------------------------------------------------------------- the hosts
def check_root() -> None:
    """Raises RuntimeError unless this process may make namespaces and shape links."""
    if os.geteuid() != 0:
        raise RuntimeError("hvdtrain bench --hosts needs root: it makes network namespaces "
                           "(ip netns add) and shapes their links (tc); run it as root")
    for tool in ("ip", "tc", "mpirun"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"hvdtrain bench --hosts needs `{tool}` on PATH "
                               "(iproute2 / openmpi-bin)")


# --------------------------------------------------------------------------- the loops
def link_loops(modes: Sequence[str], options: dict) -> list[str]:
    """The loops (the report's rows) of a run of ``modes`` with ``options``: ``modes``,
    and :data:`SHARDED_TRAINER` right after ``trainer`` when ``options`` shard the
    optimizer state (so the two run back to back in every repeat)."""
    loops = list(dict.fromkeys(modes))
    if options.get("shard_optimizer") and "trainer" in loops:
        loops.insert(loops.index("trainer") + 1, SHARDED_TRAINER)
    return loops


def loop_job(loop: str, options: dict) -> tuple[str, dict]:
    """``(worker mode, options)`` of a loop: :data:`SHARDED_TRAINER` is the Trainer with
    ``shard_optimizer=True``; ``trainer`` is the Trainer without it (its unsharded row);
    a hand-written baseline keeps stock settings (no options); any other loop (``fit``
    too) is its own mode with ``options``."""
    if loop == SHARDED_TRAINER:
        return "trainer", {**options, "shard_optimizer": True}
    if loop == "trainer":
        return "trainer", {k: v for k, v in options.items() if k != "shard_optimizer"}
    return loop, {} if loop in BASELINE_MODES else options


# --------------------------------------------------------------------------- the jobs
def across_hosts(worker: list[str], n: int, launcher: str, hostfile: str,
                 fake_bin: str) -> Process:
    """One rank of ``worker`` per namespace host under ``launcher``.

    ``mpirun`` starts its daemons through the rsh agent and keeps every byte on ``hvdt0``;
    ``horovodrun --gloo -H`` finds the agent as ``ssh`` in ``fake_bin``.
    """
    env = {**HOST_ENV, **PIN_ENV}
    if launcher == "mpirun":
        cmd = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--hostfile",
               hostfile, "-np", str(n), "--map-by", "node", "--bind-to", "none",
               "--mca", "plm_rsh_agent", str(rsh_agent()), "--mca", "oob_tcp_if_include", IFACE,
               "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", IFACE]
        for var in ("PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "PYTHONUNBUFFERED", *HOST_ENV):
            cmd += ["-x", var]
        return cmd + worker, env
    if launcher == "horovodrun":
        horovodrun = shutil.which("horovodrun", path=str(Path(worker[0]).parent)) \
            or shutil.which("horovodrun") or "horovodrun"
        hosts = ",".join(f"{PREFIX}{i}:1" for i in range(1, n + 1))
        env["PATH"] = fake_bin + os.pathsep + os.environ.get("PATH", "")
        return [horovodrun, "--gloo", "-np", str(n), "-H", hosts, "--network-interface",
                IFACE, *worker], env
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


def mwms_on_hosts(worker: list[str], n: int, port: int) -> list[Process]:
    """``n`` MultiWorkerMirrored workers, worker ``i`` on host ``i + 1``, finding each
    other through ``TF_CONFIG`` on the hosts' addresses."""
    hosts = [f"{SUBNET}.{10 + i}:{port}" for i in range(1, n + 1)]
    def tf_config(i: int) -> str:
        return json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}})
    return [(["sh", str(rsh_agent()), f"{PREFIX}{i + 1}", shlex.join(worker)],
             {**HOST_ENV, **PIN_ENV, "TF_CONFIG": tf_config(i)}) for i in range(n)]


def one_core(worker: list[str], index: int = 0) -> Process:
    """``worker`` on the ``index``-th usable core (wrapping around), unshaped: one rank's
    compute."""
    cpus = usable_cpu_ids()
    core = str(cpus[index % len(cpus)])
    cmd = ["taskset", "-c", core, *worker] if shutil.which("taskset") else worker
    return cmd, dict(HOST_ENV)


# --------------------------------------------------------------------------- the run
def _check(hosts: int, links: Sequence[str], modes: Sequence[str], models: Sequence[str],
           launcher: str, burst: str, latency: str, **positive: int) -> None:
    """Raises ValueError naming the first bad argument of :func:`run_link_bench`."""
    if not re.fullmatch(r"\d+(kb|mb|b)", str(burst)):
        raise ValueError(f"burst must be a tc size such as 512kb, 4mb or 65536b, got {burst!r}")
    if not re.fullmatch(r"\d+(\.\d+)?(us|ms|s)", str(latency)):
        raise ValueError(f"latency must be a tc time such as 100ms, 5ms or 500us, "
                         f"got {latency!r}")
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 2:
        raise ValueError(f"hosts must be an integer >= 2 (one rank per host), got {hosts!r}")
    if not links:
        raise ValueError("links must name at least one rate (e.g. 2gbit, or none)")
    for link in links:
        parse_rate(link)
    check_job_arguments(launcher, modes, models, allowed_modes=LINK_MODES,
                        modes_note=" with --hosts", **positive)


class _Jobs:
    """Runs the jobs of one bench, keeping each job's command and the veth counters."""

    def __init__(self, tmp: str, hosts: int, timeout: float, cfg: dict):
        self.tmp, self.hosts, self.timeout, self.cfg = Path(tmp), hosts, timeout, cfg
        self.commands: dict[str, str] = {}
        self.count = 0

    def worker(self, loop: str, model: str, out: Path) -> list[str]:
        """The one-rank worker command of ``loop`` (``probe`` included; :func:`loop_job`)."""
        cfg = self.cfg
        mode, options = loop_job(loop, cfg["options"])
        return worker_command(1, mode, launcher="mpirun", steps=cfg["steps"],
                              warmup=cfg["warmup"], batch_size=cfg["batch_size"],
                              examples=cfg["examples"], seed=cfg["seed"], out=str(out),
                              options=options, model=model)

    def shown(self, procs: list[Process], out: Path | list[Path]) -> str:
        """:func:`shown_command`, with this machine's ``PATH`` as ``$PATH`` and the
        folder holding the ``ssh`` stand-in named for what it is."""
        text = shown_command(procs, out)
        if os.environ.get("PATH"):
            text = text.replace(os.environ["PATH"], "$PATH")
        return text.replace(self.cfg["fake_bin"], "<ssh=scripts/netns_rsh.sh>")

    def run(self, key: str, mode: str, model: str, where: str) -> dict:
        """Runs one job (``where``: ``"one_core"``, ``"cores"``: one one-rank job per host
        at once, each on its host's core, or ``"hosts"``); returns its result with
        ``wire_bytes_per_step``, what host 1 sent per step, start-up included (for
        ``"cores"``: the first job's result, its ``samples_per_s`` the jobs' mean)."""
        self.count += 1
        out = self.tmp / f"job{self.count}.json"
        if where == "cores":
            outs = [self.tmp / f"job{self.count}-{i}.json" for i in range(self.hosts)]
            procs = [one_core(self.worker(mode, model, o), i) for i, o in enumerate(outs)]
            self.commands.setdefault(key, self.shown(procs, outs))
            result = run_job(procs, outs[0], self.timeout, what=f"bench job {key!r}")
            rates = [json.loads(o.read_text())["samples_per_s"] for o in outs]
            return {**result, "samples_per_s": statistics.mean(rates), "each": rates}
        worker = self.worker(mode, model, out)
        if where == "one_core":
            procs = [one_core(worker)]
        elif mode == "mwms":
            procs = mwms_on_hosts(worker, self.hosts, MWMS_PORT + self.count % 1000)
        else:
            procs = [across_hosts(worker, self.hosts, self.cfg["launcher"],
                                  self.cfg["hostfile"], self.cfg["fake_bin"])]
        self.commands.setdefault(key, self.shown(procs, out))
        before = veth_bytes(self.hosts) if where == "hosts" else None
        result = run_job(procs, out, self.timeout, what=f"bench job {key!r}")
        if before is not None and mode != "probe":
            sent = veth_bytes(self.hosts)[0][0] - before[0][0]
            result["wire_bytes_per_step"] = sent / (self.cfg["steps"] + self.cfg["warmup"])
        return result


def run_link_bench(hosts: int = 2, links: Sequence[str] = ("2gbit",), *,
                   models: Sequence[str] = (DEFAULT_MODEL,), modes: Sequence[str] = LINK_MODES,
                   steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                   batch_size: int = DEFAULT_BATCH_SIZE, examples: int = DEFAULT_EXAMPLES,
                   seed: int = DEFAULT_SEED, repeats: int = 1, timeout: float = DEFAULT_TIMEOUT,
                   launcher: str = DEFAULT_HOSTS_LAUNCHER, burst: str = DEFAULT_BURST,
                   latency: str = DEFAULT_LATENCY, options: dict | None = None,
                   probe: bool = True,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Runs the emulated-cluster bench and returns its report (see :func:`format_table`).

    Args:
        hosts: namespace hosts, one rank each (>= 2).
        links: tc rates to measure, in order (``none``: unshaped veths).
        models, modes: what to train and which loops (``LINK_MODES``; with
            ``shard_optimizer`` in ``options``, also ``trainer_sharded``: :func:`link_loops`).
        steps, warmup, batch_size, examples, seed: as ``hvdtrain bench``.
        repeats: runs per (rate, model, loop), alternating the loops' order; medians.
        launcher: ``"horovodrun"`` (Gloo) or ``"mpirun"`` for the Horovod loops.
        burst, latency: the tbf bucket's burst and queue latency.
        options: Trainer / DistributedOptimizer options of the Trainer and ``fit``
            (``shard_optimizer`` only for ``trainer_sharded`` and ``fit``).
        probe: time Horovod's all-reduce between the hosts at each rate (the model's
            exchange times; without it the model takes the ring's time at the rate).

    Raises:
        ValueError: a bad argument, named.
        RuntimeError: not root, a tool missing, or a job failed (with its command).
    """
    links, models, modes = (list(dict.fromkeys(x)) for x in (links, models, modes))
    options = {k: v for k, v in (options or {}).items() if v is not None}
    _check(hosts, links, modes, models, launcher, burst, latency, steps=steps,
           batch_size=batch_size, repeats=repeats, examples=examples)
    check_root()
    loops = link_loops(modes, options)
    from hvdtrain.options import DEFAULT_BUCKET_MB

    bucket_mb = float(options.get("bucket_mb") or DEFAULT_BUCKET_MB)
    cfg = dict(steps=steps, warmup=warmup, batch_size=batch_size, examples=examples,
               seed=seed, options=options, launcher=launcher)
    def say(line: str) -> None:  # with the time: a run shares the machine with whatever runs
        if progress:
            progress(time.strftime("%H:%M:%S ") + line)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-links-") as tmp:
        cfg.update(hostfile=str(Path(tmp) / "hostfile"), fake_bin=str(Path(tmp) / "bin"))
        Path(cfg["fake_bin"]).mkdir()
        (Path(cfg["fake_bin"]) / "ssh").symlink_to(rsh_agent())
        jobs = _Jobs(tmp, hosts, timeout, cfg)
        compute = _one_rank_compute(jobs, models, loops, repeats, say)
        sections = []
        with namespace_hosts(hosts, cfg["hostfile"]):
            for link in links:
                set_link(link, burst, latency)
                probes = _probe(jobs, link, say) if probe else None
                for model in models:
                    sections.append(_section(jobs, link, model, loops, repeats, probes,
                                             compute[model], bucket_mb, say))
    cfg = {k: v for k, v in cfg.items() if k not in ("hostfile", "fake_bin")}
    cfg.update(hosts=hosts, links=links, models=models, modes=modes, loops=loops,
               repeats=repeats, burst=burst, latency=latency, bucket_mb=bucket_mb, host_env=HOST_ENV,
               cpu_count=os.cpu_count())
    report = {"benchmark": "; ".join(MODELS[m].title for m in models), "config": cfg,
              "compute": compute, "sections": sections, "commands": jobs.commands}
    report["figures"] = figures(report)
    return report


def _one_rank_compute(jobs: _Jobs, models, modes, repeats: int, say) -> dict:
    """Per model and loop: the median one-rank step time, unshaped, one rank alone on one
    core (``step_s``) and ``hosts`` one-rank jobs at once, one per core
    (``together_step_s``); the sharded Trainer's is the Trainer's."""
    compute: dict = {}
    batch = jobs.cfg["batch_size"]
    for model in models:
        compute[model] = {}
        for mode in modes:
            if mode == SHARDED_TRAINER and "trainer" in compute[model]:
                # One rank has nothing to shard over: shard_optimizer=True leaves the
                # optimizer whole at np=1, so this loop's compute is the Trainer's.
                compute[model][mode] = dict(compute[model]["trainer"])
                continue
            key, key_n = f"compute {model} {mode}", f"compute {model} {mode} x{jobs.hosts}"
            runs, together = [], []
            for _ in range(repeats):
                runs.append(jobs.run(key, mode, model, "one_core"))
                together.append(jobs.run(key_n, mode, model, "cores"))
            sps = statistics.median(r["samples_per_s"] for r in runs)
            sps_n = statistics.median(r["samples_per_s"] for r in together)
            compute[model][mode] = {"samples_per_s": sps, "step_s": batch / sps,
                                    "together_samples_per_s": sps_n,
                                    "together_step_s": batch / sps_n,
                                    "command": jobs.commands[key],
                                    "together_command": jobs.commands[key_n]}
            say(f"  one rank, one core: {model} {mode:<9} {sps:,.0f} samples/s "
                f"({batch / sps * 1e3:.2f} ms a step); {jobs.hosts} at once, one per core: "
                f"{sps_n:,.0f} ({batch / sps_n * 1e3:.2f} ms)")
    return compute


def _probe(jobs: _Jobs, link: str, say) -> dict:
    """Horovod's all-reduce between the hosts at this rate, and the link fitted to it."""
    key = f"{link} probe"
    probes = jobs.run(key, "probe", DEFAULT_MODEL, "hosts")["probes"]
    fitted = perf_model.fit_link(probes)
    say(f"  {link} all-reduce probes: " + ", ".join(
        f"{p['bytes'] / 1e6:.3g} MB {p['seconds'] * 1e3:.2f} ms" for p in probes)
        + f" (fit: {fitted['latency_s'] * 1e3:.2f} ms a message, "
          f"{fitted['bandwidth_Bps'] * 8 / 1e9:.2f} Gbit/s)")
    return {"probes": probes, "fit": fitted, "command": jobs.commands[key]}


def _section(jobs: _Jobs, link: str, model: str, modes, repeats: int, probes: dict | None,
             compute: dict, bucket_mb: float, say) -> dict:
    """One rate and model: every loop, alternated over the repeats, against the limit."""
    cfg = jobs.cfg
    rate = parse_rate(link)
    nbytes = 4.0 * sum(param_counts(model))
    global_batch = cfg["batch_size"] * jobs.hosts
    fastest = min(c["step_s"] for c in compute.values())
    limit = wire_limit(nbytes, rate, fastest, global_batch, jobs.hosts)
    latency = probes["fit"]["latency_s"] if probes else 0.0
    runs: dict = {m: [] for m in modes}
    for rep in range(repeats):
        for mode in (modes if rep % 2 == 0 else modes[::-1]):
            result = jobs.run(f"{link} {model} {mode}", mode, model, "hosts")
            if result["np"] != jobs.hosts:
                raise RuntimeError(f"asked for {jobs.hosts} ranks, the {mode} job ran "
                                   f"{result['np']}")
            runs[mode].append(result)
            say(f"  {link} {model} {mode:<9} repeat {rep + 1}/{repeats}: "
                f"{result['samples_per_s']:,.0f} samples/s")
    loops = {}
    for mode in modes:
        sps = statistics.median(r["samples_per_s"] for r in runs[mode])
        wire = [r.get("wire_bytes_per_step") for r in runs[mode]]
        pred = predict(mode, model, compute[mode]["together_step_s"], rate,
                       probes["probes"] if probes else None, bucket_mb, global_batch,
                       jobs.hosts)
        loops[mode] = {
            "samples_per_s": sps, "runs": [r["samples_per_s"] for r in runs[mode]],
            "step_s": global_batch / sps,
            "ratio_to_limit": sps / limit["limit_samples_per_s"],
            "predicted": pred,
            "measured_over_predicted": (sps / pred["samples_per_s"]
                                        if pred["samples_per_s"] else None),
            "wire_bytes_per_step": statistics.median(wire) if None not in wire else None,
            "final_loss": runs[mode][-1]["final_loss"],
            "options": loop_job(mode, cfg["options"])[1],
            "command": jobs.commands[f"{link} {model} {mode}"]}
    trainer = loops.get("trainer", {}).get("samples_per_s")
    for row in loops.values():
        row["ratio_to_trainer"] = row["samples_per_s"] / trainer if trainer else None
    sharded = sharded_ratio(loops)
    if sharded:
        say(f"  {link} {model} Trainer sharded / unsharded: {sharded['value']:.3f}")
    return {"link": link, "rate_bps": rate, "model": model, "bytes_per_step": nbytes,
            "global_batch": global_batch, **limit, "latency_s": latency,
            "probe": probes, "loops": loops, "sharded_over_unsharded": sharded}
