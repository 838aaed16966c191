"""Offline tokenizer loading and prompt encoding for the sampler.

Tokenizers come from the checkpoint folder through transformers' ``AutoTokenizer`` with
``local_files_only=True``: training machines (and TPU pods) have no network, and a
silent download attempt would hang or fetch something else. Instruction-tuned
checkpoints ship a chat template; prompts must go through it (with the generation
prompt appended) or the model sees text in a format it was never tuned on. Base models
and our tiny synthetic tokenizer have none, and prompts are then encoded as plain text.

Prompts are returned unpadded (lists of ids); ``pad_prompts`` pads them into the fixed
[batch, length] arrays plus mask that the model and the KV cache take, on either side.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["encode_prompts", "has_chat_template", "load_tokenizer", "pad_prompts"]

Prompt = str | Sequence[Mapping[str, str]]


# A fast tokenizer (tokenizer.json), SentencePiece (tokenizer.model), or BPE vocab.json
# (+ merges.txt): one of them must be in the folder.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | os.PathLike):
  """``AutoTokenizer`` from a local folder, never touching the network.

  A tokenizer without a pad token (Llama 3) gets its EOS token as pad token: padding
  is always masked, so the id only has to exist.
  """
  from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer folder {str(path)!r} does not exist")
  present = set(os.listdir(path))
  if not any(f in present for f in _TOKENIZER_FILES):
    raise FileNotFoundError(f"tokenizer folder {str(path)!r} has none of the tokenizer files "
                            f"{list(_TOKENIZER_FILES)} (copy them from the model's HF repo)")
  tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
  if tok.pad_token is None and tok.eos_token is not None:
    tok.pad_token = tok.eos_token
  return tok


def max_token_chars(tokenizer: Any) -> int:
  """The longest token string of the vocabulary: no text of more than ``n`` times this
  many characters fits in ``n`` tokens (byte-level and SentencePiece vocabularies spell
  each token with at least as many symbols as the characters it decodes to), a bound
  that costs no tokenization."""
  return max((len(token) for token in tokenizer.get_vocab()), default=1)


def has_chat_template(tokenizer: Any) -> bool:
  return bool(getattr(tokenizer, "chat_template", None))


def encode_prompts(tokenizer: Any, prompts: Sequence[Prompt],
                   use_chat_template: bool | None = None) -> list[list[int]]:
  """Token ids of each prompt, unpadded.

  Args:
    tokenizer: a transformers tokenizer (see ``load_tokenizer``).
    prompts: plain strings (sent as one user message when templated) or conversations
      (lists of ``{"role", "content"}`` dicts; these need a chat template).
    use_chat_template: None = use it iff the tokenizer has one; True = require one.
  """
  if isinstance(prompts, str):
    raise TypeError("prompts must be a sequence of prompts, not a single str")
  available = has_chat_template(tokenizer)
  if use_chat_template and not available:
    raise ValueError("use_chat_template=True but the tokenizer has no chat template")
  templated = available if use_chat_template is None else bool(use_chat_template)
  out = []
  for i, prompt in enumerate(prompts):
    if templated:
      messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
      text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
      # The template writes its own BOS/role markers; adding specials again would double BOS.
      ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif isinstance(prompt, str):
      ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
      raise ValueError(f"prompt {i} is a conversation but no chat template is used")
    out.append(list(ids))
  return out


def pad_prompts(seqs: Sequence[Sequence[int]], pad_id: int, length: int | None = None,
                side: str = "left") -> tuple[np.ndarray, np.ndarray]:
  """Pads id lists to ``[len(seqs), length]`` int32 ids and a bool mask (True = real).

  ``length`` defaults to the longest sequence; a longer sequence is an error (never
  truncated silently). Left padding keeps every row's last prompt token in the last
  column, which is what a sampler wants.
  """
  if side not in ("left", "right"):
    raise ValueError(f"side={side!r}: expected 'left' or 'right'")
  longest = max((len(s) for s in seqs), default=0)
  length = longest if length is None else length
  if longest > length:
    row = next(i for i, s in enumerate(seqs) if len(s) > length)
    raise ValueError(f"prompt {row} has {len(seqs[row])} tokens > length={length}")
  ids = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, s in enumerate(seqs):
    cols = slice(length - len(s), length) if side == "left" else slice(0, len(s))
    ids[i, cols] = np.asarray(s, np.int32)
    mask[i, cols] = True
  return ids, mask
