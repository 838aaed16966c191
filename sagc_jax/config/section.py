"""The base of the typed config sections: the checks a section runs on its own fields.

Why a base: every section names its errors the same way (``<section>.<field>=<value>
must be ...``, the dotted key a user overrides on the command line), and a frozen
dataclass normalises its fields (lists to tuples) through ``object.__setattr__``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from sagc_jax.runtime.storage import is_remote

__all__ = ["Section"]


class Section:
  """Shared plumbing: ``NAME`` is the section's key in the config."""

  NAME = ""

  def _set(self, field: str, value: Any) -> None:     # normalisation in __post_init__
    object.__setattr__(self, field, value)

  def _tuple(self, field: str) -> tuple:
    value = getattr(self, field)
    if isinstance(value, (list, tuple)):
      self._set(field, tuple(value))
    return getattr(self, field)

  def _key(self, field: str) -> str:
    return f"{self.NAME}.{field}"

  def _root(self) -> dict[str, Any]:
    return {self.NAME: self}

  def _string(self, field: str, why: str = "a folder path; '' for the default") -> str:
    value = getattr(self, field)
    if not isinstance(value, str):
      raise ValueError(f"{self._key(field)}={value!r} must be a string ({why})")
    return value

  def _local_folder(self, field: str, why: str) -> None:
    if is_remote(getattr(self, field)):
      raise ValueError(f"{self._key(field)}={getattr(self, field)!r} must be a local folder "
                       f"({why})")

  def _int_at_least(self, field: str, low: int, meaning: str) -> None:
    value = getattr(self, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"{self._key(field)}={value!r} must be an int >= {low} ({meaning})")

  @contextlib.contextmanager
  def _errors_as(self, prefix: str, errors: Any = ValueError) -> Iterator[None]:
    """A check another module runs for this section: its error, as a ``ValueError``
    whose message starts with ``prefix`` (the key it concerns)."""
    try:
      yield
    except errors as err:
      raise ValueError(f"{prefix}{err}") from None

  def _bool(self, field: str) -> None:
    if not isinstance(getattr(self, field), bool):
      raise ValueError(f"{self._key(field)}={getattr(self, field)!r} must be True or False")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)
