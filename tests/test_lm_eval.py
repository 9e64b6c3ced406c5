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

from journal import JournalWriter
from tests.helpers import BIN, begin_payload, cli, pythonpath, records, train_env
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
    """The export as a JSON object (lm-eval never splits one); the user's ``--model_args``
    come after, and lm-eval merges them into it."""
    argv = lm_eval_argv("/r/step-2/hf", "t1,t2", 20, "/tasks", "--model_args dtype=float32 -b 4")
    assert argv[1:] == [
        *("-m", "lm_eval", "run", "--model", "hf"),
        *("--model_args", '{"pretrained": "/r/step-2/hf"}', "--tasks", "t1,t2"),
        *("--limit", "20", "--include_path", "/tasks", "--model_args", "dtype=float32"),
        *("-b", "4"),
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


#: What the refusal of an lm-eval option ilab-watch sets tells to use instead.
INSTEAD = {
    "--tasks": " (use --lm-eval TASKS)",
    "--limit": " (use --limit N)",
    "--include_path": " (use --include-path DIR)",
}


@pytest.mark.parametrize(
    ("spelling", "owned"),
    [
        ("-t y", "--tasks"),
        ("-ty", "--tasks"),
        ("--tasks=y", "--tasks"),
        ("--tas y", "--tasks"),
        ("-xt y", "--tasks"),  # -x (--predict_only, a flag) then -t
        ("-L 5", "--limit"),
        ("-L5", "--limit"),
        ("--limit=5", "--limit"),
        ("--lim 5", "--limit"),
        ("-o /tmp/elsewhere", "--output_path"),
        ("-o=/tmp/elsewhere", "--output_path"),
        ("--output /tmp/elsewhere", "--output_path"),
        ("-so /tmp/elsewhere", "--output_path"),  # -s (--log_samples) then -o
        ("--include_path /tmp", "--include_path"),
        ("--incl=/tmp", "--include_path"),
    ],
)
def test_every_spelling_of_an_option_ilab_watch_sets_is_refused(
    tmp_path: Path, spelling: str, owned: str
) -> None:
    """Was: only ``--tasks``, ``--limit`` and ``--output_path`` as written were refused, so
    ``-t``/``-L`` replaced ilab-watch's tasks and limit. Now every spelling lm-eval's
    argparse reads as one of them (short forms, joined short flags, ``=value``, prefixes)
    is one line at start, exit 2; the options ilab-watch leaves to lm-eval pass."""
    pytest.importorskip("lm_eval")  # the spellings are read off lm-eval's own parser
    out = cli("ilab-watch", str(tmp_path), "--lm-eval", "x", "--lm-eval-args", spelling)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    token = spelling.split()[0]
    said = token if token == owned else f"{token} (lm-eval's {owned})"
    use = INSTEAD.get(owned, "")
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"Error: --lm-eval-args: {said} is set by ilab-watch{use}", out.stderr


def test_options_ilab_watch_leaves_to_lm_eval_pass() -> None:
    from watcher.lmeval import lm_eval_hook

    for args in (
        "--model_args dtype=float32 -b 4 --log_samples",
        "-a dtype=float32 --num_fewshot 5 --gen_kwargs temperature=0",
        "--model vllm --seed 1 --system_instruction hello",
    ):
        assert lm_eval_hook("x", args=args, check=False)


#: A model's own code, run by whoever loads it with trust_remote_code: it leaves a marker.
REMOTE_CODE = """\
from pathlib import Path

Path({marker!r}).write_text("remote code ran")

from transformers import PretrainedConfig


class EvilConfig(PretrainedConfig):
    model_type = "evil"
"""


def remote_code_model(folder: Path, marker: Path) -> Path:
    """An HF model dir whose config's ``auto_map`` runs its code when loaded with
    ``trust_remote_code``: the code writes ``marker``."""
    folder.mkdir(parents=True, exist_ok=True)
    evil = "configuration_evil.EvilConfig"
    auto_map = {"AutoConfig": evil, "AutoModelForCausalLM": evil}
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    (folder / "configuration_evil.py").write_text(REMOTE_CODE.format(marker=str(marker)))
    return folder


def lm_eval_on_saves(
    tmp_path: Path, ckpt: Path, hf_paths: list[str]
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``ilab-watch --replay --lm-eval`` (a local task) on a journal of one save per
    ``hf_paths`` item (its ``hf_path``): the watcher's run and its delivery results."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", begin_payload(2 * len(hf_paths)))
        for i, hf_path in enumerate(hf_paths, 1):
            path = ckpt / f"checkpoints/step-{2 * i:06d}"
            (path / "full_state").mkdir(parents=True, exist_ok=True)
            data = {"checkpoint_path": str(path), "kind": ["full_state", "hf"], "duration": 0.1}
            w.append("save", {**data, "hf_path": hf_path}, step=2 * i)
        w.append("train_end", {"status": "completed", "reason": None, "final_checkpoint": None})
    tasks = write_task(tmp_path / "tasks")
    out = cli(
        "ilab-watch",
        str(ckpt),
        *("--replay", "--lm-eval", "ilab_sums", "--include-path", str(tasks)),
        env={**OFFLINE, "HF_HOME": str(tmp_path / "hf-home")},  # remote code is copied there
        timeout=600,
    )
    (results,) = (ckpt / "watch").glob("*.results.jsonl")
    return out, [json.loads(line) for line in results.read_text().splitlines()]


def refusal(result: dict[str, Any]) -> str:
    """The line a refused save's delivery ends with (its error's last stderr line)."""
    assert result["status"] == "failed" and result["error"] == "exit code 2", result
    return result["stderr_tail"].strip().splitlines()[-1]


def test_a_save_cannot_add_lm_eval_model_arguments_through_its_hf_path(tmp_path: Path) -> None:
    """Was: ``pretrained={hf_path}``, so a save whose hf_path ended in
    ``,trust_remote_code=True`` ran its model's own code. Now such an hf_path is refused
    before lm-eval starts (the delivery fails with that line, the watcher goes on), and the
    export is handed to lm-eval as JSON, which it does not split."""
    pytest.importorskip("lm_eval")
    ckpt = tmp_path / "run"
    marker = tmp_path / "remote-code-ran"
    hf = remote_code_model(ckpt / "checkpoints/step-000002/hf", marker)
    out, results = lm_eval_on_saves(tmp_path, ckpt, [f"{hf},trust_remote_code=True"])
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr  # a delivery failed
    assert not marker.exists()
    (result,) = results
    line = refusal(result)
    assert line == (
        f"lm-eval: refusing the save's hf_path {str(hf) + ',trust_remote_code=True'!r}: "
        "a ',' or '=' in it would be read as more lm-eval model arguments"
    )
    assert line in out.stderr  # on the watcher's console too


def test_a_save_whose_hf_path_is_outside_the_run_dir_is_refused(tmp_path: Path) -> None:
    """An hf_path that is not under the run's checkpoint dir (elsewhere, or out of it
    through ``..``): refused, one line each, lm-eval never started on it."""
    pytest.importorskip("lm_eval")
    ckpt = tmp_path / "run"
    marker = tmp_path / "remote-code-ran"
    elsewhere = remote_code_model(tmp_path / "elsewhere", marker)
    through = f"{ckpt}/checkpoints/step-000004/../../../elsewhere"
    out, results = lm_eval_on_saves(tmp_path, ckpt, [str(elsewhere), through])
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert [refusal(r) for r in results] == [
        f"lm-eval: refusing the save's hf_path {hf!r}: it is not under the run's "
        f"checkpoint dir {str(ckpt)!r}"
        for hf in (str(elsewhere), through)
    ]
    assert not marker.exists()


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
        env={
            **(os.environ | OFFLINE | {"ILAB_HF_PATH": str(broken)}),
            **{"ILAB_CKPT_DIR": str(tmp_path), "PYTHONPATH": pythonpath()},
        },
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
    callback_grace_s=1200,  # lm-eval after the last step: 120 s was not enough on 2 busy cores
)
result = run_training(args, TorchrunArgs(nproc_per_node=2), echo=False)
print(result.callbacks)
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
    reports = [r["data"] for r in recs if r["event"] == "report"]
    assert len(reports) == 1, done.stdout + done.stderr[-3000:]
    assert reports[0]["checkpoint_path"] == save and "ilab_sums/acc" in reports[0]["metrics"]
