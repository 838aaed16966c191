"""Plants each bug of ``BUGS`` in a checkout, runs the quick-suite modules that should
catch it, and puts the file back: the table in docs/results.md ("Planted bugs").

  python tests/plant_bugs.py CHECKOUT OUT.json [NAME ...]

A bug counts as caught when pytest exits 1 (a test failed); the first failing test is
recorded. Run it on a clean clone: each file is restored after its run, but a killed run
leaves the bug in place.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# name: (file, original line, planted line, test modules that should fail)
BUGS = {
  "median_off_by_one": ("sagc_jax/sampling/group_stats.py",
      "upper = sorted_lengths[jnp.clip(start + count // 2, 0, last)]",
      "upper = sorted_lengths[jnp.clip(start + (count + 1) // 2, 0, last)]",
      ["tests/test_sampler.py", "tests/test_segmented.py"]),
  "padding_row_in_group_stats": ("sagc_jax/sampling/group_stats.py",
      "gid = jnp.where(row_valid, group_ids.astype(jnp.int32), num_groups)",
      "gid = group_ids.astype(jnp.int32)",
      ["tests/test_sampler.py"]),
  "bucket_miss_recompiles": ("sagc_jax/sampling/sampler.py",
      'prompt_len = smallest_bucket(max(len(p) for p in prompts), self.prompt_buckets,',
      'prompt_len = max(len(p) for p in prompts) or smallest_bucket(0, self.prompt_buckets,',
      ["tests/test_sampler.py"]),
  "dual_update_sign": ("sagc_jax/control/sagc.py",
      "updated = self._lambda + self.eta * (rate - self.params.delta)",
      "updated = self._lambda - self.eta * (rate - self.params.delta)",
      ["tests/test_controller.py"]),
  "resumed_controller_rng": ("sagc_jax/control/risk.py",
      '"state": {"state": int(rng["state"]), "inc": int(rng["inc"])},',
      '"state": {"state": int(rng["state"]) + 1, "inc": int(rng["inc"])},',
      ["tests/test_controller.py"]),
  "dropped_kl_term": ("sagc_jax/rl/step_fns.py",
      "loss = loss + cfg.kl_coef * kl",
      "loss = loss",
      ["tests/test_packing.py", "tests/test_learner.py"]),
  "packing_target_off_by_one": ("sagc_jax/rl/packing.py",
      "first = col + len(prompt) - 1          # target column of response token 0",
      "first = col + len(prompt)          # target column of response token 0",
      ["tests/test_packing.py"]),
}


def main() -> None:
  tree, out = Path(sys.argv[1]), Path(sys.argv[2])
  names = sys.argv[3:] or list(BUGS)
  results = json.loads(out.read_text()) if out.exists() else {}
  for name in names:
    path, old, new, tests = BUGS[name]
    f = tree / path
    src = f.read_text()
    assert src.count(old) == 1, (name, src.count(old))
    f.write_text(src.replace(old, new))
    try:
      t = time.time()
      proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                             "-m", "not slow", *tests], cwd=tree, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tree)})
      failed = [line.split(" ")[1] for line in proc.stdout.splitlines()
                if line.startswith("FAILED ")]
      results[name] = {"caught": proc.returncode == 1, "rc": proc.returncode,
                       "first_failure": failed[:1], "tests": tests,
                       "seconds": round(time.time() - t)}
      print(name, results[name], flush=True)
    finally:
      f.write_text(src)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
