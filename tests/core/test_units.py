"""Sizes and durations as people write them (``ddpq.core.units``).

Durations for ``--time-limit`` are tested against the CLI in test_cli_hardening.py; here the
size parser of ``--log-cap`` and the zero a grace period may be.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpq.core.units import human_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("65536", 65536),
        ("4096B", 4096),
        ("512K", 512 << 10),
        ("64M", 64 << 20),
        ("64m", 64 << 20),
        ("64MB", 64 << 20),
        ("64MiB", 64 << 20),
        (" 1G ", 1 << 30),
        ("1.5G", 3 << 29),
        (".5K", 512),
        ("2T", 2 << 40),
    ],
)
def test_parse_size_reads_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "-1",
        "-64M",
        "1.5",  # a fraction of a byte
        "64 M",
        "M",
        "iB",
        "4096iB",
        "64Q",
        "nan",
        "inf",
        "1e3",
        "1_000",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() takes it
        "9" * 30 + "T",
        "9" * 400 + ".5G",
    ],
)
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_human_size_reads_back_as_the_same_size(size: int) -> None:
    assert parse_size(human_size(size)) == size


def test_human_size_takes_the_largest_exact_unit() -> None:
    assert [human_size(n) for n in (64 << 20, 4096, 1000, 1536, 0)] == [
        "64M",
        "4K",
        "1000",
        "1536",
        "0",
    ]


@pytest.mark.parametrize("text", ["0", "0s", "0m", "0.0"])
def test_a_zero_duration_only_where_allowed(text: str) -> None:
    assert parse_duration(text, allow_zero=True) == 0
    with pytest.raises(ValueError, match="more than 0"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-1", "-1s", "-0.5m"])
def test_a_negative_duration_is_refused_even_where_zero_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="0 or more"):
        parse_duration(text, allow_zero=True)
