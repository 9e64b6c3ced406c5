"""What happens to checkpoints: leases held on them, and rotation."""
