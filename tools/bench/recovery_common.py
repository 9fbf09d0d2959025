"""What tools/bench/vpipe_recovery.py and dynpipe_recovery.py share: running `strata train` on
local ranks or on MPI ranks (one process per rank, so each reads its own /proc counters), the
emulated-device mode, the per-step times, and a balanced start partition measured on this machine.

Modes (--modes):
  emulated  every rank an emulated device (--inject "kind=device,factor=X"): each layer's forward
            and backward lasts X times its CPU time, the rank sleeping the rest, so compute is a
            small duty cycle of the cores and ranks sharing few cores act like devices of their
            own; an injected slowdown multiplies on top (slow: its factor; load: threads + 1, the
            load's threads still spinning). Meant to be robust to other jobs on the machine as
            long as a layer's wall time stays below X times its CPU time.
  real      the plain run: ranks compute at the cores' speed and share them (the run is bound by
            the cores' total compute when there are fewer cores than ranks).
"""
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "self,vader", "OMPI_MCA_mpi_yield_when_idle": "1"}


def launcher(ranks, n):
    """The command prefix and the arguments of `strata train` for `n` ranks: 'mpi' (mpirun
    --oversubscribe -np n, one process per rank) or 'local' (threads of one process, --local)."""
    if ranks == "local":
        return [], ["--local"]
    if ranks != "mpi":
        sys.exit("--ranks must be mpi or local, got " + ranks)
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("--ranks mpi: mpirun is not on PATH (or pass --ranks local)")
    return [mpirun, "--oversubscribe", "-np", str(n)], []


def run(strata, args, metrics, prefix=()):
    cmd = list(prefix) + [strata, "train"] + args + ["--metrics", metrics, "--progress", "off",
                                                     "--log-every", "1"]
    env = dict(os.environ)
    if prefix:
        env.update(MPI_ENV)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stdout[-3000:])
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_times(records):
    """Per step (counted from 1): seconds, from the train records' elapsed time."""
    train = sorted((r for r in records if r["type"] == "train"), key=lambda r: r["step"])
    out, last = {}, 0.0
    for r in train:
        out[r["step"]] = r["elapsed_s"] - last
        last = r["elapsed_s"]
    return out


def device_spec(mode, factor):
    """The --inject spec of a mode ('' for real)."""
    if mode == "real":
        return ""
    if mode != "emulated":
        sys.exit("unknown mode " + mode + " (emulated, real)")
    return "kind=device,factor=%g" % factor


def join_specs(*specs):
    return "; ".join(s for s in specs if s)


def partition_string(cuts, names):
    """--partition text of the stages [cuts[i], cuts[i + 1])."""
    out = []
    for b, e in zip(cuts[:-1], cuts[1:]):
        out.append(names[b] if e - b == 1 else "%s-%s" % (names[b], names[e - 1]))
    return ",".join(out)


def balanced_cuts(costs, stages):
    """The contiguous partition of `costs` into `stages` non-empty stages whose slowest stage is
    the least (exhaustive; ties: the first found), as boundaries [0, ..., len(costs)]."""
    n = len(costs)
    best, best_cuts = None, None
    for inner in itertools.combinations(range(1, n), stages - 1):
        cuts = [0] + list(inner) + [n]
        slowest = max(sum(costs[b:e]) for b, e in zip(cuts[:-1], cuts[1:]))
        if best is None or slowest < best - 1e-15:
            best, best_cuts = slowest, cuts
    return best_cuts, best


def measure_balanced(strata, base, inject, prefix, names, stages, steps, every, tmp, tag,
                     repeats=1):
    """A balanced start, measured: runs of `steps` steps with --repartition pipedream-re every
    `every` steps (its records carry the per-layer seconds per step of each window, on whatever
    stage ran the layer), the median of each layer's windows, and the contiguous partition of
    those costs with the least slowest stage. Returns (partition text, per-layer ms, slowest ms)."""
    samples = [[] for _ in names]
    for rep in range(repeats):
        args = base + ["--steps", str(steps), "--repartition", "pipedream-re",
                       "--repartition-every", str(every), "--migration", "restart"]
        if inject:
            args += ["--inject", inject]
        recs = run(strata, args, os.path.join(tmp, "probe_%s_%d.jsonl" % (tag, rep)), prefix)
        for r in recs:
            if r["type"] == "repartition" and len(r["layer_seconds"]) == len(names):
                for l, t in enumerate(r["layer_seconds"]):
                    samples[l].append(t)
    if not samples[0]:
        sys.exit("the probe run made no repartition record: raise its steps")
    costs = [statistics.median(s) for s in samples]
    cuts, slowest = balanced_cuts(costs, stages)
    return partition_string(cuts, names), [1e3 * c for c in costs], 1e3 * slowest


def start_mode(a, mode, common, prefix, names, stages, tmp):
    """Prints the mode's header and returns (the --inject spec of its emulated device or "", the
    start partition, the per-layer ms per step): a.partition, or with "measured" the balanced one
    measure_balanced finds and the costs it measured (None for a given partition)."""
    device = device_spec(mode, a.device_factor)
    print("== mode %s: %s; ranks: %s ==" % (
        mode, "every rank an emulated device (--inject \"%s\"): a layer lasts %g x its CPU "
        "time, the slowdowns multiply on top" % (device, a.device_factor)
        if device else "ranks compute at the cores' speed and share this machine's cores",
        "MPI, one process per rank (mpirun --oversubscribe -np %d)" % stages if prefix else
        "local (threads of one process)"))
    print("load average at start: %s" % loadavg())
    partition, costs = a.partition, None
    if partition == "measured":
        partition, costs, slowest = measure_balanced(
            a.strata, common, device, prefix, names, stages, a.probe_steps, 10, tmp, mode,
            a.probe_runs)
        print("start partition %s: balanced on the measured per-step layer ms (%s), slowest "
              "stage %.2f ms/step (medians over the windows of %d pipedream-re probe runs of "
              "%d steps)" % (partition, " ".join("%s %.2f" % (n, c) for n, c in
                                                 zip(names, costs)), slowest, a.probe_runs,
                             a.probe_steps))
    return device, partition, costs


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])
