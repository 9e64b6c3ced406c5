"""Every exporter tells the fold's story (issue 60, "every fact has one rule"): journals
generated with hypothesis as a real run writes them (saves, rotation by the trainer and by
a watcher after the end, so saves of since-removed checkpoints; reports; commands; a
restart), each attempt ended as completed, stopped by an eval or aborted by the hang guard, are exported with
``ilab-watch --replay`` into MLflow (a local file store), TensorBoard (read back with its
own ``EventAccumulator``) and W&B (offline, read back from its transaction log), and each
says what the run's fold (:class:`journal.views.fold.RunFold`) says: who stopped the run,
its last checkpoint, every save with its fate, and every metric series by the one number
rule (:func:`journal.views.fold.metric_points`)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from journal.views.fold import RunFold, metric_points
from tests.test_views_agree import AFTER, GOAL, TRAINING, RunStory, _op, written
from watcher.cli.main import main as ilab_watch

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

ENDINGS = ("completed", "eval", "hang")


class EndedStory(RunStory):
    """A :class:`RunStory` whose end is one of :data:`ENDINGS`: an eval's applied stop
    (its ``control`` and a ``stopped`` ``train_end`` naming it), or the hang guard's abort
    (a ``failed`` ``train_end`` with ``aborted_for: hang``)."""

    def end(self, how: str = "completed") -> None:
        if self.ended:
            return
        payload: dict[str, Any] = {"status": "completed"}
        if how == "eval":
            cid, source = f"stop{self.step}", "eval:eval_accuracy.py"
            self.w.append(
                "control",
                {"command": "stop", "id": cid, "accepted": True, "source": source}
                | {"applied_at_step": self.step, "reason": "target reached"},
                step=self.step,
            )
            payload = {"status": "stopped", "reason": "target reached", "command": "stop"}
            payload |= {"command_id": cid, "command_source": source}
        elif how == "hang":
            payload = {"status": "failed", "reason": "no step for 60s", "aborted_for": "hang"}
            payload |= {"aborted_by": "watcher:guard", "alert_id": "hang-1"}
        self.w.append("train_end", payload, step=self.step)
        self.w.close()
        self.w = type(self.w)(self.dir, join=True)  # guests write after the end
        self.ended = True


#: One attempt, or two (the second a restart of the same run after the first ended).
stories = st.tuples(
    st.lists(st.sampled_from(TRAINING).flatmap(_op), min_size=2, max_size=10),
    st.sampled_from(ENDINGS),
    st.lists(st.sampled_from(AFTER).flatmap(_op), max_size=5),
    st.one_of(
        st.just([]), st.sampled_from(ENDINGS).map(lambda e: [("restart",), ("save",), ("end", e)])
    ),
).map(lambda t: [*t[0], ("end", t[1]), *t[2], *t[3]])


@contextmanager
def exported(steps: list[tuple[Any, ...]], keep_last_n: int) -> Iterator[tuple[Path, Path]]:
    """The run of ``steps`` in a fresh dir, replayed into the three trackers under ``out``."""
    with written(steps, keep_last_n, GOAL, EndedStory) as run_dir:
        out = run_dir.parent.parent / "out"
        args = [str(run_dir), "--replay", "-q", "--tensorboard", str(out / "tb")]
        args += ["--mlflow", (out / "mlruns").as_uri(), "--wandb"]
        env = {"WANDB_MODE": "offline", "WANDB_DIR": str(out / "wb"), "WANDB_SILENT": "true"}
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a local store: no server, no migration
        (out / "wb").mkdir(parents=True)
        got = CliRunner().invoke(ilab_watch, args, env=env)
        assert got.exit_code == 0, got.output
        yield run_dir, out


def f32(v: float) -> float:
    """``v`` as TensorBoard keeps a scalar (a 32-bit float)."""
    return float(struct.unpack("f", struct.pack("f", v))[0])


def name_of(text: str) -> str:
    """A checkpoint's name from an ``events/save`` or ``events/checkpoint_removed`` text
    (its path as journaled, any spelling, then `` (why)``)."""
    return Path(text.split(" (")[0]).name


def the_fold(run: Path) -> tuple[RunFold, dict[str, list[tuple[int, float]]]]:
    """The run's fold and its metric series (``train/loss`` -> sorted (step, value))."""
    fold, series = RunFold(run), {}
    for line in (run / "journal.jsonl").read_text().splitlines():
        rec = json.loads(line)
        fold.add(rec)
        got = metric_points(rec["event"], rec.get("step", 0), rec.get("data", {}))
        for name, value in (got[2] if got else {}).items():
            series.setdefault(f"{got[0]}/{name}", []).append((got[1], value))  # type: ignore[index]
    return fold, {k: sorted(v) for k, v in series.items()}


def mlflow_says(out: Path, run_id: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient((out / "mlruns").as_uri())
    exp = client.get_experiment_by_name("ilab-journal")
    (found,) = client.search_runs([exp.experiment_id], f"tags.`ilab.run_id` = '{run_id}'")
    tags = found.data.tags
    names = {k.split(".")[1] for k in tags if k.startswith("checkpoint.")}
    return {
        # an emptied tag says none (a later attempt completed: MLflow keeps the key)
        "stop": (tags.get("ilab.stop_source") or None, tags.get("ilab.stopped_by") or None),
        "last": tags.get("ilab.last_checkpoint"),
        "saves": {n: f"checkpoint.{n}.removed" in tags for n in names},
        "series": {
            k: sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, k))
            for k in found.data.metrics
        },
    }


def tensorboard_says(out: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing import event_accumulator as ea

    (sub,) = (out / "tb").iterdir()
    acc = ea.EventAccumulator(
        str(sub), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0}, purge_orphaned_data=False
    )
    acc.Reload()
    tags = acc.Tags()
    texts = {
        t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)] for t in tags["tensors"]
    }
    stop = texts.get("ilab/stop_source", [None])[-1]
    removed = {name_of(t) for t in texts.get("events/checkpoint_removed", [])}
    return {
        "stop": tuple(stop[:-1].split(" (")) if stop else (None, None),
        "last": texts.get("ilab/last_checkpoint", [""])[-1] or None,
        "saves": {name_of(t): name_of(t) in removed for t in texts.get("events/save", [])},
        "series": {t: sorted((e.step, e.value) for e in acc.Scalars(t)) for t in tags["scalars"]},
    }


def wandb_says(out: Path, run_id: str) -> dict[str, Any]:
    from watcher.exporters.wandb_log import history_rows, run_files, summary

    (file,) = run_files(out / "wb", run_id)
    s = summary(file)
    series: dict[str, list[tuple[int, float]]] = {}
    for row in history_rows(file):
        for key, value in row.items():
            prefix = key.split("/")[0]
            if "/" in key and not key.endswith("/step") and f"{prefix}/step" in row:
                series.setdefault(key, []).append((row[f"{prefix}/step"], value))
    names = {k.split("/")[1] for k in s if k.startswith("checkpoint/")}
    return {
        "stop": (s.get("ilab/stop_source") or None, s.get("ilab/stopped_by") or None),
        "last": s.get("ilab/last_checkpoint"),
        "saves": {n: f"checkpoint/{n}/removed" in s for n in names},
        "series": {k: sorted(v) for k, v in series.items()},
    }


def assert_exporters_agree(run: Path, out: Path) -> None:
    fold, series = the_fold(run)
    summary = fold.summary()
    want = {
        "stop": (summary.stop_source, summary.stopped_by),
        "last": fold.last_checkpoint,
        "saves": {f.name: f.removed is not None for f in fold.fates if f.saved},
        "series": series,
    }
    assert fold.run_id is not None
    assert mlflow_says(out, fold.run_id) == want
    assert wandb_says(out, fold.run_id) == want
    tb_series = {k: [(s, f32(v)) for s, v in pts] for k, pts in series.items()}
    assert tensorboard_says(out) == {**want, "series": tb_series}


#: The hang guard aborts the run; a late report; a watcher prunes after the end.
HANG_ABORTED = [("save",), ("save",), ("report", 0, 0.5, "absolute"), ("save",), ("end", "hang")]
HANG_ABORTED += [("report", 2, 0.7, "relative"), ("prune", "dot")]
#: An eval stops it after a refused command; saves rotated away meanwhile and after.
EVAL_STOPPED = [("save",), ("report", 0, 0.2, "dot"), ("command", False), ("save",), ("save",)]
EVAL_STOPPED += [("end", "eval"), ("prune", "slash")]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=stories, keep_last_n=st.integers(1, 2))
@example(steps=HANG_ABORTED, keep_last_n=1)
@example(steps=EVAL_STOPPED, keep_last_n=2)
def test_every_exporter_tells_the_folds_story(
    steps: list[tuple[Any, ...]], keep_last_n: int
) -> None:
    with exported(steps, keep_last_n) as (run, out):
        assert_exporters_agree(run, out)
