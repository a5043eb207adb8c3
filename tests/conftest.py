import os
import sys

import pytest

# One intra-op thread in every process the suite starts (torch reads it when it loads; `train` honours it):
# two pytest workers and their spawned ranks share 2 cores, where a 2-thread OpenMP region waits for a
# descheduled thread on every small kernel (a 256x32 @ 32x258 matmul: ~13 ms instead of ~0.2 ms).
os.environ["OMP_NUM_THREADS"] = "1"

# Spawned ranks import the test modules and the package: make both findable without installing.
_HERE = os.path.dirname(__file__)
for path in (_HERE, os.path.join(_HERE, "..", "src")):
    if path not in sys.path:
        sys.path.insert(0, os.path.abspath(path))

# The modules whose fixtures spawn the most ranks, longest first. `make test` runs `-n 2 --dist loadscope`:
# each module stays on one worker (a module-scoped fixture that spawns ranks runs once, not once per worker
# its tests land on), and starting the longest modules first lets the two workers finish together.
LONGEST_FIRST = ("test_train_matrix.py", "test_checkpoint.py", "test_guards.py", "test_train_cli.py")


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture, which keeps a module together
def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))


def pytest_sessionfinish(session, exitstatus):
    from multirank import close_all

    close_all()
