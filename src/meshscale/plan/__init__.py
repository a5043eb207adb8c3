"""The planner: search every hybrid layout for a model, cluster and batch, rank them, explain the winner."""

from meshscale.plan.search import Plan, runnable, search

__all__ = ["Plan", "runnable", "search"]
