#!/usr/bin/env python3
"""DynPipe's recovery under injected interference (issue 15's "Must show"): one stage of 4 slowed
from step --from-step, with static async-1f1b against the three re-partition policies:

  static         --schedule async-1f1b (PipeDream), the start partition throughout
  pipedream-re   --repartition pipedream-re: PipeDream's partitioner on the measured layer costs,
                 every --epoch-steps steps (standing for an epoch of the subsampled data set), by
                 restart (the pipeline drains, the layers move, it starts again)
  dynpipe-no-rf  --repartition dynpipe-no-rf every --every steps: Algorithm 2 with each rank's
                 last measured slowdown
  dynpipe        --repartition dynpipe every --every steps with --slowdown-model (fitted on this
                 machine: strata profile --colocation + strata fit-slowdown) and the monitor
                 sampling every --monitor-ms (so the counters at the first decision after the
                 slowdown's start are the slowdown's, where the measured window still mixes the
                 steps before it)

All re-partitioning runs are async-1f1b with --migration restart: the pipeline drains only where
a policy moves layers (at the first step after the decision where the run can be cut), so a
policy that moves nothing runs as static does. Ranks (--ranks): mpi (default:
mpirun --oversubscribe -np 4, one process per rank, each reading its own /proc counters) or local
(threads of one process, sharing them). Modes (--modes, recovery_common.py): emulated (every rank
an emulated device, --inject "kind=device,factor=X": each layer lasts X times its CPU time, the
slowdowns multiply on top) and real (ranks at the cores' speed, sharing the cores). Workloads:

  slow   --inject "rank=R,from=F,kind=slow,factor=X": the rank computes X times slower (a sleep).
  load   --inject "rank=R,from=F,kind=load,threads=N": N threads spinning in rank R's process.
         real: they compete for the cores with every rank on this machine's few cores;
         emulated: they also share R's emulated device N + 1 ways (a factor N + 1 on its layers).

The start partition (--partition measured, the default) is balanced on this machine's measured
layer costs, per mode: --probe-runs runs with pipedream-re record each layer's time per step, and
the contiguous 4-stage partition of their medians with the least slowest stage is the start, so a
policy gains only by reacting to the slowdown (the "none" row shows what moving costs or gains
without one).

--systems picks the systems (default all: static,pipedream-re,dynpipe-no-rf,dynpipe). After the
table, for every dynpipe run, the forest's predicted slowdown of each stage beside the slowdown
the stage measured at each decision (from the decision records: the forest's own prediction,
before the measured floor of parallel/dynpipe/policy.h), and their mean absolute difference.

--threshold sets the policies' --repartition-threshold (default 0.05, strata's): a higher one
keeps them from moving on noise, and shows where dynpipe's fresh counters lead dynpipe-no-rf's
window (a load that began in the window's last steps measures a small slowdown over the window,
below the threshold, while the monitor's latest sample already carries the whole load).

--rank slowest slows the rank of the start partition's slowest stage (measured start only): the
heavy case, where the interference lengthens every iteration (the paper's Fig. 15/16: PipeDream's
iteration 1.2-3x longer); a rank of a cheaper stage is slowed without lengthening the iteration
as much, and moving its layers gains less.

Per system: the median seconds per step over the steps after --settle steps past the slowdown's
start, the mean seconds per step over the reaction (the --settle steps from the slowdown's start:
where a system that reacts earlier or better gains), the time (s) and step at which the mean loss
of the last --loss-window steps first falls to --target-loss, and the moves made; medians of
--repeats interleaved runs. Emulated mode, measured start: beside the measured step time, the
device cost model's (the "model" columns): per step, the slowest stage of the partition in effect
(the start, then each move's) with the probe's per-layer ms and the injected factor on the slowed
rank (slow: X; load: threads + 1), the steady-state cycle of async-1f1b on devices of their own.
It shows what each system's decisions are worth where ranks do not share this machine's cores
(on 2 cores a load's spinning threads slow every rank in the measured column, and no repartition
can escape that); moves' own costs (drain, transfer) are in the measured column only.

  tools/bench/dynpipe_recovery.py build/strata --model forest.json [--steps 160] [--repeats 3]
      [--workloads none,slow:3,slow:8,load] [--rank 1] [--modes emulated,real] [--ranks mpi]
"""
import argparse
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_common import (join_specs, launcher, loadavg, run, start_mode,  # noqa: E402
                             step_times as step_seconds)

NAMES = ["conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2", "flatten", "fc1",
         "relu3", "fc2"]


def train_records(records):
    return sorted((r for r in records if r["type"] == "train"), key=lambda r: r["step"])


def time_to_loss(records, target, window):
    train = train_records(records)
    for i in range(window - 1, len(train)):
        mean = sum(r["loss"] for r in train[i - window + 1:i + 1]) / window
        if mean <= target:
            return train[i]["elapsed_s"], train[i]["step"]
    return None, None


PREDICTED = re.compile(r"predicted slowdowns ([-0-9.e+,]+), measured ([-0-9.e+,]+)")


def forest_vs_measured(records):
    """Per decision of a dynpipe run: (step, predicted per stage, measured per stage)."""
    out = []
    for r in records:
        if r["type"] != "repartition":
            continue
        m = PREDICTED.search(r.get("reason", ""))
        if m:
            out.append((r["step"], [float(x) for x in m.group(1).split(",")],
                        [float(x) for x in m.group(2).split(",")]))
    return out


def ranges(partition):
    """--partition text (over NAMES) -> [(begin, end)] per stage."""
    out = []
    for piece in partition.split(","):
        first, _, last = piece.partition("-")
        out.append((NAMES.index(first), NAMES.index(last or first) + 1))
    return out


def stage_ms(partition, costs):
    return [sum(costs[b:e]) for b, e in ranges(partition)]


def modeled_steps(recs, start, costs, rank, from_step, factor):
    """Per step (from 1): the device cost model's seconds per step (module doc)."""
    moves = sorted((m for m in recs if m["type"] == "migration"), key=lambda m: m["step"])
    out, partition = {}, start
    steps = sorted(r["step"] for r in recs if r["type"] == "train")
    for step in steps:
        for m in moves:
            if m["step"] + 1 == step:  # moved before the loop's step m["step"] (from 0)
                partition = m["partition"]
        ms = stage_ms(partition, costs)
        if step >= from_step and rank < len(ms):
            ms[rank] *= factor
        out[step] = max(ms) / 1e3
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("strata")
    ap.add_argument("--model", required=True, help="the slowdown model (strata fit-slowdown)")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--from-step", type=int, default=15)
    ap.add_argument("--settle", type=int, default=25)
    ap.add_argument("--every", type=int, default=10, help="dynpipe's --repartition-every")
    ap.add_argument("--monitor-ms", type=float, default=100,
                    help="dynpipe's --monitor-interval-ms (the counters' freshness)")
    ap.add_argument("--epoch-steps", type=int, default=40, help="pipedream-re's 'epoch'")
    ap.add_argument("--threshold", type=float, default=0.05,
                    help="--repartition-threshold of the three policies (the least predicted gain)")
    ap.add_argument("--partition", default="measured",
                    help="the start: measured (balanced on the probe's layer costs) or a "
                         "--partition text")
    ap.add_argument("--probe-steps", type=int, default=60)
    ap.add_argument("--probe-runs", type=int, default=2)
    ap.add_argument("--rank", default="1",
                    help="the slowed rank, or 'slowest': the start partition's slowest stage's")
    ap.add_argument("--ranks", default="mpi", help="mpi (one process per rank) or local")
    ap.add_argument("--modes", default="emulated,real", help="emulated, real")
    ap.add_argument("--device-factor", type=float, default=8.0,
                    help="emulated: each layer lasts this many times its CPU time")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2, help="load threads")
    ap.add_argument("--target-loss", type=float, default=0.5)
    ap.add_argument("--loss-window", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-samples", type=int, default=16384)
    ap.add_argument("--workloads", default="none,slow:3,slow:8,load",
                    help="none, slow[:FACTOR], load")
    ap.add_argument("--systems", default="static,pipedream-re,dynpipe-no-rf,dynpipe",
                    help="the systems to run (static, pipedream-re, dynpipe-no-rf, dynpipe; "
                    "dynpipe-no-rf-live, dynpipe-live: the same policies moving live, without a "
                    "drain, instead of by --migration restart)")
    a = ap.parse_args()
    prefix, local = launcher(a.ranks, 4)
    common = ["--model", "cnn", "--size", "tiny", "--dataset", "fashion-mnist", "--train-samples",
              str(a.train_samples), "--test-samples", "64", "--stages", "4", "--threads", "1",
              "--batch-size", str(a.batch_size), "--micro-batches", str(a.micro_batches),
              "--seed", "1", "--schedule", "async-1f1b", "--optimizer", "sgd", "--lr", "0.02",
              "--momentum", "0.9"] + local
    f = a.from_step
    r = -1 if a.rank == "slowest" else int(a.rank)

    def spec(key):
        """none, slow:FACTOR (or slow: --factor), load (--threads)."""
        if key == "none":
            return "none", ""
        if key.startswith("slow"):
            x = float(key.split(":")[1]) if ":" in key else a.factor
            return ("slow (rank %d, factor %g)" % (r, x),
                    "rank=%d,from=%d,kind=slow,factor=%g" % (r, f, x))
        if key == "load":
            return ("load (rank %d, %d threads)" % (r, a.threads),
                    "rank=%d,from=%d,kind=load,threads=%d" % (r, f, a.threads))
        sys.exit("unknown workload " + key)
    gate = ["--repartition-threshold", "%g" % a.threshold]
    all_systems = [
        ("static async-1f1b", []),
        ("PipeDream-Re", ["--repartition", "pipedream-re", "--repartition-every",
                          str(a.epoch_steps), "--migration", "restart"] + gate),
        ("dynpipe-no-rf", ["--repartition", "dynpipe-no-rf", "--repartition-every", str(a.every),
                           "--migration", "restart"] + gate),
        ("dynpipe", ["--repartition", "dynpipe", "--repartition-every", str(a.every),
                     "--migration", "restart", "--slowdown-model", a.model,
                     "--monitor-interval-ms", "%g" % a.monitor_ms] + gate),
    ]
    # The dynpipe policies again, their moves live (vPIPE's hand-off inside the running pipeline).
    all_systems += [(name + " live", ["live" if x == "restart" else x for x in extra])
                    for name, extra in all_systems[2:]]
    keys = ["static", "pipedream-re", "dynpipe-no-rf", "dynpipe", "dynpipe-no-rf-live",
            "dynpipe-live"]
    chosen = a.systems.split(",")
    for c in chosen:
        if c not in keys:
            sys.exit("--systems: unknown system %s (valid: %s)" % (c, ", ".join(keys)))
    systems = [s for k, s in zip(keys, all_systems) if k in chosen]
    decisions = []  # (mode, workload, repeat, forest_vs_measured)
    tmp = tempfile.mkdtemp(prefix="dynpipe_recovery_")
    for mode in a.modes.split(","):
        device, partition, costs = start_mode(a, mode, common, prefix, NAMES, 4, tmp)
        if a.rank == "slowest":
            if costs is None:
                sys.exit("--rank slowest needs --partition measured (the layer costs)")
            ms = stage_ms(partition, costs)
            r = ms.index(max(ms))
            print("slowed rank %d: the start's slowest stage (%s ms/step per stage)"
                  % (r, ", ".join("%.2f" % x for x in ms)))
        model = costs is not None and mode == "emulated"
        base = common + ["--steps", str(a.steps), "--partition", partition]
        print("cnn tiny (Fashion-MNIST), 4 stages from %s, async-1f1b, batch %d in %d "
              "micro-batches, SGD lr 0.02 momentum 0.9, %d steps; interference on rank %d from "
              "step %d; step time: median over steps %d..%d; time to loss: the mean loss of %d "
              "steps <= %g; medians of %d interleaved runs\n"
              % (partition, a.batch_size, a.micro_batches, a.steps, r, f, f + a.settle, a.steps,
                 a.loss_window, a.target_loss, a.repeats))
        print("| workload | system | s/step (after settle) | vs static | s/step (reaction) | "
              "vs static | model s/step (after settle) | vs static | time to loss (s) | step | "
              "moves | first move after step | final partition (last run) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for key in a.workloads.split(","):
            name, inject = spec(key)
            res = {s: {"step": [], "react": [], "model": [], "ttl": [], "ttl_step": [],
                       "moves": 0, "final": ""} for s, _ in systems}
            factor = 1.0
            if key.startswith("slow"):
                factor = float(key.split(":")[1]) if ":" in key else a.factor
            elif key == "load":
                factor = a.threads + 1.0
            for rep in range(a.repeats):
                for sname, extra in systems:
                    both = join_specs(device, inject)
                    args = base + extra + (["--inject", both] if both else [])
                    recs = run(a.strata, args,
                               os.path.join(tmp, "%s_%s_%d.jsonl" % (mode, key, rep)), prefix)
                    t = step_seconds(recs)
                    res[sname]["step"].append(
                        statistics.median(t[s] for s in t if s >= f + a.settle))
                    if model:
                        mt = modeled_steps(recs, partition, costs, r, f, factor)
                        res[sname]["model"].append(
                            statistics.median(mt[s] for s in mt if s >= f + a.settle))
                    react = [t[s] for s in t if f <= s < f + a.settle]
                    res[sname]["react"].append(sum(react) / max(1, len(react)))
                    ttl, ttl_step = time_to_loss(recs, a.target_loss, a.loss_window)
                    res[sname]["ttl"].append(ttl if ttl is not None else float("inf"))
                    res[sname]["ttl_step"].append(ttl_step if ttl_step is not None else -1)
                    moves = [m for m in recs if m["type"] == "migration"]
                    res[sname].setdefault("first", []).append(
                        str(moves[0]["step"]) if moves else "-")
                    res[sname]["moves"] = max(res[sname]["moves"], len(moves))
                    res[sname]["final"] = moves[-1]["partition"] if moves else "(no move)"
                    if sname == "dynpipe":
                        decisions.append((mode, name, rep, forest_vs_measured(recs)))
            static = statistics.median(res[systems[0][0]]["step"])
            static_react = statistics.median(res[systems[0][0]]["react"])
            static_model = statistics.median(res[systems[0][0]]["model"]) if model else 0
            has_static = systems[0][0] == "static async-1f1b"
            for sname, _ in systems:
                s = res[sname]
                step = statistics.median(s["step"])
                react = statistics.median(s["react"])
                ttl = statistics.median(s["ttl"])
                mod = statistics.median(s["model"]) if model else float("nan")
                print("| %s | %s | %.4f | %+.0f%% | %.4f | %+.0f%% | %.4f | %+.0f%% | %s | %s | "
                      "%d | %s | %s |"
                      % (name, sname, step,
                         100 * (step / static - 1) if has_static else float("nan"), react,
                         100 * (react / static_react - 1) if has_static else float("nan"),
                         mod, 100 * (mod / static_model - 1) if has_static and model
                         else float("nan"),
                         "%.2f" % ttl if ttl != float("inf") else "not reached",
                         "/".join(str(x) for x in s["ttl_step"]), s["moves"],
                         "/".join(s.get("first", [])), s["final"]),
                      flush=True)
        print("\nload average at end: %s\n" % loadavg(), flush=True)
    if decisions:
        print("dynpipe's forest against the measurement, per decision (stage slowdowns)\n")
        print("| mode | workload | run | step | forest predicted | measured | mean abs diff |")
        print("|---|---|---|---|---|---|---|")
        diffs = []
        for mode, name, rep, rows in decisions:
            for step, pred, meas in rows:
                d = sum(abs(p - m) for p, m in zip(pred, meas)) / len(pred)
                diffs.append(d)
                print("| %s | %s | %d | %d | %s | %s | %.2f |"
                      % (mode, name, rep, step, ", ".join("%.2f" % p for p in pred),
                         ", ".join("%.2f" % m for m in meas), d))
        if diffs:
            print("\nmean abs diff over %d decisions: %.2f (median %.2f)"
                  % (len(diffs), sum(diffs) / len(diffs), statistics.median(diffs)))


if __name__ == "__main__":
    main()
