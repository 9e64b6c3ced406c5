"""pytest's hooks and fixtures for the suite; the shared helpers are in tests/helpers.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REAL_CUDA_VISIBLE_DEVICES, hide_gpus, no_gpu_reason

# GPUs are hidden for the whole pytest process here, at conftest import: before anything in
# it can initialise CUDA and before module- or session-scoped fixtures start their runs
# (see tests/helpers.py). Tests marked gpu get the machine's real value back.
hide_gpus()
# A developer's own alert targets (docs/alerts.md) must hear nothing of the suite's runs:
# every ilab-watch and ilab-train here would fall back on them.
os.environ.pop("ILAB_NOTIFY", None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked gpu skip, with the reason, where CUDA is absent."""
    if item.get_closest_marker("gpu") is not None and (reason := no_gpu_reason()):
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _real_gpus_for_gpu_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests marked gpu see the machine's GPUs (the rest keep them hidden, see above)."""
    if request.node.get_closest_marker("gpu") is not None:
        if REAL_CUDA_VISIBLE_DEVICES is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", REAL_CUDA_VISIBLE_DEVICES)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    return d


RELIABILITY_ROWS: list[dict[str, Any]] = []


@pytest.fixture
def reliability() -> Any:
    """``reliability(scenario, **figures)`` records one row of the reliability table."""

    def record(scenario: str, **figures: Any) -> None:
        RELIABILITY_ROWS.append({"scenario": scenario, **figures})

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """With ILAB_RELIABILITY_TABLE=path (make torture): print the table and save it as JSON."""
    out = os.environ.get("ILAB_RELIABILITY_TABLE")
    if not out or not RELIABILITY_ROWS:
        return

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": RELIABILITY_ROWS}, indent=2)
    )
    terminalreporter.write_line("")
    terminalreporter.write_line(f"reliability ({time.strftime('%Y-%m-%d')}), also in {out}:")
    for row in RELIABILITY_ROWS:
        figures = ", ".join(f"{k}={v}" for k, v in row.items() if k != "scenario")
        terminalreporter.write_line(f"  {row['scenario']:<58} {figures}")


@pytest.fixture
def receiver() -> Any:
    """A webhook on 127.0.0.1 that keeps what is POSTed to it (tests/receiver.py): the
    alert tests' ``--notify json://127.0.0.1:PORT/hook`` target."""
    from tests.receiver import serve

    with serve() as got:
        yield got


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A one-node Slurm cluster for the session (tests/slurm_cluster.py), started once,
    its packages installed with apt first where missing (tests/apt.py, as the browser's);
    tests skip with the reason where Slurm still is not installed or cannot start."""
    from tests.slurm_cluster import SlurmUnavailable, start_cluster

    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A local Ray head per test module (tests/ray_cluster.py: 127.0.0.1, free ports,
    stopped by its pid); tests skip with the reason where Ray is missing or cannot start."""
    from tests.ray_cluster import RayUnavailable, start_ray

    try:
        head = start_ray(tmp_path_factory.mktemp("ray"))
    except RayUnavailable as exc:
        pytest.skip(str(exc))
    yield head
    head.stop()


@pytest.fixture(scope="module")
def browser() -> Any:
    """Debian's chromium driven by Playwright, one per test module (tests/browser.py);
    tests skip with the reason where it cannot start."""
    from tests.browser import BrowserUnavailable, launch

    try:
        with launch() as b:
            yield b
    except BrowserUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real S3 server (SeaweedFS's ``weed``) on loopback for the whole session, its keys
    and endpoint in this process's environment (AWS_*: what s3fs and every subprocess read);
    skips with the reason where it cannot start. ``s3.fresh_uri()`` gives a fresh prefix in its bucket."""
    from tests.s3_server import s3_server

    try:
        server_cm = s3_server(tmp_path_factory.mktemp("s3"))
        server = server_cm.__enter__()
    except RuntimeError as exc:
        pytest.skip(f"no S3 server: {exc}")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server_cm.__exit__(None, None, None)
