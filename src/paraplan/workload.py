"""From what a person asks for to what the planners and the simulator take: one way for everyone.

A request names a model (a zoo name, hf:..., path/to/file.py:build_fn; models/ref.py) with its
size overrides (seq_len, image_size, the dotted path of its blocks), a cluster (a preset name, a
TOML file or a Cluster already loaded; a calibrated cluster file carries the runtime's measured
overheads), where compute times come from (analytic, a layer profile or an operator profile from
`paraplan profile`, measured overheads in place of the cluster's) and, for planning, a global
batch, a memory budget ('16GiB' or bytes; sizes.py) and limits. `workload` builds the model on
meta, measures it, traces its operator graph where asked, builds the CostModel and the
PlanRequest, and hands them back together (`Workload`).

The command line (paraplan/cli), the Python API (api.py) and the benchmarks build their requests
here. The steps are public as well, for callers that check something between them (`paraplan
train` checks its data file against the built model before any cost model; `paraplan inspect`
needs no cost model). Nothing here prints: a `Watch` is how a caller shows the slow steps (the
command line's progress bar and spinners); by default nothing is shown.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.errors import FieldError, ParaplanError
from paraplan.sizes import memory_by_kind, memory_bytes

if TYPE_CHECKING:
    from paraplan.costs.model import CostModel
    from paraplan.costs.model_flops import ModelFlops
    from paraplan.hardware.cluster import Cluster, RuntimeOverheads
    from paraplan.models.built import BuiltModel
    from paraplan.models.opspec import OpGraph
    from paraplan.models.spec import ModelSpec
    from paraplan.planners.request import PlanRequest

# the operator graph of an iteration: not traced (None), traced or the error raised ("required"),
# traced where the model can be traced, else None ("optional": the comparison of every planner
# skips the operator-placement planners then, and says why)
OPERATORS = (None, "required", "optional")


def _nothing() -> None:
    pass


class Watch:
    """What a caller shows while a workload is built; every hook is a context manager, and by
    default none shows anything."""

    def measuring(self, reference: str):
        """Around building and measuring the model."""
        return contextlib.nullcontext()

    def progress(self, description: str, total: int):
        """Around the measurement itself; its value is called once per step (`total` of them)."""
        return contextlib.nullcontext(_nothing)

    def tracing(self, built: BuiltModel):
        """Around tracing the operator graph."""
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Workload:
    """A model built on meta and measured, on a cluster, with its costs and (when a batch was
    given) the planning request. `request.costs` carries the memory budget (its cluster's
    capacities replaced); `costs` is the cluster's own."""

    built: BuiltModel
    spec: ModelSpec
    cluster: Cluster
    costs: CostModel
    operators: OpGraph | None = None
    request: PlanRequest | None = None


def built_model(reference: str, *, seq_len: int | None = None, image_size: int | None = None,
                layers: str | None = None) -> BuiltModel:
    """The model built on meta, unmeasured: cheap (GPT-3 175B in well under a second), and where a
    model is refused (a mixture of experts, a build that fails) it is refused here."""
    from paraplan.models import source

    return source.build(reference, device="meta", seq_len=seq_len, image_size=image_size, layers=layers)


def measured_model(reference: str, *, seq_len: int | None = None, image_size: int | None = None,
                   layers: str | None = None, watch: Watch | None = None,
                   precision: str = "fp32", attention: str = "math") -> tuple[BuiltModel, ModelSpec]:
    """Build any model reference on meta (models/source.py) and measure it (models/measure.py) as
    a plan in `precision` runs it (mixed precision: under autocast's casts), its scaled-dot-product
    attention kept as `attention` says (`attention_kernel`)."""
    from paraplan.models import measure
    from paraplan.models.failures import MEASURE_ADVICE, model_step

    if watch is None:
        built = built_model(reference, seq_len=seq_len, image_size=image_size, layers=layers)
        return built, measure.measure(built, precision=precision, attention=attention)
    with watch.measuring(reference):
        built = built_model(reference, seq_len=seq_len, image_size=image_size, layers=layers)
        with model_step(built.ref, "cutting it into layers", MEASURE_ADVICE):
            n_layers = len(built.layers())
        with watch.progress(f"measuring {built.name} on meta", 2 * n_layers) as advance:
            return built, measure.measure(built, progress=advance, precision=precision, attention=attention)


def size_note(built: BuiltModel, *, seq_len: int | None = None, image_size: int | None = None) -> str:
    """The input size the model is planned at and where it came from, one line (models/input_note.py;
    `seq_len` / `image_size`: the command line's flags, when given)."""
    from paraplan.models.input_note import built_note

    return built_note(built, seq_len=seq_len, image_size=image_size)


def model_flops_of(built: BuiltModel, spec: ModelSpec) -> ModelFlops:
    """The model FLOPs per sample that MFU counts (costs/model_flops.py): a decoder-only transformer's
    6*N + 6*L*d*s per token, its blocks and hidden size read from the model (engines/shape.py); any
    other model 3 x its measured forward FLOPs."""
    from paraplan.costs.model_flops import model_flops
    from paraplan.engines.shape import shape_of

    shape = shape_of(built, built.ref)
    if shape.decoder:
        return model_flops(spec, layers=shape.layers, hidden=shape.hidden)
    return model_flops(spec)


def attention_kernel(cluster: Cluster, precision: str) -> str:
    """How the plan's run keeps PyTorch's scaled-dot-product attention (models/measure.py: ATTENTION).
    On a CPU, what torch does here: its flash kernel without dropout, the math path with it. On
    GPUs in mixed precision, today's fused kernels (flash / memory-efficient: no s x s tensor); in
    fp32 and tf32 the eager attention of the papers' testbeds, whose reproductions keep fp32
    (HF models of 2021-22 stored the s x s softmax and its dropout mask), which meta measures."""
    from paraplan.costs.memory_config import is_cpu
    from paraplan.precision import is_mixed

    if all(is_cpu(slot.spec.name) for slot in cluster.devices):
        return "cpu"
    return "fused" if is_mixed(precision) else "math"


def attention_here() -> str:
    """The attention kernel of a run on this machine (`paraplan train`): its GPUs' fused kernels, or
    the CPU's choice."""
    import torch

    return "fused" if torch.cuda.is_available() else "cpu"


def with_operators(w: Workload, graph: OpGraph | None) -> Workload:
    """The workload with its operator graph traced later (planners/auto.py: compare's `operators`),
    in its costs and its request's."""
    from paraplan.planners.request import with_operator_graph

    request = w.request and with_operator_graph(w.request, graph)
    return replace(w, operators=graph, costs=replace(w.costs, operators=graph), request=request)


def operator_graph(built: BuiltModel, *, optional: bool = False, watch: Watch | None = None) -> OpGraph | None:
    """The operator graph of one training iteration, traced on meta (models/op_trace.py). A model
    that cannot be traced raises, or with `optional` gives None."""
    from paraplan.models.failures import TRACE_ADVICE, model_step
    from paraplan.models.op_trace import build_op_graph

    try:
        with watch.tracing(built) if watch is not None else contextlib.nullcontext(), \
                model_step(built.ref or built.name, "tracing its operator graph on the meta device", TRACE_ADVICE):
            return build_op_graph(built)
    except ParaplanError:
        if not optional:
            raise
        return None


def check_precision(cluster: Cluster, precision: str | None, fp8_recipe: str | None = None) -> tuple[str, str]:
    """The precision a request on `cluster` trains in (its default_precision unless given) and, for
    fp8, its recipe (DEFAULT_FP8_RECIPE unless given), every device computing in it; else one line
    (FieldError for an unknown name or a recipe without fp8, PrecisionError naming the device)."""
    from paraplan.precision import DEFAULT_FP8_RECIPE, Precision, fp8_recipe_problem, parse_precision

    try:
        chosen = str(parse_precision(precision or cluster.default_precision))
    except ValueError as exc:
        raise FieldError("precision", str(exc)) from None
    recipe = (fp8_recipe or DEFAULT_FP8_RECIPE) if chosen == Precision.FP8 else (fp8_recipe or "")
    problem = fp8_recipe_problem(chosen, recipe)
    if problem:
        raise FieldError("fp8_recipe", problem)
    cluster.check_precision(chosen, recipe)
    return chosen, recipe


def precision_of(plan) -> dict:
    """The keywords of `workload` / `cost_model` that price a Plan in its own precision (the inverse
    of CostModel.plan_precision): its precision, fp8 recipe and FP8 parameter all-gather."""
    return {"precision": plan.precision, "fp8_recipe": plan.fp8_recipe or None, "fp8_param_gather": plan.fp8_param_gather}


def cost_model(spec: ModelSpec, cluster: Cluster, *, profile: str | Path | None = None, precision: str | None = None,
               fp8_recipe: str | None = None, fp8_param_gather: bool = False, **kwargs) -> CostModel:
    """The CostModel of a measured model on a cluster: analytic, or from a profile file (a layer
    profile replaces the layers' compute times; an operator profile prices the operators and
    leaves the layers analytic). `precision`: what the plans train in (precision.py; default the
    cluster's default_precision; fp8 with `fp8_recipe`, default tensorwise). `kwargs`: CostModel's
    (operators, overheads, overlap_slowdown, ...)."""
    from paraplan.costs.model import analytic_cost_model, profile_cost_model

    kwargs["precision"], recipe = check_precision(cluster, precision, fp8_recipe)
    if recipe:
        kwargs["fp8_recipe"] = recipe
    if fp8_param_gather:
        from paraplan.precision import fp8_param_gather_problem

        problem = fp8_param_gather_problem(kwargs["precision"], fp8_param_gather)
        if problem:
            raise FieldError("fp8_param_gather", problem)
        kwargs["fp8_param_gather"] = True
    kwargs.setdefault("source", cost_source(cluster))

    if profile:
        from paraplan.profiling.operator_file import is_operator_profile, read_operator_profile
        from paraplan.profiling.profile_file import read_profile

        if is_operator_profile(profile):  # measured operator times; layers stay analytic
            measured = read_operator_profile(profile)
            if measured.model != (spec.ref or spec.name):
                raise ParaplanError(f"{profile}: an operator profile of {measured.model}, not {spec.ref or spec.name}")
            kwargs["source"] = f"operator profile {profile}"
            return analytic_cost_model(spec, cluster, operator_profile=measured, **kwargs)

        kwargs.pop("source")
        costs = profile_cost_model(spec, cluster, read_profile(profile), **kwargs)
        return replace(costs, source=f"profile {profile} (measured on {costs.source.removeprefix('profile:')})")
    return analytic_cost_model(spec, cluster, **kwargs)


def engine_block(built, attention: str):
    """The transformer block's shape an engine profile prices fused kernels and a 16-bit residual
    stream with (costs/engine_profile.py: BlockShape); None for a model that is not a decoder the
    engines build (its layers are then priced as measured)."""
    from paraplan.costs.engine_profile import BlockShape
    from paraplan.engines.shape import shape_of

    shape = shape_of(built, built.ref)
    if not shape.decoder:
        return None
    llama = shape.llama_like  # Llama and its mixtures of experts: SwiGLU, no dropout
    config = getattr(built.module, "config", None)
    dropout = not llama and any(getattr(config, key, 0) for key in ("resid_pdrop", "attn_pdrop"))
    return BlockShape(hidden=shape.hidden, heads=shape.heads, kv_heads=shape.query_groups, ffn=shape.ffn,
                      seq_len=shape.seq_len, gated=llama, dropout=bool(dropout), eager_attention=attention == "math")


ESTIMATE_NOTE = "absolute times are estimates until `paraplan calibrate` measures this machine; trust the rankings"


def cost_source(cluster: Cluster) -> str:
    """What a prediction on `cluster` stands on, in a few words (issue 33): this machine as
    `paraplan calibrate` measured it (on its date), or an analytic preset (published figures; for
    `local`, this machine never measured)."""
    import re

    if cluster.overheads is not None and cluster.overheads.source.startswith("paraplan calibrate"):
        date = re.search(r"on (\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?)", cluster.description)
        return f"this machine, calibrated{' on ' + date.group(1) + ' UTC' if date else ''}"
    if cluster.name == "local":
        return "analytic preset local (this machine never measured)"
    return f"analytic preset {cluster.name}"


def plan_request(costs: CostModel, *, model_name: str, cluster_name: str, batch: int, memory=None,
                 stages: int | None = None, micro_batches: int | None = None, schedule=None,
                 exact_stages: bool = False, options=None, sequence_parallel=frozenset(),
                 tensor_parallel=None, headroom: float | None = None) -> PlanRequest:
    """The PlanRequest over a cost model; `memory`: None, bytes, a size such as '16GiB', or one per
    device type ('a100=36GiB,v100=28GiB' or a dict);
    `headroom`: the share of memory left unplanned (None: DEFAULT_HEADROOM of the device's own
    memory, none of a budget the caller gave)."""
    from paraplan.planners.request import DEFAULT_HEADROOM, PlanRequest

    if headroom is None:
        headroom = DEFAULT_HEADROOM if memory is None else 0.0
    return PlanRequest(costs=costs, model_name=model_name, cluster_name=cluster_name, batch=batch, n_stages=stages,
                       headroom=headroom,
                       n_micro=micro_batches, schedule=schedule, memory_bytes=memory_bytes(memory),
                       memory_by_kind=memory_by_kind(memory),
                       exact_stages=exact_stages, options=options or {},
                       sequence_parallel=frozenset(sequence_parallel),
                       tensor_parallel=None if tensor_parallel is None else frozenset(tensor_parallel))


def sequence_parallel_layers(built: BuiltModel, cluster: Cluster, precision: str) -> frozenset:
    """In mixed precision (where the planners search today's training): the (layer, tp degree)
    pairs the runtime runs with Megatron sequence parallelism (PlanRequest.sequence_parallel); in
    fp32, the papers' setting, none."""
    from paraplan.precision import is_mixed
    from paraplan.runtime.layers.tensor_parallel import sequence_parallel_support, strict_for

    if not is_mixed(precision):
        return frozenset()
    return sequence_parallel_support(built.layers(), min(cluster.n_devices, 64), strict=strict_for(built.ref))


def tensor_parallel_layers(built: BuiltModel, cluster: Cluster, precision: str) -> frozenset | None:
    """In mixed precision, and for every model outside the zoo: the (layer, tp degree) pairs the
    runtime runs tensor parallel (PlanRequest.tensor_parallel); for the zoo's models in fp32, None:
    the papers' planners plan TP on every layer, as the papers' systems ran it. A user's block that
    paraplan's TP cannot shard is never planned with TP (issue 46: it ran replicated, at twice the
    predicted states)."""
    from paraplan.precision import is_mixed
    from paraplan.runtime.layers.tensor_parallel import strict_for, tensor_parallel_support

    strict = strict_for(built.ref)
    if not is_mixed(precision) and not strict:
        return None
    return tensor_parallel_support(built.layers(), min(cluster.n_devices, 64), strict=strict)


def workload(model: str, cluster: str | Path | Cluster, *, batch: int | None = None, cluster_name: str | None = None,
             profile: str | Path | None = None, overheads: RuntimeOverheads | None = None,
             overlap_slowdown: float | None = None, memory=None, seq_len: int | None = None,
             image_size: int | None = None, layers: str | None = None, operators: str | None = None,
             stages: int | None = None, micro_batches: int | None = None, schedule=None, exact_stages: bool = False,
             options=None, watch: Watch | None = None, precision: str | None = None,
             engine: str = "paraplan", headroom: float | None = None, fp8_recipe: str | None = None,
             fp8_param_gather: bool = False) -> Workload:
    """The cluster loaded (unless it is one already), the model built and measured, its operator
    graph traced (`operators`: see OPERATORS), its cost model and, with a `batch`, the PlanRequest
    (its model named by the built reference, its cluster by `cluster_name`, by default the name or
    file as given). `overheads` replace the cluster's (a calibrated one carries its own). `engine`:
    whose implementation prices the plans (costs/engine_profile.py; paraplan's own runtime by default).
    `fp8_recipe`: an fp8 request's scaling recipe (precision.py; default tensorwise);
    `fp8_param_gather`: its parameters all-gathered in FP8 (Plan.fp8_param_gather)."""
    from paraplan.costs.engine_profile import engine_profile
    from paraplan.hardware import Cluster, load_cluster

    if operators not in OPERATORS:
        raise ValueError(f"operators: expected one of {OPERATORS}, got {operators!r}")
    engine_profile(engine)  # an unknown engine: one line, before anything is measured
    if engine != "paraplan" and profile:
        raise ParaplanError(f"a measured profile prices paraplan's own runtime, not {engine}: price with the "
                            "profile or with the engine, not both")
    if isinstance(cluster, Cluster):
        loaded, name = cluster, cluster_name or cluster.name
    else:
        loaded, name = load_cluster(str(cluster)), cluster_name or str(cluster)
    precision, fp8_recipe = check_precision(loaded, precision, fp8_recipe)  # before any measurement
    built, spec = measured_model(model, seq_len=seq_len, image_size=image_size, layers=layers, watch=watch,
                                 precision=precision, attention=attention_kernel(loaded, precision))
    graph = operator_graph(built, optional=operators == "optional", watch=watch) if operators else None
    extra = {key: value for key, value in (("overheads", overheads), ("overlap_slowdown", overlap_slowdown))
             if value is not None}
    if engine != "paraplan":
        extra.update(engine=engine, block=engine_block(built, attention_kernel(loaded, precision)))
    costs = cost_model(spec, loaded, profile=profile, operators=graph, precision=precision, fp8_recipe=fp8_recipe,
                       fp8_param_gather=fp8_param_gather, **extra)
    if engine != "paraplan":
        costs = replace(costs, source=f"{costs.source}, priced as {engine} runs the model")
    # the simulator refuses TP where the runtime cannot run it: for plans simulated (`paraplan
    # simulate`) as for plans made
    tensor_parallel = tensor_parallel_layers(built, loaded, precision)
    costs = replace(costs, tensor_parallel=tensor_parallel)
    request = None
    if batch is not None:
        request = plan_request(costs, model_name=built.ref, cluster_name=name, batch=batch, memory=memory,
                               stages=stages, micro_batches=micro_batches, schedule=schedule,
                               exact_stages=exact_stages, options=options, headroom=headroom,
                               sequence_parallel=sequence_parallel_layers(built, loaded, precision),
                               tensor_parallel=tensor_parallel)
    return Workload(built=built, spec=spec, cluster=loaded, costs=costs, operators=graph, request=request)
