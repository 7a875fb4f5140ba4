"""A batch script's #SBATCH and #DDPQ lines as `submit`'s options (pure)."""

from __future__ import annotations

import pytest

from ddpq.core.batch_script import ScriptError, read, slurm_time

HEAD = "#!/bin/bash\n"


def options(text: str) -> list[str]:
    return read(HEAD + text).options


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("#SBATCH --job-name=train", ["--name", "train"]),
        ("#SBATCH -J train", ["--name", "train"]),
        ("#SBATCH --job-nam train", ["--name", "train"]),  # a prefix, as getopt takes it
        ("#SBATCH --gres=gpu:2", ["--gpus", "2"]),
        ("#SBATCH --gres=gpu:a100:4", ["--gpus", "4"]),
        ("#SBATCH --gres=gpu", ["--gpus", "1"]),
        ("#SBATCH --gpus=3", ["--gpus", "3"]),
        ("#SBATCH -G 2", ["--gpus", "2"]),
        ("#SBATCH --gpus=v100:2", ["--gpus", "2"]),
        ("#SBATCH -t 90", ["--time-limit", "5400s"]),
        ("#SBATCH --time=10:30", ["--time-limit", "630s"]),
        ("#SBATCH --time=1:00:00", ["--time-limit", "3600s"]),
        ("#SBATCH --time=2-00", ["--time-limit", "172800s"]),
        ("#SBATCH --time=1-02:03", ["--time-limit", "93780s"]),
        ("#SBATCH --time=1-02:03:04", ["--time-limit", "93784s"]),
        ("#SBATCH --time=UNLIMITED", []),
        ("#SBATCH --array=0-99%10", ["--array", "0-99%10"]),
        ("#SBATCH -a 1-9:2", ["--array", "1-9:2"]),
        ("#SBATCH --dependency=afterok:7:8", ["--dependency", "afterok:7:8"]),
        ("#SBATCH -d afterok:12_3", ["--dependency", "afterok:12"]),
        (
            "#SBATCH -d afterany:3+5:s4,afternotok:9,singleton",
            ["--dependency", "afterany:3:s4,afternotok:9,singleton"],
        ),
        ("#SBATCH --chdir=/tmp/run", ["--cwd", "/tmp/run"]),
        ("#SBATCH -D /tmp/run", ["--cwd", "/tmp/run"]),
        ("#SBATCH --export=NONE", ["--export", "NONE"]),
        ("#SBATCH --export=NIL", ["--export", "NONE"]),
        ("#SBATCH --export=HOME,PATH", ["--export", "HOME,PATH"]),
        ("#SBATCH --export=ALL,FOO=1,BAR=x y", ["--export", "ALL", "--env", "FOO=1"]),
        ('#SBATCH --job-name="two words"', ["--name", "two words"]),
        ("#SBATCH --job-name=a # a comment", ["--name", "a"]),
        ("#DDPQ --priority 5 --preemptible", ["--priority", "5", "--preemptible"]),
        ("#SBATCH --cpus-per-task=4", ["--cpus", "4"]),
        ("#SBATCH -c 2", ["--cpus", "2"]),
        ("#SBATCH --mem=4000", ["--mem", "4000M"]),
        ("#SBATCH --mem=16g", ["--mem", "16G"]),
    ],
)
def test_each_directive_reads_as_the_submit_option_that_means_the_same(
    line: str, want: list[str]
) -> None:
    if "x y" in line:  # a space ends the word for sbatch too: 'y' is not an option
        with pytest.raises(ScriptError, match="'y' is not an option"):
            options(line + "\n")
        return
    assert options(line + "\n") == want


def test_directives_end_at_the_first_command_as_sbatchs_do() -> None:
    text = "#SBATCH -J a\n\n# a comment\n#SBATCH -G 1\necho hi\n#SBATCH -G 4\n#DDPQ --hold\n"
    assert options(text) == ["--name", "a", "--gpus", "1"]


def test_ddpq_lines_come_after_sbatch_ones_so_they_win() -> None:
    assert options("#DDPQ --gpus 3\n#SBATCH -G 1\n") == ["--gpus", "1", "--gpus", "3"]


def test_the_interpreter_is_the_first_lines() -> None:
    assert read("#!/usr/bin/env python3 -u\n#SBATCH -J x\n").interpreter == [
        "/usr/bin/env",
        "python3",
        "-u",
    ]
    assert read("#SBATCH -J x\n").interpreter == []


def test_an_option_ddpq_does_not_use_is_one_warning_not_silence() -> None:
    found = read(HEAD + "#SBATCH --partition=gpu -N 1 --mail-type=END\n#SBATCH -J x\n")
    assert found.options == ["--name", "x"]
    assert found.warnings == [
        "#SBATCH --partition=gpu: not used by ddpq, left out",
        "#SBATCH -N: not used by ddpq, left out",
        "#SBATCH --mail-type=END: not used by ddpq, left out",
    ]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("#SBATCH --bogus=1", "--bogus is not an sbatch option"),
        ("#SBATCH --mem-per", "ambiguous"),
        ("#SBATCH --job-name", "needs a value"),
        ("#SBATCH train.py", "is not an option"),
        ("#SBATCH --time=soon", "not a Slurm time"),
        ("#SBATCH --time=0", "no time at all"),
        ("#SBATCH --gres=gpu:two", "must be a number"),
        ("#SBATCH --gres=mps:50", "GPUs only"),
        ("#SBATCH --dependency=after:3", "not a dependency kind"),
        ("#SBATCH --dependency=afterok", "give the job ids"),
        ("#SBATCH --dependency=afterok:3?afterany:4", "not supported"),
        ("#SBATCH --array=1,3,5", "one range"),
        ("#SBATCH --mem=0", "give a size"),
        ("#SBATCH --mem=lots", "give a size"),
        ('#SBATCH --job-name="unclosed', "line 2"),
    ],
)
def test_a_directive_that_cannot_be_read_is_refused_with_its_reason(line: str, says: str) -> None:
    with pytest.raises(ScriptError, match=says):
        read(HEAD + line + "\n")


def test_slurm_time_forms() -> None:
    assert slurm_time("5") == "300s"
    assert slurm_time("infinite") == ""
    with pytest.raises(ValueError):
        slurm_time("1:2:3:4")
