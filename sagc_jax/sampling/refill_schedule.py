"""The host side of refill decoding: page accounting and the slot schedule.

``RefillSchedule`` decides, between two decode segments, which queued row takes which
slot and which pages (``PagePool``: the free list of one lane's pool). It touches no
device array, so the same policy serves real decoding (``refill.RefillDecoder.run``)
and drawn lengths (``simulate_refill``, the AOT tool's rollout projection); a test
checks that the two run the same steps on the same lengths.

One boundary, in order:

1. **Release**: rows that stopped in the last segment give back their own pages; a
   prompt's pages in a lane go back when no row of it runs there and none is queued.
2. **Reserve**: each running row gets the pages it can fill in the next segment, so no
   page is allocated inside a program. When a lane's pool is short, its youngest
   running rows are evicted (their pages freed, the rows queued again at the front:
   they restart from token 0 and sample the same tokens).
3. **Admit**: queued rows take idle slots, in order, in a lane that holds the row's
   prompt if one has an idle slot, else in the lane with the most spare pages, while
   that lane's pool holds the prompt (unless resident) and the row's first segment.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterator, Sequence

import numpy as np

from sagc_jax.models.paged_cache import SCRATCH_PAGE

__all__ = ["PagePool", "RefillSchedule", "pages_for", "simulate_refill"]


def pages_for(tokens: int, page_size: int) -> int:
  return -(-tokens // page_size)


class PagePool:
  """The host's free list of a paged cache's pages; page 0 (scratch) is never handed out.

  Every page is either free or held, never both: ``give`` refuses a page that is not
  held, so a double free or a leak shows as an error or as ``held`` not returning to
  0 after a call (both tested).
  """

  def __init__(self, num_pages: int):
    if num_pages < 2:
      raise ValueError(f"PagePool: num_pages={num_pages} must be >= 2 (page 0 is scratch)")
    self.num_pages = num_pages
    self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))     # pops low pages first
    self._held: set[int] = set()

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def held(self) -> int:
    return len(self._held)

  def take(self, n: int) -> list[int]:
    if n > len(self._free):
      raise RuntimeError(f"PagePool: {n} pages asked, {len(self._free)} free")
    pages = [self._free.pop() for _ in range(n)]
    self._held.update(pages)
    return pages

  def give(self, pages: Sequence[int]) -> None:
    for page in pages:
      if page not in self._held:
        raise RuntimeError(f"PagePool: page {page} given back but not held")
      self._held.remove(page)
      self._free.append(page)


@dataclasses.dataclass
class _Slot:
  lane: int                     # the mesh's 'data' shard that holds the slot and its pages
  row: int = -1                 # row of the call (-1: idle)
  prompt: int = -1
  pages: list = dataclasses.field(default_factory=list)    # own pages, in order
  own_len: int = 0
  last: int = 0
  done: bool = True


@dataclasses.dataclass
class _Prompt:
  tokens: list
  unfinished: int               # rows of the prompt not finished yet
  pages: dict = dataclasses.field(default_factory=dict)    # lane -> resident pages

  @property
  def kv_len(self) -> int:      # keys the prompt shares: every token but the last
    return len(self.tokens) - 1


class RefillSchedule:
  """The host side of one refill call: which row runs in which slot, on which pages.

  Kept apart from the device programs so that the same policy runs against real
  decoding (``RefillDecoder.run``) and against drawn lengths (``simulate_refill``,
  which the AOT tool uses to project a rollout). One boundary between segments is
  ``release``, ``reserve``, ``admit`` then ``grow``; the segment's results come back
  through ``advance``.
  """

  def __init__(self, prompts: Sequence[Sequence[int]], group_size: int, *, lanes: int,
               slots_per_lane: int, num_pages: int, page_size: int, segment: int,
               max_new_tokens: int):
    self.group_size, self.lanes, self.page = group_size, lanes, page_size
    self.segment, self.n_new = segment, max_new_tokens
    self.prompts = [_Prompt(list(map(int, p)), unfinished=group_size) for p in prompts]
    rows = len(prompts) * group_size
    self.queue = collections.deque(range(rows))
    self.queued = collections.Counter(row // group_size for row in self.queue)  # per prompt
    self.slots = [_Slot(lane=i // slots_per_lane) for i in range(lanes * slots_per_lane)]
    self.pools = [PagePool(num_pages) for _ in range(lanes)]
    self.lengths = np.zeros(rows, np.int32)
    self.final_lane = np.zeros(rows, np.int32)     # the lane whose outputs hold each row
    self.evictions = 0

  # ------------------------------------------------------------- accounting
  def own_pages_needed(self, slot: _Slot, prompt: _Prompt) -> int:
    """Own pages a slot needs to run the next segment (shared prompt pages aside)."""
    upto = prompt.kv_len + min(slot.own_len + self.segment, self.n_new)
    return pages_for(upto, self.page) - prompt.kv_len // self.page

  def _free_prompt(self, prompt: _Prompt, lane: int) -> None:
    self.pools[lane].give(prompt.pages.pop(lane))

  def _runs_in(self, lane: int, p: int) -> bool:
    return any(s.row >= 0 and s.lane == lane and s.prompt == p for s in self.slots)

  def _shortfall(self, lane: int) -> int:
    need = sum(max(self.own_pages_needed(s, self.prompts[s.prompt]) - len(s.pages), 0)
               for s in self.slots if s.row >= 0 and s.lane == lane)
    return need - self.pools[lane].free

  def _evict_youngest(self, lane: int) -> bool:
    running = [i for i, s in enumerate(self.slots) if s.row >= 0 and s.lane == lane]
    if len(running) <= 1:
      return False
    index = min(running, key=lambda i: (self.slots[i].own_len, -self.slots[i].row))
    victim = self.slots[index]
    self.pools[lane].give(victim.pages)
    self.queue.appendleft(victim.row)
    self.queued[victim.prompt] += 1
    self.slots[index] = _Slot(lane=lane)
    self.evictions += 1
    if not self._runs_in(lane, victim.prompt):
      self._free_prompt(self.prompts[victim.prompt], lane)   # prefilled again on restart
    return True

  @property
  def running(self) -> list[_Slot]:
    return [s for s in self.slots if s.row >= 0]

  @property
  def held(self) -> int:
    return sum(p.held for p in self.pools)

  # ------------------------------------------------------------- a boundary
  def release(self) -> None:
    """Rows that stopped give back their pages; so do prompts no row needs in a lane."""
    for index, s in enumerate(self.slots):
      if s.row >= 0 and s.done:
        self.lengths[s.row], self.final_lane[s.row] = s.own_len, s.lane
        self.pools[s.lane].give(s.pages)
        self.prompts[s.prompt].unfinished -= 1
        self.slots[index] = _Slot(lane=s.lane)
    for p, prompt in enumerate(self.prompts):
      for lane in [l for l in prompt.pages if not self.queued[p] and not self._runs_in(l, p)]:
        self._free_prompt(prompt, lane)

  def reserve(self) -> None:
    """Makes room for the running rows' next segment, evicting the youngest if short."""
    for lane in range(self.lanes):
      while self._shortfall(lane) > 0:
        if not self._evict_youngest(lane):
          raise RuntimeError("refill: the pool cannot hold one running row "
                             "(kv_pages is checked against this at construction)")

  def admit(self) -> tuple[list[list[int]], dict[int, tuple[int, int]]]:
    """Queued rows take idle slots, in order: in a lane that holds the row's prompt if
    one has an idle slot, else in the lane with the most spare pages. Returns the
    prompts each lane must prefill and the copy-on-write pages (slot -> (src, dst))."""
    page = self.page
    spare = [-self._shortfall(lane) for lane in range(self.lanes)]
    idle = [[i for i, s in enumerate(self.slots) if s.row < 0 and s.lane == lane]
            for lane in range(self.lanes)]
    new_prompts: list[list[int]] = [[] for _ in range(self.lanes)]
    copies: dict[int, tuple[int, int]] = {}
    while self.queue:
      row = self.queue[0]
      p = row // self.group_size
      prompt = self.prompts[p]
      open_lanes = [lane for lane in range(self.lanes) if idle[lane]]
      if not open_lanes:
        break
      lane = max(open_lanes, key=lambda l: (l in prompt.pages, spare[l], -l))
      resident = lane in prompt.pages
      cost = self.own_pages_needed(_Slot(lane=lane), prompt) + (
          0 if resident else pages_for(prompt.kv_len, page))
      if cost > spare[lane]:
        break
      self.queue.popleft()
      self.queued[p] -= 1
      spare[lane] -= cost
      if not resident:
        new_prompts[lane].append(p)
        prompt.pages[lane] = self.pools[lane].take(pages_for(prompt.kv_len, page))
      index = idle[lane].pop(0)
      s = self.slots[index]
      s.row, s.prompt, s.own_len, s.done = row, p, 0, False
      s.last = prompt.tokens[-1]
      s.pages = self.pools[lane].take(self.own_pages_needed(s, prompt))
      if prompt.kv_len % page:                 # copy on write of the partial page
        copies[index] = (prompt.pages[lane][prompt.kv_len // page], s.pages[0])
    if not self.running and self.queue:
      raise RuntimeError("refill: no queued row fits the empty pool")
    return new_prompts, copies

  def grow(self) -> None:
    """Every running row takes the pages it can fill in the next segment."""
    for s in self.running:
      extra = self.own_pages_needed(s, self.prompts[s.prompt]) - len(s.pages)
      if extra > 0:
        s.pages += self.pools[s.lane].take(extra)

  def boundaries(self) -> Iterator[tuple[list[list[int]], dict[int, tuple[int, int]]]]:
    """Every boundary of the call, in order, until no row runs: yields what ``admit``
    returns, after ``grow``; the caller runs the segment and ``advance``s."""
    while True:
      self.release()
      self.reserve()
      new_prompts, copies = self.admit()
      if not self.running:
        return
      self.grow()
      yield new_prompts, copies

  def advance(self, own_len, last, done) -> None:
    """The segment's results, one entry per slot."""
    for s, n, token, stop in zip(self.slots, own_len, last, done):
      if s.row >= 0:
        s.own_len, s.last, s.done = int(n), int(token), bool(stop)


def simulate_refill(prompt_lens: Sequence[int], lengths: np.ndarray, *, lanes: int,
                    slots_per_lane: int, num_pages: int, page_size: int, segment: int,
                    max_new_tokens: int) -> dict[str, Any]:
  """``RefillSchedule`` against drawn response lengths (``lengths`` [prompts, G]):
  the decode steps a refill call would run, and its prefills and evictions. A
  segment runs until ``segment`` steps or until every running row has stopped, as
  the device program does. ``segment_runs`` lists each segment's (steps, the most
  keys one lane's running rows hold at its middle): the lanes decode in lock step, so
  the fullest lane sets a step's attention reads."""
  group = lengths.shape[1]
  sched = RefillSchedule([[1] * max(int(n), 1) for n in prompt_lens], group, lanes=lanes,
                         slots_per_lane=slots_per_lane, num_pages=num_pages,
                         page_size=page_size, segment=segment, max_new_tokens=max_new_tokens)
  target = np.minimum(lengths.reshape(-1), max_new_tokens)
  steps = segments = prefills = prefill_rounds = 0
  runs: list[tuple[int, int]] = []
  for new_prompts, _ in sched.boundaries():
    if any(new_prompts):
      prefills += sum(map(len, new_prompts))
      prefill_rounds += 1
    left = [int(target[s.row]) - s.own_len for s in sched.running]
    ran = min(segment, max(left))
    keys = [0] * lanes
    for s in sched.running:
      keys[s.lane] += sched.prompts[s.prompt].kv_len + s.own_len + min(
          ran, int(target[s.row]) - s.own_len) // 2
    runs.append((ran, max(keys)))
    own = [s.own_len + min(ran, int(target[s.row]) - s.own_len) if s.row >= 0 else 0
           for s in sched.slots]
    done = [s.row >= 0 and own[i] >= target[s.row] for i, s in enumerate(sched.slots)]
    sched.advance(own, [0] * len(own), done)
    steps += ran
    segments += 1
  return dict(decode_steps=steps, segments=segments, prefills=prefills,
              prefill_rounds=prefill_rounds, evictions=sched.evictions, segment_runs=runs)
