"""``ilab-watch --lm-eval``: lm-evaluation-harness on every save's HF export, its metrics
reported as TASK/METRIC. The fast tests read a results file a real lm-eval 0.4.13 run
wrote (tests/data/lm_eval_results.json: SmolLM2 on the task below, --limit 20) and check
the options; the extended ones fine-tune the packaged SmolLM2 on 2 ranks beside
``ilab-watch --lm-eval`` on a local task the test writes (nothing downloaded), locally,
as Ray jobs and as Slurm jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BIN, cli, pythonpath, records, train_env
from watcher.lmeval.job import lm_eval_argv
from watcher.lmeval.metrics import metrics_from_results

DATA = Path(__file__).parent / "data"

TASK_YAML = """\
task: ilab_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(folder: Path) -> Path:
    """A small multiple-choice task (sums), as a JSONL file and a task YAML in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(30):
        a, b = i % 7 + 1, (i * 3) % 5 + 1
        s = a + b
        rows.append(
            {
                "question": f"What is {a} plus {b}?",
                "choices": [str(s), str(s + 1), str(s + 2), str(s + 3)],
                "answer": 0,
            }
        )
    data = folder / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "ilab_sums.yaml").write_text(TASK_YAML.format(data=data))
    return folder


def test_lm_eval_results_become_task_metric_reports() -> None:
    """Every numeric metric of a real results file, named TASK/METRIC (the ``none`` filter
    left out), standard errors as METRIC_stderr; alias and sample counts are not metrics."""
    results = json.loads((DATA / "lm_eval_results.json").read_text())
    assert metrics_from_results(results) == {
        "ilab_tiny/acc": 0.45,
        "ilab_tiny/acc_stderr": pytest.approx(0.11413288653790232),
        "ilab_tiny/acc_norm": 0.3,
        "ilab_tiny/acc_norm_stderr": pytest.approx(0.10513149660756933),
    }
    # another filter is kept after a dot; "N/A" standard errors and odd characters
    other = {"gsm8k": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": "N/A"}}
    assert metrics_from_results({"results": {**other, "a b|c": {"f1,none": 1}}}) == {
        "gsm8k/exact_match.strict-match": 0.25,
        "a_b_c/f1": 1.0,
    }


def test_lm_eval_command_line_adds_the_export_to_model_args() -> None:
    argv = lm_eval_argv("/r/step-2/hf", "t1,t2", 20, "/tasks", "--model_args dtype=float32 -b 4")
    assert argv[1:] == [
        *("-m", "lm_eval", "run", "--model", "hf"),
        *("--model_args", "pretrained=/r/step-2/hf,dtype=float32", "--tasks", "t1,t2"),
        *("--limit", "20", "--include_path", "/tasks", "-b", "4"),
    ]
    assert lm_eval_argv("/m", "t", None, None, "--model vllm").count("--model") == 1


def test_lm_eval_hook_is_a_save_command_for_run_training(tmp_path: Path) -> None:
    """``on_save=lm_eval_hook(...)``: the command ``--lm-eval`` runs, one argument per item
    (no placeholder taken from the lm-eval options' braces); a mistake is one ValueError."""
    from watcher.hooks.callbacks import CommandTarget
    from watcher.lmeval import lm_eval_hook

    tasks = write_task(tmp_path / "tasks")
    cmd = lm_eval_hook(
        ["ilab_sums"], limit=20, include_path=tasks, args="--gen_kwargs {}", check=False
    )
    argv = CommandTarget.parse(cmd, "save").render({})
    assert argv[1:] == [
        *("-m", "watcher.lmeval.job", "--tasks", "ilab_sums", "--limit", "20"),
        *("--include-path", str(tasks.resolve()), "--args", "--gen_kwargs {}"),
    ]
    with pytest.raises(ValueError, match=r"include_path .* is not a directory"):
        lm_eval_hook("x", include_path=tmp_path / "nope", check=False)
    with pytest.raises(ValueError, match="--tasks is set by ilab-watch"):
        lm_eval_hook("x", args="--tasks y", check=False)


def test_lm_eval_option_mistakes_are_one_line_exit_2(tmp_path: Path) -> None:
    """Options that need --lm-eval, and lm-eval options ilab-watch sets itself; a save
    without an HF export is one line from the job (exit 2)."""
    for extra, says in [
        (("--limit", "20"), "--limit need(s) --lm-eval TASKS"),
        (("--lm-eval", "x", "--lm-eval-args", "--tasks y"), "--tasks is set by ilab-watch"),
        (("--lm-eval", " , "), "give at least one task"),
    ]:
        out = cli("ilab-watch", str(tmp_path), *extra)
        assert out.returncode == 2, out.stderr
        assert says in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr
    env = {k: v for k, v in os.environ.items() if k != "ILAB_HF_PATH"}
    job = subprocess.run(
        [sys.executable, "-m", "watcher.lmeval.job", "--tasks", "x"],
        env={**env, "ILAB_STEP": "40", "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == 2
    assert job.stderr.strip() == (
        "lm-eval: the save at step 40 has no Hugging Face export (hf_path is null: train "
        "with --save-hf, and an --export-every that includes this save)"
    )


# -- end to end (extended): SmolLM2 on 2 ranks, lm-eval on every save ------------------------

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged SmolLM2-135M-Instruct as an HF model dir (converted once per module)."""
    pytest.importorskip("gguf")
    pytest.importorskip("lm_eval")
    from trainer.model.convert import convert_gguf, packaged_smollm2

    try:
        gguf = packaged_smollm2()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return convert_gguf(gguf, tmp_path_factory.mktemp("smollm2"))


def chat_rows(path: Path, n: int = 32) -> Path:
    rows = []
    for i in range(n):
        a, b = i % 7 + 1, (i * 3) % 5 + 1
        msgs = [{"role": "user", "content": f"What is {a} plus {b}?"}]
        rows.append({"messages": [*msgs, {"role": "assistant", "content": str(a + b)}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def scored_run(tmp_path: Path, smollm2: Path, *watch: str, env: dict[str, str]) -> Path:
    """2-rank SmolLM2 fine-tune (saves at steps 2 and 4, --keep-last-n 1 --keep-best
    ilab_sums/acc:max) beside ``ilab-watch --lm-eval ilab_sums --limit 20`` (+ ``watch``);
    asserts every checkpoint scored once, the scores journaled and the best one kept."""
    tasks = write_task(tmp_path / "tasks")
    ckpt = tmp_path / "run"
    watch_env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1", **env}
    watcher = subprocess.Popen(
        [
            *(str(BIN / "ilab-watch"), str(ckpt), "--lm-eval", "ilab_sums", "--limit", "20"),
            *("--include-path", str(tasks), "--name", "lm", *watch),
        ],
        env=watch_env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        train = subprocess.run(
            [
                *(str(BIN / "ilab-train"), "--model-path", str(smollm2)),
                *("--data", str(chat_rows(tmp_path / "chat.jsonl")), "--ckpt-dir", str(ckpt)),
                *("--nproc-per-node", "2", "--batch-size", "8", "--max-steps", "4", "--lr", "1e-5"),
                *("--save-every", "2", "--keep-last-n", "1", "--keep-best", "ilab_sums/acc:max"),
                "--quiet",
            ],
            env={**train_env(), **env},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert train.returncode == 0, train.stderr[-3000:]
        _, err = watcher.communicate(timeout=1200)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err[-3000:]
    recs = records(ckpt)
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    reports = [r["data"] for r in recs if r["event"] == "report"]
    assert sorted(r["checkpoint_path"] for r in reports) == sorted(saves)  # each scored once
    acc = {r["checkpoint_path"]: r["metrics"]["ilab_sums/acc"] for r in reports}
    assert all(
        {"ilab_sums/acc", "ilab_sums/acc_norm", "ilab_sums/acc_stderr"} <= set(r["metrics"])
        for r in reports
    )
    kept = {str(p) for p in (ckpt / "checkpoints").iterdir()}
    assert saves[-1] in kept  # the newest (--keep-last-n 1)
    assert any(acc[p] == max(acc.values()) for p in kept)  # and the best by its score
    return ckpt


@pytest.mark.extended
@pytest.mark.dist
@pytest.mark.timeout(1800)  # a SmolLM2 fine-tune and an lm-eval per save on 2 cores
def test_lm_eval_scores_every_checkpoint_and_keeps_the_best(tmp_path: Path, smollm2: Path) -> None:
    scored_run(tmp_path, smollm2, env={})


@pytest.mark.extended
@pytest.mark.dist
@pytest.mark.timeout(1800)  # a SmolLM2 fine-tune and an lm-eval per save on 2 cores
def test_lm_eval_as_ray_jobs(tmp_path: Path, smollm2: Path, ray_head: Any) -> None:
    """The same with --via ray: each evaluation a Ray job whose id is journaled."""
    env = {"RAY_ADDRESS": ray_head.address}
    ckpt = scored_run(tmp_path, smollm2, "--via", "ray", "--job-poll", "0.5", env=env)
    jobs = [r["data"] for r in records(ckpt) if r["event"] == "job"]
    done = [j for j in jobs if j["state"] == "COMPLETED"]
    assert len(done) == 2 and all(j["scheduler"] == "ray" and j["exit_code"] == 0 for j in done)


@pytest.mark.extended
@pytest.mark.dist
@pytest.mark.timeout(1800)  # a SmolLM2 fine-tune and an lm-eval per save on 2 cores
def test_lm_eval_as_slurm_jobs(tmp_path: Path, smollm2: Path, slurm: Any) -> None:
    """The same with --via slurm on the local Slurm."""
    env = {"SLURM_CONF": str(slurm.conf)}
    ckpt = scored_run(tmp_path, smollm2, "--via", "slurm", "--job-poll", "0.5", env=env)
    jobs = [r["data"] for r in records(ckpt) if r["event"] == "job"]
    done = [j for j in jobs if j["state"] == "COMPLETED"]
    assert len(done) == 2 and all(j["scheduler"] == "slurm" for j in done)


@pytest.mark.extended
@pytest.mark.timeout(900)  # lm-eval indexes its ~15,000 task files
def test_unknown_task_is_one_line_before_the_first_save(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    tasks = write_task(tmp_path / "tasks")
    out = cli(
        "ilab-watch",
        str(tmp_path / "run"),
        *("--lm-eval", "ilab_sums,no_such_task", "--include-path", str(tasks)),
        timeout=600,
    )
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "unknown task(s) no_such_task" in last and "Traceback" not in out.stderr


@pytest.mark.extended
@pytest.mark.timeout(600)
def test_a_checkpoint_lm_eval_cannot_load_is_one_line(tmp_path: Path) -> None:
    """The job on an export lm-eval cannot load: exit 1, its last line says why."""
    pytest.importorskip("lm_eval")
    tasks = write_task(tmp_path / "tasks")
    broken = tmp_path / "hf"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "watcher.lmeval.job",
            "--tasks",
            "ilab_sums",
            "--limit",
            "2",
            "--include-path",
            str(tasks),
        ],
        env={**os.environ, **OFFLINE, "ILAB_HF_PATH": str(broken), "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert job.returncode == 1
    last = job.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lm-eval failed on {broken}: ValueError: Unrecognized model"), last


RUN_TRAINING = """
import sys
from trainer.config import TrainingArgs, TorchrunArgs
from trainer.launch import run_training
from watcher.lmeval import lm_eval_hook

model, data, ckpt, tasks = sys.argv[1:5]
args = TrainingArgs(
    model_path=model, data_path=data, ckpt_dir=ckpt, effective_batch_size=8, max_steps=2,
    save_every=2, lr=1e-5, keep_best="ilab_sums/acc:max",
    on_save=lm_eval_hook("ilab_sums", limit=20, include_path=tasks),
)
result = run_training(args, TorchrunArgs(nproc_per_node=2), echo=False)
print(result.status)
"""


@pytest.mark.extended
@pytest.mark.dist
@pytest.mark.timeout(1800)
def test_run_training_scores_its_saves_with_lm_eval_hook(tmp_path: Path, smollm2: Path) -> None:
    """run_training(on_save=lm_eval_hook(...)): the embedded watcher scores the save."""
    tasks = write_task(tmp_path / "tasks")
    ckpt = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_TRAINING,
            str(smollm2),
            str(chat_rows(tmp_path / "c.jsonl")),
            str(ckpt),
            str(tasks),
        ],
        env={**train_env(), **OFFLINE},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("completed"), done.stderr[-3000:]
    recs = records(ckpt)
    (save,) = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    (report,) = [r["data"] for r in recs if r["event"] == "report"]
    assert report["checkpoint_path"] == save and "ilab_sums/acc" in report["metrics"]
