"""Layout: how one training step is spread over devices. The contract between planner and runtime.

String form (the same everywhere, CLI, JSON, planner output):
    tp=8,pp=16,dp=64,zero=1,mbs=1,schedule=1f1b,recompute=selective,sp=true
`fsdp=N` is shorthand for dp=N,zero=3. Keys left out take defaults; dp fills the devices left over.
`shard=N` (hybrid sharding, HSDP) shards the ZeRO state within groups of N of the dp*cp ranks, the groups
being replicas of each other; left out, the state is sharded over all dp*cp ranks.

Mesh order, outermost to innermost: pp, dp, cp, tp. TP is innermost so it stays inside the fast domain.
Expert parallelism borrows its ranks from the tp*cp*dp ranks of a pipeline stage (it adds no devices), folded
as Megatron-Core folds them ("MoE Parallel Folding", Liu et al. 2025, arXiv:2504.14960; Megatron-Core
parallel_state.initialize_model_parallel): the stage's ranks, in the main mesh's order, are re-cut as
(edp, ep, etp), etp innermost. `etp` ranks split each expert's matrices (expert tensor parallelism, default
tp), an EP group is `ep` ranks etp apart, and the ranks holding the same expert shards form the expert
data-parallel group of tp*cp*dp/(ep*etp) (`expert_mesh_shape`). With etp = tp this is the EP over dp*cp of
earlier releases; with etp = 1 an EP group spans TP ranks, so `tp=2,ep=32` on dp=16 is a layout.
"""

from dataclasses import dataclass, fields, replace

from meshscale.errors import UserError
from meshscale.specs.model import trainer_lacks

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv", "dualpipev")
# none; selective (the attention core); full (the whole block); op (torchtitan's: every other matmul's output
# kept); minimal (every weight matmul's output kept, the attention core and the element-wise work rerun: MaxText's
# remat_policy "minimal", JAX's checkpoint_dots_with_no_batch_dims); minimal_mlp (minimal's, but for the MLP's first
# matmul, rerun too: MaxText's save_dot_except_mlpwi, and its save_dot_except_logits_ffn1 before).
RECOMPUTE = ("none", "selective", "full", "op", "minimal", "minimal_mlp")
# The modes under which backward rebuilds a layer's forward at a time (its transient activations at the peak).
REBUILDS_LAYER = ("full", "op", "minimal", "minimal_mlp")
# The modes that keep the weight matmuls' outputs and rerun the rest (JAX's policies)
KEEPS_MATMULS = ("minimal", "minimal_mlp")
# Megatron-Core's --recompute-modules (transformer_config.py recompute_modules): the parts of a layer whose
# forward backward runs again from the input they keep; `recompute=mlp+layernorm` names several. core_attn alone
# is Korthikanti et al.'s selective recompute, written `selective`.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
# Schedules that place two model chunks on each pipeline rank (a "V": down then back up).
V_SCHEDULES = ("zbv", "dualpipev")
# Zero-bubble schedules: each backward split into its input gradient (B) and weight gradient (W), run apart
# (Qi et al. 2023; torch computes each part with autograd.grad).
ZERO_BUBBLE_SCHEDULES = ("zb",) + V_SCHEDULES
_INT_KEYS = ("dp", "zero", "shard", "tp", "pp", "vpp", "first", "last", "cp", "ep", "etp", "mbs", "offload")
_INT_MINIMA = tuple((key, 0 if key in ("zero", "mbs", "shard", "etp", "offload", "first", "last") else 1)
                    for key in _INT_KEYS)
_BOOL_KEYS = ("sp", "embedding_layer", "loss_layer")
# The keys that depart from the even cut (`split_layers`), at their defaults: what a framework cutting only
# evenly changes a layout to
EVEN_CUT = {"first": 0, "last": 0, "embedding_layer": False, "loss_layer": False}
_KEY_ORDER = ("dp", "zero", "shard", "tp", "sp", "pp", "vpp", "schedule", "first", "last", "embedding_layer",
              "loss_layer", "cp", "ep", "etp", "mbs", "recompute", "offload")


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    zero: int = 0  # 0: DDP, 1: optimizer states sharded, 2: + gradients, 3: + parameters (FSDP)
    shard: int = 0  # ranks of dp*cp each ZeRO shard group spans (HSDP); 0: all of them
    tp: int = 1
    sp: bool = False  # sequence parallelism over the TP group (Korthikanti et al. 2022)
    pp: int = 1
    vpp: int = 1  # model chunks per pipeline rank
    schedule: str = "1f1b"
    # layers of the first and the last pipeline rank (Megatron-Core --decoder-first/last-pipeline-num-layers),
    # the others sharing the rest evenly; 0: the even cut (`split_layers`)
    first: int = 0
    last: int = 0
    # the embedding, and the output head with the loss, each counted as one layer of the even cut, so the first
    # and the last chunk hold one transformer layer fewer (Megatron-Core --account-for-embedding-in-pipeline-split,
    # --account-for-loss-in-pipeline-split; `split_layers`)
    embedding_layer: bool = False
    loss_layer: bool = False
    cp: int = 1  # context parallelism (ring attention)
    ep: int = 1  # expert parallelism, folded over the stage's tp*cp*dp ranks (see the module docstring)
    etp: int = 0  # expert tensor parallelism; 0: tp (Megatron-Core's default for --expert-tensor-parallel-size)
    mbs: int = 0  # micro-batch size in sequences; 0: resolved from the batch (see `resolve_mbs`)
    recompute: str = "none"
    # layers whose activations go to host memory in forward and come back for backward (Megatron-Core
    # --cpu-offloading-num-layers, Transformer Engine's CPU offload)
    offload: int = 0

    def __post_init__(self):
        for key, least in _INT_MINIMA:
            value = getattr(self, key)
            if (type(value) is not int and (isinstance(value, bool) or not isinstance(value, int))) or value < least:
                raise UserError(f"layout: {key} must be a {'non-negative' if least == 0 else 'positive'} "
                                f"integer, got {value!r}")
        if self.zero > 3:
            raise UserError(f"layout: zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"layout: unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            object.__setattr__(self, "recompute", _module_list(self.recompute))
        if self.sp and self.tp == 1:
            raise UserError("layout: sp=true shards activations over the TP group, so it needs tp > 1")
        if self.pp > 1:
            if self.schedule == "interleaved" and self.vpp < 2:
                raise UserError("layout: schedule=interleaved needs vpp >= 2 model chunks per pipeline rank")
            if self.schedule in V_SCHEDULES and self.vpp not in (1, 2):
                raise UserError(f"layout: schedule={self.schedule} places exactly 2 chunks per rank; drop vpp")
            if self.schedule in ("gpipe", "1f1b", "zb") and self.vpp > 1:
                raise UserError(f"layout: vpp={self.vpp} needs schedule=interleaved (or zbv/dualpipev for 2)")
        elif self.vpp > 1:
            raise UserError("layout: vpp > 1 needs pp > 1")
        if (self.first or self.last) and (self.pp == 1 or self.schedule in V_SCHEDULES
                                          or self.first % self.vpp or self.last % self.vpp):
            raise UserError(f"layout: first={self.first}, last={self.last} set the layers of the first and last "
                            "pipeline ranks as Megatron-Core does: with pp > 1, not a V schedule, and a multiple of "
                            f"vpp={self.vpp} each (a rank's chunks share them evenly)")
        if (self.embedding_layer or self.loss_layer) and (self.pp == 1 or self.first or self.last):
            raise UserError("layout: embedding_layer and loss_layer count the embedding and the loss as layers of "
                            "the pipeline cut: they need pp > 1 and, as in Megatron-Core, no first or last")
        if self.v_shaped and self.vpp == 1:
            object.__setattr__(self, "vpp", 2)
        if self.shard:
            replicas = self.dp * self.cp
            if self.zero == 0:
                raise UserError(f"layout: shard={self.shard} shards ZeRO state within groups, so it needs zero=1, "
                                "2 or 3; add a zero stage or drop shard")
            if replicas % self.shard:
                raise UserError(f"layout: shard={self.shard} must divide dp*cp = {replicas} (the ranks that hold "
                                "the same parameters); pick a divisor of it")
            if self.shard == replicas:  # full sharding is the default: one canonical form
                object.__setattr__(self, "shard", 0)
        if self.etp == self.tp:  # the default: one canonical form
            object.__setattr__(self, "etp", 0)
        if self.etp and self.ep == 1:
            raise UserError(f"layout: etp={self.etp} splits the experts of an expert-parallel layout differently "
                            f"from tp={self.tp}; meshscale builds it with ep > 1 only: add ep or drop etp")

    # ---- derived sizes ------------------------------------------------------------------
    @property
    def recompute_modules(self) -> frozenset:
        """The RECOMPUTE_MODULES whose forward backward runs again: selective's and minimal's attention core,
        or those the list names; none for none, full (the whole layer) and op (every other matmul)."""
        if self.recompute == "selective" or self.recompute in KEEPS_MATMULS:
            return frozenset({"core_attn"})
        return frozenset() if self.recompute in RECOMPUTE else frozenset(self.recompute.split("+"))

    def reruns(self, module: str) -> bool:
        """Whether backward runs `module` (one of RECOMPUTE_MODULES) forward again: full recompute reruns all."""
        return self.recompute == "full" or module in self.recompute_modules

    @property
    def devices(self) -> int:
        return self.dp * self.cp * self.pp * self.tp

    @property
    def stages(self) -> int:
        """Model chunks in the whole pipeline (pp ranks times chunks per rank)."""
        return self.pp * self.vpp

    @property
    def shard_size(self) -> int:
        """Ranks each ZeRO/FSDP shard group spans (all dp*cp ranks unless hybrid sharding)."""
        return self.shard or self.dp * self.cp

    @property
    def replicas(self) -> int:
        """Shard groups holding copies of the same state (1 unless hybrid sharding)."""
        return self.dp * self.cp // self.shard_size

    @property
    def v_shaped(self) -> bool:
        """Two chunks per rank placed as a V, down the ranks and back up (specs/placement.py)."""
        return self.schedule in V_SCHEDULES and self.pp > 1

    @property
    def split_backward(self) -> bool:
        """A zero-bubble pipeline (ZERO_BUBBLE_SCHEDULES): weight gradients computed apart from the backward."""
        return self.schedule in ZERO_BUBBLE_SCHEDULES and self.pp > 1

    @property
    def expert_tp(self) -> int:
        """Ranks splitting each routed expert's matrices (etp, tp unless set)."""
        return self.etp or self.tp

    @property
    def edp(self) -> int:
        """Ranks holding the same expert shards: the expert data-parallel group, tp*cp*dp/(ep*etp)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def dispatch_split(self) -> int:
        """How many ways the TP ranks split the MoE tokens before the dispatch: tp where each TP rank sends only
        its sequence chunk (SP, as Megatron-Core's all-to-all dispatcher; or etp != tp, where an EP group
        crosses TP ranks), 1 where every TP rank sends all of them to TP-split experts."""
        return self.tp if self.sp or self.expert_tp != self.tp else 1

    @property
    def fsdp(self) -> bool:
        return self.zero == 3 and self.dp * self.cp > 1

    def resolve_mbs(self, global_batch: int) -> "Layout":
        """Fill mbs when left out: one micro-batch per DP rank without a pipeline; with one, as many
        micro-batches as possible (mbs=1) to shrink the bubble."""
        if self.mbs:
            return self
        per_rank = global_batch // self.dp
        return replace(self, mbs=max(1, per_rank if self.pp == 1 else 1))

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches each DP replica runs per step (gradient-accumulation steps, or pipeline depth)."""
        return global_batch // (self.dp * (self.mbs or 1))

    # ---- text form ----------------------------------------------------------------------
    def __str__(self) -> str:
        """Canonical text: dp always, then every key that differs from its default."""
        default = Layout()
        parts = []
        for key in _KEY_ORDER:
            value = getattr(self, key)
            if key != "dp" and value == getattr(default, key) and not (key == "schedule" and self.pp > 1):
                continue
            if (key in ("vpp", "schedule") and self.pp == 1) or (key == "vpp" and self.schedule in V_SCHEDULES):
                continue
            parts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str, devices: int | None = None) -> "Layout":
        """Parse the string form; with `devices`, dp fills what is left and the product is checked."""
        values: dict = {}
        fsdp = None
        for key, raw in layout_items(text):
            if key in values or (key == "fsdp" and fsdp is not None):
                raise UserError(f"layout: {key} given twice")
            if key == "fsdp":
                fsdp = parse_value(key, raw)
            elif key in _KEY_ORDER:
                values[key] = parse_value(key, raw)
            else:
                known = ", ".join(_KEY_ORDER + ("fsdp",))
                raise UserError(f"layout: unknown key {key!r}; known keys: {known}")
        if fsdp is not None:
            if values.get("dp", fsdp) != fsdp or values.get("zero", 3) != 3:
                raise UserError("layout: fsdp=N means dp=N,zero=3; do not combine it with a different dp or zero")
            values.update(dp=fsdp, zero=3)
        if devices is not None and "dp" not in values:
            rest = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
            if devices % rest:
                raise UserError(f"layout: tp*pp*cp = {rest} does not divide {devices} devices; "
                                "choose degrees whose product divides the device count")
            values["dp"] = devices // rest
        layout = cls(**values)
        if devices is not None and layout.devices != devices:
            raise UserError(f"layout: dp*cp*pp*tp = {layout.devices} but there are {devices} devices; "
                            "make the product equal the device count (or leave dp out to fill it)")
        return layout

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def expert_mesh_shape(layout: Layout) -> tuple[int, int, int, int]:
    """(pp, edp, ep, etp): global ranks arange(devices) reshaped to this are the mesh of expert parallelism
    (the runtime's parallel/expert.py; the cost model's groups, cost/step.py `_axis_group`). The main mesh's
    order is (pp, dp, cp, tp), so each stage's tp*cp*dp ranks are consecutive; Megatron-Core cuts them with
    the order tp-ep-dp for experts (parallel_state.py, the expert RankGenerator), etp innermost."""
    return layout.pp, layout.edp, layout.ep, layout.expert_tp


def layout_items(text: str, what: str = "layout") -> list[tuple[str, str]]:
    """(key, value text) of each key=value item of a layout string, spaces dropped; `what` names the input in
    the error."""
    items = []
    for item in filter(None, (p.strip() for p in text.replace(" ", "").split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not raw:
            raise UserError(f"{what}: {item!r} is not key=value (example: tp=8,pp=4,dp=16,zero=1)")
        items.append((key, raw))
    return items


def _module_list(text: str) -> str:
    """A recompute module list in one canonical form (RECOMPUTE_MODULES' order; core_attn alone: selective)."""
    names = text.split("+")
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown or len(set(names)) != len(names):
        raise UserError(f"layout: unknown recompute {text!r}; choose one of {', '.join(RECOMPUTE)}, or modules "
                        f"joined by + (Megatron-Core's --recompute-modules: {', '.join(RECOMPUTE_MODULES)}), "
                        "each once")
    names = [n for n in RECOMPUTE_MODULES if n in names]
    return "selective" if names == ["core_attn"] else "+".join(names)


def parse_value(key: str, raw: str, what: str = "layout"):
    """The value of layout key `key` from its text: a whole number, sp and the cut's switches a bool, schedule and
    recompute their lower-case names (which Layout checks)."""
    if key in _INT_KEYS + ("fsdp",):
        try:
            return int(raw)
        except ValueError:
            raise UserError(f"{what}: {key} must be a whole number, got {raw!r}") from None
    if key in _BOOL_KEYS:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise UserError(f"{what}: {key} must be true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    return raw.lower()


def check_against(layout: Layout, model, global_batch: int | None = None) -> None:
    """Rules that tie a layout to a model and batch. Each failure names the rule and the fix."""
    t = layout.tp
    if model.heads % t or not kv_heads_fit(model.kv_heads, t):
        raise UserError(f"layout: tp={t} must divide heads ({model.heads}) of {model.name}, and either divide "
                        f"kv_heads ({model.kv_heads}) or be a multiple of it (each rank then holds a copy of its "
                        f"KV head); pick such a tp")
    if model.ffn % t or (model.is_moe and model.shared_experts * model.expert_ffn % t):
        raise UserError(f"layout: tp={t} must divide the MLP width ({model.ffn}) of {model.name}")
    if model.is_moe and model.expert_ffn % layout.expert_tp:
        raise UserError(f"layout: etp={layout.expert_tp} (tp unless set) must divide the expert MLP width "
                        f"({model.expert_ffn}) of {model.name}; pick a divisor of it")
    if layout.first or layout.last:
        middle, ranks = model.layers - layout.first - layout.last, layout.pp - bool(layout.first) - bool(layout.last)
        if middle < ranks * layout.vpp or (middle % (ranks * layout.vpp) if ranks else middle):
            raise UserError(f"layout: first={layout.first}, last={layout.last} leave {middle} of {model.name}'s "
                            f"{model.layers} layers to the other {ranks} pipeline ranks, which must share them "
                            f"evenly over their {ranks * layout.vpp} chunks, at least one each; change first or last")
    if layout.embedding_layer or layout.loss_layer:
        units = model.layers + layout.embedding_layer + layout.loss_layer
        if units % layout.stages or units < 2 * layout.stages:
            counted = " and ".join(name for name, on in (("the embedding", layout.embedding_layer),
                                                         ("the loss", layout.loss_layer)) if on)
            raise UserError(f"layout: {model.name}'s {model.layers} layers and {counted} make {units} units, "
                            f"which Megatron-Core cuts evenly into pp*vpp = {layout.stages} chunks, at least 2 "
                            "a chunk; change pp or vpp")
    if layout.stages > model.layers + model.mtp_layers:
        raise UserError(f"layout: pp*vpp = {layout.stages} pipeline chunks but {model.name} has only "
                        f"{model.layers} layers; lower pp or vpp")
    if layout.cp > 1 and model.seq % (2 * layout.cp):
        raise UserError(f"layout: cp={layout.cp} needs seq ({model.seq}) divisible by 2*cp for load-balanced "
                        "causal ring attention; pick cp accordingly")
    if layout.sp and model.seq % (t * layout.cp):
        raise UserError(f"layout: sp=true splits each CP rank's seq/cp tokens ({model.seq}/{layout.cp}) over tp={t}; "
                        "tp*cp must divide seq")
    absent = {"moe": not model.is_moe, "moe_act": not model.is_moe, "shared_experts": not model.shared_experts,
              "mlp": model.is_moe and model.moe_layers == model.layers, "mla_up_proj": not model.uses_mla}
    missing = sorted(m for m in layout.recompute_modules if absent.get(m))
    if missing:
        raise UserError(f"layout: recompute module {', '.join(missing)} names a part {model.name} does not have; "
                        "drop it")
    if layout.offload and (layout.pp > 1 or layout.offload > model.layers):
        raise UserError(f"layout: offload={layout.offload} moves what that many of the {model.layers} layers keep "
                        "for backward to host memory, with pp=1 (Megatron-Core's and DeepSpeed's offload run without "
                        "a pipeline); change pp or offload")
    if layout.recompute == "op" and (model.is_moe or model.uses_mla or t > 1 or layout.cp > 1):
        # its every-other-matmul rule would count routed experts' and TP/CP collectives' calls
        raise UserError(f"layout: recompute=op is built for dense models at tp=1 and cp=1 ({model.name}, tp={t}, "
                        f"cp={layout.cp}); use recompute=selective or full")
    if layout.recompute in KEEPS_MATMULS and not minimal_recompute_built(model):
        raise UserError(f"layout: recompute={layout.recompute} is built for dense models without MLA ({model.name}); "
                        "use recompute=selective or full")
    if layout.ep > 1:
        if not model.is_moe:
            raise UserError(f"layout: ep={layout.ep} needs a mixture-of-experts model; {model.name} is dense, so "
                            "drop ep")
        if model.experts % layout.ep:
            raise UserError(f"layout: ep={layout.ep} must divide the expert count ({model.experts}); pick a divisor "
                            "of it")
        folded = layout.tp * layout.cp * layout.dp
        if folded % (layout.ep * layout.expert_tp):
            # Megatron-Core parallel_state.initialize_model_parallel: world % (etp * ep * pp) == 0
            raise UserError(f"layout: ep*etp = {layout.ep}*{layout.expert_tp} must divide tp*cp*dp = {folded} (the "
                            "ranks of a pipeline stage the expert groups fold over; etp is tp unless set); lower ep "
                            "or etp, or raise dp")
    if global_batch is not None:
        mbs = layout.mbs or 1
        if global_batch % (layout.dp * mbs):
            raise UserError(f"layout: global batch of {global_batch} sequences does not split into dp={layout.dp} "
                            f"x mbs={mbs}; use a batch divisible by {layout.dp * mbs}")
        reason = pipeline_refusal(layout, layout.microbatches(global_batch))
        if reason:
            raise UserError(f"layout: {reason}")


def kv_heads_fit(kv_heads: int, tp: int) -> bool:
    """TP splits the KV heads (tp divides them) or replicates them (tp a multiple of them, Megatron-LM's
    rule for grouped-query attention: each rank keeps a copy of the one KV head its query heads read)."""
    return kv_heads % tp == 0 or tp % kv_heads == 0


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads each TP rank holds: its share, or one replicated head."""
    return max(kv_heads // tp, 1)


def split_layers(n_layers: int, n_chunks: int, mtp: int = 0, pp: int = 1, first: int = 0, last: int = 0,
                 embedding: bool = False, loss: bool = False) -> list[range]:
    """Contiguous layer ranges, one per chunk: Megatron's even cut (Narayanan et al. 2021, sec. 2.2), which
    the published step times we hold the cost model against were measured with. Layers left over go to the
    inner chunks first, so the chunks also carrying the embedding or the output head stay lighter. `mtp`
    multi-token prediction modules count as layers of the last chunk, after its transformer layers (Megatron-
    Core's pipeline layouts place them so: "m" in the last stage), so that chunk may hold none. With `first`
    or `last` (Layout) the first or last of `pp` ranks holds that many layers, shared evenly by its chunks
    (rank r holds chunks r, r + pp, ...), and the other ranks' chunks share the rest evenly, as Megatron-Core's
    --decoder-first/last-pipeline-num-layers cut. With `embedding` or `loss` the embedding, or the head and
    the loss, count as one unit of the even cut, in the first or the last chunk (Megatron-Core's
    get_num_layers_to_build under --account-for-embedding/loss-in-pipeline-split, which leaves the multi-token
    prediction modules out of the cut and builds them with the loss). The runtime (parallel/pipeline.py) and
    the cost model (cost/memory.py) both cut with this function."""
    counted = embedding or loss  # Megatron-Core's counted cut leaves the MTP modules out
    units = n_layers + (embedding + loss if counted else mtp)
    if not 1 <= n_chunks <= units:
        raise ValueError(f"cannot cut {n_layers} layers into {n_chunks} pipeline chunks")
    if first or last:
        sizes = _sized_ends(n_layers, n_chunks, pp, first, last)
        if sum(sizes) != n_layers or min(sizes) < 1:
            raise ValueError(f"first={first}, last={last} do not cut {n_layers} layers into {n_chunks} chunks evenly")
    else:
        sizes = [units // n_chunks] * n_chunks
        inner_first = list(range(1, n_chunks - 1)) + [0, n_chunks - 1]
        for i in inner_first[:units % n_chunks]:
            sizes[i] += 1
        if counted:
            sizes[0] -= embedding
            sizes[-1] += mtp - loss
    starts = [sum(sizes[:i]) for i in range(n_chunks)]
    return [range(start, min(start + size, n_layers)) for start, size in zip(starts, sizes)]


def _sized_ends(n_layers: int, n_chunks: int, pp: int, first: int, last: int) -> list[int]:
    """`split_layers`' chunk sizes with the first and/or last rank's layers given (check_against has checked
    that the rest shares evenly)."""
    vpp = n_chunks // pp
    ranks = pp - bool(first) - bool(last)
    middle = (n_layers - first - last) // (ranks * vpp) if ranks else 0
    return [first // vpp if c % pp == 0 and first else last // vpp if c % pp == pp - 1 and last else middle
            for c in range(n_chunks)]


def pipeline_refusal(layout: Layout, n_microbatches: int) -> str | None:
    """Why the runtime's pipeline schedules cannot run `layout` with `n_microbatches`, or None. These are
    the shapes whose gradients were verified against one device (tests/test_pipeline.py)."""
    p, m = layout.pp, n_microbatches
    if p == 1:
        return None
    if layout.schedule != "gpipe" and m < p:
        return (f"schedule={layout.schedule} needs at least pp={p} micro-batches per step, got {m}; "
                "raise the batch or lower mbs")
    if layout.schedule in ("interleaved", "zb") and m % p:
        # torch runs these in rounds of pp micro-batches; parity is verified for whole rounds only
        return (f"schedule={layout.schedule} needs micro-batches per step ({m}) divisible by pp={p}; "
                "adjust the batch or mbs")
    if layout.split_backward and layout.fsdp:
        # measured on torch 2.13: under FSDP2, zb/zbv leave a stage's first block without weight gradients
        # and dualpipev's gradients are wrong (tests/test_pipeline.py checks the schedules it does accept)
        return (f"schedule={layout.schedule} with zero=3 gets wrong weight gradients from torch's split backward "
                "under FSDP2; use zero<=2, or schedule=gpipe/1f1b/interleaved with zero=3")
    if layout.dp * layout.cp > 1 and layout.zero == 2 and layout.split_backward:
        # ZeRO-2 reduce-scatters a bucket once backward has accumulated its gradients; zero-bubble schedules
        # compute weight gradients with autograd.grad, which never triggers that hook
        return (f"schedule={layout.schedule} computes weight gradients apart from backward, which zero=2 cannot "
                "reduce-scatter as they form; use zero=1 (or gpipe/1f1b/interleaved with zero=2)")
    if layout.split_backward and layout.recompute in REBUILDS_LAYER:
        # measured on torch 2.13 through the TP ledger (tiny, tp=2, pp=2): the split backward reruns a
        # checkpointed block for the input gradient and again for its weight gradients, so the recompute's TP
        # collectives came 10x (zb), 5.5x (zbv) and 1.6x (dualpipev) what 1f1b's single rerun moves
        return (f"schedule={layout.schedule} recomputes a checkpointed block again for its weight gradients (torch's "
                f"split backward); use recompute=selective or none with it, or recompute={layout.recompute} with "
                "schedule=1f1b or interleaved")
    if layout.schedule == "dualpipev" and m < 2 * p:
        return (f"schedule=dualpipev needs at least 2*pp = {2 * p} micro-batches per step, got {m}; "
                "raise the batch or lower mbs")
    return None


def minimal_recompute_built(model) -> bool:
    """Whether recompute=minimal is built for `model`: dense and without MLA. MoE experts read permuted tokens,
    no matmul's output, so their rerun would dispatch again; MLA's latents are not counted."""
    return not (model.is_moe or model.uses_mla)


def check_trainable(layout: Layout, model) -> None:
    """Raise the trainer's refusal of `layout` for `model` as one line, if it has one."""
    reason = trainer_refusal(layout, model)
    if reason:
        raise UserError(f"layout {layout}: {reason}")


def trainer_refusal(layout: Layout, model) -> str | None:
    """Why `meshscale train` cannot run `layout` of `model` yet, or None. Torch-free, so `plan --emit torchrun`
    can pick the best layout the trainer runs. (What it runs, it runs with the single-device loss:
    tests/test_train_matrix.py.)"""
    lacks = trainer_lacks(model)
    if lacks:
        return f"model {model.name}: the trainer has no {lacks}"
    if layout.recompute not in RECOMPUTE:
        return (f"recompute={layout.recompute} is Megatron-Core's module recompute, which predict costs and "
                "--emit megatron writes; the trainer runs recompute none, selective, full, op or minimal")
    if layout.recompute == "minimal_mlp":
        return ("recompute=minimal_mlp is MaxText's save_dot_except_mlpwi, which predict costs and --emit maxtext "
                "writes; the trainer runs recompute none, selective, full, op or minimal")
    if layout.recompute == "minimal" and (layout.tp > 1 or layout.cp > 1):
        # its policy keeps matmul outputs; under TP a row-parallel one is a partial sum before its reduction
        return "recompute=minimal is built in the trainer at tp=1 and cp=1; use recompute=selective or full"
    if layout.offload:
        return (f"offload={layout.offload} is Megatron-Core's activation offload, which predict costs and "
                "--emit megatron writes; the trainer keeps activations on the device")
    if layout.cp > 1 and model.sliding_window and model.sliding_window < model.seq:
        return f"cp>1 is not built for sliding-window attention ({model.name}); use cp=1"
    if layout.cp > 1 and model.learned_positions:
        return f"cp>1 is not built for learned position embeddings ({model.name}); use cp=1"
    if model.is_moe and model.biases and layout.tp > 1:
        return "tp>1 is not built for MoE experts with biases (their row-parallel bias); use tp=1"
    if layout.expert_tp not in (1, layout.tp):
        return f"etp={layout.etp} is built as 1 or tp={layout.tp} (whole experts, or split as TP splits them)"
    if (model.biases or model.qkv_bias) and layout.tp > model.kv_heads:
        return f"tp={layout.tp} > kv_heads is not built for biased K/V projections; use tp<={model.kv_heads}"
    if layout.pp > 1 and model.tied_embeddings and layout.dp * layout.cp > 1 and layout.zero == 2:
        # the two copies' gradients are summed after the schedule; zero=2 reduce-scatters them into flat buckets
        # that differ between the stages during it (zero=3 sums its FSDP2 shards)
        return f"pp>1 with tied embeddings ({model.name}) is not built for zero=2; use zero=1 or 3"
    if model.vocab % layout.tp:
        # the cost model pads the vocabulary like Megatron; the trainer's vocabulary-parallel embedding does not
        return (f"tp={layout.tp} must divide the vocabulary ({model.vocab}) of {model.name} for the trainer's "
                "vocabulary-parallel embedding and loss; pick a tp that divides it")
    return None
