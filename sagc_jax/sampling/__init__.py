"""Generation for RL rollouts: the bucketed jitted sampler and its length stats."""

from sagc_jax.sampling.group_stats import GroupLengthStats, LengthStatsSink, group_length_stats
from sagc_jax.sampling.params import SamplingParams
from sagc_jax.sampling.sampler import SampleBatch, Sampler, row_buckets_for

__all__ = [
    "GroupLengthStats",
    "LengthStatsSink",
    "SampleBatch",
    "Sampler",
    "SamplingParams",
    "group_length_stats",
    "row_buckets_for",
]
