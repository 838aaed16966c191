"""Typed configuration of the decoder family, read from and written to HF ``config.json``.

One decoder covers Llama 3.x, Qwen2/2.5 and Qwen3. They differ in a handful of switches
(q/k/v biases, per-head q/k RMSNorm, tied embeddings, RoPE scaling), which the
``ModelConfig`` exposes as derived properties of ``model_type`` plus the HF fields, so
that the model code never branches on family names and ``to_hf_dict`` can always write
a config that transformers reads back as the same architecture.

Two ``config.json`` dialects exist: transformers 5 nests the RoPE settings in
``rope_parameters`` (``rope_theta``, ``rope_type`` and the scaling keys); 4.x keeps
``rope_theta`` at the top level and the scaling in ``rope_scaling`` (with ``rope_type``
or the older ``type`` key). Both are read; both are written, so that either major
version loads our checkpoints.

The dataclasses are frozen and hashable: the config is static data of the nnx module
(part of its graph definition), and jit caches key on it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

__all__ = [
    "Llama3RopeScaling",
    "ModelConfig",
    "SUPPORTED_MODEL_TYPES",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# transformers' own default when a config names no rope_theta.
_DEFAULT_ROPE_THETA = 10_000.0


def _require(cond: bool, field: str, value: Any, why: str, owner: str = "ModelConfig") -> None:
  if not cond:
    raise ValueError(f"{owner}.{field}={value!r}: {why}")


def _require_positive_int(field: str, value: Any, owner: str = "ModelConfig") -> None:
  _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
           field, value, "must be a positive int", owner)


def _require_positive_float(field: str, value: Any, owner: str = "ModelConfig") -> None:
  _require(isinstance(value, (int, float)) and not isinstance(value, bool)
           and math.isfinite(value) and value > 0, field, value,
           "must be a positive finite number", owner)


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """The ``llama3`` RoPE frequency scaling of Llama 3.1/3.2 (see ``rope.py``)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
      _require_positive_float(name, getattr(self, name), "Llama3RopeScaling")
    _require(self.high_freq_factor > self.low_freq_factor, "high_freq_factor",
             self.high_freq_factor, f"must exceed low_freq_factor={self.low_freq_factor!r}",
             "Llama3RopeScaling")
    _require_positive_int("original_max_position_embeddings",
                          self.original_max_position_embeddings, "Llama3RopeScaling")

  def to_hf_dict(self) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": float(self.factor),
        "low_freq_factor": float(self.low_freq_factor),
        "high_freq_factor": float(self.high_freq_factor),
        "original_max_position_embeddings": int(self.original_max_position_embeddings),
    }


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one decoder-only checkpoint (field names follow HF where possible).

  Attributes:
    model_type: "llama", "qwen2" or "qwen3".
    vocab_size, hidden_size, intermediate_size: embedding rows, residual width, MLP width.
    num_layers: decoder blocks (HF ``num_hidden_layers``).
    num_heads, num_kv_heads: query heads and key/value heads (grouped-query attention).
    head_dim: per-head width; Qwen3 sets it explicitly (may differ from hidden/heads).
    rms_norm_eps: epsilon of every RMSNorm.
    rope_theta: RoPE base.
    rope_scaling: ``Llama3RopeScaling`` or None (plain RoPE).
    max_position_embeddings: context length the checkpoint was configured for.
    tie_word_embeddings: output head reuses the input embedding matrix.
    attention_bias: Llama/Qwen3 ``attention_bias`` (biases on q, k, v and o); Qwen2
      always has q/k/v biases and no o bias, so this must be False for it.
    mlp_bias: Llama ``mlp_bias`` (biases on gate/up/down projections).
    bos_token_id, eos_token_ids, pad_token_id: special ids copied from config.json (the
      sampler stops on any of ``eos_token_ids``).
  """

  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = _DEFAULT_ROPE_THETA
  rope_scaling: Llama3RopeScaling | None = None
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None

  def __post_init__(self):
    _require(self.model_type in SUPPORTED_MODEL_TYPES, "model_type", self.model_type,
             f"unsupported; expected one of {SUPPORTED_MODEL_TYPES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
      _require_positive_int(name, getattr(self, name))
    _require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
             f"must divide num_heads={self.num_heads}")
    _require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "must be even for RoPE")
    _require_positive_float("rms_norm_eps", self.rms_norm_eps)
    _require_positive_float("rope_theta", self.rope_theta)
    _require(self.rope_scaling is None or isinstance(self.rope_scaling, Llama3RopeScaling),
             "rope_scaling", self.rope_scaling, "must be None or a Llama3RopeScaling")
    for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
      _require(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be a bool")
    _require(not (self.model_type == "qwen2" and self.attention_bias), "attention_bias",
             self.attention_bias, "qwen2 has fixed biases (q/k/v yes, o no); must be False")
    _require(not (self.model_type != "llama" and self.mlp_bias), "mlp_bias", self.mlp_bias,
             f"only llama supports MLP biases, not {self.model_type}")
    for name in ("bos_token_id", "pad_token_id"):
      value = getattr(self, name)
      _require(value is None or (isinstance(value, int) and 0 <= value),
               name, value, "must be None or a non-negative int")
    _require(isinstance(self.eos_token_ids, tuple)
             and all(isinstance(t, int) and t >= 0 for t in self.eos_token_ids),
             "eos_token_ids", self.eos_token_ids, "must be a tuple of non-negative ints")

  # Architecture switches derived from the family, so that model code never checks names.
  @property
  def qkv_bias(self) -> bool:
    return self.model_type == "qwen2" or self.attention_bias

  @property
  def o_bias(self) -> bool:
    return self.attention_bias

  @property
  def qk_norm(self) -> bool:
    return self.model_type == "qwen3"

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
    """Reads a transformers ``config.json`` dict (4.x or 5 dialect)."""
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"config.json model_type={model_type!r} is not supported; "
                       f"expected one of {SUPPORTED_MODEL_TYPES}")
    architectures = d.get("architectures") or []
    if architectures and _ARCHITECTURES[model_type] not in architectures:
      raise ValueError(f"config.json architectures={list(architectures)!r} disagree with "
                       f"model_type={model_type!r} (expected {_ARCHITECTURES[model_type]!r}); "
                       "fix whichever of the two is wrong")
    act = d.get("hidden_act", "silu")
    if act != "silu":
      raise ValueError(f"config.json hidden_act={act!r} is not supported (only 'silu')")
    if d.get("use_sliding_window", False):
      raise ValueError("config.json use_sliding_window=True is not supported "
                       "(sliding-window attention is not implemented)")
    layer_types = d.get("layer_types") or ()
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
      raise ValueError(f"config.json layer_types contains {other}: "
                       "only full_attention is supported")
    if d.get("pretraining_tp", 1) not in (1, None):
      raise ValueError(f"config.json pretraining_tp={d['pretraining_tp']!r} is not supported "
                       "(only 1)")

    def required(key: str) -> Any:
      if key not in d:
        raise ValueError(f"config.json lacks required key {key!r} (model_type={model_type})")
      return d[key]

    hidden = required("hidden_size")
    heads = required("num_attention_heads")
    kv_heads = d.get("num_key_value_heads") or heads
    head_dim = d.get("head_dim")
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
      head_dim = hidden // heads
    theta, scaling = _parse_rope(d)
    eos = d.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return cls(
        model_type=model_type,
        vocab_size=required("vocab_size"),
        hidden_size=hidden,
        intermediate_size=required("intermediate_size"),
        num_layers=required("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=d.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=False if model_type == "qwen2" else bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)) if model_type == "llama" else False,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=d.get("pad_token_id"),
    )

  def to_hf_dict(self, dtype_name: str = "float32") -> dict[str, Any]:
    """A ``config.json`` dict that transformers 5 (and 4.x) load as this architecture."""
    rope_parameters = {"rope_type": "default", "rope_theta": float(self.rope_theta)}
    rope_scaling = None
    if self.rope_scaling is not None:
      rope_scaling = self.rope_scaling.to_hf_dict()
      rope_parameters = {**rope_scaling, "rope_theta": float(self.rope_theta)}
    eos: Any = None
    if len(self.eos_token_ids) == 1:
      eos = self.eos_token_ids[0]
    elif self.eos_token_ids:
      eos = list(self.eos_token_ids)
    d: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[self.model_type]],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "rope_parameters": rope_parameters,  # transformers 5
        "rope_theta": float(self.rope_theta),  # transformers 4.x
        "rope_scaling": rope_scaling,  # transformers 4.x
        "bos_token_id": self.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": self.pad_token_id,
        "attention_dropout": 0.0,
        "use_cache": True,
        "dtype": dtype_name,
    }
    if self.model_type == "llama":
      d["attention_bias"] = self.attention_bias
      d["mlp_bias"] = self.mlp_bias
    else:
      d["use_sliding_window"] = False
      d["sliding_window"] = None
      d["max_window_layers"] = self.num_layers
      if self.model_type == "qwen3":
        d["attention_bias"] = self.attention_bias
    return d


def _parse_rope(d: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
  """(rope_theta, scaling) from either config dialect; unsupported rope types raise."""
  new, old = d.get("rope_parameters"), d.get("rope_scaling")
  if isinstance(new, Mapping) and isinstance(old, Mapping) and old:
    kinds = [p.get("rope_type", p.get("type", "default")) for p in (new, old)]
    if kinds[0] != kinds[1] and not all(isinstance(v, Mapping) for v in new.values()):
      # transformers reads the two keys differently across versions: refuse rather
      # than train with another RoPE than the checkpoint's users will run.
      raise ValueError(f"config.json rope_parameters says rope_type={kinds[0]!r} but "
                       f"rope_scaling says {kinds[1]!r}; make them agree (or drop one)")
  params = new or old or {}
  if not isinstance(params, Mapping):
    raise ValueError(f"config.json rope_parameters/rope_scaling={params!r} must be a dict")
  if params and all(isinstance(v, Mapping) for v in params.values()):
    # transformers 5 per-layer-type nesting: accept it only when all entries agree.
    entries = [dict(v) for v in params.values()]
    if any(e != entries[0] for e in entries):
      raise ValueError(f"config.json rope_parameters differ per layer type: {dict(params)!r}")
    params = entries[0]
  theta = params.get("rope_theta", d.get("rope_theta", _DEFAULT_ROPE_THETA))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) not in (1, 1.0, None):
    raise ValueError("config.json partial_rotary_factor != 1 is not supported")
  if rope_type == "default":
    return theta, None
  if rope_type == "llama3":
    try:
      scaling = Llama3RopeScaling(
          factor=float(params["factor"]),
          low_freq_factor=float(params["low_freq_factor"]),
          high_freq_factor=float(params["high_freq_factor"]),
          original_max_position_embeddings=int(params.get(
              "original_max_position_embeddings", d["max_position_embeddings"])),
      )
    except KeyError as e:
      raise ValueError(f"config.json llama3 rope scaling lacks key {e.args[0]!r}") from None
    return theta, scaling
  raise ValueError(f"config.json rope_type={rope_type!r} is not supported "
                   "(supported: 'default', 'llama3')")
