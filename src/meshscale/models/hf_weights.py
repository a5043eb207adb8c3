"""Hugging Face safetensors <-> meshscale parameters, per model_type.

Every meshscale parameter is a view of one Hugging Face tensor (`Part`): the same tensor under another name,
a block of rows of a fused one (Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's query_key_value, whose rows
go head by head, q k v), or, for GPT-2's Conv1D layers, a block of columns of a transposed one. Loading
reads only the region of each tensor a rank holds (safetensors slices lazily); export assembles each Hugging
Face tensor from its parts.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from meshscale.errors import UserError
from meshscale.specs.model import ModelSpec


@dataclass(frozen=True)
class Part:
    """Row i of the meshscale parameter is row index[i] of Hugging Face tensor `key` (column index[i], with
    the remaining dimension transposed, when `transposed`), a tensor of `rows` such rows (None: at least as
    many as the index reaches; a position table may be longer than the run's sequence), plus `offset`
    (Nemotron's LayerNorm1P stores a gain g as g - 1)."""
    key: str
    index: range | tuple
    rows: int | None
    transposed: bool = False
    offset: float = 0.0


# ---- names --------------------------------------------------------------------------------------------
# meshscale name (regex) -> Hugging Face name, for the Llama-shaped model types; \1 is the layer.
_LLAMA = [
    (r"tok_embeddings\.weight", "model.embed_tokens.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"layers\.(\d+)\.attention_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"layers\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"layers\.(\d+)\.attention\.w([qkvo])\.(weight|bias)", r"model.layers.\1.self_attn.\2_proj.\3"),
    (r"layers\.(\d+)\.attention\.([qk])_norm\.weight", r"model.layers.\1.self_attn.\2_norm.weight"),
    (r"layers\.(\d+)\.feed_forward\.w1\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w3\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w2\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    # Qwen2-MoE / Qwen3-MoE
    (r"layers\.(\d+)\.feed_forward\.router\.weight", r"model.layers.\1.mlp.gate.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w1\.weight", r"model.layers.\1.mlp.experts.\2.gate_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w3\.weight", r"model.layers.\1.mlp.experts.\2.up_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.w2\.weight", r"model.layers.\1.mlp.experts.\2.down_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.shared\.w1\.weight", r"model.layers.\1.mlp.shared_expert.gate_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.shared\.w3\.weight", r"model.layers.\1.mlp.shared_expert.up_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.shared\.w2\.weight", r"model.layers.\1.mlp.shared_expert.down_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.shared_gate\.weight", r"model.layers.\1.mlp.shared_expert_gate.weight"),
]
_MIXTRAL = [
    (r"layers\.(\d+)\.feed_forward\.router\.weight", r"model.layers.\1.block_sparse_moe.gate.weight"),
    (r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.(w[123])\.weight",
     r"model.layers.\1.block_sparse_moe.experts.\2.\3.weight"),
] + _LLAMA


def _per_layer(prefix: str, parts: dict[str, str]) -> list:
    """meshscale's `layers.N.<ours>.weight|bias` is Hugging Face's `<prefix>.N.<theirs>.weight|bias`."""
    return [(rf"layers\.(\d+)\.{ours}\.(weight|bias)", rf"{prefix}.\1.{theirs}.\2") for ours, theirs in parts.items()]


_GPT2 = [
    (r"tok_embeddings\.weight", "transformer.wte.weight"),
    (r"pos_embeddings\.weight", "transformer.wpe.weight"),
    (r"norm\.(weight|bias)", r"transformer.ln_f.\1"),
] + _per_layer("transformer.h", {r"attention_norm": "ln_1", r"ffn_norm": "ln_2", r"attention\.w[qkv]": "attn.c_attn",
                                 r"attention\.wo": "attn.c_proj", r"feed_forward\.w1": "mlp.c_fc",
                                 r"feed_forward\.w2": "mlp.c_proj"})
_NEOX = [
    (r"tok_embeddings\.weight", "gpt_neox.embed_in.weight"),
    (r"output\.weight", "embed_out.weight"),
    (r"norm\.(weight|bias)", r"gpt_neox.final_layer_norm.\1"),
] + _per_layer("gpt_neox.layers", {r"attention_norm": "input_layernorm", r"ffn_norm": "post_attention_layernorm",
                                   r"attention\.w[qkv]": "attention.query_key_value",
                                   r"attention\.wo": "attention.dense", r"feed_forward\.w1": "mlp.dense_h_to_4h",
                                   r"feed_forward\.w2": "mlp.dense_4h_to_h"})
_NEMOTRON = [
    (r"tok_embeddings\.weight", "model.embed_tokens.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"norm\.(weight|bias)", r"model.norm.\1"),
    (r"layers\.(\d+)\.attention\.w([qkvo])\.weight", r"model.layers.\1.self_attn.\2_proj.weight"),
] + _per_layer("model.layers", {r"attention_norm": "input_layernorm", r"ffn_norm": "post_attention_layernorm",
                                r"feed_forward\.w1": "mlp.up_proj", r"feed_forward\.w2": "mlp.down_proj"})
_PHI3 = [
    (r"layers\.(\d+)\.attention\.w[qkv]\.weight", r"model.layers.\1.self_attn.qkv_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w[13]\.weight", r"model.layers.\1.mlp.gate_up_proj.weight"),
] + _LLAMA
NAMES = {"llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA, "qwen2_moe": _LLAMA,
         "qwen3_moe": _LLAMA, "mixtral": _MIXTRAL, "phi3": _PHI3, "gpt2": _GPT2, "gpt_neox": _NEOX,
         "nemotron": _NEMOTRON}


def _hf_name(model_type: str, name: str) -> str:
    for pattern, template in NAMES[model_type]:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, template, name)
    raise UserError(f"a {model_type} checkpoint has no counterpart of meshscale's {name}")


def _rows(model_type: str, spec: ModelSpec, name: str, n: int) -> tuple[range | tuple, int | None]:
    """Where a parameter's n rows sit in its Hugging Face tensor, and how many rows that tensor has."""
    q, kv, d = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.head_dim
    which = re.search(r"\.w([qkv13])\.(weight|bias)$", name)
    w = which.group(1) if which else None
    if model_type in ("phi3", "gpt2") and w and w in "qkv":  # [q | k | v] blocks
        start = {"q": 0, "k": q, "v": q + kv}[w]
        return range(start, start + n), q + 2 * kv
    if model_type == "phi3" and w in ("1", "3"):  # [gate | up]
        start = 0 if w == "1" else spec.ffn
        return range(start, start + n), 2 * spec.ffn
    if model_type == "gpt_neox" and w and w in "qkv":  # head by head: [q_h | k_h | v_h]
        shift = "qkv".index(w) * d
        return tuple(h * 3 * d + shift + j for h in range(spec.heads) for j in range(d)), 3 * q
    return range(n), None if name == "pos_embeddings.weight" else n


def parts(model_type: str, spec: ModelSpec, shapes: dict) -> dict:
    """{meshscale name: Part} for every parameter of the whole model (`shapes`: name -> full shape)."""
    out = {}
    for name, shape in shapes.items():
        if name == "output.weight" and spec.tied_embeddings:
            name_hf = _hf_name(model_type, "tok_embeddings.weight")
        else:
            name_hf = _hf_name(model_type, name)
        transposed = model_type == "gpt2" and re.search(r"\.w[qkvo12]\.weight$", name) is not None  # Conv1D
        offset = 1.0 if model_type == "nemotron" and re.search(r"norm\.weight$", name) else 0.0
        out[name] = Part(name_hf, *_rows(model_type, spec, name, shape[0]), transposed, offset)
    return out


# ---- reading ------------------------------------------------------------------------------------------
class Safetensors:
    """A save_pretrained directory's tensors, one file or several with model.safetensors.index.json; each
    tensor read lazily, a region at a time."""

    def __init__(self, root: str | Path):
        from safetensors import safe_open

        self.root = Path(root)
        index = self.root / "model.safetensors.index.json"
        if index.is_file():
            self.files = {k: self.root / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        elif (self.root / "model.safetensors").is_file():
            with safe_open(self.root / "model.safetensors", "pt") as f:
                self.files = {k: self.root / "model.safetensors" for k in f.keys()}
        else:
            raise UserError(f"--init-from {root}: no model.safetensors or model.safetensors.index.json; pass a "
                            "directory written by transformers' save_pretrained")
        self._open = {}

    def slice(self, key: str):
        from safetensors import safe_open

        if key not in self.files:
            raise UserError(f"--init-from {self.root}: the checkpoint lacks tensor {key}")
        path = self.files[key]
        if path not in self._open:
            if not path.is_file():
                raise UserError(f"--init-from {self.root}: {path.name}, named in the index, is missing")
            self._open[path] = safe_open(path, "pt")
        return self._open[path].get_slice(key)

    def read(self, part: Part, full_shape: tuple, region: tuple) -> torch.Tensor:
        """The `region` (a slice per dimension, in meshscale's coordinates) of the parameter `part` describes,
        whose whole shape is `full_shape`."""
        sl = self.slice(part.key)
        on_disk, rows_dim = tuple(sl.get_shape()), 1 if part.transposed else 0
        rest = full_shape[1:][::-1] if part.transposed else full_shape[1:]
        if len(on_disk) != len(full_shape) or max(part.index) >= on_disk[rows_dim] or \
                part.rows not in (None, on_disk[rows_dim]) or \
                tuple(d for i, d in enumerate(on_disk) if i != rows_dim) != tuple(rest):
            raise UserError(f"--init-from {self.root}: tensor {part.key} has shape {list(on_disk)}, which the "
                            f"config's sizes do not give (meshscale expects {list(full_shape)} from it)")
        rows = part.index[region[0]]
        lo, hi = min(rows), max(rows) + 1
        block = sl[region[1], lo:hi].T if part.transposed else sl[(slice(lo, hi), *region[1:])]
        if not isinstance(rows, range):  # rows spread over the block (GPT-NeoX's heads)
            block = block[torch.tensor(rows) - lo]
        return block


def model_type(root: str | Path) -> str:
    """The model_type of a save_pretrained directory, checked to be one whose weights meshscale maps."""
    config = json.loads((Path(root) / "config.json").read_text())
    if config.get("quantization_config"):
        raise UserError(f"--init-from {root}: quantized weights ({config['quantization_config'].get('quant_method')}) "
                        "are not read; pass an unquantized (bf16/fp16/fp32) checkpoint")
    kind = config.get("model_type")
    if kind not in NAMES:
        raise UserError(f"--init-from {root}: loading {kind} weights is not supported; meshscale loads "
                        f"{', '.join(sorted(NAMES))}")
    return kind


def region_of(local: tuple, full: tuple, tp_rank: int, tp: int) -> tuple:
    """The slice of the whole parameter a tensor-parallel piece of shape `local` holds: cut along the one
    dimension where the shapes differ into full/local pieces, rank r holding piece r // (tp / pieces) (one
    piece per rank, or a KV head shared by tp/kv_heads ranks)."""
    region = [slice(0, n) for n in full]
    for dim, (a, b) in enumerate(zip(local, full)):
        if a != b:
            piece = tp_rank // (tp // (b // a))
            region[dim] = slice(piece * a, (piece + 1) * a)
    return tuple(region)


@torch.no_grad()
def load(module: torch.nn.Module, root: str | Path, spec: ModelSpec, full_shapes: dict, tp_rank: int = 0,
         tp: int = 1) -> None:
    """Fill every parameter of `module` (a whole model or this rank's part of one: a pipeline stage, its
    experts, its tensor-parallel pieces, with the global names) from the save_pretrained directory `root`,
    reading only the regions it holds."""
    kind = model_type(root)
    tensors = Safetensors(root)
    mapping = parts(kind, spec, full_shapes)
    for name, p in module.named_parameters():
        full = full_shapes[name]
        value = tensors.read(mapping[name], full, region_of(tuple(p.shape), full, tp_rank, tp))
        p.copy_(value.to(p.dtype) + mapping[name].offset)


# ---- writing ------------------------------------------------------------------------------------------
def assemble(model_type: str, spec: ModelSpec, tensors: dict) -> dict:
    """{Hugging Face name: tensor} from the whole model's {meshscale name: tensor}: fused tensors gathered
    from their parts, Conv1D weights transposed back; a tied head is the embedding's (not written twice)."""
    out = {}
    for name, part in parts(model_type, spec, {n: tuple(t.shape) for n, t in tensors.items()}).items():
        if name == "output.weight" and spec.tied_embeddings:
            continue
        t = tensors[name] - part.offset
        rows = part.rows or t.shape[0]
        if part.key not in out:
            out[part.key] = t.new_empty((t.shape[1], rows) if part.transposed else (rows, *t.shape[1:]))
        index = torch.tensor(list(part.index))
        if part.transposed:
            out[part.key][:, index] = t.T
        else:
            out[part.key][index] = t
    return out


def write(tensors: dict, root: Path, max_shard_bytes: int) -> list:
    """save_pretrained's layout: model.safetensors, or model-0000k-of-0000n.safetensors files of at most
    `max_shard_bytes` each (a larger tensor alone in its file) with model.safetensors.index.json. Returns
    the files written."""
    from safetensors.torch import save_file

    shards, size = [{}], 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key].contiguous()
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], root / "model.safetensors", metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for shard, name in zip(shards, names):
        save_file(shard, root / name, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {key: name for shard, name in zip(shards, names) for key in shard}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names + ["model.safetensors.index.json"]
