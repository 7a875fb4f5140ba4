"""What `ddpq submit` sends, and the daemon's refusals said in the command line's words.

The CLI does not validate a submission against the wire schema (that would import pydantic,
~100 ms on every submit): it checks only what it parses itself (``--env`` pairs, the
``--time-limit`` duration, ``--export``) and lets the daemon judge the rest. The daemon
answers a bad submission with 422 and ``field: message`` for each problem; ``refusal`` puts
the options' names in place of the fields' (``time_limit_s`` is ``--time-limit``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping

from ddpq.core import jobenv

# The API's field -> the option that sets it.
OPTION_OF = {
    "gpus": "--gpus",
    "gpus_max": "--gpus",  # the range's MAX (``--gpus 2-4``)
    "name": "--name",
    "priority": "--priority",
    "time_limit_s": "--time-limit",
    "retries": "--retries",
    "after": "--after",
    "hold": "--hold",
    "env": "--env",
    "exported_env": "--export",
    "torchrun": "--torchrun",
    "cwd": "--cwd",
    "idle_s": "--idle",
    "expires_s": "--expires",  # a token's (``ddpq token create``)
    "notify": "--notify",
    "preemptible": "--preemptible",
    "preempt_signal": "--preempt-signal",
    "after_sweeps": "--after",
    "nodes": "--nodes",
    "gpus_per_node": "--gpus-per-node",
    "partition": "--partition",
    "slurm_options": "--slurm-opt",
    "array": "--array",
    "params": "--sweep",
    "max_running": "--max-running",
    "gpu_mem": "--gpu-mem",
    "gpu_share": "--gpu-share",
    "gpu_link": "--gpu-link",
    "gpu_type": "--gpu-type",
    "cpus": "--cpus",
    "mem": "--mem",
    "dependency": "--dependency",
}
# Fields whose problems name a variable (``env.KEY: ...``): the name is kept.
KEYED = {"env", "exported_env"}
# Compiled (re's cache) when a refusal is read: `ddpq submit` is typed in shell loops.
_AT_MOST = r"Input should be less than or equal to ([0-9.e+]+)"


class BadOption(ValueError):
    """A submission the CLI can tell is wrong before sending it (exit 2)."""


def env_pairs(items: Iterable[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a mapping (a later one wins)."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BadOption(f"--env {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def exported_env(spec: str, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``--export ALL|NONE|NAME,...`` applied to ``environ``: what travels, and the names
    left out because they are not valid UTF-8 (to warn about)."""
    try:
        names = jobenv.parse_export(spec)
    except ValueError as exc:
        raise BadOption(f"--export: {exc}") from None
    return jobenv.exported(environ, names)


@contextlib.contextmanager
def usage_if_refused(workload: str | None = None) -> Iterator[None]:
    """The daemon validates what a command sends (a submission, an update, a restart): its
    422 is bad usage (exit 2), said as the options (``refusal``)."""
    from ddpq.client.errors import DdpqError
    from ddpq.client.runtime import fail

    try:
        yield
    except DdpqError as exc:
        if exc.status != 422:
            raise
        fail(refusal(exc.detail, workload), 2)


def refusal(detail: str, workload: str | None = None) -> str:
    """The daemon's 422 ``detail`` with each field named as the option that sets it."""
    return "; ".join(_one(part, workload) for part in detail.split("; "))


def _one(part: str, workload: str | None) -> str:
    loc, sep, message = part.partition(": ")
    if not sep:
        return part
    field, _, rest = loc.partition(".")
    if field == "template" and rest:  # a sweep's: its fields are the job's options too
        return _one(f"{rest}: {message}", workload)
    if field == "command":
        return f"the command: {message}"
    if field == "args" and workload:
        return f"{workload}: {message}"
    option = OPTION_OF.get(field)
    if option is None:
        return part
    if field.endswith("_s") and (bound := re.fullmatch(_AT_MOST, message)):
        from ddpq.core.units import human_duration

        # Said in the option's words and unit, not the wire field's seconds.
        return f"{option}: at most {human_duration(float(bound.group(1)))}"
    if field in KEYED and rest:
        variable = rest.removesuffix(".[key]")
        return f"{option} {variable}: {message}"
    return f"{option}: {message}"


def unknown_option(word: str, known: Iterable[str]) -> str:
    """What to say of ``word``, left over where the command or workload should begin.

    ``submit`` passes what it does not know through to the job (a workload's own options
    follow its name), so a misspelt option of submit's own would otherwise become the
    start of the command, and the job would fail later with "command not found". No
    program's name begins with "-": say so at once, with the nearest option submit has.
    """
    import difflib

    option = word.split("=", 1)[0]
    near = difflib.get_close_matches(option, list(known), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return (
        f"no such option: {option}{hint}; the command goes after `--`, "
        "and a workload's options after its name"
    )
