"""`meshscale` command line: plan, run and verify the training of large transformer models across many devices.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
they are imported lazily so `predict` and `plan` never import torch.
"""

import argparse
import importlib
import sys

from meshscale import __version__
from meshscale.errors import UserError, fail

COMMANDS = {
    "predict": ("meshscale.commands.predict", "predict one layout's step: compute, memory, every collective"),
    "plan": ("meshscale.commands.plan", "search every hybrid layout and explain the best"),
    "scale": ("meshscale.commands.scale", "the best layout at each device count: strong or weak scaling, cost, energy"),
    "simulate": ("meshscale.commands.simulate", "simulate one step event by event: bubble, stragglers, timeline"),
    "train": ("meshscale.commands.train", "train on torch.distributed with a layout; measure beside prediction"),
    "calibrate": ("meshscale.commands.calibrate", "measure this machine and write it as a ClusterSpec file"),
    "collectives": ("meshscale.commands.collectives", "a collective's predicted time and bus bandwidth per size"),
    "export": ("meshscale.commands.export", "write a training checkpoint as a Hugging Face model directory"),
    "budget": ("meshscale.commands.budget", "cluster, devices and layout that train N tokens by a deadline, cheapest"),
    "check": ("meshscale.commands.check", "a torchtitan or Megatron-LM job's log beside the prediction for its config"),
    "data": ("meshscale.commands.data",
             "train a tokenizer, tokenize text/JSONL/Parquet into Megatron's .bin/.idx, inspect"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors follow our one-line, exit-2 rule
        fail(f"{message} (see '{self.prog} --help')")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="meshscale", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"meshscale {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen subcommand's module is imported
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    try:
        return importlib.import_module(COMMANDS[args.command][0]).run(args) or 0
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("meshscale: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
