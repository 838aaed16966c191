"""Controllers for tests, built as the package builds them: from a controller section
whose missing settings take ``ControllerSection``'s defaults (the one place that
states them)."""

from sagc_jax.config import controller_settings
import dataclasses

from sagc_jax.control.controller import SAGCController, controller_from_config


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
