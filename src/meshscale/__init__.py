"""meshscale: plan, run and verify the training of large transformers across many accelerators.

Three pillars share one contract, the Layout:
  * specs/, cost/, plan/, sim/ -- pure Python; never import torch.
  * models/                    -- the transformer in plain PyTorch, unaware of parallelism.
  * parallel/, runtime/        -- torch.distributed trainer applying a Layout to an unmodified model.
  * the closed loop            -- every run prints what it measured beside the cost model's prediction.
"""

__version__ = "0.1.0"
