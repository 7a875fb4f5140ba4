"""``ddpq.core.sweeps``: products, Slurm's array expressions, placeholders, names.

The array oracle below is written from Slurm's documentation (sbatch --array), not from
the parser: a list of indices and ranges, each range with an optional step, and an
optional trailing %K.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core import sweeps
from ddpq.core.sweeps import Member, SweepError
from ddpq.schemas import NAME_RE

SETTINGS = settings(max_examples=300, deadline=None)

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True).filter(
    lambda n: n != "index"
)
# A value is never empty nor blank (`--sweep lr=` is a slip: refused, issue 26).
values = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12
).filter(lambda v: v.strip() != "")
params = st.dictionaries(
    names, st.lists(values, min_size=1, max_size=4, unique=True), min_size=1, max_size=4
)


# --------------------------------------------------------------------------- products


@SETTINGS
@given(params)
def test_every_combination_once_and_the_count_is_the_product(p: dict[str, list[str]]) -> None:
    size = sweeps.check_params(p)
    got = sweeps.members(p)
    assert size == len(got) == math.prod(len(v) for v in p.values())
    combos = [tuple(m.params[n] for n in p) for m in got]
    assert len(set(combos)) == len(combos)  # each once
    assert set(combos) == set(itertools.product(*p.values()))  # and all of them
    assert [m.index for m in got] == list(range(size))
    # Product order: the first parameter varies slowest, as itertools.product.
    assert combos == list(itertools.product(*p.values()))


def test_a_product_too_large_is_refused_from_the_lengths_alone() -> None:
    # 10^12 members: refused by arithmetic, never expanded (this would not finish).
    huge = {f"p{i}": [str(v) for v in range(1000)] for i in range(4)}
    with pytest.raises(SweepError, match=r"1000000000000 combinations; .* at most 10000"):
        sweeps.check_params(huge)
    assert sweeps.check_params({"a": [str(v) for v in range(100)], "b": ["x"] * 0 + ["1"]}) == 100
    with pytest.raises(SweepError, match="at most 10000"):
        sweeps.check_params({"a": [str(v) for v in range(101)], "b": [str(v) for v in range(100)]})


@pytest.mark.parametrize(
    ("p", "message"),
    [
        ({"index": ["1"]}, r"'index' must be"),
        ({"1lr": ["1"]}, "must be 1-64 letters"),
        ({"l r": ["1"]}, "must be 1-64 letters"),
        ({"lr": []}, r"params.lr: give at least one value"),
        ({"lr": ["1", "1"]}, r"params.lr: '1' is listed twice"),
        ({"lr": [""]}, r"params.lr: an empty value"),
        ({"lr": ["0.1", " "]}, r"params.lr: an empty value"),
        ({"lr": ["a\x00"]}, "NUL"),
        ({"lr": ["x" * 1025]}, "longer than 1024"),
        ({f"p{i}": ["1"] for i in range(33)}, "more than 32 parameters"),
    ],
)
def test_bad_parameters_are_refused_naming_them(p: dict[str, list[str]], message: str) -> None:
    with pytest.raises(SweepError, match=message):
        sweeps.check_params(p)


# --------------------------------------------------------------------------- arrays


@st.composite
def array_exprs(draw: st.DrawFn) -> tuple[str, set[int], int | None]:
    """An expression and what Slurm's documentation says it means."""
    parts, expected = [], set()
    for _ in range(draw(st.integers(1, 5))):
        first = draw(st.integers(0, 300))
        kind = draw(st.sampled_from(["one", "range", "step"]))
        if kind == "one":
            parts.append(str(first))
            expected.add(first)
            continue
        last = first + draw(st.integers(0, 300))
        if kind == "range":
            parts.append(f"{first}-{last}")
            expected |= set(range(first, last + 1))
        else:
            step = draw(st.integers(1, 50))
            parts.append(f"{first}-{last}:{step}")
            expected |= {first + k * step for k in range((last - first) // step + 1)}
    cap = draw(st.one_of(st.none(), st.integers(1, 100)))
    expr = ",".join(parts) + (f"%{cap}" if cap is not None else "")
    return expr, expected, cap


@SETTINGS
@given(array_exprs())
def test_arrays_are_read_as_slurm_does(case: tuple[str, set[int], int | None]) -> None:
    expr, expected, cap = case
    spec = sweeps.parse_array(expr)
    assert spec.indices == tuple(sorted(expected))
    assert spec.max_running == cap
    got = sweeps.members({}, spec)
    assert [m.index for m in got] == sorted(expected) and all(m.params == {} for m in got)


@pytest.mark.parametrize(
    ("expr", "indices", "cap"),
    [
        ("0-99", tuple(range(100)), None),
        ("0-99%10", tuple(range(100)), 10),
        ("0-15:4", (0, 4, 8, 12), None),
        ("1,3,5,7%2", (1, 3, 5, 7), 2),
        ("0,6,16-18", (0, 6, 16, 17, 18), None),
        ("7", (7,), None),
        ("3-3", (3,), None),
        ("0-3,2-5", (0, 1, 2, 3, 4, 5), None),  # repeats count once
    ],
)
def test_slurm_examples(expr: str, indices: tuple[int, ...], cap: int | None) -> None:
    assert sweeps.parse_array(expr) == sweeps.ArraySpec(indices, cap)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty"),
        ("5-3", "ends before it starts"),
        ("0-9:0", "step of 0"),
        ("3:2", "has a step but is not a range"),
        ("0-9%0", "%0 would never run"),
        ("0-9%", "is not a count"),
        ("0-9%x", "is not a count"),
        ("-1", "is not an index"),
        ("1-", "is not an index"),
        ("1-2-3", "is not an index"),
        ("a-b", "is not an index"),
        (" 1", "is not an index"),
        ("1,,2", "is not an index"),
        ("0-9:", "is not an index"),
        ("١-٣", "is not an index"),  # Arabic-Indic digits: str.isdigit() says yes
        ("0-999999999", "lists 1000000000 indices; a sweep has at most 10000"),
        ("0-5000,0-5000", "lists 10002 indices"),
        ("99999999999", "above 2147483647"),
        ("9" * 1000, "above 2147483647"),  # refused before int() converts it
        ("1," * 600 + "1", "longer than 1024"),
    ],
)
def test_bad_arrays_are_refused_with_a_reason(expr: str, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        sweeps.parse_array(expr)


# --------------------------------------------------------------------------- placeholders


def test_placeholders_are_filled_and_escapes_and_shell_braces_left() -> None:
    args = ["python", "t.py", "--lr={lr}", "{batch-size}", "{index}", "{{lr}}", "${HOME}", "{1..3}"]
    m = Member(7, {"lr": "0.1", "batch-size": "64"})
    assert sweeps.placeholders(args) == {"lr", "batch-size", "index"}
    assert sweeps.fill(args, m) == [
        "python",
        "t.py",
        "--lr=0.1",
        "64",
        "7",
        "{lr}",
        "${HOME}",
        "{1..3}",
    ]
    # A value is put in as it is, never read again as a placeholder.
    assert sweeps.fill(["{a}"], Member(0, {"a": "{index}"})) == ["{index}"]


def test_a_placeholder_without_a_parameter_and_an_unused_parameter_are_refused() -> None:
    with pytest.raises(SweepError, match=r"template.command: \{bs\} names no parameter"):
        sweeps.check_placeholders(["x", "{lr}", "{bs}"], ["lr"])
    with pytest.raises(SweepError, match=r"params.bs: used nowhere in the command"):
        sweeps.check_placeholders(["x", "{lr}"], ["lr", "bs"])
    sweeps.check_placeholders(["x", "{lr}", "{index}"], ["lr"])  # index always exists
    sweeps.check_placeholders(["x"], [])  # an array needs none


@SETTINGS
@given(params)
def test_filled_commands_differ_for_every_member(p: dict[str, list[str]]) -> None:
    command = ["run", *("{" + n + "}" for n in p)]
    sweeps.check_placeholders(command, list(p))
    filled = [tuple(sweeps.fill(command, m)) for m in sweeps.members(p)]
    assert len(set(filled)) == len(filled)


def test_workload_options_and_the_ones_a_template_gives() -> None:
    m = Member(0, {"lr": "0.05", "batch-size": "64"})
    assert sweeps.workload_args(m) == ["--lr", "0.05", "--batch-size", "64"]
    assert sweeps.option_names(["--epochs", "5", "--lr=0.1", "-x", "--"]) == {"epochs", "lr"}


# --------------------------------------------------------------------------- names, env


@SETTINGS
@given(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True),
    st.integers(0, sweeps.MAX_ARRAY_INDEX),
    st.dictionaries(names, values, max_size=4),
)
def test_member_names_are_job_names_and_carry_the_index(
    base: str, index: int, p: dict[str, str]
) -> None:
    name = sweeps.member_name(base, Member(index, p))
    assert NAME_RE.match(name), name
    assert f"-{index}" in name
    assert name.startswith(base[: sweeps.BASE_MAX].rstrip(".-_") or "sweep")


def test_member_names_read_well() -> None:
    m = Member(3, {"lr": "0.1", "batch-size": "128"})
    assert sweeps.member_name("resnet18", m) == "resnet18-3-lr0.1-batch-size128"
    assert sweeps.member_name("train", Member(12, {"data": "/a b/c"})) == "train-12-data-a-b-c"


def test_member_env_holds_the_sweep_index_and_parameters_as_json() -> None:
    m = Member(2, {"lr": "0.1", "note": 'é "q"'})
    env = sweeps.member_env(9, m)
    assert env["DDPQ_SWEEP_ID"] == "9" and env["DDPQ_SWEEP_INDEX"] == "2"
    assert json.loads(env["DDPQ_SWEEP_PARAMS"]) == m.params
    assert env["DDPQ_SWEEP_PARAMS"].isascii()
