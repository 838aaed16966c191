"""Command-line benchmarks: ``python -m sagc_jax.bench <name> --out FILE.json``.

Each benchmark prints its figures and writes them as JSON; performance claims in
the docs come from these, never from timed tests.
"""
