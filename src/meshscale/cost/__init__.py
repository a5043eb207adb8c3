"""The analytic cost model: FLOPs, memory, communication, bubbles, critical batch sizes, step time.

Pure Python over numbers; never imports torch. Entry point: `predict(model, cluster, layout, global_batch)`.
"""

from meshscale.cost.step import Prediction, predict

__all__ = ["Prediction", "predict"]
