"""How to launch the workers: torchrun's nodes, processes and rendezvous (``ilab-train``'s
"Launch (torchrun)" options; the ``torchrun`` mapping of a ``--config`` file)."""

from __future__ import annotations

from pydantic import Field, model_validator

from trainer.config.fields import Settings


class TorchrunArgs(Settings):
    """How to launch the workers (maps onto torchrun's flags)."""

    nproc_per_node: int = Field(1, ge=1, description="Worker processes on this node (one per GPU).")
    nnodes: int = Field(1, ge=1, description="Number of nodes.")
    node_rank: int = Field(0, ge=0, description="This node's rank.")
    rdzv_id: str | None = Field(None, description="Rendezvous id (multi-node).")
    rdzv_endpoint: str | None = Field(
        None, description="host:port of the c10d rendezvous (multi-node)."
    )
    master_addr: str | None = Field(
        None, description="Static rendezvous address (instead of --rdzv-endpoint)."
    )
    master_port: int | None = Field(None, ge=1, le=65535, description="Static rendezvous port.")

    @model_validator(mode="after")
    def _check(self) -> TorchrunArgs:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank ({self.node_rank}) must be < nnodes ({self.nnodes})")
        if self.rdzv_endpoint and self.master_addr:
            raise ValueError("give either rdzv_endpoint or master_addr/master_port, not both")
        if self.nnodes > 1 and not (self.rdzv_endpoint or self.master_addr):
            raise ValueError("nnodes > 1 needs rdzv_endpoint (or master_addr and master_port)")
        if self.master_addr and not self.master_port:
            raise ValueError("master_addr needs master_port")
        return self
