"""The data: row checks and the byte tokenizer (no torch), chat templating, the held-out
validation split, JSONL loading, the deterministic step plan and how packed samples are kept
apart (:mod:`trainer.data.pack`), and what a rank loads (:mod:`trainer.data.load`)."""
