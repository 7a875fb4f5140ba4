"""Sharing GPUs by memory, limits and reservations through real daemons.

GPUs come from the fake libnvidia-ml (tests/nvml/fake_nvml.c) through the real NVML path,
with GPUs of 16 GiB and per-process memory that the test writes to the file the library
reads at each of the worker's looks (every 0.2 s here, DDPQ_GPU_POLL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ddpq.schemas import JobSubmit
from tests.cli_inprocess import ddpq_in_process
from tests.helpers import Daemon, wait_done, wait_for, wait_state
from tests.test_auth import add_user, me
from tests.test_metrics import scrape, value

G = 1 << 30
MIB = 1 << 20


class FakeNvml:
    """The fake library's file: its GPUs, and the processes on them."""

    def __init__(self, path: Path, gpus: int = 1) -> None:
        self.path = path
        self.gpus = gpus
        self.procs: dict[int, tuple[int, int]] = {}  # pid -> (gpu, MiB)
        self.write()

    def put(self, gpu: int, pid: int, mb: int) -> None:
        self.procs[pid] = (gpu, mb)
        self.write()

    def write(self) -> None:
        procs = ",".join(f"{g}:{pid}:{mb}" for pid, (g, mb) in self.procs.items())
        text = f"FAKE_NVML_GPUS={self.gpus}\nFAKE_NVML_MEM_MB=16384\nFAKE_NVML_PROCS={procs}\n"
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.path)  # the worker never reads half a file


@pytest.fixture
def nvml(tmp_path: Path) -> FakeNvml:
    return FakeNvml(tmp_path / "nvml-state")


@pytest.fixture
def gpu_daemon(make_daemon: Callable[..., Daemon], nvml: FakeNvml, tmp_path: Path) -> Daemon:
    from tests.nvml.conftest import _compile

    lib = _compile(tmp_path / "nvml-lib")
    return make_daemon(
        "--grace",
        "1s",
        LD_LIBRARY_PATH=str(lib),
        FAKE_NVML_FILE=str(nvml.path),
        DDPQ_GPU_POLL="0.2s",
    )


def ddpq(d: Daemon, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ddpq ARGS`` against ``d``, in this process (tests/cli_inprocess.py): what these
    tests check is what the commands say and do (the admin's on the state folder), not
    their process. ``check``: it must succeed."""
    r = ddpq_in_process(d.url, *args)
    assert r.returncode == 0 or not check, (args, r.stderr)
    return r


def sleeper(tmp_path: Path, name: str) -> list[str]:
    """A job that writes its pid (the pid its GPU memory is counted by), then waits until
    the test lets it end (exit 0) by creating ``<name>.go``."""
    pid, go = tmp_path / f"{name}.pid", tmp_path / f"{name}.go"
    script = f"echo $$ > {pid}.tmp && mv {pid}.tmp {pid}; while [ ! -e {go} ]; do sleep 0.05; done"
    return ["sh", "-c", script]


def pid_of(tmp_path: Path, name: str) -> int:
    path = tmp_path / f"{name}.pid"
    written = wait_for(lambda: (path.exists() and path.read_text().strip()) or None, what=str(path))
    return int(written)


def test_three_5g_jobs_share_a_16g_gpu_a_fourth_waits_and_a_whole_gpu_job_never_joins(
    gpu_daemon: Daemon, tmp_path: Path
) -> None:
    d = gpu_daemon
    c = d.client()
    ids = [
        int(ddpq(d, "submit", "--gpu-mem", "5G", "--", *sleeper(tmp_path, f"s{i}")).stdout)
        for i in range(4)
    ]
    whole = c.submit(JobSubmit(command=sleeper(tmp_path, "whole"), gpus=1)).id
    for job in ids[:3]:
        wait_state(c, job, "running")
    # Its reason is written by the pass after its submission, which may not have run yet.
    waits = "waiting for 5G of memory free on a GPU (next in line)"
    assert wait_for(lambda: c.show(ids[3]).reason == waits, what="the fourth's reason")
    assert c.show(ids[3]).state == "queued"
    assert c.show(whole).state == "queued"
    gpus = c.devices().items
    assert gpus[0].status == "shared"
    assert sorted(s.job_id for s in gpus[0].shares) == ids[:3]
    assert all(s.gpu_mem == 5 * G for s in gpus[0].shares)
    listing = ddpq(d, "ls").stdout
    assert "MEM" in listing and "-/5G" in listing and "  5G  " in listing
    assert "shared" in ddpq(d, "gpus").stdout
    (tmp_path / "s0.go").touch()
    assert wait_done(c, ids[0]).state == "succeeded"
    wait_state(c, ids[3], "running")  # its place freed
    for i in (1, 2, 3):
        assert c.show(whole).state == "queued"  # never beside them
        (tmp_path / f"s{i}.go").touch()
        wait_done(c, ids[i])
    wait_state(c, whole, "running")
    assert c.devices().items[0].status == "leased"
    (tmp_path / "whole.go").touch()
    wait_done(c, whole)


def test_an_outside_process_holding_10g_leaves_room_for_only_one(
    make_daemon: Callable[..., Daemon], nvml: FakeNvml, tmp_path: Path
) -> None:
    nvml.put(0, os.getpid(), 10 * 1024)  # this test's own process: in no ddpq job
    from tests.nvml.conftest import _compile

    lib = _compile(tmp_path / "nvml-lib")
    d = make_daemon(LD_LIBRARY_PATH=str(lib), FAKE_NVML_FILE=str(nvml.path), DDPQ_GPU_POLL="0.2s")
    c = d.client()
    first = c.submit(JobSubmit(command=sleeper(tmp_path, "a"), gpu_mem="5G")).id
    second = c.submit(JobSubmit(command=sleeper(tmp_path, "b"), gpu_mem="5G")).id
    wait_state(c, first, "running")
    time.sleep(0.5)  # a few of the worker's passes: the second must still wait
    assert c.show(second).state == "queued"
    # The outside process goes: the second fits.
    del nvml.procs[os.getpid()]
    nvml.write()
    wait_state(c, second, "running")
    for name in ("a", "b"):
        (tmp_path / f"{name}.go").touch()
    wait_done(c, first)
    wait_done(c, second)


def test_the_peak_is_measured_shown_and_learned_by_auto(
    gpu_daemon: Daemon, nvml: FakeNvml, tmp_path: Path
) -> None:
    d = gpu_daemon
    c = d.client()
    first = c.submit(JobSubmit(command=sleeper(tmp_path, "t1"), name="train", gpu_mem="auto"))
    job = wait_state(c, first.id, "running")
    assert job.leases.gpu_mem is None and job.attempts[-1].gpu_mem is None  # no history: whole
    nvml.put(0, pid_of(tmp_path, "t1"), 3000)
    peak = wait_for(lambda: c.show(first.id).peak_mem, what="the peak to be sampled")
    assert peak == 3000 * MIB
    nvml.put(0, pid_of(tmp_path, "t1"), 1000)  # less: the peak stays
    # The worker's look that sees 1000 MiB records peaks in the same transaction.
    wait_for(lambda: c.devices().items[0].memory_used_mb == 1000, what="the worker to look again")
    assert c.show(first.id).attempts[-1].peak_mem == 3000 * MIB
    assert "2.9G" in ddpq(d, "ls").stdout
    shown = ddpq(d, "show", str(first.id)).stdout
    assert "gpu memory auto on each GPU" in shown and "peak       2.9G" in shown
    m = scrape(d)
    assert value(m, "ddpq_gpu_memory_peak_bytes", gpu="0") == 3000 * MIB
    (tmp_path / "t1.go").touch()
    assert wait_done(c, first.id).state == "succeeded"
    m = scrape(d)
    assert value(m, "ddpq_attempt_gpu_memory_peak_bytes_count") == 1
    # The next run of the same job reserves what was measured, plus 10%.
    second = c.submit(JobSubmit(command=sleeper(tmp_path, "t2"), name="train", gpu_mem="auto"))
    job = wait_state(c, second.id, "running")
    assert job.leases.gpu_mem == job.attempts[-1].gpu_mem == 3300 * MIB
    assert value(scrape(d), "ddpq_gpu_memory_reserved_bytes", gpu="0") == 3300 * MIB
    (tmp_path / "t2.go").touch()
    wait_done(c, second.id)


def test_a_sharing_job_out_of_cuda_memory_is_requeued_once_on_a_whole_gpu(
    gpu_daemon: Daemon,
) -> None:
    c = gpu_daemon.client()
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    job = c.submit(JobSubmit(command=["sh", "-c", f"echo '{oom}'; exit 1"], gpu_mem="4G"))
    done = wait_done(c, job.id)
    assert done.state == "failed"
    assert [a.gpu_mem for a in done.attempts] == [4 * G, None]
    reasons = [e.reason for e in done.events]
    assert any("requeued once on a whole GPU" in r for r in reasons), reasons


def test_a_user_at_their_limit_waits_with_the_reason_shown(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "4", "--grace", "1s")
    home = str(d.home)
    ddpq(d, "admin", "limit", "alice", "--jobs", "1", "--gpus", "2", "--home", home)
    ddpq(d, "admin", "limit", "--default", "--gpus", "1", "--home", home)
    listed = ddpq(d, "admin", "limit", "--home", home).stdout
    assert "alice" in listed and "at most 1 running job" in listed
    c = d.client()
    first = c.submit(JobSubmit(command=sleeper(tmp_path, "a1"), gpus=1, owner="alice")).id
    second = c.submit(JobSubmit(command=sleeper(tmp_path, "a2"), gpus=1, owner="alice")).id
    bobs = c.submit(JobSubmit(command=sleeper(tmp_path, "b1"), gpus=2, owner="bob")).id
    wait_state(c, first, "running")
    assert wait_for(
        lambda: c.show(second).reason == "at alice's limit of 1 running job", what="the reason"
    )
    # Submitted after the first pass began, bob's job may be planned by the next one.
    bob_waits = "needs 2 GPUs, more than bob's limit of 1"
    assert wait_for(lambda: c.show(bobs).reason == bob_waits, what="bob's reason")
    assert "at alice's limit of 1 running job" in ddpq(d, "show", str(second)).stdout
    ddpq(d, "admin", "limit", "alice", "--clear", "--home", home)
    # Without a limit of her own, alice has everyone's: 1 GPU, which her first job holds.
    assert wait_for(lambda: c.show(second).reason == "at alice's limit of 1 GPU", what="it")
    ddpq(d, "admin", "limit", "alice", "--gpus", "2", "--home", home)
    wait_state(c, second, "running")
    for name in ("a1", "a2"):
        (tmp_path / f"{name}.go").touch()
    c.cancel(bobs)
    wait_done(c, first)
    wait_done(c, second)


def test_a_reservation_holds_its_gpus(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    d = make_daemon("--fake-gpus", "2", "--grace", "1s")
    home = str(d.home)
    out = ddpq(
        d,
        "admin",
        "reserve",
        "--gpus",
        "1",
        "--user",
        "alice",
        "--start",
        "+1h",
        "--end",
        "+2h",
        "--home",
        home,
    ).stdout
    assert out.startswith("reservation 1: 1 GPU for alice from ")
    refused = ddpq(
        d,
        "admin",
        "reserve",
        "--gpus",
        "2",
        "--user",
        "bob",
        "--start",
        "+90m",
        "--end",
        "+3h",
        "--home",
        home,
        check=False,
    )
    assert refused.returncode == 1 and "keep 3 GPUs at once; this server has 2" in refused.stderr
    c = d.client()
    untimed = [
        c.submit(JobSubmit(command=sleeper(tmp_path, f"b{i}"), gpus=1, owner="bob")).id
        for i in range(2)
    ]
    short = c.submit(
        JobSubmit(command=sleeper(tmp_path, "s"), gpus=1, owner="bob", time_limit_s=600)
    ).id
    wait_state(c, untimed[0], "running")
    wait_state(c, short, "running")  # its time limit ends before the window opens
    assert c.show(untimed[1]).reason == (
        "without a time limit it would run into reservation 1 (1 GPU for alice)"
    )
    listed = ddpq(d, "reservations").stdout
    assert "alice" in listed and "to come" in listed
    items = httpx.get(d.url + "/v1/reservations", timeout=10).json()["items"]
    assert [(r["id"], r["user"], r["gpus"], r["active"]) for r in items] == [(1, "alice", 1, False)]
    ddpq(d, "admin", "unreserve", "1", "--home", home)
    assert ddpq(d, "reservations").stdout.strip() == "no reservations"
    for name in ("b0", "b1", "s"):
        (tmp_path / f"{name}.go").touch()
    for job in (*untimed, short):
        wait_done(c, job)


def test_only_an_admin_makes_or_removes_a_reservation_through_the_api(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    alice = add_user(home, "alice", "--unix-user", me())
    admin = add_user(home, "boss", "--admin", "--unix-user", me())
    d = make_daemon("--fake-gpus", "2", "--auth", home=home)
    body = {"user": "alice", "gpus": 1, "start": "2030-01-01T09:00Z", "end": "2030-01-01T17:00Z"}

    def post(token: str, data: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.post(d.url + "/v1/reservations", json=data, headers=headers, timeout=10)

    assert post(alice, body).status_code == 403
    made = post(admin, body)
    assert made.status_code == 201, made.text
    assert made.json()["created_by"] == "boss" and made.json()["active"] is False
    for bad in (
        {**body, "gpus": 3},  # more than the server has
        {**body, "end": "2029-01-01T00:00Z"},  # ends before it starts
        {**body, "start": "2030-01-01T09:00"},  # no offset
        {**body, "gpus": "1"},
        {**body, "user": "not a name"},
        # Past the year 9999 or before the year 1 once in UTC: no datetime can show them,
        # and one stored made every later listing a 500.
        {**body, "end": "9999-12-31T23:59:59-23:59"},
        {**body, "start": "0001-01-01T00:00:00+23:59"},
    ):
        r = post(admin, bad)
        assert r.status_code == 422, (bad, r.text)
    auth = {"Authorization": f"Bearer {alice}"}
    listed = httpx.get(d.url + "/v1/reservations", headers=auth, timeout=10).json()["items"]
    assert [r["user"] for r in listed] == ["alice"]
    rid = listed[0]["id"]
    assert (
        httpx.delete(f"{d.url}/v1/reservations/{rid}", headers=auth, timeout=10).status_code == 403
    )
    gone = httpx.delete(
        f"{d.url}/v1/reservations/{rid}",
        headers={"Authorization": f"Bearer {admin}"},
        timeout=10,
    )
    assert gone.status_code == 200
    again = httpx.delete(
        f"{d.url}/v1/reservations/{rid}", headers={"Authorization": f"Bearer {admin}"}, timeout=10
    )
    assert again.status_code == 404


def test_bad_memory_requests_are_refused_at_the_door(shared_daemon: Daemon) -> None:
    queued = shared_daemon.client().list().total
    for args, says in (
        (["--gpu-mem", "lots"], "--gpu-mem: 'lots' is not a size"),
        (["--gpu-mem", "64M"], "--gpu-mem: must be between 128M and 1P"),
        (
            ["--gpu-mem", "20G"],
            "--gpu-mem: asked for 20G on each of 1 GPU(s); the GPUs here have at most 15G",
        ),
        (["--gpu-share", "2"], "--gpu-share: only with --gpu-mem"),
        (["--gpu-mem", "1G", "--gpu-share", "0"], "--gpu-share"),
        (["--gpu-mem", "1G", "--gpus", "5"], "--gpus: asked for 5 GPUs but this server has 4"),
    ):
        r = ddpq(shared_daemon, "submit", *args, "--", "true", check=False)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (
            args,
            r.stderr,
        )
    for body, says in (
        ({"command": ["true"], "gpu_mem": True}, "gpu_mem"),
        ({"command": ["true"], "gpu_mem": -5}, "gpu_mem"),
        ({"command": ["true"], "gpu_mem": "5G", "gpu_share": 1000}, "gpu_share"),
    ):
        answer = httpx.post(shared_daemon.url + "/v1/jobs", json=body, timeout=10)
        assert answer.status_code == 422 and says in answer.json()["detail"], answer.text
    assert shared_daemon.client().list().total == queued  # nothing queued


def test_a_sharing_job_gets_its_share_in_its_environment(
    shared_daemon: Daemon, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ.get('DDPQ_GPU_MEM', ''))"
    c = shared_daemon.client()
    job = c.submit(JobSubmit(command=[sys.executable, "-c", code], gpu_mem="2G"))
    assert wait_done(c, job.id).state == "succeeded"
    assert out.read_text() == str(2 * G)
