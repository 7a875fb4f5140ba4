"""Whether a built-in workload will find its data, judged at submission: `ddpq submit
resnet18` without ``--synthetic`` and without CIFAR-10 is refused at once ("CIFAR-10 not found
at …; use --data-dir or --synthetic N") instead of failing a minute later in torchrun.

The daemon checks, not the client: it knows where the job will run and as whom (a client on
a laptop would look at the laptop's disk). The folder is found as the job will find it
(``--data-dir``, relative to the job's folder, else ``~/.cache/ddpq/cifar10`` of the
account it runs as), and judged as that
account would reach it (``paths.can_enter``, as the working directory is). Like that check
it is a courtesy: where the daemon cannot judge (jobs on Slurm nodes, an account it cannot
name) the job is taken and the workload's own message stays the authority.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable

from ddpq.config import Settings
from ddpq.core import sweeps as core_sweeps
from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import JobSubmit
from ddpq.server import identity, paths
from ddpq.server.errors import ApiError
from ddpq.store import users as user_store
from ddpq.store.db import Database

BATCHES_DIR = "cifar-10-batches-py"
TEST_FILE = "test_batch"  # the workload's own test for "here it is" (workloads.cifar)


def given_options(args: list[str]) -> dict[str, str | None]:
    """``--data-dir`` and ``--synthetic`` as ``args`` give them (None: not given); the
    workload's parser has already accepted ``args``."""
    from ddpq.workloads.resnet18_cli import build_parser

    parser = build_parser()
    parser.set_defaults(data_dir=None, synthetic=None)  # given, or not: not the daemon's
    ns, _ = parser.parse_known_args(args)
    synthetic = None if ns.synthetic is None else str(ns.synthetic)
    return {"data_dir": ns.data_dir, "synthetic": synthetic}


def data_root(body: JobSubmit, cwd: str, home: str) -> str:
    """The folder the job will read: ``--data-dir`` (relative: to its folder), else the
    workload's default. ``$DDPQ_CIFAR_DIR`` never reaches a job (every ``DDPQ_*`` is
    ddpq's: ``core.jobenv``), and ``HOME`` is always its account's (``home``)."""
    root = given_options(body.args)["data_dir"] or "~/.cache/ddpq/cifar10"
    if root == "~" or root.startswith("~/"):
        root = home + root[1:]
    return os.path.normpath(os.path.join(cwd, root))


def check_cifar(body: JobSubmit, cwd: str, account_name: str | None, judge_as: bool) -> None:
    """422 unless CIFAR-10 is where the resnet18 job ``body`` will look for it.

    ``account_name``: the account the job runs as (None: the daemon's own); ``judge_as``:
    walk the path with that account's permissions (a root daemon with --auth), rather than
    asking the kernel as the daemon (whose account the job runs as)."""
    if body.workload != "resnet18" or given_options(body.args)["synthetic"] is not None:
        return
    name = account_name or identity.look_up(lambda: pwd.getpwuid(os.geteuid()).pw_name)
    pw = identity.look_up(lambda: pwd.getpwnam(name)) if name else None
    who = paths.account(name) if judge_as and name else None
    if pw is None or (judge_as and who is None):
        return  # no account to judge as: the launch decides
    root = data_root(body, cwd, pw.pw_dir)
    for folder in (os.path.join(root, BATCHES_DIR), root):
        test_file = os.path.join(folder, TEST_FILE)
        # Judged as the account all the way to the file: a link there into a folder it
        # cannot reach must not tell it whether someone else's file exists.
        if paths.sees_file(test_file, who) if who else os.path.isfile(test_file):
            return
    raise ApiError(
        422,
        "invalid",
        f"CIFAR-10 not found at {root} (nor in {BATCHES_DIR}/ there) for the job's account; "
        "use --data-dir DIR or --synthetic N",
    )


def check_members_data(
    settings: Settings,
    db: Database,
    template: JobSubmit,
    job: JobSpec,
    members_args: list[list[str]],
    params: Iterable[str],
) -> None:
    """``check_workload_data`` for a sweep's members (their args as they get them, which
    the workload's parser has accepted): a sweep that cannot find its data is refused
    whole, as one job is, not queued to fail member by member.

    Members read from one place unless a parameter or a placeholder sets where: then each
    distinct place is checked once (a parameter may name an option by a prefix of it, as
    the parser allows: ``--sweep data=...``)."""
    where_options = ("data-dir", "synthetic")
    varies = core_sweeps.placeholders(template.args) or any(
        option.startswith(name) for name in params for option in where_options
    )
    seen: set[tuple[str | None, str | None]] = set()
    for args in members_args if varies else members_args[:1]:
        given = given_options(args)
        where = (given["data_dir"], given["synthetic"])
        if where not in seen:
            seen.add(where)
            member = template.model_copy(update={"args": args})
            check_workload_data(settings, db, member, job.cwd, job.owner, job.run_as)


def check_workload_data(
    settings: Settings, db: Database, body: JobSubmit, cwd: str, owner: str, run_as: str | None
) -> None:
    """The submission's side of ``check_cifar``: as whom the job runs, as ``check_cwd``
    judges it (a root daemon with --auth: the proven or mapped account; else the daemon's
    own); nothing for jobs that run elsewhere (Slurm nodes)."""
    if body.workload is None or not capabilities(settings.executor).on_this_host:
        return
    judge_as = settings.auth and os.geteuid() == 0
    name = None
    if judge_as:
        name = run_as
        if name is None:
            with db.read() as s:
                name = user_store.unix_accounts(s, {owner}).get(owner)
        if name is None:
            return
    check_cifar(body, cwd, name, judge_as)
