"""The asynchronous save's staging into host memory, on whichever torch is installed: the
host copies are made once and refilled by every later save (torch 2.11's ``DefaultStager``
dropped them after the first save, and the second save of every run failed)."""

from __future__ import annotations

import torch

from trainer.checkpoint.async_save import HostStager


def test_every_save_refills_the_same_host_copies_with_the_current_values() -> None:
    stager = HostStager(cuda=False)
    weight = torch.arange(6, dtype=torch.float32)
    moments = {"exp_avg": torch.zeros(6), "step": torch.tensor(1.0)}
    first = stager.stage({"model": {"w": weight}, "optim": {"state": moments}})
    staged_weight = first["model"]["w"]
    assert staged_weight.data_ptr() != weight.data_ptr()  # a copy, not the live tensor
    for step in (2, 3):  # training moves on; the next saves stage its new values
        weight.add_(1.0)
        moments["exp_avg"].fill_(float(step))
        again = stager.stage({"model": {"w": weight}, "optim": {"state": moments}})
        assert torch.equal(again["model"]["w"], weight)
        assert torch.equal(again["optim"]["state"]["exp_avg"], torch.full((6,), float(step)))
        assert again["model"]["w"].data_ptr() == staged_weight.data_ptr()  # no new allocation
    stager.close()
