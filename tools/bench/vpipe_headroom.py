#!/usr/bin/env python3
"""vPIPE's headroom (paper Fig. 9, Table 3) in Strata: GPT-2 on 4 pipeline stages under a fixed
per-rank --mem-limit. For each system, the largest batch that trains (micro-batch rows doubled
until the run runs out of memory or the planner finds no plan, then bisected), and at that batch the throughput
and the share of compute spent replaying recomputed forwards.

  PipeDream       async-1f1b, every layer keeps its saved tensors
  PipeDream+vPIPE async-1f1b, --memory-policy auto (swap/recompute per layer and stage)
  GPipe           gpipe, every layer recomputed (re-materialization of a stage from its input)
  GPipe+vPIPE     gpipe, --memory-policy auto

All four run in the same engine, with the same model, data, micro-batch count and limit. The
ranks are threads of one process (--local) sharing this machine's cores, so throughput figures
are comparative only (and noisy where other work runs); the batch sizes are what the limit allows.

  tools/bench/vpipe_headroom.py build/strata [--mem-limit 24MiB] [--stages 4] [--seq-len 64]
  tools/bench/vpipe_headroom.py build/strata --blocks 6 --micro-batches 8  (8 stages)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SYSTEMS = [
    ("PipeDream", "async-1f1b", ["--memory-policy", "keep"]),
    ("PipeDream+vPIPE", "async-1f1b", ["--memory-policy", "auto"]),
    ("GPipe", "gpipe", ["--memory-policy", "recompute"]),
    ("GPipe+vPIPE", "gpipe", ["--memory-policy", "auto"]),
]


def run(strata, args, metrics):
    cmd = [strata, "train"] + args + ["--metrics", metrics, "--progress", "off", "--log-every", "1"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return p.returncode, p.stdout, records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("strata")
    ap.add_argument("--mem-limit", default="24MiB")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=0,
                    help="a GPT-2 of tiny width with this many blocks on blocks + 2 stages, one "
                         "layer each, instead of GPT-2 tiny (2 blocks)")
    ap.add_argument("--resolution", type=float, default=0.125,
                    help="bisection stops when the gap is below this fraction of the rows")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vpipe_headroom_")
    model = ["--model", "gpt2", "--size", "tiny"]
    if a.blocks > 0:
        # A deeper GPT-2 of tiny width, one layer per stage: embed, the blocks, head.
        spec = os.path.join(tmp, "gpt2_deep.prototxt")
        with open(spec, "w") as f:
            f.write(f'name: "gpt2_deep"\ninput {{ shape: [{a.seq_len}] dtype: "i64" }}\n')
            f.write(f'layer {{ name: "embed" type: "token_embedding" token_embedding {{ vocab_size: '
                    f'{a.vocab} width: 64 max_positions: {a.seq_len} dropout: 0.1 }} }}\n')
            for i in range(a.blocks):
                f.write(f'layer {{ name: "h.{i}" type: "transformer_block" transformer_block '
                        f'{{ heads: 4 dropout: 0.1 }} }}\n')
            f.write(f'layer {{ name: "head" type: "lm_head" lm_head {{ vocab_size: {a.vocab} '
                    f'tied_to: "embed.wte.weight" }} }}\n')
        model = ["--model-spec", spec]
        a.stages = a.blocks + 2
    base = model + ["--dataset", "synthetic-tokens",
            "--synthetic-vocab", str(a.vocab), "--seq-len", str(a.seq_len), "--stages",
            str(a.stages), "--local", "--micro-batches", str(a.micro_batches), "--steps",
            str(a.steps), "--partition", "uniform", "--mem-limit", a.mem_limit,
            "--test-samples", "8", "--train-samples", "100000", "--seed", "1"]
    results = []

    def attempt(name, schedule, flags, rows):
        batch = rows * a.micro_batches
        metrics = os.path.join(tmp, f"{name}-{rows}.jsonl")
        code, out, records = run(a.strata, base + ["--schedule", schedule, "--batch-size",
                                                   str(batch)] + flags, metrics)
        if code != 0:
            reason = "out of memory" if "out of memory" in out else (
                "no plan fits" if "is too small for stage" in out else out.strip()[-200:])
            print(f"{name}: batch {batch}: stops ({reason})", file=sys.stderr)
            return None
        train = [x for x in records if x.get("type") == "train"]
        stages = [x for x in records if x.get("type") == "stage"]
        # Steady state: the mean rate of the steps after the first.
        rates = [x["samples_per_s"] for x in train[1:]] or [train[-1]["samples_per_s"]]
        busy = sum(s["busy_s"] for s in stages)
        recompute = sum(s["recompute_s"] for s in stages)
        swapped = sum(s["swapped_bytes"] for s in stages)
        peak = max(s["peak_bytes"] for s in stages)
        result = dict(batch=batch, samples_per_s=sum(rates) / len(rates),
                      recompute_share=recompute / busy if busy > 0 else 0.0,
                      swapped_mib=swapped / 2**20, peak_mib=peak / 2**20)
        print(f"{name}: batch {batch}: trains, {result['samples_per_s']:.1f} samples/s",
              file=sys.stderr)
        return result

    for name, schedule, flags in SYSTEMS:
        # Micro-batch rows doubled until a run fails, then bisected between the last that
        # trained and the first that failed, to a step of --resolution of the rows.
        best, good, bad = None, 0, None
        rows = 1
        while rows <= a.max_rows:
            r = attempt(name, schedule, flags, rows)
            if r is None:
                bad = rows
                break
            best, good = r, rows
            rows *= 2
        while bad is not None and good > 0 and bad - good > max(1, int(good * a.resolution)):
            mid = (good + bad) // 2
            r = attempt(name, schedule, flags, mid)
            if r is None:
                bad = mid
            else:
                best, good = r, mid
        results.append((name, best))
    what = f"GPT-2 of width 64 with {a.blocks} blocks" if a.blocks > 0 else "GPT-2 tiny"
    print(f"\n{what} (T={a.seq_len}, V={a.vocab}) on {a.stages} stages x {a.micro_batches} "
          f"micro-batches, --mem-limit {a.mem_limit} per rank, local ranks on this machine")
    print(f"{'system':<17} {'largest batch':>13} {'samples/s':>10} {'recompute':>10} "
          f"{'swapped MiB':>12} {'peak MiB':>9}")
    for name, b in results:
        if b is None:
            print(f"{name:<17} {'none':>13}")
            continue
        print(f"{name:<17} {b['batch']:>13} {b['samples_per_s']:>10.1f} "
              f"{100 * b['recompute_share']:>9.1f}% {b['swapped_mib']:>12.1f} {b['peak_mib']:>9.2f}")
    gpipe = dict(results).get("GPipe")
    if gpipe:
        # The paper's other claim: at the batch GPipe reaches, vPIPE recomputes less of it.
        same = attempt("GPipe+vPIPE", "gpipe", SYSTEMS[3][2], gpipe["batch"] // a.micro_batches)
        if same:
            print(f"at GPipe's largest batch ({gpipe['batch']}): recompute GPipe "
                  f"{100 * gpipe['recompute_share']:.1f}%, GPipe+vPIPE "
                  f"{100 * same['recompute_share']:.1f}% (swapped {same['swapped_mib']:.1f} MiB), "
                  f"samples/s {gpipe['samples_per_s']:.1f} vs {same['samples_per_s']:.1f}")
    base_batch = dict(results).get("PipeDream")
    vpipe = dict(results).get("PipeDream+vPIPE")
    if base_batch and vpipe:
        print(f"PipeDream+vPIPE / PipeDream batch: {vpipe['batch'] / base_batch['batch']:.1f}x")


if __name__ == "__main__":
    main()
