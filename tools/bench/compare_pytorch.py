#!/usr/bin/env python3
"""Training throughput of PyTorch (eager and torch.compile) beside `strata bench --model`.

For a GPU machine with PyTorch (and torchvision for ResNet-50). Both sides train the same model
on synthetic data resident on the GPU, with the same batch, sequence length, precision, AdamW,
warm-up and timed steps, and synchronize the device before reading the clock:

  GPT-2 124M  a minimal nanoGPT-style model with Strata's architecture: token + position
              embedding, pre-LN blocks, causal scaled_dot_product_attention, GELU (tanh), the
              output projection tied to the token embedding, V = 50257 padded to 50304 rows as
              nanoGPT and llm.c do and as Strata does inside (--gpt2-padded-vocab; the tokens stay
              below 50257; nanoGPT's loss spans the padding, Strata's masks it), and dropout 0.1 where
              Strata's gpt2 has it (embedding, merged attention output, both residual branches)
  ResNet-50   torchvision.models.resnet50 (channels_last), 224 px, 1000 classes; skipped with a
              note when torchvision is not importable

Precision (--precision, one or a comma-separated list; each is run on both sides):
  fp32  full fp32 products (TF32 off)
  tf32  torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32; Strata
        --precision tf32
  bf16  automatic mixed precision: torch.autocast to bfloat16 (f32 weights and AdamW, the autocast
        ops in bf16; ResNet-50 channels_last); Strata --precision bf16 (f32 master weights,
        16-bit working copies, activations and gradients)
  fp16  torch.autocast to float16 with a GradScaler (dynamic loss scaling); Strata --precision fp16
        runs without loss scaling (its benchmark measures throughput only), so the PyTorch side
        does a little more work per step (the scaling and the overflow check)

  python3 tools/bench/compare_pytorch.py --strata build-gpu/strata --precision tf32,bf16
  python3 tools/bench/compare_pytorch.py --models gpt2 --gpt2-batch-size 8 --seq-len 1024 \
      --precision bf16

torch is imported inside main() so that --help works without it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def parse_precisions(text):
    """'tf32,bf16' -> ['tf32', 'bf16'] (each of PRECISIONS, in order, without repeats)."""
    out = []
    for p in (x.strip() for x in text.split(",")):
        if p not in PRECISIONS:
            raise argparse.ArgumentTypeError(
                f"precision '{p}' is not one of {', '.join(PRECISIONS)}"
            )
        if p not in out:
            out.append(p)
    if not out:
        raise argparse.ArgumentTypeError("no precision given")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch eager / torch.compile vs strata bench training throughput",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--models", default="gpt2,resnet50", help="comma-separated: gpt2, resnet50")
    p.add_argument(
        "--precision",
        default="fp32",
        type=parse_precisions,
        help="one or a comma-separated list of fp32, tf32, bf16, fp16",
    )
    p.add_argument("--gpt2-batch-size", type=int, default=8, help="GPT-2 sequences per step")
    p.add_argument("--seq-len", type=int, default=1024, help="GPT-2 tokens per sequence")
    p.add_argument(
        "--gpt2-padded-vocab",
        type=int,
        default=50304,
        help="rows of the PyTorch GPT-2's embedding and head (50257: no padding)",
    )
    p.add_argument("--resnet-batch-size", type=int, default=64, help="ResNet-50 images per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps (compile: at least 3)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--strata", default="build-gpu/strata", help="path of the strata binary")
    p.add_argument("--no-strata", action="store_true", help="skip the Strata runs")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--json", default="", help="also write one JSON object per row here")
    return p.parse_args(argv)


# ---- models ------------------------------------------------------------------------------------


def build_gpt2(torch, vocab=50257, positions=1024, layers=12, width=768, heads=12, dropout=0.1):
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.attn_drop = nn.Dropout(dropout)  # Strata: on the merged heads, before c_proj
            self.resid_drop = nn.Dropout(dropout)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q = q.view(b, t, heads, c // heads).transpose(1, 2)
            k = k.view(b, t, heads, c // heads).transpose(1, 2)
            v = v.view(b, t, heads, c // heads).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(b, t, c)
            return self.resid_drop(self.c_proj(self.attn_drop(y)))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(width, 4 * width)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * width, width)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            return self.drop(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width, eps=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(width, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(positions, width)
            self.drop = nn.Dropout(dropout)
            self.h = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width, eps=1e-5)
            self.lm_head = nn.Linear(width, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            self.apply(self._init)

        @staticmethod
        def _init(m):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                torch.nn.init.zeros_(m.bias)

        def forward(self, idx):
            t = idx.shape[1]
            pos = torch.arange(t, device=idx.device)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return Gpt2()


# ---- timing ------------------------------------------------------------------------------------


def set_precision(torch, precision):
    """TF32 for tf32 only (fp32 and the f32 parts of autocast run full fp32 products)."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


def make_grad_scaler(torch):
    """A CUDA GradScaler (torch.amp in PyTorch >= 2.3, torch.cuda.amp before)."""
    try:
        return torch.amp.GradScaler("cuda")
    except (AttributeError, TypeError):
        return torch.cuda.amp.GradScaler()


def time_training(torch, model, make_loss, opt, precision, steps, warmup):
    """Median and mean step seconds of `steps` timed steps after `warmup` (sync before clocks).

    bf16 and fp16: torch.autocast around the forward and the loss (automatic mixed precision);
    fp16 also scales the loss with a GradScaler, as fp16 training needs.
    """
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = make_grad_scaler(torch) if precision == "fp16" else None
    times = []
    for step in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(
            "cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ):
            loss = make_loss(model)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), statistics.fmean(times), float(loss.detach().float())


def make_adamw(torch, model, args):
    try:
        return torch.optim.AdamW(
            model.parameters(), lr=args.lr, weight_decay=args.weight_decay, fused=True
        )
    except (TypeError, RuntimeError):
        return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


def run_pytorch(torch, name, builder, make_loss, args, precision, compiled):
    """Step times of one configuration, or (None, reason) when it fails."""
    model = run_model = opt = None
    try:
        model = builder().to(args.device)
        if name == "resnet50":
            model = model.to(memory_format=torch.channels_last)
        model.train()
        opt = make_adamw(torch, model, args)
        run_model = torch.compile(model) if compiled else model
        warmup = max(args.warmup, 3) if compiled else args.warmup
        med, mean, loss = time_training(
            torch, run_model, make_loss, opt, precision, args.steps, warmup
        )
        return {"median_s": med, "mean_s": mean, "loss": loss}, None
    except Exception as e:  # compile failures, out of memory: reported, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        model = run_model = opt = None
        torch.cuda.empty_cache()


def run_strata(args, precision, model, size, batch, extra):
    """strata bench --model ... --precision P --json: (record, None) or (None, reason)."""
    if args.no_strata:
        return None, "skipped (--no-strata)"
    if not os.path.exists(args.strata):
        return None, f"no strata binary at {args.strata} (--strata PATH)"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        cmd = [
            args.strata, "bench", "--model", model, "--size", size,
            "--batch-size", str(batch), "--precision", precision,
            "--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--json", out,
        ] + extra
        print("+ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            return None, (lines[-1] if lines else f"exit status {p.returncode}")
        with open(out) as f:
            return json.loads(f.readline()), None


# ---- main --------------------------------------------------------------------------------------


def compare_model(torch, args, dev, name, precision):
    """One table row: PyTorch eager, torch.compile and Strata on `name` in `precision`."""
    if name == "gpt2":
        b, t, vocab = args.gpt2_batch_size, args.seq_len, max(args.gpt2_padded_vocab, 50257)
        tokens = torch.randint(0, 50257, (b, t + 1), device=dev)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

        def builder():
            return build_gpt2(torch, vocab=vocab)

        def make_loss(model, x=x, y=y, vocab=vocab):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

        per_sample, unit = t, "tok/s"
        strata = ("gpt2", "124M", b, ["--seq-len", str(t)])
    elif name == "resnet50":
        try:
            import torchvision
        except ImportError:
            print("resnet50: torchvision is not importable here; skipped")
            return None
        b, s = args.resnet_batch_size, args.image_size
        # channels_last images and model (run_pytorch): with autocast, the layout cuDNN's
        # tensor-core convolutions want.
        images = torch.randn(b, 3, s, s, device=dev).to(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (b,), device=dev)

        def builder():
            return torchvision.models.resnet50(num_classes=1000)

        def make_loss(model, images=images, labels=labels):
            return torch.nn.functional.cross_entropy(model(images).float(), labels)

        per_sample, unit = 1, "img/s"
        strata = ("resnet", "50", b, ["--image-size", str(s)])
    else:
        print(f"unknown model '{name}' (gpt2, resnet50); skipped")
        return None

    row = {"model": name, "precision": precision, "batch": b, "unit": unit}
    for label, compiled in (("eager", False), ("compile", True)):
        if compiled and args.no_compile:
            row[label], row[label + "_error"] = None, "skipped (--no-compile)"
            continue
        print(f"{name} {precision}: PyTorch {label} ...", flush=True)
        res, err = run_pytorch(torch, name, builder, make_loss, args, precision, compiled)
        row[label] = b * per_sample / res["median_s"] if res else None
        row[label + "_error"] = err
        if res:
            print(
                f"  median {res['median_s'] * 1e3:.2f} ms, mean {res['mean_s'] * 1e3:.2f} ms,"
                f" {row[label]:.1f} {unit}, loss {res['loss']:.4f}",
                flush=True,
            )
        else:
            print(f"  failed: {err}", flush=True)
    rec, err = run_strata(args, precision, *strata)
    if rec:
        row["strata"] = rec["tokens_per_s"] if name == "gpt2" else rec["samples_per_s"]
        row["strata_record"] = rec
    else:
        row["strata"], row["strata_error"] = None, err
        print(f"strata: {err}", flush=True)
    return row


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch  # here, so that --help works without PyTorch
    except ImportError:
        print("error: PyTorch is not installed (pip install torch torchvision)", file=sys.stderr)
        return 1

    if not torch.cuda.is_available():
        print("error: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cudnn.benchmark = True
    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    print(
        f"PyTorch {torch.__version__}, {torch.cuda.get_device_name(dev)}, precision "
        f"{','.join(args.precision)}, {args.warmup} warm-up + {args.steps} timed steps",
        flush=True,
    )

    rows = []
    for precision in args.precision:
        set_precision(torch, precision)
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            row = compare_model(torch, args, dev, name, precision)
            if row is not None:
                rows.append(row)

    def fmt(v):
        return "n/a" if v is None else f"{v:,.0f}"

    def ratio(a, b):
        return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    head = ["model", "precision", "batch", "PyTorch eager", "PyTorch compile", "Strata",
            "Strata/eager", "Strata/compile"]
    table = [head]
    for r in rows:
        table.append([
            r["model"], r["precision"], str(r["batch"]),
            f"{fmt(r['eager'])} {r['unit']}", f"{fmt(r['compile'])} {r['unit']}",
            f"{fmt(r['strata'])} {r['unit']}",
            ratio(r["strata"], r["eager"]), ratio(r["strata"], r["compile"]),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    print()
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    for r in rows:
        for key in ("eager_error", "compile_error", "strata_error"):
            if r.get(key):
                print(f"{r['model']} {r['precision']} {key.replace('_error', '')}: {r[key]}")
    if "bf16" in args.precision or "fp16" in args.precision:
        print(
            "bf16/fp16: PyTorch torch.autocast (fp16 with a GradScaler), Strata f32 master weights"
            " with 16-bit working copies (fp16 without loss scaling); both AdamW in f32"
        )
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
