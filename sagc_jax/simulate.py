"""``python -m sagc_jax.simulate [--config configs/simulate.py]``: the SAGC
controller against every static G on simulated rollout lengths, no model needed.

Prints the comparison table in seconds and writes ``--out`` (JSON), ``--plot``
(PNG) and, with ``--claims_seeds N``, the paper's claims table over N seeds. The
simulator itself is ``sagc_jax.control.simulator``. A config with a ``pool``
section (configs/simulate_prompts.py) runs the prompt-heterogeneity simulator
instead (``sagc_jax.control.prompt_simulator``: static G, SAGC, prompt_aware,
per_prompt), and ``--claims_seeds N`` then writes its per-arm and against-SAGC
tables (``sagc_jax.experiments.prompt_claims``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import run_absl_tool

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "simulate.py"


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file(
      "config", str(DEFAULT_CONFIG), "ml_collections config file (get_config()).")
  flags.DEFINE_string("out", "runs/simulate/results.json", "JSON output path.")
  flags.DEFINE_string("plot", None, "PNG plot path (default: --out with .png).")
  flags.DEFINE_integer("claims_seeds", 0, "also run this many seeds and write the paper's "
                       "claims table (sagc_jax.experiments.claims) next to --out as claims.md")
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  config = flags.config
  from sagc_jax.experiments.plots import plot_simulation

  prompts = "pool" in config
  if prompts:
    from sagc_jax.control.prompt_simulator import format_prompt_table as format_table
    from sagc_jax.control.prompt_simulator import simulate_prompts as simulate
    from sagc_jax.experiments.prompt_claims import simulate_prompt_claims as simulate_claims
  else:
    from sagc_jax.control.simulator import format_table, simulate
    from sagc_jax.experiments.claims import simulate_claims
  result = simulate(config)
  print(f"SAGC simulator{' (prompt pool)' if prompts else ''}: {config.sim.steps} steps, "
        f"mode={config.sim.mode}, "
        f"candidates={tuple(config.controller.candidates)}, tau={config.controller.tau}, "
        f"delta={config.controller.delta} ({result['simulator_seconds']:.2f} s)")
  print(format_table(result))
  out = Path(flags.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=1))
  plot_path = Path(flags.plot) if flags.plot else out.with_suffix(".png")
  plot_simulation(result, plot_path)
  print(f"wrote {out} and {plot_path}")
  if flags.claims_seeds < 0:
    raise ValueError(f"--claims_seeds={flags.claims_seeds} must be >= 0")
  if flags.claims_seeds:
    table, _ = simulate_claims(config, flags.claims_seeds)
    claims_path = out.with_name("claims.md")
    claims_path.write_text(table + "\n")
    print(table)
    print(f"wrote {claims_path} ({flags.claims_seeds} seeds)")


def run() -> None:
  """Console entry point ``sagc-simulate``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
