"""Record the option names of the two frameworks that are not on PyPI, for tests/test_export.py.

    python tests/data/record_framework_keys.py megatron MEGATRON_LM_CHECKOUT   # at tag core_v0.16.1
    python tests/data/record_framework_keys.py maxtext MAXTEXT_CHECKOUT

Megatron-LM: its own parser (megatron/training/arguments.py add_megatron_arguments), imported from the
checkout beside the installed megatron-core of the same version; importing it needs `triton` and `six`
(a CPU machine can install both into a scratch --target folder on PYTHONPATH). MaxText: base.yml's keys.
Run by hand when a framework's version moves; the files carry the commit they were read from.
"""

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def megatron(checkout: Path) -> None:
    sys.path.insert(0, str(checkout))
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    rows = sorted(f"{option}\t{a.dest}\t{0 if a.nargs == 0 else (a.nargs or 1)}\t"
                  f"{','.join(map(str, a.choices)) if a.choices else ''}"
                  for a in parser._actions for option in a.option_strings)
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    header = ["Megatron-LM's command-line flags: option, dest, values it takes (0: a switch; *, +: a list), "
              "choices.", f"Generated from NVIDIA/Megatron-LM commit {commit},",
              "megatron/training/arguments.py add_megatron_arguments(), the parser pretrain_gpt.py builds, by",
              "tests/data/record_framework_keys.py. Megatron-LM is not on PyPI (megatron-core ships megatron/core "
              "only)."]
    (HERE / "megatron_lm_flags.tsv").write_text("".join(f"# {h}\n" for h in header) + "\n".join(rows) + "\n")


def maxtext(checkout: Path) -> None:
    import yaml

    path = "src/maxtext/configs/base.yml"
    base = yaml.safe_load((checkout / path).read_text())
    kinds = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): "null"}
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    header = ["MaxText's configuration keys and the type of each default.",
              f"From AI-Hypercomputer/maxtext commit {commit},", f"{path} (MaxText is not on PyPI), read with "
              "yaml.safe_load by tests/data/record_framework_keys.py."]
    rows = [f"{key}\t{kinds[type(value)]}" for key, value in base.items()]
    (HERE / "maxtext_base_keys.tsv").write_text("".join(f"# {h}\n" for h in header) + "\n".join(rows) + "\n")


if __name__ == "__main__":
    which, checkout = sys.argv[1], Path(sys.argv[2])
    {"megatron": megatron, "maxtext": maxtext}[which](checkout)
