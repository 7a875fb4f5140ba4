"""A job's own #SBATCH options, read as sbatch's getopt reads them: what ddpq owns is refused
however it is spelled, what users may set is written back in one spelling."""

from __future__ import annotations

import pytest

from ddpq.core import sbatch
from ddpq.core.slurm import (
    DEFAULT_USER_OPTIONS,
    OWNED_OPTIONS,
    SlurmOptionError,
    user_option_name,
    user_options,
)


def refusal(text: str, allowed: tuple[str, ...] = DEFAULT_USER_OPTIONS) -> str:
    with pytest.raises(SlurmOptionError) as refused:
        user_options([text], allowed)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(repr(text[:64])), message
    return message


# Each example of the issue, and the option sbatch takes it for.
ISSUE_EXAMPLES = [
    ("--gres gpu:8", "gres"),
    ("-G8", "gpus"),
    ("-a0-999", "array"),
    ("--arr=0-999", "array"),
    ("--acco=other", "account"),
    ("-N4", "nodes"),
]


@pytest.mark.parametrize(("text", "name"), ISSUE_EXAMPLES)
def test_the_issues_examples_are_refused_by_the_option_they_are(text: str, name: str) -> None:
    assert f"is --{name} to sbatch, which ddpq sets itself" in refusal(text)


def test_an_ambiguous_prefix_is_refused_naming_what_it_could_be() -> None:
    # --tim is --time or --time-min: sbatch refuses it too; ddpq says so before.
    assert "--tim is ambiguous to sbatch (it could be --time, --time-min)" in refusal("--tim=99999")
    assert "could be --mem-per-cpu, --mem-per-gpu" in refusal("--mem-per=1G")


def unambiguous_spellings(name: str) -> list[str]:
    """Every prefix of ``--name`` that getopt reads as that option, and its short form."""
    spellings = []
    for end in range(1, len(name) + 1):
        try:
            if sbatch.canonical(name[:end]) == name:
                spellings.append(f"--{name[:end]}")
        except sbatch.SbatchOptionError:
            continue
    spellings += [f"-{c}" for c, long in sbatch.SHORT_OPTIONS.items() if long == name]
    return spellings


OWNED_SPELLINGS = [
    (spelling, name)
    for name in sorted(OWNED_OPTIONS & set(sbatch.LONG_OPTIONS))
    for spelling in unambiguous_spellings(name)
]


def test_the_owned_spellings_are_many() -> None:
    # --gres alone has --gres (and --gres-flags shares --gre); --nodes has -N, --nodes, --no...
    assert len(OWNED_SPELLINGS) > 150
    assert ("--ar", "array") in OWNED_SPELLINGS and ("-G", "gpus") in OWNED_SPELLINGS


@pytest.mark.parametrize(("spelling", "name"), OWNED_SPELLINGS)
def test_every_spelling_of_an_owned_option_is_refused(spelling: str, name: str) -> None:
    takes = sbatch.LONG_OPTIONS[name]
    attached = f"{spelling}=1" if spelling.startswith("--") else f"{spelling}1"
    forms = {
        sbatch.NO_VALUE: [spelling, f"  {spelling} "],
        # An optional value is attached only: a next word is no value to getopt.
        sbatch.OPTIONAL_VALUE: [spelling, attached],
        sbatch.VALUE: [attached, f"{spelling} 1", f"  {spelling}  1  "],
    }[takes]
    for form in forms:
        assert f"is --{name} to sbatch, which ddpq sets itself" in refusal(form), form


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("--qos=high --time=5", "is 2 options to sbatch (--qos, --time): one each"),
        ("--qos high -t 5", "is 2 options to sbatch (--qos, --time)"),
        ("-Qv", "is 2 options to sbatch (--quiet, --verbose)"),
        ("-vC a100", "is 2 options to sbatch (--verbose, --constraint)"),
        ("--qos=high\n#SBATCH --gres=gpu:8", "must be one line"),
        ("--qos=high\r#SBATCH -G8", "must be one line"),
        ("--qos=high\n", "must be one line"),
        ("--qos=high\t--time=5", "must be printable ASCII"),
        ("--qos=high\x00", "must be printable ASCII"),
        ("--qos=high\u2028--time=5", "must be printable ASCII"),
        ("--constraint=\uff41100", "must be printable ASCII"),
        ("\u2014gres=gpu:8", "must be printable ASCII"),
        ("--qos=high #--time=5", "may hold no quote, '\\' or '#'"),
        ("--qos='high' --time=5", "may hold no quote"),
        ('--qos="a b"', "may hold no quote"),
        ("--qos=a\\ -t5", "may hold no quote"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("--", "'--' is not an option"),
        ("-", "'-' is not an option"),
        ("qos=high", "'qos=high' is not an option"),
        ("hetjob", "'hetjob' is not an option"),
        ("--qos=high hetjob", "'hetjob' is not an option"),
        ("--qos", "--qos (--qos) needs a value"),
        ("-q", "-q (--qos) needs a value"),
        ("--contiguous=yes", "--contiguous (--contiguous) takes no value"),
        ("--hetjob", "--hetjob is not an sbatch option"),
        ("-I", "-I is not an sbatch option"),
        ("--=x", "-- is not an sbatch option"),
        ("--exclusive", "is --exclusive to sbatch, which users may not set here (they may:"),
        ("-s", "is --oversubscribe to sbatch, which users may not set here"),
        ("-k", "is --no-kill to sbatch, which users may not set here"),
    ],
)
def test_what_is_not_one_option_users_may_set_is_refused(text: str, says: str) -> None:
    assert says in refusal(text)


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("--constraint=a100|h100", "--constraint=a100|h100"),
        ("-C a100", "--constraint=a100"),
        ("-Ca100", "--constraint=a100"),
        ("--constr=a100", "--constraint=a100"),
        ("--constraint a100", "--constraint=a100"),
        ("  --qos   high ", "--qos=high"),
        ("-q high", "--qos=high"),
        ("--qo=high", "--qos=high"),
        ("--mem=32G", "--mem=32G"),  # an exact name wins over --mem-per-*
        ("--mem-per-g=8G", "--mem-per-gpu=8G"),
        ("-x n[1-3]", "--exclude=n[1-3]"),
        ("--mail-t=END,FAIL", "--mail-type=END,FAIL"),
        ("-C -x", "--constraint=-x"),  # a value may start with '-', as getopt takes it
    ],
)
def test_what_users_may_set_is_written_in_one_spelling(given: str, written: str) -> None:
    assert user_options([given], DEFAULT_USER_OPTIONS) == (written,)


def test_the_admin_decides_what_users_may_set() -> None:
    assert user_options(["--exclus=user"], ("exclusive",)) == ("--exclusive=user",)
    assert user_options(["--exclusive"], ("exclusive",)) == ("--exclusive",)
    # A plugin's option is taken by its full name only, with its value after '='.
    plugin = ("container-image",)
    assert user_options(["--container-image=ngc/x"], plugin) == ("--container-image=ngc/x",)
    assert "--container-im is not an sbatch option" in refusal("--container-im=x", plugin)
    assert "users may not set here (they may: none;" in refusal("--qos=high", ())
    # What the daemon's own options set is the admin's for every job.
    with pytest.raises(SlurmOptionError, match="which the daemon's --slurm-options sets"):
        user_options(["-q normal"], DEFAULT_USER_OPTIONS, ["--qos=high"])


@pytest.mark.parametrize("name", sorted(OWNED_OPTIONS))
def test_no_admin_may_let_users_set_what_ddpq_owns(name: str) -> None:
    for written in (name, f"--{name}"):
        with pytest.raises(SlurmOptionError, match="is ddpq's own"):
            user_option_name(written)


def test_the_default_list_names_only_options_sbatch_has_and_ddpq_does_not_own() -> None:
    assert set(DEFAULT_USER_OPTIONS) <= set(sbatch.LONG_OPTIONS)
    assert not set(DEFAULT_USER_OPTIONS) & OWNED_OPTIONS
    assert {user_option_name(n) for n in DEFAULT_USER_OPTIONS} == set(DEFAULT_USER_OPTIONS)
