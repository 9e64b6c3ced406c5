"""The trainer: ``ilab-train`` (:mod:`trainer.cli`) and ``run_training``, an FSDP2 training
loop under torchrun whose rank 0 journals the run (docs/layout.md: the tour).

Each subpackage is one process or one concern, and imports run one way
(``tests/test_structure.py`` pins which may import which): :mod:`trainer.config` (what a
run asks for, no torch) → :mod:`trainer.data`, :mod:`trainer.model`,
:mod:`trainer.checkpoint`, :mod:`trainer.steering`, :mod:`trainer.journaling` →
:mod:`trainer.rank` (inside torchrun) and :mod:`trainer.integrations` (other trainers);
:mod:`trainer.launch` (the launching process) and :mod:`trainer.instructlab` start runs."""
