"""Probe: what sets vLLM's sampling speed on a CPU (dtype, compilation, threads).

    python benchmarks/vllm_cpu_probe.py {hf1|hf2|vllm|vllm_eager} {float32|bfloat16} N NEW

One configuration per process (vLLM binds its threads for the life of the process; run
it with ``VLLM_CPU_OMP_THREADS_BIND=0-1 OMP_NUM_THREADS=2`` to give vLLM both cores):
``hfK`` samples with ``transformers``' ``generate`` on K torch threads, ``vllm`` /
``vllm_eager`` with vLLM (compiled / ``enforce_eager``). The model is Qwen2.5-0.5B's
architecture with random weights (``scaleup.tiny``; saved once per dtype under
``--folder``), N random prompts of 32 tokens, NEW tokens each forced (no end token),
temperature 1, no top-k/top-p. Prints one JSON line: seconds and tokens/s of the timed
call (after a 2-prompt warm-up). ``benchmarks/bench_rollout.py`` is the side-by-side
benchmark; this probe answers "why is vLLM slow here" one factor at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def save(folder: Path, dtype: torch.dtype) -> Path:
    """``bench_rollout``'s 0.5B model folder, made once per dtype."""
    from bench_rollout import save_model  # this script's neighbour in benchmarks/

    return folder if (folder / "config.json").exists() else save_model(folder, "0.5b", dtype)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("hf1", "hf2", "vllm", "vllm_eager"))
    p.add_argument("dtype", choices=("float32", "bfloat16"))
    p.add_argument("n", type=int, help="prompts (B*G)")
    p.add_argument("new", type=int, help="new tokens per prompt")
    p.add_argument("--folder", default="/tmp/vllm-cpu-probe", help="model folders go here")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    folder = save(Path(args.folder) / args.dtype, dtype)
    prompts = torch.randint(0, 256, (args.n, 32), generator=torch.Generator().manual_seed(0))
    if args.mode.startswith("hf"):
        from transformers import AutoModelForCausalLM

        from scaleup.rollout import sampling_config

        torch.set_num_threads(int(args.mode[2:]))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()

        def gen(k):  # the scale-up's sampler settings, every completion forced to k tokens
            config = sampling_config(k, [model.config.eos_token_id], model.config.pad_token_id)
            config.min_new_tokens = k
            return config

        with torch.no_grad():
            model.generate(input_ids=prompts[:2], attention_mask=torch.ones_like(prompts[:2]),
                           generation_config=gen(2))
            t0 = time.perf_counter()
            out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                                 generation_config=gen(args.new))
            seconds = time.perf_counter() - t0
        tokens = (out.shape[1] - prompts.shape[1]) * args.n
        startup = None
    else:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        t0 = time.perf_counter()
        llm = vllm.LLM(model=str(folder), dtype=args.dtype, max_model_len=32 + args.new + 8,
                       kv_cache_memory_bytes=2 * 2**30, enforce_eager=args.mode == "vllm_eager",
                       seed=0, generation_config="vllm", distributed_executor_backend="uni")
        startup = time.perf_counter() - t0
        params = vllm.SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, max_tokens=args.new,
                                     min_tokens=args.new, ignore_eos=True, detokenize=False)
        reqs = [{"prompt_token_ids": row.tolist()} for row in prompts]
        llm.generate(reqs[:2], params, use_tqdm=False)
        t0 = time.perf_counter()
        outs = llm.generate(reqs, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    env = {k: v for k, v in os.environ.items()
           if k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}
    print(json.dumps({"mode": args.mode, "dtype": args.dtype, "n": args.n, "new": args.new,
                      "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
                      "startup_s": None if startup is None else round(startup, 1), "env": env}),
          flush=True)


if __name__ == "__main__":
    main()
