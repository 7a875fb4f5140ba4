"""Elastic resume: a checkpoint of the built-in workload written by N ranks, resumed on M.

An elastic job (docs/elastic.md) is stopped with the preemption signal and started again
with another number of GPUs. For its training to go on as one run, what defines the
optimisation is fixed by the job's first attempt and kept in every checkpoint, its *recipe*:
the global batch G (ranks x per-rank batch) and the positions an epoch covers (steps x G).
A later attempt splits G over its own ranks (``split``); when G does not divide by them the
per-rank batch rounds down, the global batch shrinks and the caller rescales the learning
rate by the same factor (the linear scaling rule its ``peak_lr`` already follows).

The data order is world-size free. An epoch's permutation of the n training images (seeded
by seed + epoch) is read as a sequence of positions, position p being image perm[p mod n]
(the wrap is DistributedSampler's padding). Global step s covers the positions
[origin + s*G, origin + (s+1)*G); rank r of M takes those congruent to origin + r modulo M.
With origin 0 and the same ranks this is DistributedSampler's split, step by step. A
checkpoint records the positions its epoch has consumed; the next attempt starts its first
step there (``resumed_epoch``), so no image of the epoch is seen twice and none is skipped,
whatever the number of ranks before and after. Standard library only: the accounting is
tested with plain integers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ResizeError(ValueError):
    """A checkpoint that cannot be resumed on this many ranks (one line)."""


def train_geometry(n: int, world: int, batch: int, max_steps: int | None) -> tuple[int, int]:
    """(batch, steps) per rank: whole batches only (a last short batch would recompile
    kernels and, with one image, break BatchNorm); a shard smaller than a batch is one step."""
    per_rank = math.ceil(n / world)
    b = min(batch, per_rank)
    steps = max(1, per_rank // b)
    if max_steps is not None:
        steps = min(steps, max_steps)
    return b, steps


@dataclass(frozen=True)
class Recipe:
    """What the job's first attempt fixed: kept through every resize."""

    world: int  # the ranks it was drawn up for
    global_batch: int
    epoch_samples: int  # positions an epoch covers: its steps x the global batch

    @classmethod
    def fresh(cls, n: int, world: int, batch: int, max_steps: int | None) -> Recipe:
        b, steps = train_geometry(n, world, batch, max_steps)
        return cls(world, world * b, steps * world * b)


@dataclass(frozen=True)
class Split:
    """A recipe spread over ``world`` ranks."""

    world: int
    batch: int  # per rank
    steps: int  # per whole epoch

    @property
    def global_batch(self) -> int:
        return self.world * self.batch


def split(recipe: Recipe, world: int) -> Split:
    batch = recipe.global_batch // world
    if batch < 1:
        raise ResizeError(
            f"the checkpoint's global batch of {recipe.global_batch} images cannot be split "
            f"over {world} ranks (at least one image each): run it on at most "
            f"{recipe.global_batch}"
        )
    return Split(world, batch, max(1, recipe.epoch_samples // (world * batch)))


@dataclass(frozen=True)
class EpochSpan:
    """One epoch's steps on a split: step s (0-based) covers positions origin + s*G..+G."""

    first: int  # steps of the epoch done before this attempt
    steps: int  # the number of its last step
    origin: int

    def consumed(self, split: Split, done: int) -> int:
        """Positions of the epoch consumed once ``done`` steps are done."""
        return self.origin + done * split.global_batch


def whole_epoch(split: Split) -> EpochSpan:
    return EpochSpan(0, split.steps, 0)


def resumed_epoch(recipe: Recipe, split: Split, step: int, consumed: int) -> EpochSpan:
    """The rest of an epoch that ``step`` steps (``consumed`` positions) into it was saved,
    on ``split``: its steps go on from ``step``, in whole global batches up to the epoch's
    end (when a resize shrank the global batch, the under-a-batch tail is left out, as
    ``train_geometry`` leaves out an epoch's tail)."""
    left = max(0, recipe.epoch_samples - consumed) // split.global_batch
    return EpochSpan(step, step + left, consumed - step * split.global_batch)


def rank_positions(span: EpochSpan, split: Split, rank: int) -> range:
    """The positions rank ``rank`` trains on, for every step of ``span`` (row s*batch + i
    of its plan is image i of step s); those of steps before ``span.first`` go unused."""
    start = span.origin + rank
    return range(start, start + split.world * span.steps * split.batch, split.world)


def saved_recipe(data: Mapping[str, Any]) -> tuple[Recipe, Split, int]:
    """A checkpoint's recipe, the split it was saved on and the positions its epoch had
    consumed. Checkpoints from before elastic resume have no recipe: theirs was their split."""
    before = Split(int(data["world_size"]), int(data["batch"]), int(data["steps"]))
    g = before.global_batch
    recipe = Recipe(
        int(data.get("recipe_world", before.world)),
        int(data.get("global_batch", g)),
        int(data.get("epoch_samples", before.steps * g)),
    )
    return recipe, before, int(data.get("consumed", int(data.get("step") or 0) * g))


@dataclass(frozen=True)
class Resumption:
    recipe: Recipe
    split: Split
    span: EpochSpan | None  # the resumed epoch's, when saved mid-epoch and resumable
    note: str  # why a mid-epoch checkpoint restarts its epoch
    resized_from: Split | None  # the checkpoint's split, when it had another world size


def resume_plan(
    data: Mapping[str, Any] | None,
    step: int,
    recipe_for: Callable[[int], Recipe],
    seed: int,
    n: int,
    world: int,
) -> Resumption:
    """How to resume a checkpoint (``data``: its data position, None if it has none) on
    ``world`` ranks. ``recipe_for(w)``: the recipe this run's arguments draw up for w ranks.
    The saved recipe is kept when these arguments would have drawn up the same one on the
    saved recipe's ranks; otherwise (another seed, data set, --batch-size or
    --max-steps-per-epoch) this run's own recipe starts, at a mid-epoch checkpoint's epoch
    start (the note says why)."""
    fresh = recipe_for(world)
    if data is None:
        return Resumption(fresh, split(fresh, world), None, "", None)
    recipe, before, consumed = saved_recipe(data)
    mine = recipe_for(recipe.world)
    diff = [
        f"{name} {was} (now {now})"
        for name, was, now in (
            ("seed", data.get("seed"), seed),
            ("train_size", data.get("train_size"), n),
            ("global batch", recipe.global_batch, mine.global_batch),
            ("images an epoch", recipe.epoch_samples, mine.epoch_samples),
        )
        if was != now
    ]
    if diff:
        note = f"saved at step {step} with {', '.join(diff)}: that epoch restarts at its first step"
        return Resumption(fresh, split(fresh, world), None, note if step else "", None)
    now = split(recipe, world)
    span = resumed_epoch(recipe, now, step, consumed) if step else None
    return Resumption(recipe, now, span, "", before if before.world != world else None)


def resize_line(before: Split, now: Split, recipe: Recipe, lr_before: float, lr_now: float) -> str:
    """The one line a resumed run says about its new world size."""
    text = (
        f"resumed on {now.world} ranks from a checkpoint of {before.world}: "
        f"per-rank batch {before.batch} → {now.batch}"
    )
    if now.global_batch == before.global_batch:
        return text + ", lr unchanged"
    why = (
        ""
        if now.global_batch == recipe.global_batch
        else f": the job's {recipe.global_batch} does not divide by {now.world}"
    )
    return (
        f"{text} (global batch {before.global_batch} → {now.global_batch}{why}), "
        f"peak lr {lr_before:.4g} → {lr_now:.4g}"
    )
