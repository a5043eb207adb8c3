"""`meshscale export CHECKPOINT --to hf DIR`: a training checkpoint (any layout saved it) as a Hugging Face
model directory, safetensors and config.json, that transformers' from_pretrained loads."""

import json
from pathlib import Path

from meshscale.errors import UserError
from meshscale.specs.hf import to_hf_config
from meshscale.specs.model import ModelSpec


def add_arguments(p):
    p.add_argument("checkpoint", help="a checkpoint (step-NNNNNNNN directory) or a --checkpoint-dir (its newest)")
    p.add_argument("--to", required=True, choices=("hf",), help="hf: Hugging Face safetensors + config.json")
    p.add_argument("out", metavar="DIR", help="the directory to write: new, or empty")
    p.add_argument("--max-shard-gb", type=float, default=5.0,
                   help="largest safetensors file; more weights go into several with an index (default 5)")


def _checkpoint(path: str) -> Path:
    from meshscale.runtime.resilience.checkpoint import MANIFEST, complete

    if (Path(path) / MANIFEST).is_file():
        return Path(path)
    found = complete(path) if Path(path).is_dir() else []
    if not found:
        raise UserError(f"{path} is neither a checkpoint (a step directory with {MANIFEST}) nor a --checkpoint-dir "
                        "holding a complete one")
    return found[-1][1]


def _weights(path: Path, spec) -> dict:
    """The whole model's parameters from the checkpoint, read on this one process (DCP reassembles each
    from however the saving layout cut it; runtime/resilience/checkpoint.py keys them model.<name>)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from meshscale.models.transformer import full_shapes

    shapes = full_shapes(spec)
    if spec.tied_embeddings:
        del shapes["output.weight"]  # saved once, as the embedding
    state = {f"model.{name}": torch.empty(shape) for name, shape in shapes.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return {key.removeprefix("model."): t for key, t in state.items()}


def run(args) -> int:
    from meshscale.models.hf_weights import assemble, write
    from meshscale.runtime.resilience.checkpoint import read_manifest, verify

    path = _checkpoint(args.checkpoint)
    manifest = read_manifest(path)
    spec = ModelSpec(**manifest["model"])
    config = to_hf_config(spec)  # a model no model_type expresses is refused before anything is read
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty directory; export writes into a new or empty one")
    if args.max_shard_gb <= 0:
        raise UserError(f"--max-shard-gb must be positive, got {args.max_shard_gb}")
    verify(path, manifest)
    tensors = assemble(config["model_type"], spec, _weights(path, spec))
    out.mkdir(parents=True, exist_ok=True)
    files = write(tensors, out, int(args.max_shard_gb * 1e9))
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}, indent=2) + "\n")
    count = sum(t.numel() for t in tensors.values())
    print(f"wrote {out}: {spec.name} (step {manifest['step']}) as a Hugging Face {config['model_type']} model, "
          f"{count:,} parameters in {len(files)} file(s) and config.json")
    return 0
