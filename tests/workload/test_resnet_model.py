"""The workload's own ResNet18 is torchvision's, weight for weight and output for output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpq.workloads import resnet18 as workload
from ddpq.workloads.resnet18 import Architecture, build_model
from ddpq.workloads.resnet18_cli import build_parser


@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_a_seed_gives_torchvisions_weights_and_outputs(stem: str) -> None:
    from torch import nn
    from torchvision.models import resnet18

    torch.manual_seed(7)
    ours = build_model(Architecture(stem, 64))
    torch.manual_seed(7)
    theirs = resnet18(weights=None, num_classes=10)
    if stem == "cifar":
        theirs.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        theirs.maxpool = nn.Identity()
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)  # same names, same order: weights files load by name
    for name, tensor in reference.items():
        assert torch.equal(mine[name], tensor), name
    ours.eval()
    theirs.eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(ours(images), theirs(images))


def test_building_the_model_does_not_import_torchvision() -> None:
    code = (
        "import sys; from ddpq.workloads.resnet18 import Architecture, build_model; "
        "build_model(Architecture('cifar', 64)); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def scaled(name: str, dim: int, channels: int, width: int) -> int:
    """A published weight's size along ``dim`` at ``width``."""
    if name == "conv1.weight" and dim == 1:
        return channels  # the image's three colours
    if name.startswith("fc.") and dim == 0:
        return channels  # the ten classes
    if dim >= 2:
        return channels  # a kernel's height and width
    return channels * width // 64


@pytest.mark.parametrize("width", [1, 8, 16, 32])
@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_a_width_scales_every_layer_s_channels_alike(stem: str, width: int) -> None:
    """--width keeps ResNet18's layers, in their order and at their strides, each with
    width/64 of its channels: the published network's weights, each shape scaled."""
    published = build_model(Architecture(stem, 64)).state_dict()
    narrow = build_model(Architecture(stem, width))
    shapes = {name: tuple(t.shape) for name, t in narrow.state_dict().items()}
    assert list(shapes) == list(published)
    for name, tensor in published.items():
        expected = tuple(scaled(name, dim, n, width) for dim, n in enumerate(tensor.shape))
        assert shapes[name] == expected, name
    out = narrow.eval()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)


def test_a_checkpoint_resumes_only_on_its_own_width(tmp_path: Path) -> None:
    """A checkpoint of one width cannot load into another; the run says so in one line
    (an old checkpoint, from before --width, counts as 64); --eval-only evaluates what was
    trained."""
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    state = {"format": 2, "epoch": 1, "stem": "imagenet", "width": 16}
    args = build_parser().parse_args(["--checkpoint-dir", str(tmp_path), "--width", "32"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workload, "load_checkpoint", lambda path: dict(state))
        wrong = r"--width 16, not --stem imagenet --width 32"
        with pytest.raises(workload.WorkloadError, match=wrong):
            workload.find_checkpoint(args)
        args.width = 16
        assert workload.find_checkpoint(args)[2] == Architecture("imagenet", 16)
        args.width, args.eval_only = 64, True
        assert workload.find_checkpoint(args)[2] == Architecture("imagenet", 16)
        del state["width"]
        args.eval_only = False
        assert workload.find_checkpoint(args)[2] == Architecture("imagenet", 64)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--width", "0"], "argument --width: must be from 1 to 256, got 0"),
        (["--width", "257"], "argument --width: must be from 1 to 256, got 257"),
        (["--width", "-16"], "argument --width: must be from 1 to 256, got -16"),
        (["--width", "16.5"], "argument --width: must be a whole number, got '16.5'"),
        (["--width", "wide"], "argument --width: must be a whole number, got 'wide'"),
        (["--width", ""], "argument --width: must be a whole number, got ''"),
        (["--width"], "argument --width: expected one argument"),
        (
            ["--width", "16", "--pretrained"],
            "--pretrained: the ImageNet weights fit --width 64 only, not --width 16",
        ),
    ],
)
def test_a_bad_width_is_refused_at_submission_with_one_line(args: list[str], said: str) -> None:
    """What ``ddpq submit resnet18`` and the API check before a job is queued (a 422)."""
    from ddpq.workloads import registry

    with pytest.raises(registry.BadWorkload) as refused:
        registry.resolve("resnet18", args)
    assert str(refused.value) == said
    assert registry.resolve("resnet18", ["--width", "16"])[-2:] == ["--width", "16"]
