"""Training: the loop, checkpoints, metrics, evaluation, inference, reports."""
