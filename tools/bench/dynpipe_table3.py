#!/usr/bin/env python3
"""DynPipe's Table III ablation (issue 15; ../shared/papers/dynpipe.md §2.10, §4): iterations to
finish a repartition with and without the moved state sent asynchronously in chunks behind
training, and with and without flow control, 2 x 2, on an EMULATED LINK between the two stages
(--link-mbps: the device's cost model, not a measured network; on this machine the ranks talk over
shared memory, where chunking and priorities change nothing measurable).

  async, chunked, behind training   --migration dynpipe: the moved layers' updates pause, their
                              frozen weights and optimizer state go in --migration-chunk-mb chunks
                              on a low-priority thread while the pipeline trains on the old
                              placement; the target takes them over once it holds them, then
                              applies the buffered gradients (parallel/runtime/live_pause.h)
                      no      --migration restart: the pipeline drains, the whole moved state is
                              sent at once, training waits for it (stop-and-copy)
  flow control           on   --link-flow-control on (a free link takes training messages first,
                              chunks only when none waits) with --migration-window-mb W
                         off  --link-flow-control off (FIFO) and --migration-window-mb 0

The model is a wide MLP (a --model-spec written here) on Fashion-MNIST, SGD with momentum,
async-1f1b, 2 stages as local threads; the move takes fc2-relu2 from stage 0 to stage 1 before
step --move-at. Per configuration (medians of --repeats interleaved runs):

  iterations      the steps from the move's step to the one in which the move finished, both
                  counted: for dynpipe the step of the target's first update of the moved layers
                  (the resume R of the migration record: the state arrived, the layers were taken
                  over, the buffered gradients were flushed to the target and applied); for a
                  stop-and-copy the step in which the last moved byte arrived (the "link"
                  records of tools/train_link.h)
  iteration-eq.   the wall time from the start of the move's step to that point, divided by the
                  median step time of the run without a move on the same link (the iterations the
                  pipeline would have run meanwhile; a stop-and-copy stalls inside one step, so
                  its iterations alone say little)
  (extra row)     --migration live (vPIPE's hand-off: the target's next instruction waits for the
                  whole state) in chunks with flow control
  steps lost      iteration-eq. minus iterations: the steps the run did not make meanwhile against
                  the run without a move (a stop-and-copy loses nearly all; a move behind
                  training loses what the shared link and the pause cost it)
  step ms during  the mean step time over those steps; and the baseline's median
  K, R            dynpipe: the take-over and resume micro-batches the record gives (a resume at
                  the run's last micro-batch means the flush came after the end: raise --steps)

  tools/bench/dynpipe_table3.py build-cpu/strata [--repeats 3] [--link-mbps 16] [--check]

--check: a tiny run of the four configurations (the CTest): each finishes, each moved bytes and
reports an iteration count of at least 1; prints the table, no timing asserted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_common import loadavg, step_times  # noqa: E402

CONFIGS = [
    # (name, protocol, flow control); "live": the extra row, vPIPE's hand-off
    ("dynpipe + flow control", "dynpipe", True),
    ("dynpipe, no flow control", "dynpipe", False),
    ("stop-and-copy + flow control", "restart", True),
    ("stop-and-copy, no flow control", "restart", False),
    ("vPIPE live hand-off + flow control", "live", True),
]


def write_spec(path, width):
    with open(path, "w") as f:
        f.write('name: "wide_mlp"\ninput { shape: [1, 28, 28] }\n')
        f.write('layer { name: "flatten" type: "flatten" }\n')
        for i in (1, 2, 3):
            f.write('layer { name: "fc%d" type: "linear" linear { out_features: %d } }\n' % (i, width))
            f.write('layer { name: "relu%d" type: "relu" }\n' % i)
        f.write('layer { name: "fc4" type: "linear" linear { out_features: 10 } }\n')


def config_args(a, protocol, flow):
    args = ["--link-mbps", str(a.link_mbps), "--link-flow-control", "on" if flow else "off"]
    if protocol is None:
        return args  # the baseline: no move
    args += ["--migrate-at", "%d:flatten-relu1,fc2-fc4" % a.move_at, "--migration", protocol]
    if protocol != "restart":
        args += ["--migration-chunk-mb", str(a.chunk_mb),
                 "--migration-window-mb", str(a.window_mb if flow else 0)]
    return args


def run(a, args, metrics):
    cmd = [a.strata, "train"] + args + ["--metrics", metrics, "--progress", "off",
                                        "--log-every", "1"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stdout[-3000:])
    with open(metrics) as f:
        return cmd, [json.loads(line) for line in f if line.strip()]


def measure(records, move_at, base_step, micro_batches, steps):
    """The ablation's numbers of one run with a move (see the module's text)."""
    links = [r for r in records if r["type"] == "link" and r["bulk_bytes"] > 0]
    if not links:
        sys.exit("a run with a move made no link record with bulk bytes")
    last = max(links, key=lambda r: r["bulk_end_s"])
    if last["bulk_last_step"] < 1:
        sys.exit("the moved state arrived after the last step: raise --steps")
    ends = last["step_end_s"]
    start = ends[move_at - 1] if move_at >= 1 else 0.0  # the move's step starts there
    first_step = move_at + 1  # the records count steps from 1
    migration = [r for r in records if r["type"] == "migration"]
    take_over = resume = -1
    if migration and migration[0]["mode"] == "dynpipe":
        # Finished at the target's first update of the moved layers (R), in step R // M + 1.
        take_over, resume = migration[0]["take_over"], migration[0]["resume"]
        last_step = resume // micro_batches + 1
        end_s = ends[last_step - 1]
    else:
        last_step, end_s = last["bulk_last_step"], last["bulk_end_s"]
    iterations = last_step - first_step + 1
    t = step_times(records)
    during = [t[s] for s in range(first_step, last_step + 1)]
    return {"iterations": iterations,
            "take_over": take_over, "resume": resume,
            "forced_end": resume == steps * micro_batches - 1,
            "iteration_eq": (end_s - start) / base_step,
            "step_ms": 1e3 * statistics.mean(during),
            "seconds": end_s - start,
            "bytes": sum(r["bulk_bytes"] for r in links),
            "chunks": sum(r["bulk_messages"] for r in links),
            "wait_max_ms": max(r["training_wait_max_ms"] for r in records if r["type"] == "link"),
            "migrations": len(migration)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("strata")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--move-at", type=int, default=10)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--link-mbps", type=float, default=16.0)
    ap.add_argument("--chunk-mb", type=float, default=0.0625)
    ap.add_argument("--window-mb", type=float, default=0.125)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="a tiny run of the 2x2 (the CTest)")
    a = ap.parse_args()
    if a.check:
        a.repeats, a.steps, a.move_at, a.width, a.link_mbps = 1, 12, 3, 64, 8.0
        a.chunk_mb, a.window_mb, a.batch_size = 0.004, 0.008, 16
    tmp = tempfile.mkdtemp(prefix="strata_table3_")
    spec = os.path.join(tmp, "wide_mlp.prototxt")
    write_spec(spec, a.width)
    common = ["--model-spec", spec, "--dataset", "fashion-mnist", "--train-samples",
              str(a.batch_size * a.steps), "--test-samples", "16", "--stages", "2", "--local",
              "--threads", "1", "--schedule", "async-1f1b", "--batch-size", str(a.batch_size),
              "--micro-batches", str(a.micro_batches), "--partition", "flatten-relu2,fc3-fc4",
              "--steps", str(a.steps), "--seed", str(a.seed), "--optimizer", "sgd",
              "--momentum", "0.9", "--lr", "0.02"]
    print("DynPipe Table III ablation on an EMULATED LINK of %g Mbit/s per direction between the "
          "2 stages (a cost model, not a measured network); wide MLP %d, async-1f1b, batch %d in "
          "%d micro-batches, SGD momentum 0.9, move fc2-relu2 0->1 before step %d; chunks %g "
          "MiB, window %g MiB; "
          "medians of %d interleaved runs" % (a.link_mbps, a.width, a.batch_size, a.micro_batches,
                                               a.move_at, a.chunk_mb, a.window_mb, a.repeats))
    print("load average at start: %s" % loadavg())
    configs = CONFIGS[:4] if a.check else CONFIGS  # --check: the 2x2 only
    results = {name: [] for name, _, _ in configs}
    base_steps = []
    commands = {}
    for rep in range(a.repeats):
        cmd, recs = run(a, common + config_args(a, None, True),
                        os.path.join(tmp, "base_%d.jsonl" % rep))
        commands["baseline (no move)"] = cmd
        t = step_times(recs)
        base = statistics.median(t[s] for s in t if s > 2)
        base_steps.append(base)
        for name, protocol, flow in configs:
            cmd, recs = run(a, common + config_args(a, protocol, flow),
                            os.path.join(tmp, "%s_%d.jsonl" % (name.replace(" ", "_"), rep)))
            commands[name] = cmd
            m = measure(recs, a.move_at, base, a.micro_batches, a.steps)
            if m["migrations"] != 1:
                sys.exit("%s: %d migration records, expected 1" % (name, m["migrations"]))
            results[name].append(m)
    print("load average at end: %s" % loadavg())
    base_ms = 1e3 * statistics.median(base_steps)
    print("\n| flow control | async, chunked, behind training | iterations | iteration-eq. | "
          "steps lost | step ms during (baseline %.1f) | s to finish | MiB moved | chunks | max training wait "
          "ms | K, R (dynpipe) |" % base_ms)
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, protocol, flow in configs:
        rows = results[name]

        def med(key):
            return statistics.median(r[key] for r in rows)
        points = ", ".join("%d/%d%s" % (r["take_over"], r["resume"], " (end)" if r["forced_end"]
                                        else "") for r in rows) if protocol == "dynpipe" else "-"
        print("| %s | %s | %g | %.1f | %.1f | %.1f | %.2f | %.2f | %d | %.0f | %s |" % (
            "yes" if flow else "no",
            {"dynpipe": "yes (dynpipe)", "restart": "no (stop-and-copy)",
             "live": "chunked, target waits (vPIPE live)"}[protocol],
            med("iterations"),
            med("iteration_eq"), statistics.median(r["iteration_eq"] - r["iterations"]
                                                   for r in rows), med("step_ms"), med("seconds"), med("bytes") / (1 << 20),
            med("chunks"), med("wait_max_ms"), points))
    print("\nCommands (one repeat each; the metrics path is per run):")
    for name, cmd in commands.items():
        print("  %s:\n    %s" % (name, " ".join(cmd)))
    if a.check:
        for name, _, _ in configs:
            for r in results[name]:
                if r["iterations"] < 1 or r["bytes"] <= 0:
                    sys.exit("%s: %s" % (name, r))
        print("check: the four configurations finished with their link records")


if __name__ == "__main__":
    main()
