"""InstructLab's ``run_training(torch_args, train_args)`` on this trainer (docs/instructlab.md)."""

from __future__ import annotations

import enum
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import BIN, ROOT, records, tiny_llama_config, train_env
from trainer.data.plan import load_jsonl, make_demo_data
from trainer.data.rows import DataError
from trainer.data.validation_split import split
from trainer.instructlab import (
    TORCH_FIELDS,
    InstructLabConfigError,
    load_config,
    run_training,
    to_ours,
)
from trainer.instructlab.fields import TRAIN_RULES
from trainer.launch.data_check import check_file

DOC = ROOT / "docs" / "instructlab.md"


def processed_data(out_dir: Path, n: int = 96) -> Path:
    """``out_dir/data.jsonl`` as InstructLab's data_process step writes it: input_ids,
    labels and len (the demo's arithmetic problems, byte tokens)."""
    files = make_demo_data(out_dir / "demo", n_train=n, seed=0)
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    path = out_dir / "data.jsonl"
    path.write_text("".join(json.dumps({**r, "len": len(r["input_ids"])}) + "\n" for r in rows))
    return path


def tiny_llama(path: Path) -> Path:
    pytest.importorskip("transformers")
    tiny_llama_config().save_pretrained(path)
    return path


def base_args(tmp_path: Path) -> dict[str, Any]:
    """InstructLab's required fields, pointing at files that exist (no launch)."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text('{"vocab_size": 300}')
    processed_data(tmp_path / "processed", n=70)
    return {
        "model_path": str(tmp_path / "model"),
        "data_path": str(tmp_path / "processed" / "data.jsonl"),
        "ckpt_output_dir": str(tmp_path / "run"),
        "data_output_dir": str(tmp_path / "processed"),
        "max_seq_len": 64,
        "max_batch_len": 1024,
        "effective_batch_size": 16,
        "learning_rate": 1e-3,
    }


# -- the mapping ---------------------------------------------------------------------------


def test_absent_fields_take_instructlabs_defaults(tmp_path: Path) -> None:
    ours, trun = to_ours({}, base_args(tmp_path))
    assert (ours.lr, ours.warmup_steps, ours.seed, ours.num_epochs) == (1e-3, 0, 42, 1)
    assert ours.adam_betas == (0.9, 0.95) and ours.adam_eps == 1e-8
    assert ours.sharding == "hybrid"  # FSDPOptions' HYBRID_SHARD
    assert ours.keep_last_n is None  # InstructLab keeps every checkpoint
    assert ours.save_at_epoch_end and not ours.save_final and ours.save_samples is None
    assert ours.min_lr_ratio == 0.0 and ours.validation_split == 0 and ours.eval_every is None
    assert (trun.nproc_per_node, trun.nnodes) == (1, 1)


def test_fields_map_onto_ours(tmp_path: Path) -> None:
    class Sharding(enum.Enum):  # what a caller holding InstructLab's enums passes
        SHARD_GRAD_OP = "SHARD_GRAD_OP"

    args = {
        **base_args(tmp_path),
        "process_data": False,  # trains on data_output_dir/data.jsonl
        "data_path": "never/read.jsonl",
        "save_samples": 40,
        "adamw_betas": [0.8, 0.9],
        "keep_last_checkpoint_only": True,
        "validation_split": 0.1,
        "validation_frequency": 3,
        "fsdp_options": {"sharding_strategy": Sharding.SHARD_GRAD_OP},
        "disable_flash_attn": True,
        "use_liger": True,
        "log_level": "DEBUG",
    }
    ours, trun = to_ours({"nproc_per_node": 2, "rdzv_id": 7, "master_addr": "h"}, args)
    assert ours.data_path == tmp_path / "processed" / "data.jsonl"
    assert (ours.save_samples, ours.adam_betas, ours.keep_last_n) == (40, (0.8, 0.9), 1)
    assert (ours.validation_split, ours.eval_every, ours.sharding) == (0.1, 3, "grad_op")
    assert (ours.packing, ours.fused_loss) == ("off", "liger")
    assert ours.lora_rank is None  # lora: null is a full fine-tune
    assert (trun.rdzv_id, trun.master_port) == ("7", 29500)  # torchrun's default port


def test_lora_options_map_onto_ours(tmp_path: Path) -> None:
    """InstructLab's LoraOptions: its defaults for the fields left out; rank 0 (or null) is
    a full fine-tune, as there."""
    args = base_args(tmp_path)
    ours, _ = to_ours({}, {**args, "lora": {"rank": 8, "dropout": 0.0}})
    assert (ours.lora_rank, ours.lora_alpha, ours.lora_dropout) == (8, 32, 0.0)
    assert ours.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    ours, _ = to_ours({}, {**args, "lora": {"rank": 0, "quantize_data_type": None}})
    assert ours.lora_rank is None


@pytest.mark.parametrize(
    ("field", "value", "line"),
    [
        (
            "lora",
            {"rank": 8, "quantize_data_type": "nf4"},
            "train_args.lora.quantize_data_type: quantized LoRA (nf4) is not supported",
        ),
        ("use_dolomite", True, "train_args.use_dolomite: not supported"),
        ("distributed_backend", "deepspeed", "train_args.distributed_backend: deepspeed"),
        (
            "deepspeed_options",
            {"cpu_offload_optimizer": True},
            "train_args.deepspeed_options.cpu_offload_optimizer: DeepSpeed is not supported",
        ),
        (
            "fsdp_options",
            {"cpu_offload_params": True},
            "train_args.fsdp_options.cpu_offload_params: not supported",
        ),
        ("validation_split", 0.05, "train_args.validation_frequency: must be > 0"),
        ("warmup_step", 3, "train_args.warmup_step: unknown field"),
        ("learning_rate", -1.0, "train_args.learning_rate: Input should be greater than 0"),
        ("learning_rate", float("inf"), "train_args.learning_rate: Input should be a finite"),
        ("learning_rate", "Infinity", "train_args.learning_rate: Input should be a finite"),
        ("learning_rate", float("nan"), "train_args.learning_rate: Input should be a finite"),
        (
            "random_seed",
            2**80,
            "train_args.random_seed: must be a whole number from 0 to 4294967295",
        ),
        (
            "warmup_steps",
            10**20,
            "train_args.warmup_steps: must be at most 9223372036854775807 (2**63 - 1",
        ),
        (
            "effective_batch_size",
            1e12,
            "train_args.effective_batch_size: expected a whole number, got the float 1000000000000.0",
        ),
        ("callbacks", [object()], "train_args.callbacks: 'object' object has no on_<hook> method"),
        ("data_path", "/", "training data file / is a directory, not a data file"),
    ],
)
def test_a_field_that_cannot_run_here_is_one_line_naming_it(
    tmp_path: Path, field: str, value: Any, line: str
) -> None:
    with pytest.raises(InstructLabConfigError) as err:
        to_ours({}, {**base_args(tmp_path), field: value})
    assert line in str(err.value) and "\n" not in str(err.value)


def test_tracker_fields_map_onto_report_to_and_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InstructLab's logger rules: any mlflow_* field, wandb_project, tensorboard_log_dir."""
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    ours, _ = to_ours({}, base_args(tmp_path))
    assert (ours.report_to, ours.tracker_settings) == ([], {})
    trackers = {
        "mlflow_tracking_uri": "http://127.0.0.1:5000",
        "mlflow_experiment_name": "exp",
        "mlflow_run_name": "r1",
        "wandb_entity": "team",  # alone it enables nothing, as in InstructLab
        "tensorboard_log_dir": str(tmp_path / "tb"),
    }
    ours, _ = to_ours({}, {**base_args(tmp_path), **trackers})
    assert ours.report_to == ["tensorboard", "mlflow"]
    assert ours.tracker_settings == {
        "mlflow_tracking_uri": "http://127.0.0.1:5000",
        "mlflow_experiment": "exp",
        "mlflow_run_name": "r1",
        "wandb_entity": "team",
        "tensorboard_dir": str(tmp_path / "tb"),
    }
    monkeypatch.setenv("WANDB_PROJECT", "p")  # as InstructLab: the variable enables W&B
    ours, _ = to_ours({}, {**base_args(tmp_path), "wandb_run_name": "w"})
    assert (ours.report_to, ours.tracker_settings) == (["wandb"], {"wandb_run_name": "w"})
    # a password in the URI would be journaled: refused in one line that does not repeat it
    secret = {"mlflow_tracking_uri": "http://me:hunter2@127.0.0.1:5000"}
    with pytest.raises(InstructLabConfigError) as err:
        to_ours({}, {**base_args(tmp_path), **secret})
    assert "MLFLOW_TRACKING_PASSWORD" in str(err.value) and "hunter2" not in str(err.value)
    assert "\n" not in str(err.value)


def test_every_problem_at_once_and_missing_required_fields(tmp_path: Path) -> None:
    args = {**base_args(tmp_path), "lora": {"rank": 4, "x": 1}, "trust_remote_code": True}
    with pytest.raises(InstructLabConfigError, match=r"lora: .*; train_args\.trust_remote_code"):
        to_ours({}, args)
    del args["learning_rate"]
    with pytest.raises(InstructLabConfigError, match=r"train_args\.learning_rate: required"):
        to_ours({}, args)
    with pytest.raises(InstructLabConfigError, match=r"torch_args\.procs: unknown field"):
        to_ours({"procs": 2}, base_args(tmp_path))
    with pytest.raises(InstructLabConfigError, match="'gpu' but this node has no GPU"):
        to_ours({"nproc_per_node": "gpu"}, base_args(tmp_path))  # the suite hides GPUs


def test_instructlab_trainings_own_objects_where_installed(tmp_path: Path) -> None:
    ilab = pytest.importorskip("instructlab.training")
    assert set(ilab.TrainingArgs.model_fields) == set(TRAIN_RULES)
    assert set(ilab.TorchrunArgs.model_fields) == set(TORCH_FIELDS)
    train_args = ilab.TrainingArgs(**base_args(tmp_path), use_liger=True)
    torch_args = ilab.TorchrunArgs(nproc_per_node=2, nnodes=1, node_rank=0, rdzv_id=1)
    ours, trun = to_ours(torch_args, train_args)
    assert (ours.fused_loss, ours.sharding, trun.nproc_per_node) == ("liger", "hybrid", 2)
    lora = ilab.LoraOptions(rank=8, target_modules=["q_proj"])
    ours, _ = to_ours(torch_args, train_args.model_copy(update={"lora": lora}))
    assert (ours.lora_rank, ours.lora_target_modules) == (8, ["q_proj"])


def test_docs_list_every_field_with_its_kind() -> None:
    text = DOC.read_text()
    for name, rule in TRAIN_RULES.items():
        assert re.search(rf"^\| `{name}` \| {rule.kind} \|", text, re.M), name
    for name in TORCH_FIELDS:
        assert re.search(rf"^\| `{name}` \| supported \|", text, re.M), name


def test_processed_rows_pass_the_launchers_data_check(tmp_path: Path) -> None:
    path = processed_data(tmp_path)
    assert check_file(path, 300, has_tokenizer=False) == (96, False)
    row = json.loads(path.read_text().splitlines()[0])
    path.write_text(json.dumps({**row, "messages": [], "unmask": False}) + "\n")
    assert check_file(path, 300, has_tokenizer=False) == (1, False)  # extra fields: fine
    path.write_text(json.dumps({**row, "len": 999}) + "\n")
    with pytest.raises(DataError, match=r"data.jsonl:1: 'len' is 999"):
        check_file(path, 300, has_tokenizer=False)


# -- real runs: 2 CPU ranks ------------------------------------------------------------------


def saves_and_evaluations(ckpt: Path) -> tuple[list[int], list[int]]:
    recs = records(ckpt)
    saves = [r["step"] for r in recs if r["event"] == "save"]
    evals = sorted({r["step"] for r in recs if r["event"] == "evaluate"})
    return saves, evals


@pytest.mark.extended
@pytest.mark.dist
def test_run_training_in_instructlabs_order_with_a_resume(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "model")
    data = processed_data(tmp_path / "processed")
    torch_args = {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "rdzv_id": 123}
    train_args = {
        "model_path": str(tmp_path / "model"),
        "data_path": str(tmp_path / "raw.jsonl"),  # not read: process_data is false
        "data_output_dir": str(tmp_path / "processed"),
        "process_data": False,
        "ckpt_output_dir": str(tmp_path / "run"),
        "max_seq_len": 64,
        "max_batch_len": 1024,
        "num_epochs": 2,
        "effective_batch_size": 16,
        "learning_rate": 1e-3,
        "adamw_weight_decay": 0.01,
        "adamw_betas": [0.9, 0.95],
        "adamw_eps": 1e-8,
        "warmup_steps": 2,
        "random_seed": 42,
        "save_samples": 40,
        "checkpoint_at_epoch": True,
        "keep_last_checkpoint_only": False,
        "validation_split": 0.1,
        "validation_frequency": 2,
        "distributed_backend": "fsdp",
        "use_dolomite": False,
        "lora": None,
        "log_level": "INFO",
        "data_process_num_cpu_procs": 4,
    }
    saved: list[str] = []
    first = run_training(
        torch_args,
        train_args,
        echo=False,
        max_steps=4,  # ours, on top: stop early, then resume below
        on_save=lambda event, checkpoint_path, **kw: saved.append(checkpoint_path),
    )
    assert first.status == "completed"
    result = run_training(torch_args, train_args, echo=False)
    assert result.status == "completed"

    ckpt = tmp_path / "run"
    recs = records(ckpt)
    begins = [r for r in recs if r["event"] == "train_begin"]
    assert len(begins) == 2 and begins[1]["data"]["resumed_from"]
    # 96 rows, 10 held out; 86 / 16 = 5 steps per epoch
    split_info = {"fraction": 0.1, "val_samples": 10}
    for b in begins:
        assert b["data"]["data"]["validation_split"].items() >= split_info.items()
        assert b["data"]["train_samples"] == 86 and b["data"]["world_size"] == 2
        cfg = b["data"]["config"]
        assert (cfg["adam_betas"], cfg["weight_decay"], cfg["warmup_steps"]) == (
            [0.9, 0.95],
            0.01,
            2,
        )
    digests = {b["data"]["data"]["validation_split"]["held_out_digest"] for b in begins}
    assert len(digests) == 1  # the same held-out set after the resume

    # save_samples 40 with 16 samples a step: steps 3 (48), 5 (80), 8 (128), 10 (160); the
    # epoch ends (5, 10) had just saved
    saves, evals = saves_and_evaluations(ckpt)
    assert saves == [3, 5, 8, 10]
    assert evals == [2, 4, 6, 8, 10]
    paths = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    assert saved == paths[:1]  # the override's callback ran in this process
    assert all(Path(p).is_dir() for p in paths)  # keep_last_checkpoint_only false: all kept

    # every rank evaluated exactly the held-out samples: their loss tokens, summed
    _, val = split(load_jsonl(data, 64), 0.1, 42)
    evaluate = [r for r in recs if r["event"] == "evaluate"]
    assert {r["data"]["val_num_tokens"] for r in evaluate} == {sum(s.loss_tokens for s in val)}


def doc_example() -> dict[str, Any]:
    text = DOC.read_text()
    block = text.split("<!-- example: instructlab.yaml", 1)[1].split("```yaml\n", 1)[1]
    return dict(yaml.safe_load(block.split("```", 1)[0]))


@pytest.mark.extended
@pytest.mark.dist
def test_the_docs_example_runs_with_ilab_train_instructlab_config(tmp_path: Path) -> None:
    example = doc_example()
    tiny_llama(tmp_path / example["train_args"]["model_path"])
    processed_data(tmp_path / example["train_args"]["data_output_dir"])
    (tmp_path / "ilab.yaml").write_text(yaml.safe_dump(example))
    assert load_config(tmp_path / "ilab.yaml") == (example["torch_args"], example["train_args"])
    proc = subprocess.run(
        [str(BIN / "ilab-train"), "--instructlab-config", "ilab.yaml", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=train_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert saves_and_evaluations(tmp_path / "runs" / "ilab") == ([3, 5, 8, 10], [2, 4, 6, 8, 10])


def test_ilab_train_refuses_an_unsupported_field_in_one_line(tmp_path: Path) -> None:
    example = doc_example()
    args = {**base_args(tmp_path), "lora": {"rank": 4, "quantize_data_type": "nf4"}}
    path = tmp_path / "ilab.yaml"
    path.write_text(yaml.safe_dump({**example, "train_args": args}))
    proc = subprocess.run(
        [str(BIN / "ilab-train"), "--instructlab-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=train_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "ilab-train: train_args.lora.quantize_data_type: quantized LoRA (nf4) is not supported\n"
    )
    assert not (tmp_path / "run").exists()  # refused before anything started
    # a value our settings refuse is named as InstructLab spells it, not by our flag
    path.write_text(yaml.safe_dump({"train_args": {**base_args(tmp_path), "learning_rate": 1e999}}))
    proc = subprocess.run(
        [str(BIN / "ilab-train"), "--instructlab-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=train_env(),
    )
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr == "ilab-train: train_args.learning_rate: Input should be a finite number\n"
    path.write_text(yaml.safe_dump({"train_args": base_args(tmp_path), "torchrun": {}}))
    proc = subprocess.run(
        [str(BIN / "ilab-train"), "--instructlab-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=train_env(),
    )
    assert proc.returncode == 2 and "unknown section(s) ['torchrun']" in proc.stderr
    assert "Traceback" not in proc.stderr
