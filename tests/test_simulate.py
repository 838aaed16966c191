"""The replay engine's synthetic and prompt-pool worlds: cost model, length process,
prompt pool, LP reference, claims tables, CLI."""

import json
from pathlib import Path

import numpy as np
import pytest

from sagc_jax.config import controller_settings
from sagc_jax.control.budget import ROLLOUT_MODES, prompts_for
from sagc_jax.replay.costs import CostModel
from sagc_jax.replay.engine import best_fixed_mixture
from sagc_jax.replay.entry_points import simulate
from sagc_jax.replay.worlds import LengthProcess, PromptPool
from sagc_jax.experiments.replay_tables import simulate_tables

REPO = Path(__file__).resolve().parents[1]


def load_default_config():
  namespace = {}
  exec((REPO / "configs" / "simulate.py").read_text(), namespace)
  return namespace["get_config"]()


def run_sim(config):
  """``simulate`` as the CLI runs it: arms from the config's complete controller section."""
  return simulate(config, controller_settings(config.controller))


def test_cost_model_matches_hand_computation():
  cost = CostModel(prefill_s_per_token=1e-3, decode_s_per_iter=0.5,
                   decode_s_per_row_iter=0.01, learner_s_per_token=1e-2, step_overhead_s=3.0)
  lengths = np.array([10, 20, 5, 40])              # 4 rows, longest 40, prompts of <= 7
  out = cost([(lengths, np.array([7, 3]))], (lengths[:3], np.array([7, 7, 3])))
  rollout = 1e-3 * 4 * 7 + 40 * (0.5 + 0.01 * 4)
  learner = 1e-2 * 3 * (7 + 20)                    # the trained rows, padded to theirs
  assert out["rollout_s"] == pytest.approx(rollout)
  assert out["learner_s"] == pytest.approx(learner)
  assert out["total_s"] == pytest.approx(rollout + learner + 3.0)


def test_decode_time_is_driven_by_the_longest_response():
  cost = CostModel(0.0, 1.0, 0.0, 0.0, 0.0)
  price = lambda lengths: cost([(np.array(lengths), np.array([0]))], (np.zeros(0, int),) * 2)
  short = price([100, 100, 100, 100])["rollout_s"]
  straggler = price([100, 100, 100, 400])["rollout_s"]
  assert straggler == pytest.approx(4 * short)


def test_length_process_is_deterministic_truncated_and_drifts():
  config = load_default_config()
  process = LengthProcess.of(config)
  a = process.draw(5, 32, 16)
  np.testing.assert_array_equal(a, process.draw(5, 32, 16))
  assert a.dtype == np.int64 and a.min() >= 1 and a.max() <= config.sim.max_len
  assert not np.array_equal(a, process.draw(6, 32, 16))
  early = np.concatenate([process.draw(t, 32, 16).ravel() for t in range(20)])
  late = np.concatenate([process.draw(t, 32, 16).ravel()
                         for t in range(config.sim.steps - 20, config.sim.steps)])
  assert np.median(late) > 2 * np.median(early)
  spread = lambda x: np.std(np.log(x))
  assert spread(late) > spread(early)


def test_best_fixed_mixture_matches_brute_force():
  rng = np.random.default_rng(0)
  candidates = (4, 8, 16)
  for _ in range(20):
    rates = np.sort(rng.uniform(0, 0.6, 3))
    delta = float(rng.uniform(0.05, 0.5))
    grid = np.linspace(0, 1, 401)
    best = None
    for w0 in grid:
      for w1 in grid[grid <= 1 - w0 + 1e-12]:
        w = np.array([w0, w1, max(0.0, 1 - w0 - w1)])
        if w @ rates <= delta + 1e-12:
          value = float(w @ np.log2(candidates))
          best = value if best is None else max(best, value)
    got = best_fixed_mixture(candidates, list(rates), delta)
    if best is None:
      assert got is None
    else:
      assert got == pytest.approx(best, abs=5e-3)


@pytest.mark.parametrize("mode", ROLLOUT_MODES)
def test_simulation_arms_share_random_streams(mode):
  config = load_default_config()
  config.sim.steps = 60
  config.sim.mode = mode
  result = run_sim(config)
  assert set(result["summary"]) == {"static_G4", "static_G8", "static_G16", "sagc"}
  process = LengthProcess.of(config)
  # Re-derive static G=8's straggler rate directly from the length process.
  rates = []
  for t in range(60):
    block = process.draw(t, prompts_for(config.sim, 4), 16)[:prompts_for(config.sim, 8), :8]
    rates.append(np.mean(block.max(1) > 2.0 * np.median(block, 1)))
  assert result["summary"]["static_G8"]["straggler_rate"] == pytest.approx(np.mean(rates))
  assert result["summary"]["static_G16"]["speedup_vs_largest_static"] == 1.0
  rows = [g * n for g, n in zip(result["traces"]["sagc"]["g"], result["traces"]["sagc"]["n_groups"])]
  if mode == "hold_rollouts":
    assert set(rows) == {config.sim.rollouts_per_step}
  else:
    assert set(result["traces"]["sagc"]["n_groups"]) == {config.sim.prompts_per_step}


@pytest.mark.parametrize("key, value, match", [
    ("sim.steps", 0, "sim.steps=0"),
    ("sim.mode", "hold_nothing", "sim.mode='hold_nothing'"),
    ("sim.tail_prob_end", 1.5, "sim.tail_prob_end=1.5"),
    ("sim.rollouts_per_step", 100, "not divisible by group size"),
    ("cost.decode_s_per_iter", -1.0, "cost.decode_s_per_iter"),
    ("controller.delta", 1.5, "delta"),
])
def test_invalid_config_names_the_key(key, value, match):
  config = load_default_config()
  config.sim.mode = "hold_rollouts"
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=match):
    run_sim(config)


def test_dapo_rounds_are_refused_where_every_arm_reads_the_steps_prompts():
  from sagc_jax.replay.engine import build_arms, run

  config = load_prompts_config(steps=5)
  section = controller_settings(config.controller)
  with pytest.raises(ValueError, match="DAPO rounds need new prompts per arm: the PromptPool"):
    run(build_arms(section), make_pool(config), steps=5, budget=config.sim,
        candidates=(4, 8, 16), cost=CostModel.of(config), measure=(2.0, "group"), dapo=True,
        max_rounds=2)


def test_default_cli_runs_and_writes_json_and_png(commands, tmp_path):
  out = tmp_path / "sim.json"
  proc = commands.run("sagc_jax.simulate", f"--out={out}", "--config.sim.steps=200",
                      cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert "static_G16" in proc.stdout and "sagc" in proc.stdout
  result = json.loads(out.read_text())
  assert result["config"]["sim"]["steps"] == 200
  assert len(result["traces"]["sagc"]["g"]) == 200
  png = out.with_suffix(".png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_bad_override_with_key(commands, tmp_path):
  proc = commands.run("sagc_jax.simulate", f"--out={tmp_path / 'x.json'}",
                      "--config.sim.mode=sideways", cwd=tmp_path)
  assert proc.returncode == 2
  assert "sim.mode='sideways'" in proc.stderr


def test_claims_rows_are_per_seed_simulations_and_the_table_covers_every_claim():
  from sagc_jax.experiments.claims import CLAIMS

  config = load_default_config()
  config.sim.steps = 150
  table, rows = simulate_tables(config, controller_settings(config.controller), 3)
  arms = len(config.controller.candidates) + 1
  assert len(rows) == 3 * arms and {r["seed"] for r in rows} == {0, 1, 2}
  # Seed k is exactly the simulation with seed + k (lengths and controller RNG).
  seeded = config.copy_and_resolve_references()
  seeded.seed, seeded.controller.seed = config.seed + 2, config.controller.seed + 2
  direct = run_sim(seeded)["summary"]
  for row in (r for r in rows if r["seed"] == 2):
    name = "sagc" if row["controller"] == "sagc" else f"static_G{row['static_g']}"
    assert row["wall_clock_s"] == direct[name]["wall_clock_s"]
    assert row["step_straggler_rate"] == direct[name]["step_straggler_rate"]
  assert len(table.splitlines()) == 2 + len(CLAIMS)
  # final reward and accuracy and length: not simulated (no accuracy curve, so no
  # claims at equal wall-clock either)
  assert "simulator, 3 seeds" in table and table.count("n/a") == 3


# ------------------------------------------------ the prompt-heterogeneity scenario
def load_prompts_config(steps=80):
  import runpy
  config = runpy.run_path(str(REPO / "configs" / "simulate_prompts.py"))["get_config"]()
  config.sim.steps = steps
  return config


def make_pool(config):
  return PromptPool(config.sim, config.pool, per_step=per_step(config), max_g=16,
                    seed=config.seed)


def per_step(config):
  """M = max_G P(G): the prompts the loader hands out per step."""
  return max(prompts_for(config.sim, g) for g in (4, 8, 16))


def draw(config, step):
  """The pool's prompts of ``step`` (a fresh pool: its one-step memory stays out)."""
  m = per_step(config)
  return make_pool(config).block(m * step, m, step)


def test_prompt_pool_is_heterogeneous_deterministic_and_drifts():
  config = load_prompts_config(steps=400)
  pool = make_pool(config)
  a = draw(config, 5)
  b = draw(config, 5)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert a["lengths"].shape == (32, 16)
  assert a["lengths"].min() >= 1 and a["lengths"].max() <= config.sim.max_len
  # An epoch hands out every prompt at most once (62 steps x 32 of 2000 prompts).
  epoch = np.concatenate([pool.loader.take(32 * t, 32)[0]
                          for t in range(config.pool.size // 32)])
  assert len(set(epoch.tolist())) == len(epoch) == 1984
  early = [draw(config, t) for t in range(10)]
  late = [draw(config, t) for t in range(390, 400)]
  mean = lambda draws, key: np.mean([d[key].mean() for d in draws])
  assert mean(late, "pass_rate") > mean(early, "pass_rate") + 0.1     # prompts get easier
  assert mean(late, "lengths") > 2 * mean(early, "lengths")           # and longer
  # Prompts differ: pass rates span (0, 1); tail weights spread with tail_spread on the
  # logit scale and are higher for harder (rarely passed) prompts.
  pass_rate = np.concatenate([d["pass_rate"] for d in early])
  tail = np.concatenate([d["tail_prob"] for d in early])
  assert pass_rate.min() < 0.1 and pass_rate.max() > 0.9
  logit = np.log(tail / (1 - tail))
  assert logit.std() == pytest.approx(config.pool.tail_spread, rel=0.15)
  assert np.corrcoef(logit, np.log(pass_rate / (1 - pass_rate)))[0, 1] < -0.3


def test_prompt_simulation_arms_budgets_and_equal_budget_metrics():
  config = load_prompts_config(steps=80)
  config.sim.mode = "hold_rollouts"
  result = run_sim(config)
  summary, traces = result["summary"], result["traces"]
  assert list(summary) == ["static_G4", "static_G8", "static_G16", "sagc", "prompt_aware",
                           "per_prompt", "signal_rate"]
  assert max(traces["per_prompt"]["rows"]) <= config.sim.rollouts_per_step
  assert set(traces["static_G8"]["n_groups"]) == {32}
  # static G = 8 re-derived from the pool: rates, signal proxies.
  rates, signal, informative = [], 0.0, 0.0
  for t in range(80):
    d = draw(config, t)
    block = d["lengths"][:32, :8]
    rates.append(np.mean(block.max(1) > 2.0 * np.median(block, 1)))
    p = d["pass_rate"][:32]
    signal += np.sum(4 * p * (1 - p) * 3.0)
    informative += np.sum(1 - p ** 8 - (1 - p) ** 8)
  row = summary["static_G8"]
  assert row["group_straggler_rate"] == pytest.approx(np.mean(rates))
  assert row["signal"] == pytest.approx(signal) and row["informative_groups"] == pytest.approx(
      informative)
  # The arm with the least signal reaches the target at its end; the shortest run's
  # signal at equal wall-clock is its own.
  low = min(summary, key=lambda a: summary[a]["signal"])
  short = min(summary, key=lambda a: summary[a]["wall_clock_s"])
  assert summary[low]["time_to_target_s"] == pytest.approx(summary[low]["wall_clock_s"])
  assert summary[short]["signal_at_equal_time"] == pytest.approx(summary[short]["signal"])
  assert all(r["controller_us"] > 0 for r in summary.values())


def test_prompt_simulation_invalid_pool_key_is_named():
  config = load_prompts_config()
  config.pool.tail_difficulty_corr = 1.5
  with pytest.raises(ValueError, match="pool.tail_difficulty_corr=1.5"):
    run_sim(config)
  config = load_prompts_config()
  config.controller.history_size = 0
  with pytest.raises(ValueError, match="controller: history_size"):
    run_sim(config)


def test_prompt_claims_rows_and_tables(tmp_path):
  config = load_prompts_config(steps=40)
  table, rows = simulate_tables(config, controller_settings(config.controller), 2)
  assert len(rows) == 14 and {r["seed"] for r in rows} == {0, 1}     # 7 arms x 2 seeds
  assert "| per_prompt |" in table and "| prompt_aware | verdict | per_prompt | verdict |" in table
  assert table.count("signal at equal wall-clock, arm / SAGC") == 1


def test_prompt_cli_runs_and_writes_json(commands, tmp_path):
  out = tmp_path / "prompts.json"
  proc = commands.run("sagc_jax.simulate",
                      f"--config={REPO / 'configs' / 'simulate_prompts.py'}", f"--out={out}",
                      "--config.sim.steps=60", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert "per_prompt" in proc.stdout and "ctrl_us" in proc.stdout
  result = json.loads(out.read_text())
  assert len(result["traces"]["per_prompt"]["signal"]) == 60
  assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
