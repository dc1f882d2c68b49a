"""Per-token log-probs of completions from the training forward, in chunks.

The decoder runs once over ``[prompt | completion]``; the LM head and the log-softmax
then run over ``chunk`` positions at a time (under activation checkpointing when
gradients are on), so the full-vocabulary float32 logits of the whole batch never exist
at once: at most (rows, chunk, V) of them, recomputed in the backward pass.
"""

from __future__ import annotations

import torch
from peft import PeftModel
from torch.utils.checkpoint import checkpoint

from torchref import selective_log_softmax, token_entropy


def causal_lm_parts(model):
    """``(decoder, lm_head)`` of a causal LM, looking through a peft wrapper (the LoRA
    layers live inside them, so they stay active unless the adapter is disabled)."""
    lm = model.get_base_model() if isinstance(model, PeftModel) else model
    return lm.base_model, lm.get_output_embeddings()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as ``generate`` does with left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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
                        entropy_grad: bool = False):
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
    Returns:
      ``(logp, entropy)``: (N, T) float32 each (``entropy`` is ``None`` unless asked).
      Values at masked positions are meaningless; mask them.
    """
    decoder, head = causal_lm_parts(model)
    attn = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn),
                     use_cache=False).last_hidden_state
    n_prompt, n_comp = prompt_ids.shape[1], completion_ids.shape[1]
    hidden = hidden[:, n_prompt - 1: n_prompt - 1 + n_comp]  # position t predicts token t+1
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
