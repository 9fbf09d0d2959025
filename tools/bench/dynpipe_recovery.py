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
                 machine: strata profile --colocation + strata fit-slowdown)

All re-partitioning runs are async-1f1b with --migration restart. Workloads:

  slow   --inject "rank=R,from=F,kind=slow,factor=X": the rank sleeps (X - 1) times each layer's
         time: the meaningful kind here (a sleep leaves the shared cores to the other ranks).
  load   --inject "rank=R,from=F,kind=load,threads=N": spinning threads; local ranks are threads
         of one process on this machine's few cores, so the load slows every rank, not only R.

Per system: the median seconds per step over the steps after --settle steps past the slowdown's
start, the time (s) and step at which the mean loss of the last --loss-window steps first falls
to --target-loss, and the moves made; medians of --repeats interleaved runs.

  tools/bench/dynpipe_recovery.py build/strata --model forest.json [--steps 160] [--repeats 2]
      [--workloads none,slow:3,slow:8,load] [--rank 0]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vpipe_recovery import run, step_times as step_seconds  # noqa: E402


def train_records(records):
    return sorted((r for r in records if r["type"] == "train"), key=lambda r: r["step"])


def time_to_loss(records, target, window):
    train = train_records(records)
    for i in range(window - 1, len(train)):
        mean = sum(r["loss"] for r in train[i - window + 1:i + 1]) / window
        if mean <= target:
            return train[i]["elapsed_s"], train[i]["step"]
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("strata")
    ap.add_argument("--model", required=True, help="the slowdown model (strata fit-slowdown)")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--from-step", type=int, default=15)
    ap.add_argument("--settle", type=int, default=25)
    ap.add_argument("--every", type=int, default=10, help="dynpipe's --repartition-every")
    ap.add_argument("--epoch-steps", type=int, default=40, help="pipedream-re's 'epoch'")
    ap.add_argument("--partition", default="conv1-pool1,conv2,bn2-pool2,flatten-fc2",
                    help="the start (stage 0 the heaviest, as measured here)")
    ap.add_argument("--rank", type=int, default=0,
                    help="the slowed rank (stage 0, conv1-pool1, is the heaviest here)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2, help="load threads")
    ap.add_argument("--target-loss", type=float, default=0.5)
    ap.add_argument("--loss-window", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default="none,slow:3,slow:8,load",
                    help="none, slow[:FACTOR], load")
    a = ap.parse_args()
    base = ["--model", "cnn", "--size", "tiny", "--dataset", "fashion-mnist", "--train-samples",
            "60000", "--test-samples", "64", "--stages", "4", "--local", "--threads", "1",
            "--batch-size", str(a.batch_size), "--micro-batches", str(a.micro_batches),
            "--steps", str(a.steps), "--partition", a.partition, "--seed", "1",
            "--schedule", "async-1f1b", "--optimizer", "sgd", "--lr", "0.02", "--momentum", "0.9"]
    f, r = a.from_step, a.rank
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
    systems = [
        ("static async-1f1b", []),
        ("PipeDream-Re", ["--repartition", "pipedream-re", "--repartition-every",
                          str(a.epoch_steps), "--migration", "restart"]),
        ("dynpipe-no-rf", ["--repartition", "dynpipe-no-rf", "--repartition-every", str(a.every),
                           "--migration", "restart"]),
        ("dynpipe", ["--repartition", "dynpipe", "--repartition-every", str(a.every),
                     "--migration", "restart", "--slowdown-model", a.model]),
    ]
    tmp = tempfile.mkdtemp(prefix="dynpipe_recovery_")
    print("load average at start: %s" % open("/proc/loadavg").read().split()[:3])
    print("cnn tiny (Fashion-MNIST), 4 local stages from %s, async-1f1b, batch %d in %d "
          "micro-batches, SGD lr 0.02 momentum 0.9, %d steps; interference on rank %d from step "
          "%d; step time: median over steps %d..%d; time to loss: the mean loss of %d steps <= %g; "
          "medians of %d interleaved runs\n"
          % (a.partition, a.batch_size, a.micro_batches, a.steps, r, f, f + a.settle, a.steps,
             a.loss_window, a.target_loss, a.repeats))
    print("| workload | system | s/step (after settle) | vs static | time to loss (s) | "
          "step | moves | final partition (last run) |")
    print("|---|---|---|---|---|---|---|---|")
    for key in a.workloads.split(","):
        name, inject = spec(key)
        res = {s: {"step": [], "ttl": [], "ttl_step": [], "moves": 0, "final": ""}
               for s, _ in systems}
        for rep in range(a.repeats):
            for sname, extra in systems:
                args = base + extra + (["--inject", inject] if inject else [])
                recs = run(a.strata, args, os.path.join(tmp, "%s_%d.jsonl" % (key, rep)))
                t = step_seconds(recs)
                res[sname]["step"].append(
                    statistics.median(t[s] for s in t if s >= f + a.settle))
                ttl, ttl_step = time_to_loss(recs, a.target_loss, a.loss_window)
                res[sname]["ttl"].append(ttl if ttl is not None else float("inf"))
                res[sname]["ttl_step"].append(ttl_step if ttl_step is not None else -1)
                moves = [m for m in recs if m["type"] == "migration"]
                res[sname]["moves"] = max(res[sname]["moves"], len(moves))
                res[sname]["final"] = moves[-1]["partition"] if moves else "(no move)"
        static = statistics.median(res[systems[0][0]]["step"])
        for sname, _ in systems:
            s = res[sname]
            step = statistics.median(s["step"])
            ttl = statistics.median(s["ttl"])
            print("| %s | %s | %.4f | %+.0f%% | %s | %s | %d | %s |"
                  % (name, sname, step, 100 * (step / static - 1),
                     "%.1f" % ttl if ttl != float("inf") else "not reached",
                     "/".join(str(x) for x in s["ttl_step"]), s["moves"], s["final"]))
    print("\nload average at end: %s" % open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
