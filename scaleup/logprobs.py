"""Per-token log-probs of completions from the training forward, in chunks.

The decoder runs over ``[prompt | completion]`` (one forward, or the two of a shared
prompt, below); the LM head and the log-softmax then run over ``chunk`` positions at a
time (under activation checkpointing when gradients are on), so the full-vocabulary
float32 logits of the whole batch never exist at once: at most (rows, chunk, V) of them,
recomputed in the backward pass.

A GRPO batch holds each prompt G times, in consecutive rows. The decoder then runs each
distinct prompt once and its completions on the prompt's keys and values, repeated for
each row (:func:`completion_hidden`): the same function (the gradient reaches the
prompt's positions through the repeated keys and values), with G - 1 of every G prompt
forwards saved.
"""

from __future__ import annotations

import torch
from peft import PeftModel
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from torchref import selective_log_softmax, token_entropy


def causal_lm_parts(model):
    """``(decoder, lm_head)`` of a causal LM, looking through a peft wrapper (the LoRA
    layers live inside them, so they stay active unless the adapter is disabled)."""
    lm = model.get_base_model() if isinstance(model, PeftModel) else model
    return lm.base_model, lm.get_output_embeddings()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as ``generate`` does with left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Runs of consecutive rows with the same prompt (ids and mask).

    Returns ``(first, run)``: ``first`` (U,) the first row of each run, ``run`` (N,) the
    run of each row (so ``prompt_ids[first][run]`` is ``prompt_ids``); ``None`` when no
    row repeats the prompt of the row before it (nothing to share).
    """
    same = ((prompt_ids[1:] == prompt_ids[:-1]).all(1)
            & (prompt_mask[1:] == prompt_mask[:-1]).all(1))
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero()[:, 0], starts.long().cumsum(0) - 1


def can_share_prompts(decoder) -> bool:
    """Whether :func:`completion_hidden` may run a repeated prompt once: not under
    activation checkpointing (transformers then drops the key/value cache the completions
    read), and no dropout that acts (with it each row draws its own masks at the prompt's
    positions, which one shared forward would not)."""
    for m in decoder.modules():
        # transformers sets the flag on each module it checkpoints (and on the decoder)
        if vars(m).get("gradient_checkpointing") is True:
            return False
        if decoder.training and isinstance(m, torch.nn.Dropout) and m.p > 0:
            return False
    return not (decoder.training and getattr(decoder.config, "attention_dropout", 0) > 0)


def completion_hidden(decoder, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                      share_prompts: bool) -> torch.Tensor:
    """The decoder's last hidden states (N, T, H) that predict each completion token:
    position ``P - 1 + t`` of ``[prompt | completion]`` predicts completion token ``t``.

    Positions are counted over real tokens (:func:`position_ids`). With ``share_prompts``
    (and :func:`can_share_prompts`), when consecutive rows repeat a prompt
    (:func:`prompt_runs`), the decoder runs each distinct prompt once with a key/value
    cache, the cache's rows are repeated for the rows of each run, and the completions
    (all but their last token, which predicts nothing) run on it. Otherwise one forward
    over ``[prompt | completion]``. The two are the same function, equal up to rounding.
    """
    attn = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    n_prompt, n_comp = prompt_ids.shape[1], completion_ids.shape[1]
    runs = prompt_runs(prompt_ids, prompt_mask) if share_prompts else None
    if runs is None or not can_share_prompts(decoder):
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn),
                         use_cache=False).last_hidden_state
        return hidden[:, n_prompt - 1: n_prompt - 1 + n_comp]
    first, run = runs
    # the forward fills the cache it is given, the 4th positional argument (transformers
    # 5.2x renamed it from past_key_values to cache); a plain DynamicCache keeps every
    # position of every layer, which is right for sliding-window layers too
    cache = DynamicCache()
    hidden = decoder(prompt_ids[first], prompt_mask[first], position_ids(prompt_mask[first]),
                     cache).last_hidden_state
    last = hidden[run, -1:]  # the last prompt position predicts completion token 0
    if n_comp == 1:
        return last
    cache.batch_select_indices(run)  # each run's keys and values, once per row
    tail = decoder(completion_ids[:, :-1], attn[:, :-1], position_ids(attn)[:, n_prompt:-1],
                   cache).last_hidden_state
    return torch.cat([last, tail], dim=1)


def _head_logprobs(head, hidden: torch.Tensor, ids: torch.Tensor, with_entropy: bool,
                   entropy_grad: bool = False):
    # A chunk is a strided slice of the (N, L, H) hidden states. Given that, F.linear
    # runs a batched product with the head's weight expanded to N rows, which bf16
    # copies (N x 272 MB for Qwen2.5-0.5B's 151,936 x 896 head: 24x slower than one
    # (N*chunk, H) x (H, V) product, a micro-batch's forward and backward 3x slower).
    logits = head(hidden.contiguous())
    logp = selective_log_softmax(logits, ids)
    if not with_entropy:
        return logp, None
    if entropy_grad:  # the entropy bonus differentiates it (recomputed in the backward too)
        return logp, token_entropy(logits)
    with torch.no_grad():
        return logp, token_entropy(logits)


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        chunk: int = 64, with_entropy: bool = False,
                        entropy_grad: bool = False, share_prompts: bool = True):
    """Log-probs (and optionally entropies) of each completion token under ``model``.

    Args:
      model: a causal LM (peft-wrapped or not).
      prompt_ids, prompt_mask: (N, P) left-padded prompts.
      completion_ids, completion_mask: (N, T) completions and their response mask.
      chunk: positions per LM-head chunk.
      with_entropy: also return the entropy ``H_t = -sum_v p_v log p_v`` of each
        position's distribution (no grad unless ``entropy_grad``).
      entropy_grad: the entropy keeps its gradient (for an entropy bonus in the loss); it
        is computed per chunk under the same checkpoint as the log-probs, so its (rows,
        chunk, V) logits are recomputed in the backward pass, never all kept.
      share_prompts: run a prompt repeated in consecutive rows once
        (:func:`completion_hidden`).
    Returns:
      ``(logp, entropy)``: (N, T) float32 each (``entropy`` is ``None`` unless asked).
      Values at masked positions are meaningless; mask them.
    """
    decoder, head = causal_lm_parts(model)
    hidden = completion_hidden(decoder, prompt_ids, prompt_mask, completion_ids,
                               completion_mask, share_prompts)
    n_comp = completion_ids.shape[1]
    logps, ents = [], []
    for start in range(0, n_comp, chunk):
        h, tgt = hidden[:, start:start + chunk], completion_ids[:, start:start + chunk]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_head_logprobs, head, h, tgt, with_entropy, entropy_grad,
                                 use_reentrant=False)
        else:
            lp, ent = _head_logprobs(head, h, tgt, with_entropy)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps, dim=1)
    return logp, (torch.cat(ents, dim=1) if with_entropy else None)


def trim(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Drop the columns that are padding in every row: leading prompt padding and trailing
    completion positions after every row's end. Returns the four tensors sliced."""
    first = int(prompt_mask.any(0).float().argmax())
    valid_cols = completion_mask.any(0).nonzero()
    last = int(valid_cols[-1]) + 1 if len(valid_cols) else 1
    return (prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :last],
            completion_mask[:, :last])
