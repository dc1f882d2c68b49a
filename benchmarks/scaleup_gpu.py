"""Does GRPO + LoRA on Qwen2.5-0.5B fit in 8 GB, and how fast is it? No download needed.

Builds a random-initialised model with Qwen2.5-0.5B's exact architecture (sizes below,
from its config.json), wraps it with LoRA (r=16, all linear layers) and measures, for
B*G sequences of prompt + completion tokens:

* sampling: ``generate`` with KV cache, every sequence forced to the full length;
* one training step per micro-batch size: the no-grad ``logp_old`` pass plus forward,
  backward (gradient accumulation) and an AdamW step, as ``scaleup.step`` does it;
* peak GPU memory of each, and whether it stays under 8 GB.

Usage::

    python benchmarks/scaleup_gpu.py                      # the real sizes, on cuda
    python benchmarks/scaleup_gpu.py --device cpu --tiny  # a smoke run on a tiny model

Random weights sample longer than a trained model would, but the cost per token is the
same: the numbers are for exactly ``batch`` x (``prompt_len`` + ``new_tokens``) tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from scaleup.config import TrainConfig
from scaleup.modeling import add_lora, resolve_dtype
from scaleup.rollout import sampling_config
from scaleup.step import Batch, batch_logprobs, loss_backward
from scaleup.tiny import QWEN25_05B_SIZES, TINY_SIZES, qwen2_config, tiny_tokenizer
from scaleup.train import make_optimizer

GB = 1e9
BUDGET_GB = 8.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    p.add_argument("--tiny", action="store_true", help="tiny model and sizes (smoke test)")
    p.add_argument("--batch", type=int, default=64, help="B*G sequences (default 64)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=256, help="completion tokens (default 256)")
    p.add_argument("--micro-batch-sizes", default="4,8,16",
                   help="comma-separated micro-batch sizes to time (default 4,8,16)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute decoder activations in the backward pass")
    p.add_argument("--logprob-chunk", type=int, default=64, help="LM-head chunk (positions)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if args.tiny:
        args.batch, args.prompt_len, args.new_tokens = min(args.batch, 4), 8, 8
        args.micro_batch_sizes = "2,4"
    return args


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GB if device.type == "cuda" else None


def build(args, device):
    """The LoRA-wrapped random model, its config and dtype."""
    config = qwen2_config(TINY_SIZES, tiny_tokenizer()) if args.tiny else \
        qwen2_config(QWEN25_05B_SIZES)
    dtype = resolve_dtype("auto", device)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    cfg = TrainConfig(lora_r=16, lora_alpha=32, gradient_checkpointing=args.gradient_checkpointing,
                      logprob_chunk=args.logprob_chunk, learning_rate=2e-5)
    return add_lora(model, cfg), cfg, config, dtype


def bench_sampling(model, config, args, device) -> dict:
    """Generate ``new_tokens`` for each of ``batch`` random prompts (EOS suppressed)."""
    prompts = torch.randint(0, config.vocab_size - 1000 if not args.tiny else 256,
                            (args.batch, args.prompt_len), device=device)
    gen = sampling_config(args.new_tokens, [config.eos_token_id], config.pad_token_id)
    gen.min_new_tokens = args.new_tokens
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                             generation_config=gen)
    _sync(device)
    seconds = time.perf_counter() - t0
    n_new = (out.shape[1] - args.prompt_len) * args.batch
    return {"seconds": seconds, "tokens": n_new, "tokens_per_s": n_new / seconds,
            "peak_gb": _peak_gb(device), "completions": out[:, args.prompt_len:]}


def bench_train_step(model, cfg, prompts, completions, micro_batch_size, device) -> dict:
    """logp_old pass + accumulated forward/backward + AdamW step on the whole batch."""
    cfg.micro_batch_size = micro_batch_size
    n = prompts.shape[0]
    batch = Batch(prompts, torch.ones_like(prompts), completions,
                  torch.ones(completions.shape, device=device),
                  torch.randn(n, device=device))
    opt = make_optimizer(model, cfg)
    _reset_peak(device)
    _sync(device)
    t0 = time.perf_counter()
    try:
        model.train(cfg.gradient_checkpointing)
        batch.logp_old, _ = batch_logprobs(model, batch, micro_batch_size, cfg.logprob_chunk)
        opt.zero_grad(set_to_none=True)
        loss_backward(model, batch, cfg)
        opt.step()
        _sync(device)
    except torch.OutOfMemoryError:
        return {"micro_batch_size": micro_batch_size, "oom": True}
    finally:
        opt.zero_grad(set_to_none=True)
        model.eval()
    seconds = time.perf_counter() - t0
    return {"micro_batch_size": micro_batch_size, "oom": False, "step_seconds": seconds,
            "peak_gb": _peak_gb(device)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but no CUDA GPU is available (try --device cpu --tiny)")
    mbs = [int(x) for x in args.micro_batch_sizes.split(",") if x.strip()]
    if not mbs or min(mbs) < 1:
        sys.exit(f"error: --micro-batch-sizes must be positive ints, got {args.micro_batch_sizes}")
    model, cfg, config, dtype = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sample = bench_sampling(model, config, args, device)
    prompts = torch.randint(0, 256, (args.batch, args.prompt_len), device=device)
    completions = sample.pop("completions")
    steps = [bench_train_step(model, cfg, prompts, completions, m, device) for m in mbs]
    peaks = [s["peak_gb"] for s in steps if not s["oom"] and s["peak_gb"] is not None]
    fits = None
    if device.type == "cuda":
        ok = [s for s in steps if not s["oom"] and s["peak_gb"] < BUDGET_GB]
        fits = bool(ok) and sample["peak_gb"] < BUDGET_GB
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": "tiny" if args.tiny else "Qwen2.5-0.5B architecture (random init)",
        "dtype": str(dtype), "params": n_params, "lora_params": n_train,
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "sampling": sample, "train_steps": steps,
        "min_train_peak_gb": min(peaks) if peaks else None,
        "fits_8gb": fits,
    }
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _print(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['dtype']}): {r['params'] / 1e6:.1f}M params, "
          f"{r['lora_params'] / 1e6:.2f}M LoRA; {r['batch']} seqs x "
          f"({r['prompt_len']} + {r['new_tokens']}) tokens")
    s = r["sampling"]
    peak = f"{s['peak_gb']:.2f} GB" if s["peak_gb"] is not None else "n/a"
    print(f"sampling: {s['tokens_per_s']:.0f} tokens/s ({s['seconds']:.1f} s), peak {peak}")
    for t in r["train_steps"]:
        if t["oom"]:
            print(f"train step, micro-batch {t['micro_batch_size']}: out of memory")
            continue
        peak = f"{t['peak_gb']:.2f} GB" if t["peak_gb"] is not None else "n/a"
        print(f"train step, micro-batch {t['micro_batch_size']}: {t['step_seconds']:.2f} s, "
              f"peak {peak}")
    fits = r["fits_8gb"] if r["fits_8gb"] is not None else "n/a (cpu)"
    print(f"fits in {BUDGET_GB:.0f} GB: {fits}")


if __name__ == "__main__":
    main()
