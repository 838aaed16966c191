"""Decoder LMs (Llama 3.x, Qwen2/2.5, Qwen3) in flax.nnx, with HF checkpoint I/O.

Modules, one job each:

* ``config``: ``ModelConfig``, read from / written to transformers ``config.json``;
* ``rope``: rotary embeddings (incl. Llama 3.1 ``llama3`` scaling), matching transformers;
* ``transformer``: the nnx model, the static-shape ``KVCache`` and random init;
* ``sharding``: fits parameter sharding annotations to a concrete mesh;
* ``hf_io``: ``from_pretrained`` / ``save_pretrained`` (safetensors only);
* ``tokenizer``: offline ``AutoTokenizer`` loading, chat-template prompt encoding, padding;
* ``tiny``: the built-in tiny config and character tokenizer for CPU runs.

Typical use::

    model, cfg = from_pretrained(path, dtype=jnp.bfloat16, mesh=mesh)
    logits = model(ids, attention_mask=mask)          # [B, T, vocab] float32
"""

from sagc_jax.models.config import Llama3RopeScaling, ModelConfig
from sagc_jax.models.hf_io import from_pretrained, read_config, save_pretrained
from sagc_jax.models.tiny import build_tiny_checkpoint, build_tiny_tokenizer, tiny_config
from sagc_jax.models.tokenizer import encode_prompts, load_tokenizer, pad_prompts
from sagc_jax.models.kv_cache import KVCache, cache_sharding, init_cache
from sagc_jax.models.transformer import Transformer, init_model, real_token_positions

__all__ = [
    "KVCache",
    "Llama3RopeScaling",
    "ModelConfig",
    "Transformer",
    "build_tiny_checkpoint",
    "build_tiny_tokenizer",
    "cache_sharding",
    "encode_prompts",
    "from_pretrained",
    "init_cache",
    "init_model",
    "load_tokenizer",
    "pad_prompts",
    "read_config",
    "real_token_positions",
    "save_pretrained",
    "tiny_config",
]
