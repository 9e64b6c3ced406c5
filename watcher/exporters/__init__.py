"""Experiment trackers (TensorBoard, MLflow, W&B): the base every exporter shares and the registry by name."""
