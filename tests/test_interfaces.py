"""The stable surface: `meshscale --version` and a schema_version in every --json object."""

import json

import pytest

import meshscale
from meshscale.cli import main

STEP = ["--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "16", "--global-batch", "32"]


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"meshscale {meshscale.__version__}"


@pytest.mark.parametrize("argv", [
    ["predict", *STEP, "--layout", "tp=8,dp=2,zero=1"],
    ["plan", *STEP, "--top", "2"],
    ["simulate", *STEP, "--layout", "tp=4,pp=2,dp=2,zero=1"],
    ["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "16,32", "--global-batch-tokens",
     "131072"],
    ["collectives", "--cluster", "h100-80gb", "--devices", "8", "--sizes", "1M"],
], ids=lambda a: a[0])
def test_every_json_object_carries_the_schema_version(argv, capsys):
    main(argv + ["--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["schema_version"] == meshscale.SCHEMA_VERSION == 1
    assert len(out) > 1  # and what it versions
