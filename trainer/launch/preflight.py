"""The launcher's preflight: settings that cannot work on this machine are refused with one
line naming the fix, before any worker starts.

Without it they end in torchrun's tracebacks: rank 1 of ``--nproc-per-node 2`` on one GPU
dies in ``torch.cuda.set_device(1)`` with ``invalid device ordinal``. The decision is split
in two: :func:`probe` asks this node what the workers will find, :func:`problem` decides
from that alone (a pure function, tested without GPUs). The backend is resolved as
:func:`trainer.model.device.device_and_backend` does: NCCL for ``nccl``, and for ``auto`` when a GPU
is visible. Settings that cannot work together or with the model, on any machine (a batch
smaller than the ranks, a LoRA rank above the model's hidden size), are
:func:`settings_problem`'s, asked first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.config import ConfigError, TorchrunArgs, TrainingArgs
from trainer.launch.data_check import hf_setting

#: bf16 arithmetic in hardware: Ampere (compute capability 8.0) and newer.
BF16_MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Machine:
    """What the workers of this node will find."""

    gpus: int  # CUDA devices visible to the workers
    #: the GPUs the ranks would use that have no bf16, each described ("GPU 0 (Tesla V100,
    #: compute capability 7.0)"); probed only when bf16 compute on CUDA is asked for
    without_bf16: tuple[str, ...] = ()


def resolve_backend(backend: str, gpus: int) -> str:
    """The process group backend the workers will use (as ``device_and_backend`` picks it)."""
    if backend == "nccl" or (backend == "auto" and gpus > 0):
        return "nccl"
    return "gloo"


def problem(
    backend: str, mixed_precision: str, nproc_per_node: int, machine: Machine
) -> str | None:
    """Why these settings cannot run on ``machine``, as one line naming the fix; None if
    they can."""
    gpus = machine.gpus
    if backend == "nccl" and gpus == 0:
        return (
            "--backend nccl needs CUDA GPUs and none is visible on this machine "
            "(use --backend gloo, or auto to pick NCCL only when GPUs are there)"
        )
    if resolve_backend(backend, gpus) != "nccl":
        return None  # gloo: any number of CPU ranks, bf16 computed on the CPU
    if nproc_per_node > gpus:
        which = "--backend nccl" if backend == "nccl" else "--backend auto picks NCCL here and"
        visible = f"{gpus} GPU is" if gpus == 1 else f"{gpus} GPUs are"
        return (
            f"{which} needs one GPU per rank: --nproc-per-node {nproc_per_node} but only "
            f"{visible} visible (use --nproc-per-node {gpus}, or --backend gloo to run "
            f"{nproc_per_node} ranks on the CPU)"
        )
    if mixed_precision == "bf16" and machine.without_bf16:
        major, minor = BF16_MIN_CAPABILITY
        lack = "lacks" if len(machine.without_bf16) == 1 else "lack"
        return (
            f"--mixed-precision bf16 needs GPUs with bf16 support (compute capability "
            f"{major}.{minor} or newer), which {', '.join(machine.without_bf16)} {lack} "
            "(use --mixed-precision fp32, or --backend gloo to compute in bf16 on the CPU)"
        )
    return None


def settings_problem(args: TrainingArgs, torchrun: TorchrunArgs) -> str | None:
    """Why these settings cannot work with each other or with the model, whatever the
    machine, as one line; None if they can. The model is read from its config.json."""
    world = torchrun.nproc_per_node * torchrun.nnodes
    if args.effective_batch_size < world:
        return (
            f"effective_batch_size (--batch-size) {args.effective_batch_size} is smaller than "
            f"the {world} ranks (--nproc-per-node {torchrun.nproc_per_node} x --nnodes "
            f"{torchrun.nnodes}): every rank needs at least one sample a step"
        )
    hidden = hf_setting(args, "hidden_size", "n_embd", "d_model")
    if args.lora_rank is not None and hidden is not None and args.lora_rank > hidden[1]:
        # every projection a decoder's LoRA adapts has the hidden size on one side
        key, width = hidden
        where = Path(args.model_path or "") / "config.json"
        return (
            f"lora_rank (--lora-rank) {args.lora_rank} is larger than the model's hidden size "
            f"{width} ({key} in {where}): an adapter wider than the layers it adapts adds "
            f"parameters, not capacity (give --lora-rank {width} or less)"
        )
    return None


def needs_probe(backend: str, mixed_precision: str, nproc_per_node: int) -> bool:
    """Whether :func:`problem`'s answer can depend on the machine. When it cannot (gloo; one
    rank with ``auto``, which runs on a GPU or on the CPU alike) the node is not asked, and
    the launcher imports neither torch nor CUDA for it."""
    if backend == "gloo":
        return False
    return not (backend == "auto" and nproc_per_node == 1 and mixed_precision != "bf16")


def visible_gpus(env: Mapping[str, str]) -> int:
    """How many GPUs workers started with ``env`` will see.

    ``CUDA_VISIBLE_DEVICES`` is read from ``env`` rather than left to torch: torch counts
    devices once per process and caches the answer, so a value set after that, or one given
    only to the workers (``run_training(env=...)``), would be missed. CUDA stops at the
    first entry that is empty or negative (``-1`` hides all).
    """
    listed = env.get("CUDA_VISIBLE_DEVICES")
    entries: list[str] = []
    for entry in (listed or "").split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    if listed is not None and not entries:
        return 0  # hidden: no need to ask CUDA at all
    import torch

    count = int(torch.cuda.device_count())
    return count if listed is None else min(count, len(entries))


def probe(args: TrainingArgs, torchrun: TorchrunArgs, env: Mapping[str, str]) -> Machine:
    """What :func:`problem` needs to know of this node. Device properties (which initialise
    CUDA in this process) are read only when bf16 compute on CUDA is asked for."""
    gpus = visible_gpus(env)
    if args.mixed_precision != "bf16" or gpus == 0 or torchrun.nproc_per_node > gpus:
        return Machine(gpus=gpus)
    import torch

    lacking = []
    if not torch.version.hip:  # on ROCm, torch takes every GPU it supports as bf16-capable
        for i in range(torchrun.nproc_per_node):
            cap = torch.cuda.get_device_capability(i)
            if cap < BF16_MIN_CAPABILITY:
                name = torch.cuda.get_device_name(i)
                lacking.append(f"GPU {i} ({name}, compute capability {cap[0]}.{cap[1]})")
    return Machine(gpus=gpus, without_bf16=tuple(lacking))


def preflight(
    args: TrainingArgs, torchrun: TorchrunArgs, env: Mapping[str, str] | None = None
) -> None:
    """Raise :class:`~trainer.config.ConfigError` (one line) when the settings cannot work on
    this node. ``env`` is what the launcher adds to the workers' environment.

    Called by the launcher on each node, before anything is written: ``ilab-train`` turns the
    error into exit code 2."""
    reason = settings_problem(args, torchrun)
    if reason is not None:
        raise ConfigError(reason)
    if not needs_probe(args.backend, args.mixed_precision, torchrun.nproc_per_node):
        return
    machine = probe(args, torchrun, {**os.environ, **(env or {})})  # the workers' environment
    reason = problem(args.backend, args.mixed_precision, torchrun.nproc_per_node, machine)
    if reason is not None:
        raise ConfigError(reason)
