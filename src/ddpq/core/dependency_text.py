"""Slurm's ``--dependency`` text, read (pure): ``afterok:ID[:ID...]``, ``afterany:...``,
``afternotok:...`` and ``singleton``, comma-separated (all of them must hold: Slurm's
``?``, any one of them, is refused). An ID is a job's id, or ``sN`` for every member of
sweep N, as ``--after`` takes them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpq.core.deps import Kind

MAX_IDS = 64
_ID_MAX = 2**63 - 1
KINDS_TEXT = "afterok, afterany, afternotok, singleton"


@dataclass(frozen=True)
class Dependencies:
    """What a ``--dependency`` text asks: each job's and sweep's kind, and singleton."""

    jobs: dict[int, Kind] = field(default_factory=dict)
    sweeps: dict[int, Kind] = field(default_factory=dict)
    singleton: bool = False

    def of(self, kind: Kind) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The jobs and the sweeps waited on with ``kind``, each sorted."""
        jobs = tuple(sorted(i for i, k in self.jobs.items() if k is kind))
        return jobs, tuple(sorted(i for i, k in self.sweeps.items() if k is kind))


def _number(word: str, item: str) -> tuple[int, bool]:
    """An ID of ``item``: (number, whether it names a sweep)."""
    sweep = word[:1] in ("s", "S")
    digits = word[1:] if sweep else word
    if not digits.isascii() or not digits.isdigit() or not 1 <= int(digits) <= _ID_MAX:
        raise ValueError(f"{item!r}: {word!r} is not a job id or a sweep (sN)")
    return int(digits), sweep


def parse(text: str) -> Dependencies:
    """The dependencies ``text`` names; ValueError with the reason for anything else: an
    unknown kind, a bad id, an id named under two kinds, more than ``MAX_IDS`` ids."""
    if "?" in text:
        raise ValueError("'?' (any one of them) is not supported; separate kinds with ','")
    jobs: dict[int, Kind] = {}
    sweeps: dict[int, Kind] = {}
    singleton = False
    for item in text.split(","):
        item = item.strip()
        word, _, rest = item.partition(":")
        if word == "singleton" and not rest:
            singleton = True
            continue
        if word not in Kind.__members__.values():
            raise ValueError(f"{item!r}: not a dependency kind ddpq knows ({KINDS_TEXT})")
        if not rest:
            raise ValueError(f"{item!r}: give the job ids, as {word}:ID[:ID...]")
        kind = Kind(word)
        for w in rest.split(":"):
            number, sweep = _number(w.strip(), item)
            into = sweeps if sweep else jobs
            if into.setdefault(number, kind) is not kind:
                ref = f"s{number}" if sweep else str(number)
                raise ValueError(f"{ref} is named as both {into[number]} and {kind}")
    if len(jobs) + len(sweeps) > MAX_IDS:
        raise ValueError(f"at most {MAX_IDS} jobs and sweeps to wait on")
    return Dependencies(jobs, sweeps, singleton)


def text_of(kinds: dict[Kind, tuple[tuple[int, ...], tuple[int, ...]]], singleton: bool) -> str:
    """The ``--dependency`` text of the jobs and sweeps of each kind (``ddpq show``)."""
    items = []
    for kind in Kind:
        jobs, sweeps = kinds.get(kind, ((), ()))
        refs = [str(i) for i in sorted(jobs)] + [f"s{i}" for i in sorted(sweeps)]
        if refs:
            items.append(f"{kind}:" + ":".join(refs))
    if singleton:
        items.append("singleton")
    return ",".join(items)
