"""ResNet18 as torchvision builds it, without importing torchvision.

``import torchvision`` loads all of it (datasets, io, ops and their compiled extension): about
2 s of CPU on top of torch's 3 s in every rank process, at every start and every resume after
a preemption. The workload needs one model, so it is written here, layer for layer as
``torchvision.models.resnet18(weights=None)`` makes it: the same module names (so torchvision's
ImageNet weights file loads into it by name), the same construction order and the same
initialisation, so that a seed gives the same weights draw for draw
(``tests/workload/test_resnet_model.py`` compares the two).
"""

from __future__ import annotations

import torch
from torch import nn

from ddpq.workloads.resnet18_cli import PUBLISHED_WIDTH

BLOCKS_PER_STAGE = (2, 2, 2, 2)  # ResNet18
STAGE_WIDENING = (1, 2, 4, 8)  # each stage's channels, as multiples of the first's


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and the shortcut around them (torchvision's ``BasicBlock``)."""

    def __init__(
        self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None
    ) -> None:
        super().__init__()
        # Attribute order is registration order, which the initialisation walks: as torchvision.
        self.conv1 = nn.Conv2d(
            inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        out += identity
        activated: torch.Tensor = self.relu(out)
        return activated


def stage(inplanes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    downsample = None
    if stride != 1 or inplanes != planes:
        # Made before the block, as torchvision does: its weights are drawn first.
        downsample = nn.Sequential(
            nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False),
            nn.BatchNorm2d(planes),
        )
    layers = [BasicBlock(inplanes, planes, stride, downsample)]
    layers += [BasicBlock(planes, planes, 1, None) for _ in range(1, blocks)]
    return nn.Sequential(*layers)


class ResNet18(nn.Module):
    """A ``width`` other than 64 scales every layer's channels alike: the same depth and the
    same image sizes through it, with width/64 times the channels (at 16: a quarter of the
    channels, a sixteenth of the parameters, of the compute and of the gradient all-reduced
    each step). The workload's ``--width`` asks for it."""

    def __init__(self, num_classes: int, width: int = PUBLISHED_WIDTH) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = width
        for number, (widening, blocks) in enumerate(
            zip(STAGE_WIDENING, BLOCKS_PER_STAGE, strict=True), 1
        ):
            planes = width * widening
            setattr(
                self, f"layer{number}", stage(inplanes, planes, blocks, 1 if number == 1 else 2)
            )
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for number in range(1, len(STAGE_WIDENING) + 1):
            x = getattr(self, f"layer{number}")(x)
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits
