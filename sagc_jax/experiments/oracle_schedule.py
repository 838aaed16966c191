"""The replay oracle's G per step on a trace (``python -m
sagc_jax.experiments.oracle_schedule --trace T``): the ``controller.schedule`` of an arm
that trains on it (``control.schedule``), which measures whether the oracle's objective
tracks learning apart from how well ``signal_rate`` estimates it (``replay.oracle``)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["oracle_schedule"]


def oracle_schedule(trace_path: str, *, cost_flag: str = "cpu", budget: str | None = None,
                    steps: int = 400, seed: int = 0) -> list[int]:
  """The oracle's G of each step of one replay of ``trace_path`` (GRPO, its cost and
  budget as calibrate replays it): the ``controller.schedule`` of an arm that follows it."""
  from sagc_jax.config import controller_settings
  from sagc_jax.replay.costs import budgeted_settings, cost_from_flag
  from sagc_jax.replay.entry_points import replay
  from sagc_jax.replay.trace import read_trace

  trace = read_trace(trace_path)
  cost = cost_from_flag(cost_flag, trace)
  settings = budgeted_settings(cost, trace, budget)
  section = dict(controller_settings(trace.header["controller"]),
                 candidates=tuple(settings["candidates"]))
  result = replay([trace], section, cost, rollout=settings["rollout"], steps=steps,
                  max_rounds=1, kinds=(), seed=seed)
  return [int(g) for g in result["traces"]["oracle"]["g"]]


def main(argv: Sequence[str] | None = None) -> None:
  import argparse
  import json

  parser = argparse.ArgumentParser(description="The replay oracle's G schedule of a trace "
                                   "(GRPO), for controller.kind=schedule.")
  parser.add_argument("--trace", required=True)
  parser.add_argument("--cost", default="cpu")
  parser.add_argument("--budget", default=None)
  parser.add_argument("--steps", type=int, default=400)
  args = parser.parse_args(argv)
  print(json.dumps(oracle_schedule(args.trace, cost_flag=args.cost, budget=args.budget,
                                   steps=args.steps)))


if __name__ == "__main__":
  main()
