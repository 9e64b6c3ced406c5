"""Lease bookkeeping: a lease always expires (no infinite or NaN ttl), and a watcher's
renewal never brings back a lease its delivery just released."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from journal import leases
from tests.helpers import cli
from watcher.leasing import LeaseKeeper


@pytest.mark.parametrize("ttl", ["inf", "nan", "-inf", "1e12", "0"])
def test_a_lease_that_would_never_expire_is_refused_in_one_line(ckpt: Path, ttl: str) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    proc = cli("ilab-journal", "lease", str(ckpt), "step-000004", "--ttl", ttl)
    assert proc.returncode == 2, proc.stderr
    assert "--ttl" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not list(ckpt.glob("leases/*.json"))


@pytest.mark.parametrize("ttl", [float("inf"), float("nan"), 0.0, -1.0])
def test_the_python_api_refuses_a_ttl_that_never_or_already_ends(ckpt: Path, ttl: float) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    with pytest.raises(leases.LeaseError, match="ttl"):
        leases.acquire(ckpt, "step-000004", ttl=ttl)


class ObservedLock:
    """The keeper's lock, with a signal when an acquire has to wait (so the test knows a
    release is blocked behind a renewal without sleeping)."""

    def __init__(self, on_wait: threading.Event) -> None:
        self._lock = threading.Lock()
        self._on_wait = on_wait

    def __enter__(self) -> ObservedLock:
        if not self._lock.acquire(blocking=False):
            self._on_wait.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def test_a_release_during_a_renewal_stays_released(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery completes (release) while the renewal thread is rewriting the lease
    file: afterwards the lease file is gone and rotation may remove the checkpoint. Before,
    the renewal rewrote the file after the release and the checkpoint outlived keep_last_n."""
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    keeper = LeaseKeeper(ckpt, ttl=60, holder="test")
    lease_id = keeper.take(str(ckpt / "checkpoints" / "step-000004"))
    assert lease_id is not None
    progressed = threading.Event()  # the release either finished or waits for the renewal
    keeper._lock = ObservedLock(progressed)  # type: ignore[assignment]
    real_write = leases.atomic_write

    def release_then() -> None:
        keeper.release(lease_id)
        progressed.set()

    def renewal_write(path: Any, data: bytes, **kw: Any) -> None:
        releaser = threading.Thread(target=release_then)
        releaser.start()  # the delivery completes right now
        assert progressed.wait(30)
        real_write(path, data, **kw)
        threads.append(releaser)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(leases, "atomic_write", renewal_write)
    keeper.renew_held()
    monkeypatch.setattr(leases, "atomic_write", real_write)
    for t in threads:
        t.join()
    assert leases.leased(ckpt, {"step-000004"}) == set()
    assert not list((ckpt / "leases").glob("*.json"))
