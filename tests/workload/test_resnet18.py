"""The built-in ResNet18/CIFAR-10 workload: data files, augmentation, and real torchrun runs.

The multi-rank tests run gloo on the CPU, one thread per rank, a few tiny steps, under
``python -m torch.distributed.run`` (or, where the launcher is not what is checked, with the
environment it gives the ranks: runs.run_ranks); each waits on a condition with a deadline,
never a fixed sleep.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch  # noqa: E402

from ddpq.workloads import cifar, resize  # noqa: E402
from ddpq.workloads import resnet18 as workload  # noqa: E402
from tests.workload.runs import (  # noqa: E402
    NARROW,
    RUN_TIMEOUT_S,
    SRC,
    finish,
    kill_group,
    kill_job,
    records,
    run,
    run_ranks,
    start,
    wait_for,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CIFAR-format files with a test split of 33 images: odd, so 2 ranks cannot split it
    evenly and a DistributedSampler-style padding would count an image twice."""
    root = tmp_path_factory.mktemp("cifar")
    cifar.write_cifar10(root, train_n=160, test_n=33, seed=7)
    return root


# --------------------------------------------------------------------------- data files


def test_reader_round_trips_written_files(tmp_path: Path) -> None:
    folder = cifar.write_cifar10(tmp_path, train_n=23, test_n=7, seed=3)
    assert folder == tmp_path / "cifar-10-batches-py"
    # The files themselves: dicts with bytes keys, uint8 (N, 3072) data, list labels.
    raw = []
    for name in (*cifar.TRAIN_FILES, cifar.TEST_FILE):
        with (folder / name).open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
        assert {b"data", b"labels"} <= set(batch)
        assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape[1] == 3072
        assert isinstance(batch[b"labels"], list)
        raw.append(batch)
    with (folder / cifar.META_FILE).open("rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert meta[b"label_names"][0] == b"airplane"
    assert sum(len(b[b"labels"]) for b in raw[:5]) == 23

    data = cifar.load_cifar10(tmp_path)
    assert data.train_x.shape == (23, 3, 32, 32) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (7, 3, 32, 32)
    want_train = np.concatenate([b[b"data"] for b in raw[:5]]).reshape(23, 3, 32, 32)
    np.testing.assert_array_equal(data.train_x, want_train)
    np.testing.assert_array_equal(data.train_y, np.concatenate([b[b"labels"] for b in raw[:5]]))
    np.testing.assert_array_equal(data.test_x.reshape(7, -1), raw[5][b"data"])
    np.testing.assert_array_equal(data.test_y, raw[5][b"labels"])
    # The batch folder itself is accepted as the root too.
    np.testing.assert_array_equal(cifar.load_cifar10(folder).test_x, data.test_x)


def test_reader_reads_hand_written_batches(tmp_path: Path) -> None:
    """Files written independently of our writer, channel planes in CIFAR's order, and with
    str keys as a Python 3 program might write them."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    want: dict[str, tuple[np.ndarray, list[int]]] = {}
    for i, name in enumerate((*cifar.TRAIN_FILES, cifar.TEST_FILE)):
        n = 2 + i
        x = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, size=n)]
        keys: tuple[Any, Any] = (b"data", b"labels") if i % 2 == 0 else ("data", "labels")
        with (folder / name).open("wb") as f:
            pickle.dump({keys[0]: x, keys[1]: y, b"batch_label": b"x"}, f, protocol=2)
        want[name] = (x, y)
    data = cifar.load_cifar10(tmp_path)
    x0, y0 = want["data_batch_1"]
    # Pixel (row 0, col 1) of image 0: red at 1, green at 1024 + 1, blue at 2048 + 1.
    assert data.train_x[0, :, 0, 1].tolist() == [x0[0, 1], x0[0, 1025], x0[0, 2049]]
    assert data.train_y[:2].tolist() == y0
    assert len(data.train_x) == sum(2 + i for i in range(5))
    np.testing.assert_array_equal(data.test_x.reshape(len(data.test_x), -1), want["test_batch"][0])


def test_reader_rejects_a_broken_file(tmp_path: Path) -> None:
    folder = cifar.write_cifar10(tmp_path, train_n=10, test_n=5)
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(cifar.CifarFormatError, match="data_batch_3"):
        cifar.load_cifar10(tmp_path)


def test_missing_folder_error_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(cifar.CifarNotFoundError) as info:
        cifar.load_cifar10(tmp_path / "nowhere")
    text = str(info.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in text
    assert "--synthetic N" in text and "\n" not in text


def test_synthetic_is_deterministic_and_learnable() -> None:
    a, b, c = cifar.synthetic(500, seed=1), cifar.synthetic(500, seed=1), cifar.synthetic(500, 2)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    assert not np.array_equal(a.train_x, c.train_x)
    assert a.test_x.shape == (100, 3, 32, 32) and set(a.train_y.tolist()) == set(range(10))
    # Learnable: even nearest class mean of the per-image mean colour beats chance (10 %) by
    # far, so a CNN has something to find within an epoch or two.
    feats = a.train_x.reshape(500, 3, -1).mean(axis=2)
    centroids = np.stack([feats[a.train_y == k].mean(axis=0) for k in range(10)])
    test_feats = a.test_x.reshape(100, 3, -1).mean(axis=2)
    guess = np.argmin(((test_feats[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (guess == a.test_y).mean() > 0.5


def test_cli_parser_does_not_import_torch() -> None:
    code = (
        "import sys; from ddpq.workloads.resnet18_cli import build_parser; "
        "a = build_parser().parse_args(['--epochs', '3', '--no-amp', '--synthetic', '64']); "
        "assert a.epochs == 3 and a.amp is False and a.synthetic == 64 and a.eval is True; "
        "assert 'torch' not in sys.modules, 'parser imported torch'"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)


# --------------------------------------------------------------------------- pieces


def test_batch_augmentation_matches_a_per_image_reference() -> None:
    data = cifar.synthetic(40, seed=5)
    cpu = torch.device("cpu")
    cl = workload.Cluster(0, 0, 1, 1, cpu, False)
    plain = workload.DeviceData.build(data, cpu, channels_last=False)
    one_step = resize.Split(world=1, batch=40, steps=1)
    plan = workload.plan_epoch(plain, cl, 0, 3, one_step, resize.whole_epoch(one_step))
    x, y = plain.train_batch(*plan.step(0))
    rows, cols = plan.rows.numpy(), plan.cols.numpy()
    flips = cols[:, 0] > cols[:, -1]
    assert 0 < flips.sum() < 40, "both flipped and unflipped images expected"
    mean = np.array(workload.CIFAR_MEAN)[:, None, None]
    std = np.array(workload.CIFAR_STD)[:, None, None]
    for j, i in enumerate(plan.idx.tolist()):
        oy, ox = rows[j, 0], min(cols[j, 0], cols[j, -1])
        assert 0 <= oy <= 8 and 0 <= ox <= 8
        padded = np.pad(data.train_x[i], ((0, 0), (4, 4), (4, 4)))
        crop = padded[:, oy : oy + 32, ox : ox + 32]
        if flips[j]:
            crop = crop[:, :, ::-1]
        want = (crop / 255.0 - mean) / std
        np.testing.assert_allclose(x[j].numpy(), want, atol=1e-5)
        assert y[j].item() == data.train_y[i]
    cl_data = workload.DeviceData.build(data, cpu, channels_last=True)
    x_cl, _ = cl_data.train_batch(*plan.step(0))
    assert x_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x_cl, x)


def test_epoch_shards_cover_the_data_like_distributed_sampler() -> None:
    shards = [workload.epoch_shard(33, seed=0, epoch=2, rank=r, world=2) for r in range(2)]
    assert [len(s) for s in shards] == [17, 17]
    assert set(torch.cat(shards).tolist()) == set(range(33))
    other_epoch = workload.epoch_shard(33, seed=0, epoch=3, rank=0, world=2)
    assert not torch.equal(other_epoch, shards[0]), "set_epoch must reshuffle"


def test_lr_scales_with_world_size_warms_up_and_decays() -> None:
    peak = workload.peak_lr(0.1, world=4, batch=128)
    assert peak == pytest.approx(0.2)
    sched = workload.Schedule(peak, warmup_epochs=1.0, epochs=3)
    lrs = [sched.lr(e, s, 10) for e in range(3) for s in range(10)]
    assert lrs[:10] == sorted(lrs[:10]) and lrs[9] == pytest.approx(peak)
    assert lrs[10:] == sorted(lrs[10:], reverse=True) and lrs[-1] == pytest.approx(0.0, abs=1e-9)


def test_pretrained_weights_come_from_a_local_file_only(tmp_path: Path) -> None:
    from torchvision.models import resnet18

    imagenet = resnet18(weights=None)  # 1000 classes, like the published file
    path = tmp_path / "resnet18-f37072fd.pth"
    torch.save(imagenet.state_dict(), path)
    model = workload.build_model(workload.Architecture("cifar", 64))
    skipped = workload.load_pretrained(model, str(path))
    # The new head and the CIFAR stem's 3x3 conv keep their fresh initialisation.
    assert skipped == ["conv1.weight", "fc.bias", "fc.weight"]
    key = "layer1.0.conv1.weight"
    torch.testing.assert_close(model.state_dict()[key], imagenet.state_dict()[key])
    with pytest.raises(workload.WorkloadError, match="never downloads"):
        workload.load_pretrained(model, str(tmp_path / "absent.pth"))


# --------------------------------------------------------------------------- whole runs


def test_missing_data_folder_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-cifar-here"
    code, out = run(["--data-dir", str(missing)], tmp_path / "job")
    lines = out.strip().splitlines()
    assert code == workload.EXIT_USAGE, out
    assert len(lines) == 1, out
    assert "Traceback" not in out
    assert str(missing) in lines[0] and "--synthetic N" in lines[0]


def test_two_ranks_under_torchrun_train_and_report(tmp_path: Path) -> None:
    job = tmp_path / "job"
    args = ["--synthetic", "256", "--epochs", "2", "--batch-size", "16"]
    args += ["--max-steps-per-epoch", "5", "--seed", "1"]
    # The narrow network: what is checked is torchrun's run and its report, not the network
    # (tests/test_workload_ddpq.py trains the published width under torchrun).
    args += NARROW
    code, out = run(args, job, nproc=2)
    assert code == 0, out
    assert "world_size 2" in out and "done: epochs 2/2, final test_acc" in out
    recs = records(job)
    epochs = [r for r in recs if r["phase"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    keys = {"epoch", "epochs", "step", "steps", "train_loss", "train_acc", "test_loss"}
    keys |= {"test_acc", "images_per_s", "eta_s", "time", "phase"}
    for r in recs:
        assert keys <= set(r), r
    for r in epochs:
        assert r["steps"] == 5 and r["epochs"] == 2
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"])
        assert 0.0 <= r["train_acc"] <= 1.0 and 0.0 <= r["test_acc"] <= 1.0
        assert r["images_per_s"] > 0
        # Global numbers: accuracy over 2 ranks x 5 steps x 16 images, on a 1/160 grid.
        assert round(r["train_acc"] * 160, 6) == round(r["train_acc"] * 160)
    assert any(r["phase"] == "train" for r in recs)
    assert epochs[-1]["eta_s"] == 0
    assert (job / "checkpoint.pt").is_file()


@pytest.mark.usefixtures("alone")
def test_eval_is_the_same_on_one_and_two_ranks(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt_dir = tmp_path / "ckpt"
    # The ImageNet stem (the default) and the narrow network: what is compared is how the
    # test split is shared out, the same with any network.
    common = ["--data-dir", str(data_dir), "--batch-size", "16", "--stem", "imagenet", *NARROW]
    common += ["--checkpoint-dir", str(ckpt_dir)]
    monkeypatch.setenv("DDPQ_JOB_DIR", str(tmp_path / "train"))
    # Trained on one rank in this process; its evaluation is one rank's, of the model saved.
    assert workload.main([*common, "--epochs", "1", "--max-steps-per-epoch", "3"]) == 0
    (one,) = [r for r in records(tmp_path / "train") if r["phase"] == "epoch"]

    code, out = run_ranks([*common, "--eval-only"], tmp_path / "two", nproc=2)
    assert code == 0, out
    (two,) = [r for r in records(tmp_path / "two") if r["phase"] == "eval"]
    assert two["test_samples"] == 33  # each test image counted once
    # The saved model, loaded and evaluated on two ranks, as on the one that trained it (the
    # epoch's record has no count: equal means over the same 33 images are what show it).
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-5)
    assert two["test_acc"] == pytest.approx(one["test_acc"], abs=1e-12)


@pytest.mark.usefixtures("alone")
def test_sigterm_then_rerun_resumes_at_the_next_epoch(
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = tmp_path / "job"
    args = ["--data-dir", str(data_dir), "--batch-size", "16", "--max-steps-per-epoch", "4"]
    args += NARROW
    log = tmp_path / "first.log"
    proc = start([*args, "--epochs", "50"], job, nproc=2, log=log)
    ckpt = job / "checkpoint.pt"
    try:
        wait_for(ckpt.is_file, timeout=RUN_TIMEOUT_S, proc=proc)
        kill_group(proc, signal.SIGTERM)
        code = finish(proc, timeout=60)
    finally:
        kill_job(proc, signal.SIGKILL)
    first = log.read_text(errors="replace")
    assert code != 0, first
    assert "SIGTERM: stopping during epoch" in first, first
    done = int(torch.load(ckpt, map_location="cpu", weights_only=True)["epoch"])
    assert 1 <= done < 50
    before = len(records(job))

    # The rerun in this process, on one rank: where it resumes does not depend on how many
    # (an epoch's end is the same point on any), and SIGTERM above needed the two.
    monkeypatch.setenv("DDPQ_JOB_DIR", str(job))
    capsys.readouterr()
    code = workload.main([*args, "--epochs", str(done + 1)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"epoch {done} done): continuing at epoch {done + 1}/{done + 1}" in out, out
    second = records(job)[before:]
    assert second, "the rerun wrote no metrics"
    assert {r["epoch"] for r in second} == {done + 1}
    assert [r["phase"] for r in second][-1] == "epoch"
    assert int(torch.load(ckpt, map_location="cpu", weights_only=True)["epoch"]) == done + 1
