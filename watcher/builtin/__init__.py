"""Callbacks that ship with the watcher: early stopping and divergence, InstructLab's and training_hub's callbacks run unchanged."""
