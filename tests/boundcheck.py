"""What every search's bound must hold against predict, checked over a search run with prune=False."""

import importlib

import pytest

from meshscale.cost import bound, predict
from meshscale.errors import UserError

search_mod = importlib.import_module("meshscale.plan.search")  # the module (the package exports the function)


def bounds_and_memory_hold(model, cluster, pool, batch: int, precision: str) -> list:
    """Assert every costed layout's bound is at most its predicted step and the bound's memory is predict's for
    every scored row; return the (bound, prediction) pairs."""
    costed = [(b, pool.costed.get(pool.layout(i))) for i, b in enumerate(pool.bounds)]
    costed = [(b, pred) for b, pred in costed if pred is not None]
    assert costed and all(b <= pred.step_time_s * (1 + 1e-9) for b, pred in costed)
    for shape, rows in pool.scored:
        memory = bound.memory_bytes(model, cluster, shape, rows, precision)
        for i in range(len(rows)):
            layout = search_mod._layout(shape, rows, i)
            try:
                want = predict(model, cluster, layout, batch, precision).memory_per_device_bytes["total"]
            except UserError:  # a row the search's later rules drop (a schedule's micro-batch minimum)
                continue
            assert memory[i] == pytest.approx(want, rel=1e-9), layout
    return costed
