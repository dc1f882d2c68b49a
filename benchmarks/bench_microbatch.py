"""Benchmark: the training forward and backward of one GRPO micro-batch, two ways side by
side: each prompt run once for its group (``share_prompts=True``, the default) vs once per
row (``--compare sharing``), or the frozen LM head's gradient computed in the forward
(``fused_head=True``, the default) vs the head's chunks checkpointed and recomputed in
the backward (``--compare fused-head``).

    python benchmarks/bench_microbatch.py [--compare sharing|fused-head] [--model 0.5b]
                                          [--dtype bfloat16] [--threads 2]
    python benchmarks/bench_microbatch.py --quick        # a smoke run (tiny model)

A micro-batch of ``--rows`` sequences whose prompts come in runs of ``--group`` (a GRPO
micro-batch of whole groups), ``--prompt-tokens`` random prompt tokens and
``--completion-tokens`` random completion tokens each; the model is random, with
Qwen2.5-0.5B's architecture (``--model 0.5b``) or the tests' tiny one, LoRA r=16 on all
linear layers (the scale-up's default adapter), in train mode. Each repeat times
``scaleup.logprobs.completion_logprobs`` and the backward of the log-probs' sum, with
the compared option on (the default) and off, alternately (the order swapped every
repeat), and prints the median seconds of each and their ratio; also the largest
difference of the two log-probs and of the two LoRA gradients.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compare", default="sharing", choices=("sharing", "fused-head"),
                   help="the option timed on and off (default sharing)")
    p.add_argument("--model", default="0.5b", choices=("tiny", "0.5b"),
                   help="random model: Qwen2.5-0.5B's architecture or the tiny one")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--rows", type=int, default=8, help="sequences in the micro-batch")
    p.add_argument("--group", type=int, default=8, help="rows per prompt (G)")
    p.add_argument("--prompt-tokens", type=int, default=49,
                   help="prompt length (default 49: the digit task's chat prompt)")
    p.add_argument("--completion-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="timed pairs (median)")
    p.add_argument("--quick", action="store_true", help="tiny model and sizes (smoke run)")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.quick:
        args.model, args.dtype, args.repeats = "tiny", "float32", 2
        args.rows, args.group, args.prompt_tokens, args.completion_tokens = 4, 2, 5, 6
    for name in ("threads", "rows", "group", "prompt_tokens", "completion_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got "
                             f"{getattr(args, name)}")
    from bench_rollout import save_model  # this script's neighbour in benchmarks/
    from transformers import AutoModelForCausalLM

    from scaleup.config import TrainConfig
    from scaleup.logprobs import completion_logprobs
    from scaleup.modeling import add_lora

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_model(Path(tmp), args.model, dtype)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = add_lora(model, TrainConfig(lora_r=16, lora_alpha=32)).train()
    g = torch.Generator().manual_seed(0)
    n_prompts = -(-args.rows // args.group)
    prompts = torch.randint(0, 256, (n_prompts, args.prompt_tokens), generator=g)
    p_ids = prompts.repeat_interleave(args.group, 0)[:args.rows]
    p_mask = torch.ones_like(p_ids)
    c_ids = torch.randint(0, 256, (args.rows, args.completion_tokens), generator=g)
    c_mask = torch.ones(c_ids.shape)

    option = {"sharing": "share_prompts", "fused-head": "fused_head"}[args.compare]

    def fwd_bwd(on: bool) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
        t0 = time.perf_counter()
        lp, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, **{option: on})
        lp.float().sum().backward()
        seconds = time.perf_counter() - t0
        grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return seconds, lp.detach(), grads

    fwd_bwd(True)  # warm-up
    times, lps, grads = {True: [], False: []}, {}, {}
    for r in range(args.repeats):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            seconds, lps[on], grads[on] = fwd_bwd(on)
            times[on].append(seconds)
        print(json.dumps({"repeat": r, "on_s": round(times[True][-1], 3),
                          "off_s": round(times[False][-1], 3)}), flush=True)
    result = {"compare": args.compare, "model": args.model, "dtype": args.dtype,
              "threads": args.threads, "rows": args.rows, "group": args.group,
              "prompt_tokens": args.prompt_tokens,
              "completion_tokens": args.completion_tokens, "repeats": args.repeats,
              "on_s": statistics.median(times[True]), "off_s": statistics.median(times[False]),
              "max_abs_logp_difference": float((lps[True] - lps[False]).abs().max()),
              "max_rel_grad_difference": max(
                  float((a - b).norm() / b.norm().clamp_min(1e-30))
                  for a, b in zip(grads[True], grads[False], strict=True))}
    result["speedup"] = result["off_s"] / result["on_s"]
    on, off = {"sharing": ("prompt per group", "prompt per row"),
               "fused-head": ("fused head", "checkpointed head")}[args.compare]
    print(f"\n| rows x (prompt + completion) | {off} s | {on} s | speed-up | "
          f"max |logp diff| | max rel. grad diff |\n|---|---:|---:|---:|---:|---:|\n"
          f"| {args.rows} x ({args.prompt_tokens} + {args.completion_tokens}), G={args.group}, "
          f"{args.model} {args.dtype}, {args.threads} thread(s) | {result['off_s']:.3f} | "
          f"{result['on_s']:.3f} | {result['speedup']:.2f}x | "
          f"{result['max_abs_logp_difference']:.2g} | "
          f"{result['max_rel_grad_difference']:.2g} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
