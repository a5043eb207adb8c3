"""The model itself, plain PyTorch and unaware of parallelism: `parallel/` wraps it after construction."""
