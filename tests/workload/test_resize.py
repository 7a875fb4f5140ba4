"""Elastic resume (workloads/resize.py, docs/elastic.md): a checkpoint written by N ranks
resumed on M at the same step, each image of the epoch trained on once.

The accounting is checked with plain integers, then on the real data path (plan_epoch);
whole runs are in test_resize_runs.py.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

import pytest

from ddpq.workloads import resize
from ddpq.workloads.resize import EpochSpan, Recipe, Split

N = 100  # training images


def trained(span: EpochSpan, split: Split, upto: int | None = None) -> list[int]:
    """The positions the ranks of ``split`` train on in steps span.first..upto."""
    end = span.steps if upto is None else upto
    out: list[int] = []
    for rank in range(split.world):
        rows = list(resize.rank_positions(span, split, rank))
        out += rows[span.first * split.batch : end * split.batch]
    return out


def test_a_fresh_epoch_is_distributed_samplers_split() -> None:
    recipe = Recipe.fresh(N, 2, 8, None)
    assert recipe == Recipe(world=2, global_batch=16, epoch_samples=96)  # 6 whole steps
    two = resize.split(recipe, 2)
    assert two == Split(2, 8, 6)
    # Rank r takes r, r+2, r+4...: DistributedSampler's stride, cut to whole batches.
    assert list(resize.rank_positions(resize.whole_epoch(two), two, 1))[:3] == [1, 3, 5]
    assert sorted(trained(resize.whole_epoch(two), two)) == list(range(96))


def test_two_ranks_preempted_mid_epoch_then_four_cover_the_epoch_once() -> None:
    recipe = Recipe.fresh(N, 2, 8, None)
    two, four = resize.split(recipe, 2), resize.split(recipe, 4)
    assert four == Split(4, 4, 6)  # the global batch kept: per-rank batch halved
    first = resize.whole_epoch(two)
    before = trained(first, two, upto=3)
    rest = resize.resumed_epoch(recipe, four, 3, first.consumed(two, 3))
    assert rest == EpochSpan(first=3, steps=6, origin=0)  # the same step, the same end
    after = trained(rest, four)
    assert sorted(before + after) == list(range(96))
    # Step by step the same images as a 4-rank run's: the same global batches.
    assert sorted(after) == sorted(trained(EpochSpan(3, 6, 0), four))
    # As images: none twice (the epoch covers 96 of its 100 positions, no wrap).
    perm = list(range(N))
    random.Random(7).shuffle(perm)
    assert max(Counter(perm[p % N] for p in before + after).values()) == 1


def test_a_global_batch_that_does_not_divide_shrinks_and_comes_back() -> None:
    recipe = Recipe.fresh(N, 2, 8, None)
    three = resize.split(recipe, 3)
    assert three == Split(3, 5, 6)  # 15 images a step: the lr is rescaled by 15/16
    rest = resize.resumed_epoch(recipe, three, 3, 48)
    # 48 left: three steps of 15, the last 3 images of the epoch left out (whole batches).
    assert rest == EpochSpan(first=3, steps=6, origin=3)
    assert sorted(trained(rest, three)) == list(range(48, 93))
    # Preempted again after step 4 (63 consumed), resumed on 4: back to 16 a step.
    four = resize.split(recipe, 4)
    again = resize.resumed_epoch(recipe, four, 4, rest.consumed(three, 4))
    assert rest.consumed(three, 4) == 63
    assert again == EpochSpan(first=4, steps=6, origin=-1)
    assert sorted(trained(again, four)) == list(range(63, 95))
    line = resize.resize_line(three, four, recipe, 0.046875, 0.05)
    assert line == (
        "resumed on 4 ranks from a checkpoint of 3: per-rank batch 5 → 4 "
        "(global batch 15 → 16), peak lr 0.04688 → 0.05"
    )
    line = resize.resize_line(Split(2, 8, 6), three, recipe, 0.05, 0.046875)
    assert "(global batch 16 → 15: the job's 16 does not divide by 3)" in line


def test_the_log_line_of_a_kept_global_batch() -> None:
    recipe = Recipe(2, 64, 640)
    line = resize.resize_line(Split(2, 32, 10), Split(4, 16, 10), recipe, 0.25, 0.25)
    assert line == "resumed on 4 ranks from a checkpoint of 2: per-rank batch 32 → 16, lr unchanged"


def test_more_ranks_than_images_in_a_step_is_refused() -> None:
    with pytest.raises(resize.ResizeError) as caught:
        resize.split(Recipe(2, 2, 20), 4)
    assert str(caught.value) == (
        "the checkpoint's global batch of 2 images cannot be split over 4 ranks "
        "(at least one image each): run it on at most 2"
    )


def test_a_checkpoint_from_before_elastic_resume_reads_as_its_own_recipe() -> None:
    old = {"world_size": 2, "batch": 8, "steps": 6, "step": 2, "seed": 0, "train_size": N}
    recipe, before, consumed = resize.saved_recipe(old)
    assert (recipe, before, consumed) == (Recipe(2, 16, 96), Split(2, 8, 6), 32)

    def fresh(world: int) -> Recipe:
        return Recipe.fresh(N, world, 8, None)

    plan = resize.resume_plan(old, 2, fresh, 0, N, 4)
    assert plan.split == Split(4, 4, 6) and plan.resized_from == Split(2, 8, 6)
    assert plan.span == EpochSpan(2, 6, 0) and plan.note == ""


# --------------------------------------------------------------------------- with torch


@pytest.mark.torch
def test_plan_epoch_trains_each_image_once_across_the_resize() -> None:
    pytest.importorskip("torch")
    import torch

    from ddpq.workloads import cifar
    from ddpq.workloads import resnet18 as workload

    cpu = torch.device("cpu")
    data = workload.DeviceData.build(cifar.synthetic(N, seed=3), cpu, channels_last=False)
    recipe = Recipe.fresh(N, 2, 8, None)
    seen: list[int] = []
    for world, first, upto in ((2, 0, 3), (4, 3, 6)):
        split = resize.split(recipe, world)
        span = resize.resumed_epoch(recipe, split, first, first * 16)
        for rank in range(world):
            cl = workload.Cluster(rank, rank, world, world, cpu, True)
            plan = workload.plan_epoch(data, cl, 1, 0, split, span)
            seen += plan.idx[first * split.batch : upto * split.batch].tolist()
    assert len(seen) == 96 and len(set(seen)) == 96
    # The same world: exactly DistributedSampler's shards (bit-identical resumes rely on it).
    for rank in range(2):
        cl = workload.Cluster(rank, rank, 2, 2, cpu, True)
        two = resize.split(recipe, 2)
        plan = workload.plan_epoch(data, cl, 1, 0, two, resize.whole_epoch(two))
        shard = workload.epoch_shard(N, 1, 0, rank, 2)
        assert torch.equal(plan.idx, shard[:48])


@pytest.mark.torch
def test_too_many_ranks_for_the_checkpoint_is_one_readable_error() -> None:
    pytest.importorskip("torch")
    import torch

    from ddpq.workloads import resnet18 as workload

    args = argparse.Namespace(batch_size=1, max_steps_per_epoch=None, seed=0, eval_only=False)
    data = {"world_size": 2, "batch": 1, "steps": 50, "seed": 0, "train_size": N}
    cl = workload.Cluster(0, 0, 4, 4, torch.device("cpu"), True)
    with pytest.raises(workload.WorkloadError, match="cannot be split over 4 ranks"):
        workload.resume_geometry(args, cl, N, {"data": data, "step": 3})
