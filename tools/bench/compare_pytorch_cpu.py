#!/usr/bin/env python3
"""CPU training step time of `strata bench` beside PyTorch (eager) on the same models, and of
`strata train` beside `strata bench`.

For a machine with Debian's python3-torch (and python3-torchvision for ResNet-18); not part of CI.
Both sides train the same architecture on synthetic data with the same batch, sequence length,
thread count, fp32 and AdamW (lr 1e-4, weight decay 0.01). Each measurement is its own process
(so thread pools start clean); the repeats are interleaved (Strata, PyTorch, Strata, ...) and the
table reports the medians of the per-run median step times, and Strata / PyTorch as a speed ratio
(PyTorch's step time / Strata's: above 1, Strata is faster).

  /usr/bin/python3 tools/bench/compare_pytorch_cpu.py --strata build-cpu/strata --threads 2
  /usr/bin/python3 tools/bench/compare_pytorch_cpu.py --models gpt2-tiny,resnet18 --repeats 5
  /usr/bin/python3 tools/bench/compare_pytorch_cpu.py --train     # strata train / strata bench
  /usr/bin/python3 tools/bench/compare_pytorch_cpu.py --beside pytorch --models gpt2-tiny

--beside runs each side's step alone and beside a second training job on the same cores (PyTorch's
twin of the model with --beside pytorch, `strata train` of it with --beside strata), the second
job started first and warmed up: the slowdown a shared machine costs (2x is a fair share).

--train runs `strata train` on synthetic-images (3x32x32) and synthetic-tokens (GPT-2 token ids,
so both sides take --vocab 50257) beside `strata bench` on the same shapes: the training path
(data loader, executor, metrics, logging every step) against the bare step.

The models (Strata's `strata bench --model/--size` on the left):
  cnn          cnn small: 2 x (conv3x3 no bias, BN, ReLU, max pool 2), fc 128, ReLU, fc 10; 3x32x32
  vgg11        vgg 11-bn-small: VGG-11 features with BN, global average pool, 512-512-10 classifier
               with dropout 0.5; 3x32x32 (the fifth pool left out: the image is 1 px there)
  resnet18     resnet 18 with the small-image stem (conv 3x3 stride 1, no max pool); 3x32x32
  gpt2-tiny    gpt2 tiny: 2 layers, width 64, 4 heads, vocabulary 256, T 64 (dropout 0.1)
  bert-tiny    bert tiny: 2 post-norm layers, width 64, 4 heads, vocabulary 256, T 64, masked LM
  gpt2-124m    gpt2 124M, vocabulary 50257, T 64
torch is imported only in the PyTorch worker processes.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    # name: (strata model, size, batch, extra strata bench flags, tokens per sample)
    "cnn": ("cnn", "small", 64, ["--image-size", "32"], 0),
    "vgg11": ("vgg", "11-bn-small", 32, ["--image-size", "32"], 0),
    "resnet18": ("resnet", "18", 32, ["--image-size", "32"], 0),
    "gpt2-tiny": ("gpt2", "tiny", 16, ["--seq-len", "64"], 64),
    "bert-tiny": ("bert", "tiny", 16, ["--seq-len", "64"], 64),
    "gpt2-124m": ("gpt2", "124M", 4, ["--seq-len", "64"], 64),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strata", default="build-cpu/strata")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per side")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--train", action="store_true",
                   help="strata train (synthetic data of the same shapes) beside strata bench")
    p.add_argument("--beside", default="", choices=["", "pytorch", "strata"],
                   help="the Strata step alone and beside a second 2-thread training job of the "
                   "same model (PyTorch's twin, or strata train), and PyTorch's step alone and "
                   "beside strata train")
    p.add_argument("--vocab", type=int, default=0,
                   help="gpt2/bert vocabulary for both sides (0: the model's own)")
    p.add_argument("--pytorch-blas", default="/usr/lib/x86_64-linux-gnu/openblas-openmp",
                   help="directory put first on PyTorch's LD_LIBRARY_PATH for its libblas.so.3: "
                   "Debian's OpenMP OpenBLAS (one thread pool with PyTorch's OpenMP, as Strata "
                   "links it; the default alternative is the pthread build); empty: as installed")
    p.add_argument("--pytorch-wait-policy", default="passive",
                   help="OMP_WAIT_POLICY of the PyTorch processes (strata runs with passive); "
                   "empty: libgomp's default (spinning), which collapses on a busy machine")
    p.add_argument("--json", default="", help="also write the rows as JSON Lines here")
    p.add_argument("--pytorch-worker", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- PyTorch models (worker process) -----------------------------------------------------------


def build_transformer(torch, kind, vocab, layers, width, heads, positions, dropout=0.1):
    nn, F = torch.nn, torch.nn.functional
    causal = kind == "gpt2"
    eps = 1e-5 if causal else 1e-12

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.attn_drop = nn.Dropout(dropout)  # Strata: on the merged heads, before proj

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            # PyTorch 1.13 (Debian's) has no scaled_dot_product_attention: nanoGPT's slow path.
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            if causal:
                att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.proj(self.attn_drop(y.transpose(1, 2).reshape(b, t, c)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width, eps=eps), nn.LayerNorm(width, eps=eps)
            self.attn = Attention()
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)
            self.drop1, self.drop2 = nn.Dropout(dropout), nn.Dropout(dropout)

        def mlp(self, x):
            return self.out(F.gelu(self.fc(x), approximate="tanh"))

        def forward(self, x):
            if causal:  # pre-norm (GPT-2)
                x = x + self.drop1(self.attn(self.ln1(x)))
                return x + self.drop2(self.mlp(self.ln2(x)))
            x = self.ln1(x + self.drop1(self.attn(x)))  # post-norm (BERT)
            return self.ln2(x + self.drop2(self.mlp(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(positions, width)
            self.wtt = nn.Embedding(2, width) if not causal else None
            self.ln_e = nn.LayerNorm(width, eps=eps) if not causal else None
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            if causal:
                self.ln_f = nn.LayerNorm(width, eps=eps)
            else:  # MLM head: dense, GELU, LayerNorm, decoder tied to the embedding, own bias
                self.dense = nn.Linear(width, width)
                self.ln_h = nn.LayerNorm(width, eps=eps)
                self.bias = nn.Parameter(torch.zeros(vocab))

        def forward(self, idx):
            t = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(t))
            if not causal:
                x = self.ln_e(x + self.wtt(torch.zeros_like(idx)))
            x = self.drop(x)
            for blk in self.blocks:
                x = blk(x)
            if causal:
                return self.ln_f(x) @ self.wte.weight.t()
            h = self.ln_h(F.gelu(self.dense(x), approximate="tanh"))
            return h @ self.wte.weight.t() + self.bias

    return Model()


def build_image_model(torch, name):
    nn = torch.nn
    if name == "cnn":
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.ReLU(), nn.MaxPool2d(2)]
        return nn.Sequential(*block(3, 32), *block(32, 64), nn.Flatten(),
                             nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "vgg11":
        layers, cin, side = [], 3, 32
        for w in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
            if w == "M":
                if side >= 2:
                    layers.append(nn.MaxPool2d(2, 2))
                    side //= 2
                continue
            layers += [nn.Conv2d(cin, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
            cin = w
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5),
                             nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))
    if name == "resnet18":
        import torchvision
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
        return m
    raise ValueError(name)


def pytorch_worker(args):
    """Times one model in this process; prints {"step_ms": [...]} as JSON."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name = args.pytorch_worker
    _, _, batch, _, t = MODELS[name]
    F = torch.nn.functional
    if name in ("gpt2-tiny", "bert-tiny", "gpt2-124m"):
        kind = "gpt2" if name.startswith("gpt2") else "bert"
        if name == "gpt2-124m":
            dims = dict(vocab=50257, layers=12, width=768, heads=12, positions=1024)
        else:
            dims = dict(vocab=256, layers=2, width=64, heads=4, positions=64)
        if args.vocab:
            dims["vocab"] = args.vocab
        model = build_transformer(torch, kind, **dims)
        v = dims["vocab"]
        x = torch.randint(0, v, (batch, t))
        y = torch.randint(0, v, (batch, t))
        if kind == "bert":  # 15% of the positions carry a target
            y[torch.rand(batch, t) > 0.15] = -100

        def loss_fn():
            return F.cross_entropy(model(x).view(-1, v), y.view(-1), ignore_index=-100)
    else:
        model = build_image_model(torch, name)
        x = torch.randn(batch, 3, 32, 32)
        y = torch.randint(0, 10, (batch,))

        def loss_fn():
            return F.cross_entropy(model(x), y)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"step_ms": times, "torch": torch.__version__}))
    return 0


# ---- runs --------------------------------------------------------------------------------------


def run_pytorch(args, name):
    cmd = [sys.executable, os.path.abspath(__file__), "--pytorch-worker", name,
           "--threads", str(args.threads), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--vocab", str(args.vocab)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=pytorch_env(args))
    if p.returncode != 0:
        raise RuntimeError(f"PyTorch {name}: {p.stderr.strip().splitlines()[-1:]}")
    return statistics.median(json.loads(p.stdout.strip().splitlines()[-1])["step_ms"])


def strata_common(args, name):
    model, size, batch, extra, _ = MODELS[name]
    vocab = ["--vocab", str(args.vocab)] if args.vocab and model in ("gpt2", "bert") else []
    return model, size, batch, extra, vocab


def run_strata_bench(args, name):
    model, size, batch, extra, vocab = strata_common(args, name)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        cmd = [args.strata, "bench", "--model", model, "--size", size, "--batch-size",
               str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--threads", str(args.threads), "--device", "cpu", "--json", out] + extra + vocab
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"strata bench {name}: {p.stderr.strip()[-300:]}")
        with open(out) as f:
            return json.loads(f.readline())["step_ms_median"]


def run_strata_train(args, name):
    """strata train on synthetic data of the bench's shapes: the median step time."""
    model, size, batch, extra, vocab = strata_common(args, name)
    steps = args.warmup + args.steps
    if model in ("gpt2", "bert"):  # GPT-2's vocabulary: --train runs the bench with --vocab 50257
        data = ["--dataset", "synthetic-tokens", "--seq-len", extra[1]]
    else:
        data = ["--dataset", "synthetic-images", "--image-size", "32"]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [args.strata, "train", "--model", model, "--size", size, "--batch-size",
               str(batch), "--steps", str(steps), "--threads", str(args.threads),
               "--device", "cpu", "--log-every", "1", "--progress", "off", "--eval-every",
               str(steps + 1), "--test-samples", str(batch), "--train-samples",
               str(batch * steps), "--lr", "1e-4", "--weight-decay", "0.01",
               "--metrics", metrics] + data
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"strata train {name}: {p.stderr.strip()[-300:]}")
        recs = [json.loads(l) for l in open(metrics) if '"type":"train"' in l]
        times = [batch / r["samples_per_s"] * 1e3 for r in recs[args.warmup:]]
        return statistics.median(times)


def pytorch_env(args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.pytorch_wait_policy:
        env["OMP_WAIT_POLICY"] = args.pytorch_wait_policy
    if args.pytorch_blas:
        env["LD_LIBRARY_PATH"] = args.pytorch_blas + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def start_second_job(args, name, kind):
    """A training job of `name` that runs until killed: PyTorch's twin or strata train."""
    if kind == "pytorch":
        cmd = [sys.executable, os.path.abspath(__file__), "--pytorch-worker", name,
               "--threads", str(args.threads), "--steps", "1000000", "--warmup", "0",
               "--vocab", str(args.vocab)]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=pytorch_env(args))
    else:
        model, size, batch, extra, vocab = strata_common(args, name)
        if model in ("gpt2", "bert"):
            data = ["--dataset", "synthetic-tokens", "--seq-len", extra[1]]
            if not vocab:
                data += ["--synthetic-vocab", "256"]
        else:
            data = ["--dataset", "synthetic-images", "--image-size", "32"]
        cmd = [args.strata, "train", "--model", model, "--size", size, "--batch-size",
               str(batch), "--steps", "1000000", "--threads", str(args.threads), "--device",
               "cpu", "--progress", "off", "--log-every", "1000000", "--eval-every", "1000000",
               "--train-samples", str(batch * 64), "--test-samples", str(batch)] + data + vocab
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)  # past start-up and warm-up: the measured run meets a job in its steady state
    if p.poll() is not None:
        raise RuntimeError(f"the second job ({kind} {name}) ended at once: {' '.join(cmd)}")
    return p


def beside(args, names):
    """Each side alone and beside a second job, interleaved; the slowdowns."""
    kind = args.beside
    print(f"second job: {kind}; threads {args.threads}, {args.warmup} warm-up + {args.steps} "
          f"timed steps, {args.repeats} repeats; load average at start {os.getloadavg()[0]:.2f}",
          flush=True)
    rows = []
    for name in names:
        runs = {"strata alone": [], "strata beside": [], "pytorch alone": [],
                "pytorch beside strata": []}
        for r in range(args.repeats):
            runs["strata alone"].append(run_strata_bench(args, name))
            job = start_second_job(args, name, kind)
            try:
                runs["strata beside"].append(run_strata_bench(args, name))
            finally:
                job.kill()
                job.wait()
            runs["pytorch alone"].append(run_pytorch(args, name))
            job = start_second_job(args, name, "strata")
            try:
                runs["pytorch beside strata"].append(run_pytorch(args, name))
            finally:
                job.kill()
                job.wait()
            print(f"  {name} repeat {r + 1}: " + ", ".join(
                f"{k} {v[-1]:.2f} ms" for k, v in runs.items()), flush=True)
        row = {"model": name, "second job": kind}
        for k, v in runs.items():
            row[k] = statistics.median(v)
            row[k + " runs"] = v
        row["strata slowdown"] = row["strata beside"] / row["strata alone"]
        row["pytorch slowdown"] = row["pytorch beside strata"] / row["pytorch alone"]
        rows.append(row)
    print(f"\n{'model':<11} {'strata alone':>13} {'beside ' + kind:>15} {'slowdown':>9}"
          f" {'pytorch alone':>14} {'beside strata':>14} {'slowdown':>9}")
    for r in rows:
        print(f"{r['model']:<11} {r['strata alone']:>13.2f} {r['strata beside']:>15.2f} "
              f"{r['strata slowdown']:>9.2f} {r['pytorch alone']:>14.2f} "
              f"{r['pytorch beside strata']:>14.2f} {r['pytorch slowdown']:>9.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}; 2x is a fair share of 2 cores")
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.pytorch_worker:
        return pytorch_worker(args)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.train:
        args.vocab = 50257  # synthetic-tokens are GPT-2 token ids
    for n in names:
        if n not in MODELS:
            print(f"unknown model {n} (valid: {', '.join(MODELS)})", file=sys.stderr)
            return 2
    if args.beside:
        rows = beside(args, names)
        if args.json:
            with open(args.json, "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        return 0
    left, right = (("strata train", run_strata_train), ("strata bench", run_strata_bench)) \
        if args.train else (("strata", run_strata_bench), ("pytorch", run_pytorch))
    load = os.getloadavg()
    print(f"threads {args.threads}, {args.warmup} warm-up + {args.steps} timed steps, "
          f"{args.repeats} interleaved repeats; load average at start {load[0]:.2f}", flush=True)
    rows = []
    for name in names:
        a, b = [], []
        for r in range(args.repeats):
            a.append(left[1](args, name))
            b.append(right[1](args, name))
            print(f"  {name} repeat {r + 1}: {left[0]} {a[-1]:.2f} ms, {right[0]} {b[-1]:.2f} ms",
                  flush=True)
        row = {"model": name, left[0]: statistics.median(a), right[0]: statistics.median(b),
               left[0] + " runs": a, right[0] + " runs": b}
        row["ratio"] = row[right[0]] / row[left[0]]
        rows.append(row)
    end_load = os.getloadavg()
    what = "speed strata train / strata bench" if args.train else "speed Strata / PyTorch"
    print(f"\n{'model':<11} {left[0] + ' ms':>16} {right[0] + ' ms':>16} {what:>34}")
    for r in rows:
        print(f"{r['model']:<11} {r[left[0]]:>16.2f} {r[right[0]]:>16.2f} {r['ratio']:>34.2f}")
    print(f"load average at the end {end_load[0]:.2f} (2 cores: above ~2, other work shared "
          "them and the figures are noisy)")
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
