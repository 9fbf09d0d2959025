#!/usr/bin/env python3
"""vPIPE's recovery (issue 14's "Recovery" must-show): a pipeline whose stage becomes slower
during training, with a static partition against --repartition vpipe, in three workloads:

  slow   --inject "rank=R,from=F,kind=slow,factor=X": the rank computes X times slower (after each
         layer's forward and backward it sleeps (X - 1) times the layer's measured time). A sleep
         leaves the cores to the other ranks, so this is the meaningful slowdown on a machine
         whose local ranks share few cores.
  load   --inject "rank=R,from=F,kind=load,threads=N": N threads spinning beside the rank. The
         local ranks are threads of one process sharing this machine's cores: the load slows
         every rank, not only R, and a repartition cannot escape it (reported for completeness).
  grow   --inject "from=F,kind=grow,layers=A-B,factor=X": those layers' compute grows X times
         from step F (vPIPE's dynamic model), wherever they are.

Ranks (--ranks): mpi (default: mpirun --oversubscribe -np 2, one process per rank) or local
(threads of one process). Modes (--modes, recovery_common.py): emulated (every rank an emulated
device, --inject "kind=device,factor=X": each layer lasts X times its CPU time; the kinds above
multiply on top, and a load of N threads on an emulated device is a factor N + 1 besides its
spinning threads) and real. The start partition (--partition measured, the default) is balanced
on the layer costs measured here per mode (recovery_common.measure_balanced).

For each, the throughput (samples/s) over the steps after `--settle` steps past the slowdown's
start, static vs repartition (medians of --repeats interleaved runs), and the partition the loop
ended in. With --timeline, also the per-step time around a scripted migration (--migrate-at):
1f1b (a synchronous schedule moves between steps: nothing to drain), async-1f1b with
--migration restart (the asynchronous pipeline drains at the move and fills again) and with
--migration live (the layers move while the pipeline runs: parallel/runtime/live_stage.h), live
with whole tensors and no flow control (--migration-chunk-mb 0 --migration-window-mb 0), beside
async-1f1b without a move: measured runs, medians per step.

  tools/bench/vpipe_recovery.py build/strata [--steps 60] [--repeats 3] [--timeline] [--timeline-only]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_common import (join_specs, launcher, loadavg, run, start_mode,  # noqa: E402
                             step_times)

NAMES = ["conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2", "flatten", "fc1",
         "relu3", "fc2"]


def throughput(records, first_step, batch):
    t = step_times(records)
    steps = [s for s in t if s >= first_step]
    return batch * len(steps) / sum(t[s] for s in steps)


def print_table(rows):
    print("| workload | static samples/s | --repartition vpipe samples/s | speedup | moves | "
          "final partition (last run) |")
    print("|---|---|---|---|---|---|")
    for name, s, v, x, d, p in rows:
        print("| %s | %.1f | %.1f | %.2fx | %d | %s |" % (name, s, v, x, d, p))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("strata")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--from-step", type=int, default=10, help="the slowdown starts here")
    ap.add_argument("--settle", type=int, default=30,
                    help="steps after the slowdown's start left out of the throughput")
    ap.add_argument("--every", type=int, default=10, help="--repartition-every")
    ap.add_argument("--partition", default="measured",
                    help="the start: measured (balanced on the probe's layer costs) or a "
                         "--partition text")
    ap.add_argument("--probe-steps", type=int, default=60)
    ap.add_argument("--probe-runs", type=int, default=2)
    ap.add_argument("--ranks", default="mpi", help="mpi (one process per rank) or local")
    ap.add_argument("--modes", default="emulated,real", help="emulated, real")
    ap.add_argument("--device-factor", type=float, default=8.0,
                    help="emulated: each layer lasts this many times its CPU time")
    ap.add_argument("--grow-layers", default="bn2-fc2")
    ap.add_argument("--grow-factor", type=float, default=8.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2, help="load threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-samples", type=int, default=16384)
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--timeline-only", action="store_true", help="--timeline without the table")
    a = ap.parse_args()
    prefix, local = launcher(a.ranks, 2)
    common = ["--model", "cnn", "--size", "tiny", "--dataset", "fashion-mnist", "--train-samples",
              str(a.train_samples), "--test-samples", "64", "--stages", "2", "--threads", "1",
              "--batch-size", str(a.batch_size), "--micro-batches", str(a.micro_batches),
              "--seed", "1"] + local
    f = a.from_step
    workloads = [
        ("none (no slowdown)", ""),
        ("slow (rank 1, factor %g)" % a.factor, "rank=1,from=%d,kind=slow,factor=%g" % (f, a.factor)),
        ("load (rank 1, %d threads)" % a.threads,
         "rank=1,from=%d,kind=load,threads=%d" % (f, a.threads)),
        ("grow (%s, factor %g)" % (a.grow_layers, a.grow_factor),
         "from=%d,kind=grow,layers=%s,factor=%g" % (f, a.grow_layers, a.grow_factor)),
    ]
    tmp = tempfile.mkdtemp(prefix="vpipe_recovery_")
    if a.timeline_only:
        partition = "conv1-pool1,conv2-fc2" if a.partition == "measured" else a.partition
        print("load average at start: %s" % loadavg())
        timeline(a, common + ["--steps", str(a.steps), "--partition", partition], prefix, tmp)
        print("\nload average at end: %s" % loadavg())
        return
    for mode in a.modes.split(","):
        device, partition, _ = start_mode(a, mode, common + ["--schedule", "1f1b"], prefix, NAMES, 2, tmp)
        base = common + ["--steps", str(a.steps), "--partition", partition]
        print("model cnn tiny (Fashion-MNIST), 2 stages, start partition %s, "
              "1f1b, batch %d in %d micro-batches, %d steps; slowdown from step %d; throughput "
              "over steps %d..%d; --repartition-every %d; medians of %d interleaved runs\n"
              % (partition, a.batch_size, a.micro_batches, a.steps, f, f + a.settle, a.steps,
                 a.every, a.repeats))
        rows = []
        for name, spec in workloads:
            res = {"static": [], "vpipe": []}
            final = ""
            decisions = 0
            for rep in range(a.repeats):
                for system in ("static", "vpipe"):
                    both = join_specs(device, spec)
                    extra = ["--schedule", "1f1b"] + (["--inject", both] if both else [])
                    if system == "vpipe":
                        extra += ["--repartition", "vpipe", "--repartition-every", str(a.every)]
                    recs = run(a.strata, base + extra,
                               os.path.join(tmp, "%s_%s_%d.jsonl" % (mode, system, rep)), prefix)
                    res[system].append(throughput(recs, f + a.settle, a.batch_size))
                    if system == "vpipe":
                        moves = [r for r in recs if r["type"] == "migration"]
                        decisions = max(decisions, len(moves))
                        final = moves[-1]["partition"] if moves else partition + " (no move)"
            s, v = statistics.median(res["static"]), statistics.median(res["vpipe"])
            rows.append((name, s, v, v / s, decisions, final))
        print("| workload | static samples/s | --repartition vpipe samples/s | speedup | moves | "
              "final partition (last run) |")
        print("|---|---|---|---|---|---|")
        for name, s, v, x, d, p in rows:
            print("| %s | %.1f | %.1f | %.2fx | %d | %s |" % (name, s, v, x, d, p))
        print("\nload average at end: %s\n" % loadavg(), flush=True)
        if a.timeline:
            timeline(a, base, prefix, tmp)


def timeline(a, base, prefix, tmp):
    """Per-step time around a scripted migration: measured runs, medians per step."""
    k = a.steps // 2
    print("\nper-step seconds around a migration after %d steps (conv2 moves to stage 0: "
          "--migrate-at %d:conv1-conv2,bn2-fc2; no slowdown; medians of %d runs)"
          % (k, k, a.repeats))
    move = ["--migrate-at", "%d:conv1-conv2,bn2-fc2" % k]
    cases = [("1f1b, move (live)", ["--schedule", "1f1b"] + move),
             ("async-1f1b, no move", ["--schedule", "async-1f1b"]),
             ("async-1f1b, move (restart)",
              ["--schedule", "async-1f1b", "--migration", "restart"] + move),
             ("async-1f1b, move (live)",
              ["--schedule", "async-1f1b", "--migration", "live"] + move),
             ("async-1f1b, move (live, whole tensors, no window)",
              ["--schedule", "async-1f1b", "--migration", "live", "--migration-chunk-mb", "0",
               "--migration-window-mb", "0"] + move)]
    times = {c: [] for c, _ in cases}
    for rep in range(a.repeats):
        for c, extra in cases:
            recs = run(a.strata, base + extra, os.path.join(tmp, "tl_%d.jsonl" % rep), prefix)
            times[c].append(step_times(recs))
    window = list(range(k - 2, k + 4))
    print("| case | " + " | ".join("step %d" % (s + 1) for s in window) + " |")
    print("|---|" + "---|" * len(window))
    for c, _ in cases:
        cells = [statistics.median(t[s + 1] for t in times[c]) for s in window]
        print("| %s | " % c + " | ".join("%.3f" % x for x in cells) + " |")


if __name__ == "__main__":
    main()
