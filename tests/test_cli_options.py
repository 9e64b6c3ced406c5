"""ilab-train's options come from the models' fields: every setting reachable, today's flags
unchanged, defaults shown from the models themselves, flags over a --config file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from pydantic import BaseModel

from tests.helpers import cli
from trainer.cli import main
from trainer.config import TorchrunArgs, TrainingArgs
from trainer.config.cli_options import CONFIG_ONLY, FIELD_OPTIONS, FLAG_OF, apply_given

#: Every ilab-train flag before the options were generated: its help spec (name, metavar,
#: choices) and the field it sets (None: the launcher's own). None of this may change.
FLAGS_BEFORE: dict[str, tuple[str, str | None]] = {
    "--config": ("--config FILE", None),
    "--quiet": ("--quiet", None),
    "--ckpt-dir": ("--ckpt-dir DIRECTORY", "ckpt_dir"),
    "--data": ("--data FILE", "data_path"),
    "--val-data": ("--val-data FILE", "val_data_path"),
    "--demo": ("--demo", "demo"),
    "--demo-samples": ("--demo-samples INTEGER", "demo_samples"),
    "--max-steps": ("--max-steps INTEGER", "max_steps"),
    "--num-epochs": ("--num-epochs INTEGER", "num_epochs"),
    "--batch-size": ("--batch-size INTEGER", "effective_batch_size"),
    "--max-batch-len": ("--max-batch-len INTEGER", "max_batch_len"),
    "--lr": ("--lr FLOAT", "lr"),
    "--warmup-steps": ("--warmup-steps INTEGER", "warmup_steps"),
    "--seed": ("--seed INTEGER", "seed"),
    "--log-every": ("--log-every INTEGER", "log_every"),
    "--eval-every": ("--eval-every INTEGER", "eval_every"),
    "--save-every": ("--save-every INTEGER", "save_every"),
    "--keep-last-n": ("--keep-last-n INTEGER", "keep_last_n"),
    "--keep-best": ("--keep-best METRIC:max|min", "keep_best"),
    "--resume": ("--resume [auto|never]", "resume"),
    "--journal-detail": ("--journal-detail [step|microbatch|off]", "journal_detail"),
    "--model-path": ("--model-path PATH", "model_path"),
    "--train-on-all-tokens": ("--train-on-all-tokens", "train_on_all_tokens"),
    "--activation-checkpointing": ("--activation-checkpointing", "activation_checkpointing"),
    "--d-model": ("--d-model INTEGER", "model.d_model"),
    "--n-layers": ("--n-layers INTEGER", "model.n_layers"),
    "--n-heads": ("--n-heads INTEGER", "model.n_heads"),
    "--max-seq-len": ("--max-seq-len INTEGER", "max_seq_len"),
    "--mixed-precision": ("--mixed-precision [auto|bf16|fp32]", "mixed_precision"),
    "--sharding": ("--sharding [full|grad_op|hybrid|replicate]", "sharding"),
    "--reduce-grads": ("--reduce-grads [every_micro_batch|last_micro_batch]", "reduce_grads"),
    "--model-init": ("--model-init [meta|full]", "model_init"),
    "--export-every": ("--export-every INTEGER RANGE", "export_every"),
    "--export-dtype": ("--export-dtype [auto|bf16|fp32]", "export_dtype"),
    "--pg-timeout": ("--pg-timeout FLOAT RANGE", "pg_timeout_s"),
    "--packing": ("--packing [auto|on|off]", "packing"),
    "--fused-loss": ("--fused-loss [auto|off|chunked|liger]", "fused_loss"),
    "--compile": ("--compile [auto|on|off]", "compile"),
    "--backend": ("--backend [auto|gloo|nccl]", "backend"),
    "--nproc-per-node": ("--nproc-per-node INTEGER", "torchrun.nproc_per_node"),
    "--nnodes": ("--nnodes INTEGER", "torchrun.nnodes"),
    "--node-rank": ("--node-rank INTEGER", "torchrun.node_rank"),
    "--rdzv-id": ("--rdzv-id TEXT", "torchrun.rdzv_id"),
    "--rdzv-endpoint": ("--rdzv-endpoint TEXT", "torchrun.rdzv_endpoint"),
    "--master-addr": ("--master-addr TEXT", "torchrun.master_addr"),
    "--master-port": ("--master-port INTEGER", "torchrun.master_port"),
}


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Field path -> field info for every field, nested models walked (callbacks included)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= _leaf_paths(sub, f"{prefix}{name}.")
        else:
            out[prefix + name] = info
    return out


FIELDS = _leaf_paths(TrainingArgs) | _leaf_paths(TorchrunArgs, "torchrun.")


def _help_records() -> dict[str, tuple[str, str]]:
    ctx = click.Context(main)
    return {
        p.opts[0]: rec
        for p in main.params
        if isinstance(p, click.Option) and (rec := p.get_help_record(ctx))
    }


def test_every_setting_is_a_flag_or_config_only_with_a_reason() -> None:
    callbacks = {p for p, info in FIELDS.items() if info.exclude}
    assert callbacks == {"callbacks"} | {p for p in FIELDS if p.startswith("on_")}
    missing = set(FIELDS) - callbacks - set(FLAG_OF) - set(CONFIG_ONLY)
    assert not missing, f"neither a flag nor in CONFIG_ONLY: {sorted(missing)}"
    assert len(CONFIG_ONLY) <= 3  # the exception, not the rule
    for path, why in CONFIG_ONLY.items():
        assert path in FIELDS and path not in FLAG_OF, path
        assert len(why.split()) >= 4, f"{path}: say why no flag sets it"
    flags = [fo.flag for fo in FIELD_OPTIONS]
    assert len(flags) == len(set(flags))  # no two fields behind one flag


def test_todays_flags_keep_name_type_choices_and_field(tmp_path: Path) -> None:
    records = _help_records()
    assert {flag: records[flag][0] for flag in FLAGS_BEFORE} == {
        flag: spec for flag, (spec, _) in FLAGS_BEFORE.items()
    }
    assert {f: p for f, (_, p) in FLAGS_BEFORE.items() if p} == {
        f: p for p, f in FLAG_OF.items() if f in FLAGS_BEFORE
    }
    # each one, given on the command line, sets its field to the value of its type
    argv: list[str] = []
    expected: dict[str, Any] = {}
    for flag, (spec, path) in FLAGS_BEFORE.items():
        if path is not None:
            text, expected[path] = _sample(spec, tmp_path)
            argv += [flag] if spec == flag else [flag, text]
    ctx = main.make_context("ilab-train", argv)
    base: dict[str, Any] = {}
    apply_given(ctx, ctx.params, base)
    for path, value in expected.items():
        assert (_get(base, path), type(_get(base, path))) == (value, type(value)), path


def _sample(spec: str, tmp_path: Path) -> tuple[str, Any]:
    """A command-line value for a help spec such as ``--lr FLOAT``, and what it parses to."""
    if " " not in spec:  # a flag
        return "", True
    metavar = spec.split(" ", 1)[1]
    if metavar.startswith("["):
        choice = metavar.strip("[]").split("|")[-1]
        return choice, choice
    return {
        "INTEGER": ("7", 7),
        "INTEGER RANGE": ("7", 7),
        "FLOAT": ("0.5", 0.5),
        "FLOAT RANGE": ("0.5", 0.5),
        "TEXT": ("host-a", "host-a"),
        "METRIC:max|min": ("accuracy:max", "accuracy:max"),
    }.get(metavar) or _path(metavar, tmp_path)


def _path(metavar: str, tmp_path: Path) -> tuple[str, Path]:
    """FILE: an existing file; DIRECTORY, PATH: an existing directory."""
    path = tmp_path / "rows.jsonl" if metavar == "FILE" else tmp_path
    path.touch()
    return str(path), path


def _get(base: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        base = base[key]
    return base


def test_help_shows_each_default_from_the_models() -> None:
    records = _help_records()
    for fo in FIELD_OPTIONS:
        info = FIELDS[fo.path]
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        text = records[fo.flag][1]
        assert info.description and text.startswith(info.description), fo.path
        if default is None or default is False or default == []:
            assert "[default:" not in text, fo.path
            continue
        if default is True:
            shown = fo.flag[2:]
        elif isinstance(default, tuple):  # click shows a pair as "a, b"
            shown = ", ".join(map(str, default))
        else:
            shown = str(default)
        assert re.search(rf"\[default: {re.escape(shown)}[];]", text), (fo.path, text)
        if not isinstance(default, bool):  # the default is click's to show, not the text's
            assert "default" not in info.description, fo.path
    proc = cli("ilab-train", "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    shown_help = " ".join(proc.stdout.split())
    for title in ("Options:", "Run and data:", "Model:", "Optimization:", "Launch (torchrun):"):
        assert title in shown_help
    assert "--lr FLOAT Peak learning rate (AdamW). [default: 0.001]" in shown_help


def test_flags_override_a_config_file_and_only_when_given(tmp_path: Path) -> None:
    config = {
        "demo": True,
        "seed": 7,
        "lr": -1,
        "model": {"d_model": 30, "n_layers": 2},
        "torchrun": {"nnodes": 2},
    }
    ctx = main.make_context(
        "ilab-train", ["--lr", "0.01", "--d-model", "32", "--nnodes", "1", "--no-save-hf"]
    )
    base = json.loads(json.dumps(config))
    apply_given(ctx, ctx.params, base)
    assert base == {
        "demo": True,
        "seed": 7,  # not given: the file's value, not the model's default
        "lr": 0.01,
        "model": {"d_model": 32, "n_layers": 2},
        "torchrun": {"nnodes": 1},
        "save_hf": False,
    }
    # and through the real command: the file alone is refused, the flags fix it; the run
    # then stops at the launcher's check of --backend nccl (no GPU here), before launching
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    run = ["ilab-train", "--config", str(path), "--ckpt-dir", str(tmp_path / "run")]
    proc = cli(*run)
    # named as the file spells it, with the flag that overrides it
    assert proc.returncode == 2 and "lr in --config (--lr): Input should be greater" in proc.stderr
    proc = cli(*run, "--lr", "inf")  # a flag's value is named by the flag, file or not
    assert proc.returncode == 2 and "; --lr: Input should be a finite number" in proc.stderr
    proc = cli(*run, "--lr", "0.01", "--d-model", "32", "--nnodes", "1", "--backend", "nccl")
    assert proc.returncode == 2 and "--backend nccl needs CUDA GPUs" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_settings_in_a_config_file_are_named_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("demo: true\ncallback_grace_s: -1\nmodel: {dropout: 2}\ntorchrun: {gpus: 2}\n")
    proc = cli("ilab-train", "--config", str(path), "--ckpt-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "callback_grace_s in --config: Input should be greater than or equal to 0" in (
        proc.stderr
    )
    assert "model.dropout in --config (--dropout): Input should be less than 1" in proc.stderr
    path.write_text("demo: true\ntorchrun: {gpus: 2}\n")
    proc = cli("ilab-train", "--config", str(path), "--ckpt-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "unknown setting 'torchrun.gpus' in --config" in proc.stderr


def test_instructlab_parity_settings_are_flags() -> None:
    """The settings InstructLab users bring (docs/instructlab.md) are flags like any other,
    a pair included, and reach TrainingArgs as the model validates them."""
    argv = ["--validation-split", "0.1", "--save-samples", "64", "--adam-betas", "0.9", "0.95"]
    ctx = main.make_context("ilab-train", [*argv, "--adam-eps", "1e-6"])
    base: dict[str, Any] = {}
    apply_given(ctx, ctx.params, base)
    assert base == {
        "validation_split": 0.1,
        "save_samples": 64,
        "adam_betas": (0.9, 0.95),
        "adam_eps": 1e-6,
    }
    args = TrainingArgs.model_validate({**base, "demo": True, "ckpt_dir": "run"})
    assert args.adam_betas == (0.9, 0.95) and args.save_samples == 64


def test_a_list_setting_is_one_comma_separated_flag() -> None:
    ctx = main.make_context("ilab-train", ["--report-to", "tensorboard, mlflow"])
    base: dict[str, Any] = {}
    apply_given(ctx, ctx.params, base)
    assert base == {"report_to": ["tensorboard", "mlflow"]}
    with pytest.raises(click.BadParameter, match="'neptune' is not one of tensorboard, mlflow"):
        main.make_context("ilab-train", ["--report-to", "mlflow,neptune"])


def test_list_setting_is_one_comma_separated_flag(tmp_path: Path) -> None:
    """--lora-target-modules takes names as one comma-separated value; a malformed list
    and LoRA without a Hugging Face model are one usage line each (exit 2)."""
    ctx = main.make_context(
        "ilab-train", ["--lora-rank", "8", "--lora-target-modules", "q_proj, v_proj"]
    )
    base: dict[str, Any] = {}
    apply_given(ctx, ctx.params, base)
    assert base == {"lora_rank": 8, "lora_target_modules": ["q_proj", "v_proj"]}
    run = str(tmp_path / "run")
    proc = cli(
        "ilab-train",
        "--demo",
        "--ckpt-dir",
        run,
        "--lora-rank",
        "8",
        "--lora-target-modules",
        "q_proj,,v",
    )
    assert proc.returncode == 2 and "is not a comma-separated list of names" in proc.stderr
    proc = cli("ilab-train", "--demo", "--ckpt-dir", run, "--lora-rank", "8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "lora_rank needs model_path" in proc.stderr
    proc = cli("ilab-train", "--demo", "--ckpt-dir", run, "--lora-target-modules", "q_proj,lm_head")
    assert proc.returncode == 2 and "lm_head cannot take an adapter here" in proc.stderr
