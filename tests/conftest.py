import os
import sys

# Spawned ranks import the test modules and the package: make both findable without installing.
_HERE = os.path.dirname(__file__)
for path in (_HERE, os.path.join(_HERE, "..", "src")):
    if path not in sys.path:
        sys.path.insert(0, os.path.abspath(path))
