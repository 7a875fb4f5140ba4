"""sbatch's options as sbatch itself reads them from ``#SBATCH`` lines.

sbatch gathers the words of every ``#SBATCH`` line into one argument vector and hands it
to glibc's ``getopt_long`` with its own option table (Slurm's ``src/common/slurm_opt.c``).
So what an option *is* depends on getopt's rules, not on how it is spelled:

- a short option takes its value attached or from the next word (``-G8``, ``-G 8``), and
  flags bundle (``-Qv``);
- a long option takes ``--name=value`` or ``--name value``, and any prefix of a name that
  matches that option only is that option (``--gre`` is ``--gres``, ``--tim`` is
  ``--time``); an exact name wins over longer ones (``--mem`` is not ``--mem-per-gpu``);
  a prefix that matches several options is refused.

The table below is the union of sbatch's options from Slurm 20.11 to 25.11: a prefix that
is unambiguous here is unambiguous in each of those versions (a version's table is a
subset), and means the same option where it means one at all. Options a site's SPANK
plugins add are not in it; ``parse`` takes them by their full name only (``extra``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

NO_VALUE, VALUE, OPTIONAL_VALUE = 0, 1, 2

_NO_VALUE = (
    "consolidate-segments contiguous external help hold ignore-pbs no-requeue overcommit "
    "oversubscribe parsable quiet reboot spread-job spread-segments stepmgr test-only usage "
    "use-min-nodes verbose version wait"
)
_VALUE = (
    "account acctg-freq array autocomplete batch bb bbf begin chdir cluster "
    "cluster-constraint clusters comment constraint container container-id context "
    "core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
    "dependency distribution error exclude export export-file extra extra-node-info gid "
    "gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint "
    "input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind "
    "mem-per-cpu mem-per-gpu mem-update mincpus network nodefile nodelist nodes ntasks "
    "ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres "
    "open-mode output partition power prefer priority profile qos reservation resources "
    "runtime segment signal sockets-per-node switches tasks-per-node thread-spec "
    "threads-per-core time time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap"
)
# Some versions take no value for get-user-env and requeue: a value is optional in all.
_OPTIONAL_VALUE = "exclusive get-user-env nice no-kill oom-kill-step propagate requeue resv-ports"
# Long option name -> whether it takes a value.
LONG_OPTIONS: dict[str, int] = {
    **dict.fromkeys(_NO_VALUE.split(), NO_VALUE),
    **dict.fromkeys(_VALUE.split(), VALUE),
    **dict.fromkeys(_OPTIONAL_VALUE.split(), OPTIONAL_VALUE),
}
# Two names of one option (the same entry of getopt's table): getopt takes a prefix of
# both as that option, and so does ``canonical``.
ALIASES = {"tasks-per-node": "ntasks-per-node"}
# Short option -> its long name (the same in every version).
SHORT_OPTIONS = {
    "A": "account",
    "a": "array",
    "B": "extra-node-info",
    "b": "begin",
    "C": "constraint",
    "c": "cpus-per-task",
    "D": "chdir",
    "d": "dependency",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "h": "help",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "M": "clusters",
    "m": "distribution",
    "N": "nodes",
    "n": "ntasks",
    "O": "overcommit",
    "o": "output",
    "p": "partition",
    "Q": "quiet",
    "q": "qos",
    "S": "core-spec",
    "s": "oversubscribe",
    "t": "time",
    "V": "version",
    "v": "verbose",
    "W": "wait",
    "w": "nodelist",
    "x": "exclude",
}


class SbatchOptionError(ValueError):
    """Words that are not options sbatch would read as one meaning, or not at all."""


@dataclass(frozen=True)
class SbatchOption:
    """One option as getopt reads it: its canonical long name and its value (None: none)."""

    name: str
    value: str | None
    written: str  # how it was spelled ("-G", "--gre"), for messages

    def line(self) -> str:
        """The option as ddpq writes it into a script: ``--name=value``, one reading only."""
        return f"--{self.name}" if self.value is None else f"--{self.name}={self.value}"


def canonical(typed: str, extra: Collection[str] = ()) -> str:
    """The long option that ``--typed`` is to getopt (``gre`` -> ``gres``).

    ``extra``: options outside the table (a site's plugins), matched by full name only.
    """
    if typed in LONG_OPTIONS:
        return ALIASES.get(typed, typed)
    if typed in extra:
        return typed
    matches = {ALIASES.get(n, n) for n in LONG_OPTIONS if typed and n.startswith(typed)}
    if len(matches) == 1:
        return matches.pop()
    if matches:
        shown = ", ".join(f"--{n}" for n in sorted(matches))
        raise SbatchOptionError(f"--{typed} is ambiguous to sbatch (it could be {shown})")
    raise SbatchOptionError(f"--{typed} is not an sbatch option")


def parse(words: Sequence[str], extra: Collection[str] = ()) -> list[SbatchOption]:
    """``words`` read as sbatch's getopt reads its argument vector, option by option.

    Refused (``SbatchOptionError``): an option sbatch does not know, an ambiguous prefix, a
    missing or unwanted value, and any word that is not an option: sbatch stops reading
    options at the first such word (``+`` in its getopt string), which fails the script.
    """
    options: list[SbatchOption] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and word != "--":
            typed, eq, value = word[2:].partition("=")
            name = canonical(typed, extra)
            takes = LONG_OPTIONS.get(name, OPTIONAL_VALUE)
            if takes == NO_VALUE and eq:
                raise SbatchOptionError(f"--{typed} (--{name}) takes no value")
            if takes == VALUE and not eq:
                if i == len(words):
                    raise SbatchOptionError(f"--{typed} (--{name}) needs a value")
                value, i = words[i], i + 1
            options.append(SbatchOption(name, value if eq or takes == VALUE else None, word))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            taken, i = _short_options(word, words, i)
            options += taken
        else:
            raise SbatchOptionError(
                f"{word!r} is not an option (sbatch stops reading options there)"
            )
    return options


def _short_options(word: str, words: Sequence[str], i: int) -> tuple[list[SbatchOption], int]:
    """The options of one ``-abc`` word (flags bundle; a value ends the word or is the next
    one), and the index of the word after those it took."""
    options: list[SbatchOption] = []
    for at, letter in enumerate(word[1:], start=1):
        name = SHORT_OPTIONS.get(letter)
        if name is None:
            raise SbatchOptionError(f"-{letter} is not an sbatch option")
        takes = LONG_OPTIONS[name]
        if takes == NO_VALUE:
            options.append(SbatchOption(name, None, f"-{letter}"))
            continue
        value: str | None = word[at + 1 :]
        if not value and takes == VALUE:
            if i == len(words):
                raise SbatchOptionError(f"-{letter} (--{name}) needs a value")
            value, i = words[i], i + 1
        options.append(SbatchOption(name, value if value or takes == VALUE else None, f"-{letter}"))
        break
    return options, i
