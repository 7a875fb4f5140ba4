"""CIFAR-10 in torchvision's on-disk python format, read and written with numpy and pickle.

The format (https://www.cs.toronto.edu/~kriz/cifar.html): a folder ``cifar-10-batches-py/``
holding ``data_batch_1`` .. ``data_batch_5``, ``test_batch`` and ``batches.meta``; each batch is
a pickled dict whose ``b"data"`` is a uint8 array of shape (N, 3072) -- 1024 red, then 1024
green, then 1024 blue values of a 32x32 image, row-major -- and ``b"labels"`` a list of N ints.

We read it ourselves rather than through ``torchvision.datasets.CIFAR10`` because that class
md5-checks every file, so the small datasets the tests and benchmarks write would be rejected,
and because this module must stay importable without torch.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
LABEL_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
NUM_CLASSES = len(LABEL_NAMES)
IMAGE_SHAPE = (3, 32, 32)
_PIXELS = 3 * 32 * 32

U8Array = npt.NDArray[np.uint8]
I64Array = npt.NDArray[np.int64]


class CifarError(Exception):
    """The dataset cannot be used; the message is one line meant for the user."""


class CifarNotFoundError(CifarError, FileNotFoundError):
    """The folder or one of its files is missing."""


class CifarFormatError(CifarError, ValueError):
    """A file exists but is not a CIFAR-10 python batch."""


class Cifar10(NamedTuple):
    """Images are uint8 in the files' own layout, [N, 3, 32, 32]; labels int64 in 0..9."""

    train_x: U8Array
    train_y: I64Array
    test_x: U8Array
    test_y: I64Array


def resolve_root(root: str | os.PathLike[str]) -> Path:
    """The folder holding the batch files: ``root/cifar-10-batches-py`` or ``root`` itself."""
    base = Path(root).expanduser()
    nested = base / BATCHES_DIR
    if (nested / TEST_FILE).is_file():
        return nested
    if (base / TEST_FILE).is_file():
        return base
    return nested


def load_cifar10(root: str | os.PathLike[str]) -> Cifar10:
    """Read all five training batches and the test batch below ``root``."""
    folder = resolve_root(root)
    missing = [name for name in (*TRAIN_FILES, TEST_FILE) if not (folder / name).is_file()]
    if missing:
        what = "folder does not exist" if not folder.is_dir() else f"missing {', '.join(missing)}"
        raise CifarNotFoundError(
            f"CIFAR-10 not found: expected {folder}/ with {', '.join(TRAIN_FILES)} and "
            f"{TEST_FILE} (torchvision's python format) but the {what}; "
            "point --data-dir (or $DDPQ_CIFAR_DIR) at it, or train on generated images "
            "with --synthetic N"
        )
    parts = [_read_batch(folder / name) for name in TRAIN_FILES]
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    test_x, test_y = _read_batch(folder / TEST_FILE)
    return Cifar10(train_x, train_y, test_x, test_y)


def _field(batch: dict[Any, Any], name: str) -> Any:
    # The original files were pickled by Python 2: read with encoding="bytes" their keys are
    # bytes, files pickled by Python 3 may have str keys. Accept both.
    if name.encode() in batch:
        return batch[name.encode()]
    return batch.get(name)


def _read_batch(path: Path) -> tuple[U8Array, I64Array]:
    try:
        with path.open("rb") as f:
            # encoding="bytes": Python 2 str objects (the keys, numpy's raw buffer) stay bytes,
            # which numpy's unpickler expects for its array data.
            batch = pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CifarFormatError(f"{path}: not a CIFAR-10 python batch ({exc})") from exc
    if not isinstance(batch, dict):
        raise CifarFormatError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    data = _field(batch, "data")
    labels = _field(batch, "labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise CifarFormatError(f"{path}: 'data' must be a uint8 array of shape (N, {_PIXELS})")
    if data.shape[1] != _PIXELS:
        raise CifarFormatError(f"{path}: 'data' has shape {data.shape}, expected (N, {_PIXELS})")
    if labels is None:
        raise CifarFormatError(f"{path}: no 'labels'")
    y = np.asarray(labels, dtype=np.int64)
    if y.shape != (data.shape[0],):
        raise CifarFormatError(f"{path}: {y.size} labels for {data.shape[0]} images")
    if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
        raise CifarFormatError(f"{path}: labels outside 0..{NUM_CLASSES - 1}")
    x = np.ascontiguousarray(data).reshape(-1, *IMAGE_SHAPE)
    return x, y


def write_cifar10(root: str | os.PathLike[str], train_n: int, test_n: int, seed: int = 0) -> Path:
    """Write a synthetic dataset of the given sizes in CIFAR-10's python format.

    Returns the ``cifar-10-batches-py`` folder. Files are written as the originals load with
    ``encoding="bytes"``: dicts with bytes keys, ``b"data"`` uint8 (N, 3072), ``b"labels"`` list.
    """
    folder = Path(root).expanduser() / BATCHES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 0])
    train_x, train_y = _make_images(train_n, rng)
    test_x, test_y = _make_images(test_n, np.random.default_rng([seed, 1]))
    chunks = np.array_split(np.arange(train_n), len(TRAIN_FILES))
    for i, (name, idx) in enumerate(zip(TRAIN_FILES, chunks, strict=True)):
        _write_batch(folder / name, f"training batch {i + 1} of 5", train_x[idx], train_y[idx])
    _write_batch(folder / TEST_FILE, "testing batch 1 of 1", test_x, test_y)
    meta = {
        b"label_names": [n.encode() for n in LABEL_NAMES],
        b"num_cases_per_batch": len(chunks[0]),
        b"num_vis": _PIXELS,
    }
    _dump(folder / META_FILE, meta)
    return folder


def _write_batch(path: Path, label: str, x: U8Array, y: I64Array) -> None:
    batch = {
        b"batch_label": label.encode(),
        b"labels": [int(v) for v in y],
        b"data": np.ascontiguousarray(x.reshape(len(x), _PIXELS), dtype=np.uint8),
        b"filenames": [f"synthetic_{i:06d}.png".encode() for i in range(len(x))],
    }
    _dump(path, batch)


def _dump(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        pickle.dump(obj, f, protocol=4)
    os.replace(tmp, path)


def synthetic(n: int, seed: int = 0) -> Cifar10:
    """``n`` generated training images and ``n // 5`` test images, deterministic in ``seed``."""
    train_x, train_y = _make_images(n, np.random.default_rng([seed, 0]))
    test_x, test_y = _make_images(n // 5, np.random.default_rng([seed, 1]))
    return Cifar10(train_x, train_y, test_x, test_y)


# Each class has a colour and a stripe pattern (orientation, frequency); images add random
# phase, contrast and colour jitter plus pixel noise, so a small CNN gets well above chance
# (10 %) within an epoch or two but not instantly to 100 %.
_CLASS_HUES = np.linspace(0.0, 1.0, NUM_CLASSES, endpoint=False)
_CLASS_ANGLES = np.linspace(0.0, np.pi, NUM_CLASSES, endpoint=False)
_CLASS_FREQS = np.array([2.0, 3.0, 4.0, 2.5, 3.5] * 2)
_CHUNK = 4096


def _hue_to_rgb(h: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    k = (np.array([5.0, 3.0, 1.0]) + h[:, None] * 6.0) % 6.0
    return 1.0 - np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def _make_images(n: int, rng: np.random.Generator) -> tuple[U8Array, I64Array]:
    y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
    x = np.empty((n, *IMAGE_SHAPE), dtype=np.uint8)
    coords = np.linspace(-1.0, 1.0, 32)
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    for start in range(0, n, _CHUNK):
        c = y[start : start + _CHUNK]
        m = len(c)
        hue = (_CLASS_HUES[c] + rng.normal(0.0, 0.04, m)) % 1.0
        colour = 0.25 + 0.5 * _hue_to_rgb(hue)  # (m, 3) in [0.25, 0.75]
        angle = _CLASS_ANGLES[c] + rng.normal(0.0, 0.15, m)
        freq = _CLASS_FREQS[c] * np.pi
        phase = rng.uniform(0.0, 2.0 * np.pi, m)
        proj = np.cos(angle)[:, None, None] * xx + np.sin(angle)[:, None, None] * yy
        stripes = np.sin(freq[:, None, None] * proj + phase[:, None, None])  # (m, 32, 32)
        contrast = rng.uniform(0.1, 0.25, m)[:, None, None, None]
        img = colour[:, :, None, None] * (1.0 + contrast * stripes[:, None, :, :] * 2.0)
        img += rng.normal(0.0, 0.08, img.shape)
        x[start : start + m] = np.clip(img * 255.0, 0.0, 255.0).astype(np.uint8)
    return x, y
