"""Plain, validated descriptions of what we train (ModelSpec), where (ClusterSpec) and how (Layout)."""

from meshscale.specs.layout import Layout
from meshscale.specs.model import ModelSpec

__all__ = ["Layout", "ModelSpec"]
