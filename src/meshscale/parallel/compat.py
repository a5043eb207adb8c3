"""torch.distributed names that differ across the torch releases we run on (>= 2.11), resolved once.

Bound at import, so the code that records its own collectives (ZeRO, TP, calibration) calls torch's
functions directly and `ledger.tap()`, which wraps the torch.distributed attributes for code we do not own
(FSDP2), does not count those calls a second time.
"""

import torch.distributed as dist

all_reduce = dist.all_reduce
# torch 2.13 names these *_single; older releases only have the *_tensor spellings.
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_from = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
