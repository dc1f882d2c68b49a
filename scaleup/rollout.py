"""Sampling completions from the policy itself, and the response mask.

Layout of a batch of N = B * G sequences, group by group (rows ``g*G .. g*G+G-1`` share
a prompt): ``input_ids = [left-padded prompt (P) | completion (T)]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from scaleup.tasks import Problem


@dataclass
class Rollouts:
    """Sampled completions and what the update needs about them.

    Attributes:
      prompt_ids: (N, P) left-padded prompt tokens.
      prompt_mask: (N, P) 1 on real prompt tokens.
      completion_ids: (N, T) generated tokens (padding after the end of a turn).
      response_mask: (N, T) 1 on completion tokens up to and including the first
        end-of-turn token, 0 after it.
      truncated: (N,) True where no end-of-turn token was generated.
      texts: the N completions decoded, special tokens dropped.
      problems: the N problems (each repeated G times).
      sample_seconds: wall time spent in ``generate``.
      logp_sampler: (N, T) each sampled token's log-prob under the sampler (vLLM's,
        ``--rollout vllm``; 0 on padding), or None (``generate``: the sampler is the trainer).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    problems: list[Problem]
    sample_seconds: float
    logp_sampler: torch.Tensor | None = None

    @property
    def input_ids(self) -> torch.Tensor:
        """(N, P + T) prompt then completion."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N, P + T) 1 on real prompt tokens and on response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask.to(self.prompt_mask.dtype)], 1)

    def select(self, rows: torch.Tensor) -> Rollouts:
        """The rollouts of the given row indices (for dropping zero-variance groups)."""
        idx = rows.tolist()
        return Rollouts(self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
                        self.response_mask[rows], self.truncated[rows],
                        [self.texts[i] for i in idx], [self.problems[i] for i in idx],
                        self.sample_seconds,
                        None if self.logp_sampler is None else self.logp_sampler[rows])


def response_mask(completion_ids: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 on each completion token up to and including the first stop token, 0 after.

    Args:
      completion_ids: (N, T) generated tokens.
      stop_ids: the end-of-turn token ids.
    Returns:
      (N, T) float32 mask; a row without a stop token is all ones (truncated).
    """
    is_stop = torch.isin(completion_ids, torch.tensor(stop_ids, device=completion_ids.device))
    stops_before = torch.cumsum(is_stop.int(), dim=1) - is_stop.int()  # stops strictly before t
    return (stops_before == 0).float()


def truncated_rows(completion_ids: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """(N,) bool: the completions that hold no stop token (cut off at the length limit)."""
    stops = torch.tensor(stop_ids, device=completion_ids.device)
    return ~torch.isin(completion_ids, stops).any(1)


def sampling_config(max_new_tokens: int, stop_ids: list[int], pad_id: int,
                    greedy: bool = False) -> GenerationConfig:
    """Sample from the policy itself: temperature 1, and every warper set to its no-op
    value explicitly (``top_k=0``, ``top_p=1``, ...), because transformers fills unset
    fields from the model's generation config (Qwen-Instruct: top_k 20, top_p 0.8,
    temperature 0.7, repetition_penalty 1.05) and then from defaults (``top_k=50``)."""
    common = dict(max_new_tokens=max_new_tokens, eos_token_id=stop_ids, pad_token_id=pad_id,
                  use_cache=True, repetition_penalty=1.0, no_repeat_ngram_size=0,
                  num_beams=1, min_new_tokens=0)
    if greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                            typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, **common)


def chat_prompts(tokenizer, problems: list[Problem]) -> list[str]:
    """Each problem as a single user turn, with the assistant turn opened."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}],
                                          tokenize=False, add_generation_prompt=True)
            for p in problems]


def sample_rollouts(model, tokenizer, problems: list[Problem], group_size: int,
                    max_new_tokens: int, stop_ids: list[int], device: torch.device,
                    greedy: bool = False) -> Rollouts:
    """``group_size`` completions of each problem from ``model`` (KV cache, no grad).

    Sampling uses the global torch RNG (saved in checkpoints). ``greedy`` is for
    evaluation only.
    """
    enc = tokenizer(chat_prompts(tokenizer, problems), return_tensors="pt", padding=True,
                    padding_side="left", add_special_tokens=False)
    prompt_ids = enc["input_ids"].repeat_interleave(group_size, 0).to(device)
    prompt_mask = enc["attention_mask"].repeat_interleave(group_size, 0).to(device)
    gen_cfg = sampling_config(max_new_tokens, stop_ids, tokenizer.pad_token_id, greedy)
    was_training = model.training
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                             generation_config=gen_cfg)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    model.train(was_training)
    completion_ids = out[:, prompt_ids.shape[1]:]
    mask = response_mask(completion_ids, stop_ids)
    truncated = truncated_rows(completion_ids, stop_ids)
    texts = tokenizer.batch_decode(completion_ids.masked_fill(mask == 0, tokenizer.pad_token_id),
                                   skip_special_tokens=True)
    reps = [p for p in problems for _ in range(group_size)]
    return Rollouts(prompt_ids, prompt_mask, completion_ids, mask, truncated, texts, reps, seconds)
