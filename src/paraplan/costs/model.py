"""The cost model a simulation uses: a model, a cluster and where compute times come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from paraplan.costs.analytic import analytic_costs
from paraplan.costs.engine_memory import engine_activations
from paraplan.costs.engine_profile import BlockShape, engine_profile
from paraplan.costs.fp8_linear import saved_input_bytes
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.op_costs import OperatorProfile
from paraplan.costs.profile import Profile, profile_costs
from paraplan.costs.timefn import LayerCosts
from paraplan.errors import ParaplanError
from paraplan.hardware.cluster import Cluster, DeviceSpec, RuntimeOverheads  # noqa: F401  (re-exported)
from paraplan.models.opspec import OpGraph
from paraplan.models.spec import ModelSpec

NO_OVERHEADS = RuntimeOverheads()


@dataclass(frozen=True, eq=False)
class CostModel:
    """Compute time functions per device type (analytic or measured), links from the cluster.

    `compute_costs(device_spec)` returns the LayerCosts of that device type; only its forward and
    backward functions are used here, transfers are priced from bytes and the actual link.
    """

    model: ModelSpec
    cluster: Cluster
    compute_costs: Callable[[DeviceSpec], LayerCosts]
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    overlap_slowdown: float = 1.0  # compute and communication overlapping on one device (Galvatron: 1.3)
    source: str = "analytic"
    overheads: RuntimeOverheads = NO_OVERHEADS
    # the model at operator granularity (FD-DPS and the operator-graph planners; 'dag' plans), built
    # by models/op_trace.py; None where only layers are needed
    operators: OpGraph | None = None
    operator_profile: OperatorProfile | None = None  # measured operator times (else the device model)
    # what the plans train in (precision.py): the devices' peak in that dtype, activations and what
    # crosses links at its element size (the model in its compute dtype: `analytic_cost_model`),
    # the low-precision weight copies in memory (MemoryConfig.for_precision)
    precision: str = "fp32"
    # the (layer, tp degree) pairs paraplan's runtime runs tensor parallel (PlanRequest.tensor_parallel,
    # from runtime/layers/tensor_parallel.py); a plan with TP elsewhere is not runnable, and its prediction
    # says so (simulator/predict.py). None: TP anywhere (the zoo's models in fp32, the papers' setting)
    tensor_parallel: frozenset | None = None
    # the engine whose implementation prices the plan (costs/engine_profile.py): paraplan's own runtime
    # unless the plan is priced for the engine it is exported to
    engine: str = "paraplan"
    # an fp8 plan's scaling recipe (precision.py FP8_RECIPES; costs/fp8_linear.py); "" for other precisions
    fp8_recipe: str = ""
    # an fp8 plan's parameters gathered in FP8 (Plan.fp8_param_gather): the blocks' all-gathers at 1
    # byte a parameter (LayerSpec.gathered_element_bytes), Transformer Engine's FP8 weight the parameter
    fp8_param_gather: bool = False
    # device type -> LayerCosts; not an init field, so dataclasses.replace() starts a fresh one
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        from paraplan.precision import element_bytes, fp8_param_gather_problem, fp8_recipe_problem

        problem = (fp8_recipe_problem(self.precision, self.fp8_recipe)
                   or fp8_param_gather_problem(self.precision, self.fp8_param_gather))
        if problem:
            raise ValueError(problem)
        self.cluster.check_precision(self.precision, self.fp8_recipe)  # a device without the dtype: one line
        if self.model.compute_dtype_bytes != element_bytes(self.precision):
            raise ValueError(f"the model computes in {self.model.compute_dtype_bytes}-byte activations, a {self.precision} "
                             "cost model needs model.in_compute_dtype(element_bytes(precision))")
        object.__setattr__(self, "memory", self.memory.for_precision(self.precision).for_engine(
            self.engine, self.precision, self.fp8_param_gather))
        # A calibrated cluster carries the runtime's measured overheads: used unless the caller
        # gives its own (train --compare --overheads FILE)
        if self.overheads is NO_OVERHEADS and self.cluster.overheads is not None:
            object.__setattr__(self, "overheads", self.cluster.overheads)
        # One memory rule for every caller (planners, the simulator): on a cluster of CPUs the
        # CUDA-only terms (context, caching allocator) go (MemoryConfig.for_device_kind)
        kinds = {slot.spec.name for slot in self.cluster.devices}
        if len(kinds) == 1:
            object.__setattr__(self, "memory", self.memory.for_device_kind(kinds.pop()))

    @property
    def plan_precision(self) -> dict:
        """The Plan fields that say what this cost model prices: `replace(plan, **costs.plan_precision)`."""
        return {"precision": self.precision, "fp8_recipe": self.fp8_recipe, "fp8_param_gather": self.fp8_param_gather}

    def compute(self, device_id: int) -> LayerCosts:
        spec = self.cluster.device(device_id)
        if spec.name not in self._cache:
            self._cache[spec.name] = self.compute_costs(spec.for_precision(self.precision, self.fp8_recipe))
        return self._cache[spec.name]


def analytic_cost_model(model: ModelSpec, cluster: Cluster, precision: str = "fp32", engine: str = "paraplan",
                        block: BlockShape | None = None, fp8_recipe: str = "", fp8_param_gather: bool = False,
                        **kwargs) -> CostModel:
    """The device model's compute at the cluster's peak in `precision`, the activations at its element
    size, as `engine` runs the model (costs/engine_profile.py; `block`: the transformer block's shape,
    which an engine with fused kernels or a 16-bit residual stream needs to price them)."""
    from paraplan.precision import element_bytes

    profile = engine_profile(engine)
    model = model.in_compute_dtype(element_bytes(precision))
    if profile.residual_bytes is not None and block is not None:
        model = residual_stream_in(model, profile.residual_bytes)
        fp8_inputs = saved_input_bytes(engine, fp8_recipe) if fp8_recipe else None
        model = engine_activations(model, block, profile, profile.residual_bytes, linear_input_bytes=fp8_inputs)
    if fp8_param_gather:  # the blocks' weights gathered in FP8 (their linears' weights: the parameters)
        model = replace(model, layers=tuple(replace(x, gathered_element_bytes=1) if x.kind == "block" else x
                                            for x in model.layers))
    link = cluster.nodes[0].intra_link  # unused for compute; transfers use cluster.link(a, b)
    return CostModel(model, cluster, lambda spec: analytic_costs(model, spec, link, profile, block, fp8_recipe),
                     precision=precision, engine=engine, fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather,
                     **kwargs)


def residual_stream_in(model: ModelSpec, element_bytes: int) -> ModelSpec:
    """The model with its residual stream (what the embedding and every block output, and its
    gradient: TP collectives and pipeline sends move these) at `element_bytes` per element, where
    the measurement kept it in another dtype (autocast keeps fp32: LayerSpec.output_element_bytes)."""
    layers = []
    for layer in model.layers:
        measured = layer.output_element_bytes
        if layer.kind in ("embedding", "block") and measured and measured != element_bytes:
            factor = element_bytes / measured
            layer = replace(layer, output_bytes=layer.output_bytes.scaled(factor),
                            output_grad_bytes=layer.output_grad_bytes.scaled(factor), output_element_bytes=element_bytes)
        layers.append(layer)
    return replace(model, layers=tuple(layers))


def profile_cost_model(model: ModelSpec, cluster: Cluster, profile: Profile, **kwargs) -> CostModel:
    """Measured compute times for every device of the cluster (the profile's device stands for
    all of them); transfers still priced from the cluster's links. Profiles are measured in fp32
    (paraplan profile), so they price fp32 plans only."""
    if kwargs.get("precision", "fp32") != "fp32":
        raise ParaplanError(f"a layer profile is measured in fp32 and prices fp32 plans; plan in fp32 with it, or in "
                            f"{kwargs['precision']} without it (analytic compute)")
    identity = model.ref or model.name
    if profile.model != identity:
        raise ParaplanError(f"the profile was measured for {profile.model!r}, not {identity!r}; profile this model "
                            "(paraplan profile) or plan the profiled one")
    if len(profile.layers) != model.n_layers:
        raise ParaplanError(f"profile of {profile.model!r} has {len(profile.layers)} layers, "
                            f"model {model.name!r} has {model.n_layers}")
    for i, (measured, layer) in enumerate(zip(profile.layers, model.layers, strict=True)):
        if measured.name != layer.name:
            raise ParaplanError(f"profile layer {i} is {measured.name!r}, model layer {i} is {layer.name!r}")
    link = cluster.nodes[0].intra_link
    costs = profile_costs(profile, link)
    return CostModel(model, cluster, lambda spec: costs, source=f"profile:{profile.device_name}", **kwargs)
