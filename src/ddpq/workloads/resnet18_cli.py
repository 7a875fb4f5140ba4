"""Command line of the built-in ResNet18/CIFAR-10 workload.

Standard library only: the daemon imports this module to validate a submission's arguments
(``build_parser().parse_args(argv)``) without paying for ``import torch`` (~3 s).
"""

from __future__ import annotations

import argparse
import os

# torchvision's file name for ResNet18_Weights.IMAGENET1K_V1; looked up in torch's hub cache
# ($TORCH_HOME/hub/checkpoints) when --pretrained is given without a path.
PRETRAINED_FILENAME = "resnet18-f37072fd.pth"


def default_data_dir() -> str:
    """Where CIFAR-10 is looked for unless --data-dir says otherwise."""
    env = os.environ.get("DDPQ_CIFAR_DIR")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "ddpq", "cifar10")


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = _number(text)
    if not value >= 0.0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# The first stage's channels: 64 is ResNet18 as published (and as its ImageNet weights fit);
# defined here, where the workload's options are read without importing torch.
# The bound keeps a typo from asking for a network no machine holds (at 256: 180 M weights).
PUBLISHED_WIDTH = 64
MAX_WIDTH = 256


def _width(text: str) -> int:
    value = _whole_number(text)
    if not 1 <= value <= MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_WIDTH}, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """Checks what no single option's type can: a combination of options."""

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if parsed.pretrained is not None and parsed.width != PUBLISHED_WIDTH:
            self.error(
                f"--pretrained: the ImageNet weights fit --width {PUBLISHED_WIDTH} only, "
                f"not --width {parsed.width}"
            )
        return parsed, rest


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ddpq.workloads.resnet18",
        description=(
            "DDP ResNet18 on CIFAR-10. Run under torchrun (one process per device) or plainly "
            "(world size 1). Progress goes to $DDPQ_JOB_DIR/metrics.jsonl, checkpoints to "
            "$DDPQ_JOB_DIR/checkpoint.pt; nothing is ever downloaded."
        ),
    )
    _training_options(p.add_argument_group("training"))
    _data_options(p.add_argument_group("data"))
    _model_options(p.add_argument_group("model"))
    _execution_options(p.add_argument_group("execution"))
    _checkpoint_options(p.add_argument_group("checkpoints"))
    return p


def _training_options(train: argparse._ArgumentGroup) -> None:
    train.add_argument("--epochs", type=_positive_int, default=5, help="default: %(default)s")
    train.add_argument(
        "--batch-size",
        type=_positive_int,
        default=128,
        help="images per rank per step (default: %(default)s)",
    )
    train.add_argument(
        "--lr",
        type=_positive_float,
        default=0.1,
        help=(
            "learning rate for a global batch of 256; scaled linearly with "
            "world_size*batch_size/256 (default: %(default)s)"
        ),
    )
    train.add_argument(
        "--warmup-epochs",
        type=_non_negative_float,
        default=1.0,
        help="linear LR warm-up before the cosine decay (default: %(default)s)",
    )
    train.add_argument(
        "--weight-decay",
        type=_non_negative_float,
        default=5e-4,
        help="applied to conv/linear weights, not to biases or BatchNorm (default: %(default)s)",
    )
    train.add_argument(
        "--momentum",
        type=_non_negative_float,
        default=0.9,
        help="SGD momentum, Nesterov when > 0 (default: %(default)s)",
    )
    train.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    train.add_argument(
        "--max-steps-per-epoch",
        type=_positive_int,
        default=None,
        help="cap the training steps of every epoch (tests, benchmarks)",
    )


def _data_options(data: argparse._ArgumentGroup) -> None:
    data.add_argument(
        "--data-dir",
        metavar="DIR",
        default=default_data_dir(),
        help=(
            "folder holding cifar-10-batches-py/ (torchvision's python format), or that folder "
            "itself (default: $DDPQ_CIFAR_DIR or ~/.cache/ddpq/cifar10; now %(default)s)"
        ),
    )
    data.add_argument(
        "--synthetic",
        metavar="N",
        type=_positive_int,
        default=None,
        help="train on N generated images (and test on N//5) instead of reading CIFAR-10",
    )


def _model_options(model: argparse._ArgumentGroup) -> None:
    model.add_argument(
        "--stem",
        choices=("imagenet", "cifar"),
        default="imagenet",
        help=(
            "imagenet: torchvision's 7x7/2 conv + maxpool; cifar: 3x3/1 conv, no maxpool "
            "(slower, more accurate on 32x32 images) (default: %(default)s)"
        ),
    )
    model.add_argument(
        "--width",
        type=_width,
        default=PUBLISHED_WIDTH,
        help=(
            "channels of the first stage, doubled at each of the next three; 64 is ResNet18 "
            "as published, 8 to 32 a smaller, quicker network for checking a set-up "
            "(default: %(default)s)"
        ),
    )
    model.add_argument(
        "--pretrained",
        metavar="PATH",
        nargs="?",
        const="",
        default=None,
        help=(
            "start from ImageNet weights read from PATH, or without PATH from torch's hub "
            f"cache ($TORCH_HOME/hub/checkpoints/{PRETRAINED_FILENAME}); never downloads"
        ),
    )


def _execution_options(run: argparse._ArgumentGroup) -> None:
    run.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: CUDA when available, else CPU with gloo (default: %(default)s)",
    )
    run.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on for CUDA, off on CPU)",
    )
    run.add_argument(
        "--workers",
        type=_non_negative_int,
        default=0,
        help=(
            "CPU threads per rank; 0 = $OMP_NUM_THREADS if set, else cores // ranks on this "
            "host. There are no loader processes: batches are cropped, flipped and normalised "
            "with tensor ops on the training device (default: %(default)s)"
        ),
    )
    run.add_argument(
        "--deterministic",
        action="store_true",
        help=(
            "on GPUs: deterministic cuDNN convolutions and no autotuning, so that runs of one "
            "seed (a preempted and resumed one included) differ less, at some speed; on the "
            "CPU, torch's deterministic algorithms (runs with a fixed thread count are "
            "bit-identical anyway)"
        ),
    )
    run.add_argument(
        "--eval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate on the test split after every epoch (default: on)",
    )
    run.add_argument(
        "--eval-only",
        action="store_true",
        help="load the checkpoint, evaluate it on the test split, and exit",
    )


def _checkpoint_options(ckpt: argparse._ArgumentGroup) -> None:
    ckpt.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=1,
        help=(
            "save every N epochs and after the last one; 0 = never, except when preempted "
            "(default: %(default)s)"
        ),
    )
    ckpt.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        default=None,
        help="where checkpoint.pt lives (default: $DDPQ_JOB_DIR; without either, no checkpoints)",
    )
