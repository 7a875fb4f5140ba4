"""`ddpq submit resnet18` without CIFAR-10 is refused at submission (issue 26, item 11):
the daemon looks where the job will look (--data-dir, relative to the job's folder;
$DDPQ_CIFAR_DIR of the job's environment; ~/.cache/ddpq/cifar10 of its account), as its
account would, and says "CIFAR-10 not found at …; use --data-dir DIR or --synthetic N"."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddpq.schemas import JobSubmit
from ddpq.server.errors import ApiError
from ddpq.server.workload_data import check_cifar, data_root
from tests.inprocess import client_with_gpus


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_with_gpus(tmp_path / "home", gpus=2)


def cifar(root: Path, nested: bool = True) -> Path:
    folder = root / "cifar-10-batches-py" if nested else root
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_batch").write_bytes(b"x")
    return root


def submit(api: TestClient, tmp_path: Path, *args: str, **body: Any) -> Any:
    body = {"workload": "resnet18", "args": list(args), "gpus": 1, "cwd": str(tmp_path), **body}
    return api.post("/v1/jobs", json=body)


def refused(r: Any) -> str:
    assert r.status_code == 422, r.text
    detail: str = r.json()["detail"]
    assert "CIFAR-10 not found at" in detail and "--data-dir" in detail, detail
    assert "--synthetic N" in detail
    return detail


def test_no_data_anywhere_is_refused_naming_where_it_looked(
    api: TestClient, tmp_path: Path
) -> None:
    missing = tmp_path / "nothing"
    detail = refused(submit(api, tmp_path, "--data-dir", str(missing)))
    assert str(missing) in detail


@pytest.mark.parametrize(
    "layout",
    ["a-file-not-a-folder", "an-empty-folder", "train-batches-but-no-test-batch"],
)
def test_a_folder_that_is_not_cifar_is_refused(
    api: TestClient, tmp_path: Path, layout: str
) -> None:
    root = tmp_path / "data"
    if layout == "a-file-not-a-folder":
        root.write_text("x")
    else:
        (root / "cifar-10-batches-py").mkdir(parents=True)
        if layout == "train-batches-but-no-test-batch":
            (root / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    refused(submit(api, tmp_path, "--data-dir", str(root)))


@pytest.mark.parametrize("nested", [True, False], ids=["root", "the-batches-folder-itself"])
def test_data_where_it_is_looked_for_is_taken(
    api: TestClient, tmp_path: Path, nested: bool
) -> None:
    root = cifar(tmp_path / "data", nested)
    assert submit(api, tmp_path, "--data-dir", str(root)).status_code == 201
    assert submit(api, tmp_path, f"--data-dir={root}").status_code == 201


def test_a_relative_data_dir_is_the_jobs_folders(api: TestClient, tmp_path: Path) -> None:
    cifar(tmp_path / "job" / "data")
    (tmp_path / "elsewhere").mkdir()
    assert submit(api, tmp_path / "job", "--data-dir", "data").status_code == 201
    refused(submit(api, tmp_path / "elsewhere", "--data-dir", "data"))


def test_synthetic_data_needs_no_folder(api: TestClient, tmp_path: Path) -> None:
    r = submit(api, tmp_path, "--synthetic", "64", "--data-dir", str(tmp_path / "nothing"))
    assert r.status_code == 201, r.text


def test_ddpqs_own_variables_cannot_move_it(api: TestClient, tmp_path: Path) -> None:
    """$DDPQ_CIFAR_DIR never reaches a job (every DDPQ_* is ddpq's): it moves nothing."""
    root = cifar(tmp_path / "env-data")
    exported = {"DDPQ_CIFAR_DIR": str(root), "PATH": "/bin", "HOME": str(tmp_path)}
    refused(submit(api, tmp_path, "--data-dir", str(tmp_path / "gone"), exported_env=exported))


def test_without_a_data_dir_it_is_the_accounts_cache(tmp_path: Path) -> None:
    body = JobSubmit(workload="resnet18", args=[], gpus=1, exported_env={"PATH": "/bin"})
    assert data_root(body, "/work", "/home/ann") == "/home/ann/.cache/ddpq/cifar10"
    tilde = JobSubmit(workload="resnet18", args=["--data-dir", "~/c10"], gpus=1)
    assert data_root(tilde, "/work", "/home/ann") == "/home/ann/c10"


@pytest.mark.skipif(os.geteuid() != 0, reason="judging as another account needs root")
def test_data_the_jobs_account_cannot_reach_is_refused_as_missing() -> None:
    """A root daemon with --auth judges as the job's account: a 0700 folder of root's
    reads as missing for nobody (and says nothing more about it)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp_path is root's 0700
        os.chmod(top, 0o755)
        judged_as_nobody(Path(top))


def judged_as_nobody(tmp_path: Path) -> None:
    private = tmp_path / "private"
    root = cifar(private / "data")
    private.chmod(0o700)
    body = JobSubmit(workload="resnet18", args=["--data-dir", str(root)], gpus=1)
    nobody = pwd.getpwnam("nobody").pw_name
    with pytest.raises(ApiError, match="CIFAR-10 not found at"):
        check_cifar(body, str(tmp_path), nobody, judge_as=True)
    check_cifar(body, str(tmp_path), "root", judge_as=True)  # root may
    private.chmod(0o755)
    check_cifar(body, str(tmp_path), nobody, judge_as=True)  # and now nobody too


@pytest.mark.skipif(os.geteuid() != 0, reason="judging as another account needs root")
@pytest.mark.parametrize("how", ["test_batch", "cifar-10-batches-py", "data folder"])
def test_a_link_to_someone_elses_file_tells_nothing_of_it(how: str) -> None:
    """nobody's own folder, with a link (the test file, the batches' folder, or the data
    folder itself) into a 0700 folder of root's: refused alike whether root's file is
    there or not; the daemon does not follow the link as root."""
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        private = Path(top) / "private"
        theirs = cifar(private / "data")
        private.chmod(0o700)
        mine = Path(top) / "mine"
        if how == "data folder":
            mine.symlink_to(theirs)
        else:
            (mine / "cifar-10-batches-py").mkdir(parents=True)
            if how == "test_batch":
                target = theirs / "cifar-10-batches-py" / "test_batch"
                (mine / "cifar-10-batches-py" / "test_batch").symlink_to(target)
            else:
                (mine / "cifar-10-batches-py").rmdir()
                (mine / "cifar-10-batches-py").symlink_to(theirs / "cifar-10-batches-py")
        body = JobSubmit(workload="resnet18", args=["--data-dir", str(mine)], gpus=1)
        for _ in ("there", "gone"):
            with pytest.raises(ApiError, match="CIFAR-10 not found at"):
                check_cifar(body, top, "nobody", judge_as=True)
            (theirs / "cifar-10-batches-py" / "test_batch").unlink(missing_ok=True)
        private.chmod(0o755)  # reachable to nobody now: the same links lead to data
        cifar(private / "data")
        check_cifar(body, top, "nobody", judge_as=True)


def test_another_workload_or_a_command_is_not_judged(api: TestClient, tmp_path: Path) -> None:
    r = api.post("/v1/jobs", json={"command": ["/bin/true"], "gpus": 0, "cwd": str(tmp_path)})
    assert r.status_code == 201, r.text


def sweep(api: TestClient, tmp_path: Path, params: dict[str, list[str]], *args: str) -> Any:
    template = {"workload": "resnet18", "args": list(args), "gpus": 1, "cwd": str(tmp_path)}
    return api.post("/v1/sweeps", json={"template": template, "params": params})


def test_a_sweep_without_its_data_is_refused_whole_as_one_job_is(
    api: TestClient, tmp_path: Path
) -> None:
    """The README's own sweep on a host without CIFAR-10 was queued, and every member
    failed in torchrun a minute later (found by a new user's walk through the README)."""
    missing = str(tmp_path / "nothing")
    lrs = {"lr": ["0.05", "0.1"], "batch-size": ["64", "128"]}
    refused(sweep(api, tmp_path, lrs, "--epochs", "1", "--data-dir", missing))
    root = str(cifar(tmp_path / "data"))
    assert sweep(api, tmp_path, lrs, "--data-dir", root).status_code == 201
    assert sweep(api, tmp_path, lrs, "--synthetic", "64").status_code == 201
    assert api.get("/v1/jobs").json()["total"] == 8  # the two taken, four members each


@pytest.mark.parametrize("name", ["data-dir", "data"], ids=["named", "a-prefix-of-it"])
def test_a_sweep_over_where_its_data_is_checks_each_place(
    api: TestClient, tmp_path: Path, name: str
) -> None:
    here = str(cifar(tmp_path / "here"))
    refused(sweep(api, tmp_path, {name: [here, str(tmp_path / "not-here")]}))
    assert sweep(api, tmp_path, {name: [here]}).status_code == 201
    templated = {"seed": ["1", "2"]}
    refused(sweep(api, tmp_path, templated, "--data-dir", str(tmp_path / "d{index}")))
    cifar(tmp_path / "d0")
    cifar(tmp_path / "d1")
    assert (
        sweep(api, tmp_path, templated, "--data-dir", str(tmp_path / "d{index}")).status_code == 201
    )
