"""`ddpq submit`'s steps, from its options to the job's id on stdout, with no Typer to
import: ``client.submit`` declares the options and runs these, and so does ``client.quick``
straight from the command line's words (`ddpq submit` is typed in shell loops).

What runs (a command after ``--``, or a workload and its options), the options the CLI
checks itself (``--env``, ``--export``, ``--after``, ``--gpu-mem``, ``--time-limit``), the
body sent (one job, or a sweep with ``--sweep`` or ``--array``), sending it (a 422 is bad
usage, said as the options: ``client.submission``), and printing what the daemon answered.
Only what differs from the API's defaults travels.
"""

from __future__ import annotations

import os
import sys

from ddpq.client import sharing
from ddpq.client.runtime import client, echo, fail, print_json

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def submit_with(argv: list[str], o: dict[str, Any]) -> None:
    """The submission ``argv`` and ``submit``'s parameters ``o`` (by name) ask for."""
    checked = check_options(
        o["env"] or [], o["export"], o["after"] or [], o["gpu_mem"], o["gpu_share"]
    )
    # Left out when not given, as every option; a 0 or an empty size would be too.
    if o["cpus"] is not None and o["cpus"] < 1:
        fail(f"--cpus: {o['cpus']} is not a number of cores (1 or more)", 2)
    if o["mem"] is not None and not o["mem"].strip():
        fail("--mem: give a size, as 4G or 512M", 2)
    plain = {
        name: o[name]
        for name in (
            "gpus",
            "name",
            "priority",
            "retries",
            "hold",
            "torchrun",
            "notify",
            "preemptible",
            "preempt_signal",
            "nodes",
            "gpus_per_node",
            "partition",
            "gpu_link",
            "gpu_type",
            "cpus",
            "mem",
            "dependency",
        )
    }
    plain["gpus"], plain["gpus_max"] = gpu_range(o["gpus"])
    plain["slurm_options"] = o["slurm_opt"] or []
    fields = job_fields(argv, plain, checked, o["cwd"], o["time_limit"])
    warn_if_no_program(fields)
    many = bool(o["sweep"]) or o["array"] is not None
    if o["max_running"] is not None and not many:
        fail("--max-running: only with --sweep or --array", 2)
    body = sweep_body(fields, o["sweep"] or [], o["array"], o["max_running"]) if many else fields
    show_submitted(send(body, many, fields.get("workload")), many, o["as_json"])


def warn_if_no_program(fields: dict[str, Any]) -> None:
    """A warning, not a refusal, when the command's program is nowhere the job would find
    it (its PATH, or its folder for a path): `ddpq submit resnet` (a slip for the workload)
    was queued and failed a moment later. Not refused: a job may run what an earlier one
    builds, and the server's files are not always the client's."""
    command = fields.get("command")
    if not command or fields.get("torchrun") or "{" in command[0] or not _daemon_here():
        return  # a workload, torchrun's script (or -m), a sweep's placeholder, elsewhere
    word, cwd = command[0], fields["cwd"]
    if "/" in word:
        found = os.path.isfile(os.path.join(cwd, word))
    else:
        from ddpq.core.jobenv import MINIMAL_PATH

        env = fields["exported_env"]
        path = (os.environ if env is None else env).get("PATH", MINIMAL_PATH)
        places = (os.path.join(cwd, d, word) for d in path.split(os.pathsep))
        found = any(os.path.isfile(p) and os.access(p, os.X_OK) for p in places)
    if found:
        return
    from ddpq.client.format import sanitize

    near = near_workload(word)
    hint = f" (did you mean the workload {near}?)" if near else ""
    echo(f"ddpq: warning: {sanitize(word)} is not found where the job will look{hint}", err=True)


def _daemon_here() -> bool:
    """Whether the daemon asked runs on this machine (its socket, or a loopback address):
    only then are this machine's files the job's."""
    from ddpq.client.credentials import connection, uses_socket
    from ddpq.client.errors import DdpqError
    from ddpq.client.runtime import OPTIONS
    from ddpq.core.loopback import is_loopback

    try:  # the daemon the request goes to, as the client chooses it (a saved login's too)
        url, _ = connection(OPTIONS["url"], OPTIONS["token"])
    except DdpqError:
        return False  # the request says why
    if uses_socket(url):
        return True
    # Its host, without urllib (~3 ms on the fast path): less its user and port.
    host = url.partition("://")[2].partition("/")[0].rpartition("@")[2]
    host = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
    return is_loopback(host)


def gpu_range(given: object) -> tuple[int, int | None]:
    """``--gpus``: a count (``2``) or an elastic job's range (``2-4``), as the API's
    ``gpus`` and ``gpus_max`` (None: not elastic). Whether the range makes sense is the
    API's to say (its reasons name the field)."""
    read = gpu_range_of(given)
    if read is None:
        fail(f"--gpus: {not_gpus(given)}", 2)
    return read


def gpu_range_of(given: object) -> tuple[int, int | None] | None:
    """``gpu_range``'s reading, None where ``given`` is neither a count nor a range."""
    text = str(given).strip()
    least, dash, most = text.partition("-")
    if not text.isascii() or not least.isdigit() or (dash and not most.isdigit()):
        return None
    return int(least), int(most) if dash else None


def not_gpus(given: object) -> str:
    return f"{str(given).strip()!r} is not a number of GPUs nor a range MIN-MAX (as 2 or 2-4)"


# A plain class: a dataclass imports ``inspect`` (~5 ms), a NamedTuple compiles each
# (string) annotation; `ddpq submit` and `ddpq ls` are typed in shell loops.
class Checked:
    """The options the CLI reads itself, as the API's fields."""

    __slots__ = ("after", "after_sweeps", "env", "exported_env", "memory")

    def __init__(
        self,
        env: dict[str, str],
        exported_env: dict[str, str],
        after: list[int],
        after_sweeps: list[int],
        memory: dict[str, Any],
    ) -> None:
        self.env = env
        self.exported_env = exported_env
        self.after = after
        self.after_sweeps = after_sweeps
        self.memory = memory


def check_options(
    env: list[str], export: str, after: list[str], gpu_mem: str | None, gpu_share: int | None
) -> Checked:
    """``--env``, ``--export``, ``--after``, ``--gpu-mem`` and ``--gpu-share`` read (bad
    usage where one cannot be); a warning for the variables ``--export`` leaves out."""
    from ddpq.client import submission
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.format import sanitize

    try:
        env_map = submission.env_pairs(env)
        exported, undecodable = submission.exported_env(export, os.environ)
        waits = sweep_cli.parse_refs(after)
        memory = sharing.submit_fields(gpu_mem, gpu_share)
    except (submission.BadOption, sweep_cli.BadRef, sharing.BadOption) as exc:
        fail(sanitize(str(exc)), 2)
    if undecodable:
        echo(
            "ddpq: warning: left out of the job's environment (not UTF-8): "
            + sanitize(", ".join(undecodable)),
            err=True,
        )
    return Checked(
        env=env_map,
        exported_env=exported,
        after=[r.id for r in waits if not r.sweep],
        after_sweeps=[r.id for r in waits if r.sweep],
        memory=memory,
    )


def job_fields(
    argv: list[str],
    plain: dict[str, Any],
    checked: Checked,
    cwd: Path | None,
    time_limit: str | None,
) -> dict[str, Any]:
    """The job's fields: the options given (those at their default left out, as
    ``exclude_defaults`` would), the folder, the environment, and what runs."""
    given = {
        **plain,
        "after": checked.after,
        "after_sweeps": checked.after_sweeps,
        "env": checked.env,
    }
    fields = {k: v for k, v in given.items() if v}
    fields.update(checked.memory)
    # Path.cwd().resolve() without pathlib (~3 ms): the same realpath (a --cwd given is a
    # Path already; its resolve() also reports a symlink loop).
    fields["cwd"] = str(cwd.resolve()) if cwd is not None else os.path.realpath(os.getcwd())
    fields["exported_env"] = checked.exported_env
    if "--" not in sys.argv and is_workload(argv[0]):
        fields.update(workload=argv[0], args=argv[1:])
        fields.pop("torchrun", None)
    else:
        fields["command"] = argv
    # `is not None`: an explicitly empty `--time-limit ""` (an unset shell variable) is a
    # mistake to report, not a request for no limit.
    if time_limit is not None:
        from ddpq.client.format import sanitize
        from ddpq.core.units import parse_duration

        try:
            fields["time_limit_s"] = parse_duration(time_limit)
        except ValueError as exc:
            fail(f"--time-limit: {sanitize(str(exc))}", 2)
    return fields


def near_workload(word: str) -> str | None:
    """The built-in workload ``word`` may be a slip for (``resnet``: resnet18), if any."""
    import difflib

    from ddpq.workloads.registry import WORKLOADS

    near = difflib.get_close_matches(word, list(WORKLOADS), n=1, cutoff=0.6)
    return near[0] if near else None


def is_workload(name: str) -> bool:
    """Whether ``name`` is a built-in workload's (its registry is imported only if asked:
    `ddpq submit -- CMD` never asks)."""
    from ddpq.workloads.registry import WORKLOADS

    return name in WORKLOADS


def sweep_body(
    fields: dict[str, Any], sweep: list[str], array: str | None, max_running: int | None
) -> dict[str, Any]:
    """The sweep of ``fields`` that ``--sweep``/``--array`` ask for (bad usage if unreadable)."""
    from ddpq.client import sweeps as sweep_cli
    from ddpq.client.format import sanitize

    try:
        return sweep_cli.sweep_body(fields, sweep, array, max_running)
    except sweep_cli.BadRef as exc:
        fail(sanitize(str(exc)), 2)


def send(body: dict[str, Any], many: bool, workload: str | None) -> dict[str, Any]:
    """The daemon's answer to the submission: the job, or the sweep."""
    from ddpq.client import submission

    with client() as c, submission.usage_if_refused(workload):
        out: dict[str, Any] = c.submit_sweep(body) if many else c.submit(body)
    return out


def show_submitted(out: dict[str, Any], many: bool, as_json: bool) -> None:
    """The job's id (the sweep's, sN), or the daemon's whole answer with ``--json``."""
    from ddpq.client.sweeps import SWEEP_PREFIX

    if as_json:
        print_json(out)
    else:
        echo(f"{SWEEP_PREFIX}{out['id']}" if many else out["id"])
