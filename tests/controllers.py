"""Controllers for tests, built as the package builds them: from a controller section
whose missing settings take ``ControllerSection``'s defaults (the one place that
states them)."""

from sagc_jax.config import controller_settings
import dataclasses

import numpy as np

from sagc_jax.control.controller import SAGCController, controller_from_config
from sagc_jax.control.protocol import GroupPlan
from sagc_jax.control.signal_rate_per_prompt import SignalRatePerPromptController


def build(kind, prompts_for=None, **settings):
  return controller_from_config(controller_settings(dict(settings, kind=kind)),
                                prompts_for=prompts_for)


def sagc(candidates=None, **settings):
  return build("sagc", **_with(candidates, settings))


def static(g, candidates=None, **settings):
  """A static G; its candidates are G alone unless given."""
  return build("static", static_g=g, candidates=(g,) if candidates is None else candidates,
               **settings)


def prompt_aware(candidates=None, **settings):
  return build("prompt_aware", **_with(candidates, settings))


def per_prompt(candidates=None, **settings):
  return build("per_prompt", **_with(candidates, settings))


def _with(candidates, settings):
  return settings if candidates is None else dict(settings, candidates=candidates)


def sagc_settings(**changes):
  """The keyword arguments of a SAGC constructor (a subclass's too), defaults filled."""
  names = {f.name for f in dataclasses.fields(SAGCController.Settings)}
  return {k: v for k, v in controller_settings(changes).items() if k in names}


class SkipsEveryOther(SignalRatePerPromptController):
  """``signal_rate_per_prompt`` with its skipping forced: of the context's first 2 x P(G_b)
  prompts every other one gets size 0, so a test sees skipped prompts in every step
  whatever the posteriors say."""

  def plan(self, context=None):
    if self._pending and self._plan is not None:
      return self._plan
    self._context_ids = np.asarray(context().prompt_ids, np.int64)
    base = self.propose()
    take = int(self.prompts()[self._index])
    sizes = np.zeros(2 * take, np.int64)
    sizes[1::2] = base
    self._skipped = take
    self._plan = GroupPlan(base, sizes)
    return self._plan
