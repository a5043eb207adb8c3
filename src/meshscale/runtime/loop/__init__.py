"""The training loop: a resolved configuration, token batches, the optimizer, the step, and the launcher."""
