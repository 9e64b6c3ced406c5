"""What run_training's result says of each report_to tracker (watcher/embedded.Trackers):
"ok", or what failed and the ilab-watch line that replays the run into it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import free_port
from watcher.embedded import Trackers
from watcher.hooks.callbacks import callable_name


def test_a_tracker_that_could_not_start_or_failed_mid_run_names_its_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from watcher.exporters.tensorboard_export import TensorBoardExport

    dead = f"http://127.0.0.1:{free_port()}"
    settings = {"mlflow_tracking_uri": dead, "tensorboard_dir": str(tmp_path / "tb")}
    trackers = Trackers(tmp_path, ["tensorboard", "mlflow"], settings)
    assert list(trackers.exporters) == ["tensorboard"]
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "training goes on without it" in warning
    assert f"ilab-watch {tmp_path} --mlflow {dead} --replay" in warning
    # its hooks' label: the class, then its destination's digest (the cursor's identity)
    label = trackers.exporters["tensorboard"].callback_label
    assert label is not None and label.startswith(callable_name(TensorBoardExport) + ".to-")
    rows = [
        {
            "callback": f"{label}.on_log",
            "event": "log",
            "failed": 2,
            "errors": ["OSError: disk full"],
        }
    ]
    assert trackers.outcomes([])["tensorboard"] == "ok"
    out = trackers.outcomes(rows)
    assert out["mlflow"].startswith("not started: ")
    assert out["tensorboard"] == (
        "incomplete: 2 record(s) not written (OSError: disk full); "
        f"replay: ilab-watch {tmp_path} --tensorboard {tmp_path / 'tb'} --replay"
    )
    for exporter in trackers.exporters.values():
        exporter.close()
