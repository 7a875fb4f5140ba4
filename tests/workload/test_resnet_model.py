"""The workload's own ResNet18 is torchvision's, weight for weight and output for output."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddpq.workloads.resnet18 import build_model


@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_a_seed_gives_torchvisions_weights_and_outputs(stem: str) -> None:
    from torch import nn
    from torchvision.models import resnet18

    torch.manual_seed(7)
    ours = build_model(stem)
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
        "import sys; from ddpq.workloads.resnet18 import build_model; build_model('cifar'); "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
