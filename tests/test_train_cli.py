"""ilab-train option errors: one clear line, exit 2, before anything is launched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli, records, train_env
from trainer.config import TrainingArgs, WorkerConfig


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--demo", "--lr", "-1"], "--lr: Input should be greater than 0"),
        (["--demo", "--d-model", "30"], "must be divisible by n_heads"),
        (["--data", "/nonexistent.jsonl"], "training data file /nonexistent.jsonl does not exist"),
        ([], "no training data"),
        (["--demo", "--nnodes", "2"], "needs rdzv_endpoint"),
        (["--demo", "--journal-detail", "loud"], "Invalid value for '--journal-detail'"),
        (["--demo", "--keep-best", "accuracy"], "--keep-best: 'accuracy': expected METRIC:max"),
        (["--demo", "--model-path", "/nonexistent"], "Path '/nonexistent' does not exist"),
        (["--demo", "--model-path", str(Path(__file__).parent)], "has no config.json"),
        (["--demo", "--data", __file__], "both data_path and demo given: give data_path"),
        (["--demo", "--dropout", "1"], "--dropout: Input should be less than 1"),
        (["--demo", "--profile-steps", "5-7"], "--profile-steps: expected A:B or N"),
        (["--demo", "--profile-steps", "7:5"], "--profile-steps: expected steps 1 <= A <= B"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli("ilab-train", "--ckpt-dir", str(tmp_path / "run"), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was launched


def test_bad_config_files(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("lr: [1,\n")
    proc = cli("ilab-train", "--config", str(bad_yaml), "--ckpt-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "not valid yaml" in proc.stderr
    unknown = tmp_path / "c.json"
    unknown.write_text('{"demo": true, "learning_rate": 0.1}')
    proc = cli("ilab-train", "--config", str(unknown), "--ckpt-dir", str(tmp_path / "r"))
    assert (
        proc.returncode == 2 and "learning_rate" in proc.stderr and "Traceback" not in proc.stderr
    )
    missing = cli("ilab-train", "--demo")
    assert missing.returncode == 2 and "--ckpt-dir is required" in missing.stderr


@pytest.mark.parametrize("where", ["under-a-file", "in-proc"])
def test_a_checkpoint_dir_that_cannot_be_created_is_one_line_exit_2(
    tmp_path: Path, where: str
) -> None:
    """A --ckpt-dir below a regular file, or where nothing can be created (/proc), is a bad
    option (exit 2), found before any worker starts; a full disk stays exit 1."""
    (tmp_path / "afile").write_text("")
    ckpt, why = {
        "under-a-file": (tmp_path / "afile" / "run", "Not a directory"),
        "in-proc": (Path("/proc/ilab-run"), "No such file or directory"),
    }[where]
    proc = cli("ilab-train", "--demo", "--ckpt-dir", str(ckpt), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"ilab-train: cannot use {ckpt} as the checkpoint dir: {why}"


# The suite hides GPUs from every test not marked gpu (conftest), so these hold everywhere.
@pytest.mark.parametrize("nproc", ["1", "2"])
def test_nccl_without_a_gpu_is_refused_before_launch(tmp_path: Path, nproc: str) -> None:
    proc = cli(
        "ilab-train",
        *("--demo", "--ckpt-dir", str(tmp_path / "run")),
        *("--backend", "nccl", "--nproc-per-node", nproc),
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no worker said anything
    [line] = proc.stderr.splitlines()  # one line, no usage banner
    assert (
        line.startswith("ilab-train: --backend nccl needs CUDA GPUs") and "--backend gloo" in line
    )
    assert not (tmp_path / "run").exists()  # nothing was launched or written


@pytest.mark.extended
def test_a_failure_while_setting_up_the_worker_is_journaled(tmp_path: Path) -> None:
    """Past the launcher's checks (here: a worker config written by hand), a failure while
    setting up device or process group still ends in train_end failed, not a bare traceback."""
    ckpt = tmp_path / "run"
    cfg = tmp_path / "worker.json"
    args = TrainingArgs(ckpt_dir=ckpt, demo=True, backend="nccl", max_steps=1)
    cfg.write_text(WorkerConfig(args=args).model_dump_json())
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"),
            *("-m", "trainer.rank.worker", str(cfg)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=train_env(),
    )
    assert proc.returncode != 0
    end = records(ckpt)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert "needs CUDA" in end["data"]["reason"]


BAD_DATA = {
    "empty": ("", "{path}: no samples"),
    "bad_json": ('{"input_ids": [1, 2]}\n{"input_ids": [1,\n', "{path}:2: not valid JSON"),
    "not_a_list": ('{"input_ids": "1 2 3"}\n', "{path}:1: 'input_ids' must be a non-empty list"),
    "vocabulary": ('{"input_ids": [1, 2, 258]}\n', "{path}:1: token id 258 >= vocabulary size 258"),
    "chat_role": (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}\n',
        "{path}:1: message 1",
    ),
}


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_data_is_one_line_before_any_worker_starts(tmp_path: Path, case: str) -> None:
    """The launcher checks every row with the workers' own checks: one line naming
    file:line, exit 2, nothing launched (no torchrun traceback, no run dir)."""
    text, message = BAD_DATA[case]
    data = tmp_path / "train.jsonl"
    data.write_text(text)
    model = tmp_path / "model"  # the chat check needs a model with a tokenizer, not its files
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 512}')
    extra = ["--model-path", str(model)] if case == "chat_role" else []
    run = tmp_path / "run"
    proc = cli("ilab-train", "--data", str(data), "--ckpt-dir", str(run), *extra, timeout=60)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("ilab-train: " + message.format(path=data)), line
    assert not run.exists()


def test_a_failure_inside_the_workers_reaches_the_console_as_one_line(tmp_path: Path) -> None:
    """A mistake only the workers can find (here a micro-batch budget below the longest
    sample): each rank's one line and the launcher's, no traceback or torchrun report on
    the console; the launch log keeps them."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n' * 70)
    run = tmp_path / "run"
    argv = ["--data", str(data), "--ckpt-dir", str(run), "--nproc-per-node", "2"]
    proc = cli("ilab-train", *argv, "--max-batch-len", "8", timeout=240, env=train_env())
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert (
        "Traceback" not in console and "ChildFailedError" not in console and "=====" not in console
    )
    why = "max_batch_len 8 is shorter than the longest sample (12 tokens)"
    assert f"[rank0] data error: {why}" in proc.stdout
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"ilab-train: training failed: DataError: {why}")
    )
    [log] = (run / "logs").glob("launch-*.log")
    assert "ChildFailedError" in log.read_text()  # the whole story stays in the log


def test_settings_that_do_less_than_they_say_warn_at_start(tmp_path: Path) -> None:
    from trainer.launch.data_check import DataSummary, start_warnings

    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, max_steps=200)
    [line] = start_warnings(args, DataSummary(6000, chat=False))
    assert line == (
        "--max-steps 200 is more than 1 epoch(s) of 93 steps (6000 samples / batch size 64): "
        "training ends at step 93 (--num-epochs 3 trains all 200 steps)"
    )
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2]}\n')
    args = TrainingArgs(ckpt_dir=tmp_path, data_path=data, eval_every=5, effective_batch_size=1)
    [line] = start_warnings(args, DataSummary(1, chat=False))
    assert line.startswith("--eval-every 5 has no validation data to evaluate")
    assert start_warnings(args.model_copy(update={"eval_every": None}), DataSummary(1, False)) == []


SEED_RANGE = "must be a whole number from 0 to 4294967295 (2**32 - 1)"
INT_RANGE = (
    "must be at most 9223372036854775807 (2**63 - 1, the largest whole number the journal "
    "and the workers hold)"
)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--seed", str(2**80)], f"--seed: {SEED_RANGE}, got {2**80}"),
        (["--seed", "-1"], f"--seed: {SEED_RANGE}, got -1"),
        (["--warmup-steps", str(10**20)], f"--warmup-steps: {INT_RANGE}, got {10**20}"),
        (["--save-every", str(2**63)], f"--save-every: {INT_RANGE}, got {2**63}"),
        (["--lr", "inf"], "--lr: Input should be a finite number"),
        (["--lr", "nan"], "--lr: Input should be a finite number"),
        (
            ["--batch-size", "1000000000000"],
            "effective_batch_size (--batch-size) 1000000000000 is more than the 6000 training "
            "samples: one optimizer step takes that many samples (at most 6000 here)",
        ),
        (
            ["--batch-size", "1", "--nproc-per-node", "2"],
            "effective_batch_size (--batch-size) 1 is smaller than the 2 ranks "
            "(--nproc-per-node 2 x --nnodes 1): every rank needs at least one sample a step",
        ),
        (
            ["--max-steps", "5", "--profile-steps", "50:60"],
            "--profile-steps 50:60 starts after the run's last step, 5 (--max-steps 5): "
            "nothing would be profiled (give steps within 1:5)",
        ),
        (
            ["--demo-samples", "640", "--profile-steps", "12"],
            "--profile-steps 12 starts after the run's last step, 10 (1 epoch(s) of 10 steps: "
            "640 samples / batch size 64): nothing would be profiled (give steps within 1:10)",
        ),
    ],
)
def test_settings_the_workers_cannot_run_are_one_line_before_launch(
    tmp_path: Path, args: list[str], line: str
) -> None:
    """Settings that used to pass the launcher and fail in every worker (exit 1 after
    torchrun started, or a run that silently does nothing): one line, exit 2, no worker."""
    run = tmp_path / "run"
    proc = cli("ilab-train", "--demo", "--ckpt-dir", str(run), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"ilab-train: {line}" or (
        f"Error: {line}" in proc.stderr  # a click usage error: banner, then the line
    ), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (run / "logs").exists()  # nothing was launched


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        (
            "c.json",
            '{"effective_batch_size": 1e12}',
            "effective_batch_size in --config (--batch-size): expected a whole number, got "
            "the float 1000000000000.0 (write 1000000000000)",
        ),
        (
            "c.yaml",
            "effective_batch_size: 1e12",  # YAML 1.1 reads this as a string
            "effective_batch_size in --config (--batch-size): expected a whole number, got "
            "the string '1e12' (write 1000000000000)",
        ),
        ("c.yaml", "lr: .inf", "lr in --config (--lr): Input should be a finite number"),
        ("c.yaml", "lr: Infinity", "lr in --config (--lr): Input should be a finite number"),
        (
            "c.yaml",
            f"seed: {2**80}",
            f"seed in --config (--seed): {SEED_RANGE}, got {2**80}",
        ),
        (
            "c.yaml",
            f"warmup_steps: {10**20}",
            f"warmup_steps in --config (--warmup-steps): {INT_RANGE}, got {10**20}",
        ),
        (
            "c.yaml",
            "model: {d_model: 64.5}",
            "model.d_model in --config (--d-model): expected a whole number, got the float 64.5",
        ),
    ],
)
def test_a_bad_value_in_a_config_file_is_named_as_written_there(
    tmp_path: Path, name: str, text: str, line: str
) -> None:
    """The error names the setting as the file spells it (and the flag that overrides it),
    not only as a flag the user never typed."""
    config = tmp_path / name
    config.write_text(text)
    run = tmp_path / "run"
    proc = cli("ilab-train", "--demo", "--config", str(config), "--ckpt-dir", str(run))
    assert proc.returncode == 2, proc.stderr
    assert f"Error: {line}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not run.exists()


def test_a_directory_as_data_is_named_a_directory(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"data_path: {tmp_path}\n")
    proc = cli("ilab-train", "--config", str(config), "--ckpt-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert f"Error: training data file {tmp_path} is a directory, not a data file" in proc.stderr
    with pytest.raises(ValueError, match=r"validation data file .* is a directory, not a data"):
        TrainingArgs(ckpt_dir=tmp_path / "run", demo=True, val_data_path=tmp_path)


def test_run_training_refuses_what_the_workers_cannot_run(tmp_path: Path) -> None:
    """The Python API: a field the model rules out is pydantic's ValidationError (a
    ValueError) when the settings are made; what the data rules out is a ConfigError from
    run_training, before the checkpoint dir is touched."""
    from pydantic import ValidationError

    from trainer.config import ConfigError
    from trainer.launch import run_training

    run = tmp_path / "run"
    for bad in (
        {"seed": 2**80},
        {"lr": float("inf")},
        {"effective_batch_size": 1e12},
        {"warmup_steps": 10**20},
    ):
        with pytest.raises(ValidationError):
            TrainingArgs(ckpt_dir=run, demo=True, **bad)
    args = TrainingArgs(ckpt_dir=run, demo=True, effective_batch_size=10**12)
    with pytest.raises(ConfigError, match="is more than the 6000 training samples"):
        run_training(args, echo=False)
    args = TrainingArgs(ckpt_dir=run, demo=True, max_steps=5, profile_steps="50:60")
    with pytest.raises(ConfigError, match="--profile-steps 50:60 starts after"):
        run_training(args, echo=False)
    assert not run.exists()
