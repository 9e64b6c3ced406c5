"""What a step boundary does: the one pure function that turns schedules, control commands
and signals into actions (``decide``), so the training step only carries them out.

What commands and signals do (precedence: ``abort`` > ``stop`` > interrupt; ``abort`` never
saves) is the steering policy, :mod:`trainer.steering.policy`, shared with the bridges. ``decide``
adds the schedules: a checkpoint when one is due (``save_every``, or ``save_samples``: the
first boundary at or past each multiple of that many samples; at most one per step, its
trigger ``interval`` unless a command or interrupt names it), logging and validation when
due (also on the final step, and before the save, so the checkpoint's step has its metrics
in the journal first).

Every rank calls ``decide`` with the same inputs (the command bits and the interrupt flag
come out of the step's all-reduce), so every rank takes the same actions at the same step.
"""

from __future__ import annotations

from trainer.config import TrainingArgs
from trainer.steering.policy import Actions, EndReason, SaveTrigger, steer


def decide(
    step: int,
    commands: int,
    interrupted: bool,
    args: TrainingArgs,
    samples_seen: int = 0,
    step_samples: int = 0,
) -> Actions:
    """The actions for the boundary after optimizer step ``step``.

    Args:
        step: the step just taken (1-based).
        commands: bit mask of the control commands applied at this boundary.
        interrupted: whether any rank received SIGTERM/SIGINT.
        args: the schedules (``log_every``, ``eval_every``, ``save_every``, ``save_samples``).
        samples_seen: training samples seen, this step's included.
        step_samples: the samples of this step (all ranks).
    """
    act = steer(commands, interrupted)
    save: SaveTrigger | None = act.save
    if save is None and act.end != "abort":
        due = args.save_every and step % args.save_every == 0
        if due or samples_due(args.save_samples, samples_seen, step_samples):
            save = "interval"
    return Actions(
        log=step % args.log_every == 0 or act.log,
        evaluate=bool(args.eval_every and step % args.eval_every == 0) or act.evaluate,
        save=save,
        end=act.end,
    )


def samples_due(every: int | None, samples_seen: int, step_samples: int) -> bool:
    """Whether this step crossed (or reached) a multiple of ``every`` samples: InstructLab's
    ``save_samples``, which with any batch size saves once per multiple, at the first step
    boundary at or past it."""
    if not every or step_samples <= 0:
        return False
    return samples_seen // every > (samples_seen - step_samples) // every


def export_decision(
    args: TrainingArgs, step: int, total_steps: int, why: str, ending: EndReason | None
) -> tuple[bool, str | None]:
    """Whether a save writes the consolidated model, and if not, why (journaled). On
    interrupt only the sharded state is written: a large model's export would not finish
    inside torchrun's shutdown grace period. ``export_every`` thins the exports out; the
    save that ends the run always exports."""
    if not args.save_hf:
        return False, None
    if why == "interrupt" or ending == "interrupt":
        return False, "interrupt: only the sharded state is saved (resume, or export later)"
    last = why == "final" or ending is not None or step >= total_steps
    if args.export_every is None or last or step % args.export_every == 0:
        return True, None
    return False, f"export_every={args.export_every}"
