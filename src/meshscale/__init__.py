"""meshscale: plan, run and verify the training of large transformers across many accelerators.

Three pillars share one contract, the Layout:
  * specs/, cost/, plan/, sim/ -- pure Python; never import torch.
  * models/                    -- the transformer in plain PyTorch, unaware of parallelism.
  * parallel/, runtime/        -- torch.distributed trainer applying a Layout to an unmodified model.
  * the closed loop            -- every run prints what it measured beside the cost model's prediction.
"""

__version__ = "0.1.0"
# The version of every --json object's keys (each carries it as "schema_version"): raised when a key is
# renamed or removed, not when one is added.
SCHEMA_VERSION = 1
