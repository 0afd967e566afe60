"""What a user asks a planner for, validated once: `PlanRequest`.

Every planner receives the same frozen, keyword-only request and a judge (Plan -> Prediction, the
simulator, given by the registry), and returns a Plan. Errors name the request's field
(`stages`, `micro_batches`, `options.eta`, ...), never a command-line flag: the CLI maps fields to
its flags (`FieldError.field`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from paraplan.costs.model import CostModel
from paraplan.errors import FieldError
from paraplan.planners.divisors import choices_near, divisors  # noqa: F401  (divisors: the planners' import)
from paraplan.plans.plan import Plan, Prediction, Schedule

Judge = Callable[[Plan], Prediction]  # the one yardstick (simulator/predict.py), passed in by the registry


BEST_SCHEDULE = "best"  # a request for the planner to choose the schedule as well


# the share of each device's memory a plan leaves unplanned by default (`paraplan plan --headroom`):
# a planning margin for the memory model's own error, not a second fragmentation term (the
# allocator's share is counted in costs/memory_config.py). Its size is that error where it was
# checked on runs it was not fitted to: torchtitan's Llama 3.1 8B Tables 1 and 3, predicted 4.7% and
# 3.7% under the published peaks (docs/published-runs.md); without it a winner was planned to the
# last byte (79.94 of 80 GiB) and ran or failed on that error
DEFAULT_HEADROOM = 0.05


def resolve_kinds(cluster, budgets) -> tuple[tuple[str, int], ...]:
    """Each (kind, bytes) with its kind as the cluster names the device type: the name itself, or the
    one type it is a prefix of ('a100' for 'a100-40gb'); one line naming the types otherwise."""
    types = list(cluster.device_types())
    out: dict[str, int] = {}
    for kind, nbytes in budgets:
        matches = [t for t in types if t == kind] or [t for t in types if t.lower().startswith(kind.lower())]
        if len(matches) != 1:
            why = "names none" if not matches else f"names {len(matches)} ({', '.join(matches)})"
            raise FieldError("memory_by_kind", f"device type {kind!r} {why} of {cluster.name}'s device types: "
                                             f"{', '.join(types)}")
        if matches[0] in out:
            raise FieldError("memory_by_kind", f"device type {matches[0]} has two budgets")
        out[matches[0]] = nbytes
    return tuple(out.items())


# The cost model a request's memory limits were applied to, per cost model they made, and the one
# they made from each, per limits (both weakly held). A request replaced with other options or another
# batch (dataclasses.replace runs __post_init__ again) keeps its limits applied once, not again (a
# 5% headroom had become 9.75% in Galvatron's searches in a comparison, and less at every batch
# tried), and keeps the same cost model object, which searches' caches are keyed by
# (planners/galvatron/searcher.py `_shared`, planners/registry.py `_JUDGED`)
# (the origin is held while what it made lives: a request kept after its workload is dropped)
_LIMITED_FROM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # made -> from
_LIMITED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # from -> {limits: ref(made)}


def limited_costs(costs: CostModel, memory_bytes: int | None, memory_by_kind: tuple, headroom: float) -> CostModel:
    """`costs` with a request's memory limits applied to its cluster: a budget per device (or per
    device type), then the headroom's share taken off. Given a cost model these limits made, they are
    applied to the one it was made from, not to it again."""
    limits = (memory_bytes, memory_by_kind, headroom)
    costs = _LIMITED_FROM.get(costs, costs)
    made = _LIMITED.setdefault(costs, {}).get(limits)
    if made is not None and made() is not None:
        return made()
    cluster = costs.cluster
    if memory_bytes is not None:
        cluster = cluster.with_memory(memory_bytes)
    if memory_by_kind:
        cluster = cluster.with_memory_of_kinds(dict(memory_by_kind))
    if headroom:
        cluster = cluster.with_memory_scaled(1 - headroom)
    if cluster is costs.cluster:
        return costs
    out = replace(costs, cluster=cluster)
    _LIMITED[costs][limits] = weakref.ref(out)
    _LIMITED_FROM[out] = costs
    return out


def with_operator_graph(request: PlanRequest, graph) -> PlanRequest:
    """The request with its cost model's operator graph set (traced after the request was made:
    planners/auto.py), the memory limits applied once to the cost model they were made from."""
    origin = _LIMITED_FROM.get(request.costs, request.costs)
    return replace(request, costs=replace(origin, operators=graph))


def cost_model_cache(store: dict, costs: CostModel) -> dict:
    """`store`'s entries for `costs`, emptied when another cost model is asked for: a process-wide cache
    that holds one cost model's results at a time (the model held, so its id stays its own), for the
    searches and judgements that planners in one process share (planners/galvatron/searcher.py,
    planners/registry.py)."""
    if store.get("costs") is not costs:
        store.clear()
        store["costs"], store["entries"] = costs, {}
    return store["entries"]


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """One planning problem: a model and a cluster (with their costs), a batch, and limits.

    `costs` carries the model (ModelSpec), the cluster, where compute times come from (analytic or
    a measured profile) and the memory accounting; `model_name` and `cluster_name` are what the
    Plan records so that simulate and train rebuild the same world.
    """

    costs: CostModel
    model_name: str
    cluster_name: str
    batch: int  # global batch: samples per iteration over all replicas
    n_stages: int | None = None  # pipeline stages / workers (None: the planner chooses, up to the devices)
    n_micro: int | None = None  # micro-batches per replica (None: the planner chooses)
    # None: the planner's own; BEST_SCHEDULE ("best"): the planner searches the schedule kinds and
    # chunk counts too (planners/schedule_search.py), where it can
    schedule: Schedule | str | None = None
    memory_bytes: int | None = None  # a memory budget per device (None: each device's own capacity)
    # a budget per device type, (type, bytes) pairs (`--memory a100=36GiB,v100=28GiB`: a prefix naming
    # one of the cluster's types is resolved to it); the types not named keep their own capacity
    memory_by_kind: tuple[tuple[str, int], ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)  # per-planner knobs (eta, seed, method, ...)
    # use exactly n_stages stages (workers), even where fewer would be faster; without it a planner
    # may use fewer and says why in the plan's SearchInfo.note
    exact_stages: bool = False
    # (layer, tp degree) pairs the runtime runs with Megatron sequence parallelism
    # (runtime/layers/tensor_parallel.sequence_parallel_support, filled by paraplan.workload): the layers a
    # planner may give TP + SP. Empty (a request built without the model's modules): SP not searched.
    sequence_parallel: frozenset = frozenset()
    # (layer, tp degree) pairs the runtime runs tensor parallel (tensor_parallel_support, filled by
    # paraplan.workload in mixed precision); None: not known, every layer may take TP (the papers'
    # fp32 setting, as their systems ran it)
    tensor_parallel: frozenset | None = None
    # the share of each device's memory (of `memory_bytes` where given) left unplanned: plans fit
    # within the rest (DEFAULT_HEADROOM is what `paraplan plan` gives without --memory)
    headroom: float = 0.0

    def __post_init__(self):
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1:
            raise FieldError("batch", f"must be a positive whole number, got {self.batch}")
        n_devices = self.costs.cluster.n_devices
        for field_name, value in (("stages", self.n_stages), ("micro_batches", self.n_micro)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise FieldError(field_name, f"must be a whole number, got {value!r}")
        if self.n_stages is not None:
            if self.n_stages < 1:
                raise FieldError("stages", f"must be positive, got {self.n_stages}")
            if self.n_stages > n_devices:
                raise FieldError("stages", f"{self.n_stages} stages need {self.n_stages} devices; "
                                           f"{self.cluster_name} has {n_devices}")
        if not isinstance(self.exact_stages, bool):
            raise FieldError("exact_stages", f"must be true or false, got {self.exact_stages!r}")
        if self.exact_stages and self.n_stages is None:
            raise FieldError("exact_stages", "needs a stage count (stages) to hold to")
        if self.n_micro is not None:
            if self.n_micro < 1:
                raise FieldError("micro_batches", f"must be positive, got {self.n_micro}")
            if self.batch % self.n_micro:
                raise FieldError("micro_batches", f"{self.n_micro} does not divide the batch {self.batch} "
                                                  f"({choices_near(self.batch, self.n_micro)})")
        if self.schedule is not None and self.schedule != BEST_SCHEDULE:
            try:
                object.__setattr__(self, "schedule", Schedule(self.schedule))
            except ValueError:
                raise FieldError("schedule", f"unknown {self.schedule!r}; expected one of "
                                             f"{', '.join(s.value for s in Schedule)}, {BEST_SCHEDULE}") from None
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise FieldError("memory_bytes", f"must be positive, got {self.memory_bytes}")
        if self.memory_by_kind and self.memory_bytes is not None:
            raise FieldError("memory_by_kind", "one budget for every device or one per device type, not both")
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, int | float) \
                or not 0 <= self.headroom < 1:
            raise FieldError("headroom", f"a share of each device's memory in [0, 1), got {self.headroom!r}")
        if self.memory_by_kind:
            object.__setattr__(self, "memory_by_kind", resolve_kinds(self.costs.cluster, self.memory_by_kind))
        # one memory truth: planners and the judge read capacities from the request's cluster
        object.__setattr__(self, "costs", limited_costs(self.costs, self.memory_bytes, self.memory_by_kind,
                                                        self.headroom))
        object.__setattr__(self, "options", dict(self.options))

    @property
    def n_layers(self) -> int:
        return self.costs.model.n_layers

    @property
    def n_devices(self) -> int:
        return self.costs.cluster.n_devices

    def option(self, name: str, default=None):
        return self.options.get(name, default)


@dataclass(frozen=True)
class OptionSpec:
    """One per-planner option: its default and a check that raises FieldError on a bad value."""

    default: object
    help: str
    check: Callable[[object], None] | None = None


def at_least(name: str, lowest: int) -> Callable[[object], None]:
    def check(value):
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise FieldError(f"options.{name}", f"must be a whole number of at least {lowest}, got {value!r}")
    return check


def whole_number(name: str) -> Callable[[object], None]:
    def check(value):
        if not isinstance(value, int) or isinstance(value, bool):
            raise FieldError(f"options.{name}", f"must be a whole number, got {value!r}")
    return check


def one_of(name: str, choices) -> Callable[[object], None]:
    allowed = [str(c) for c in choices]

    def check(value):
        if str(value) not in allowed:
            raise FieldError(f"options.{name}", f"unknown {value!r}; expected one of {', '.join(allowed)}")
    return check


def validated_options(planner: str, given: Mapping[str, object], specs: Mapping[str, OptionSpec]) -> dict:
    """The planner's options with defaults filled in; an unknown option is an error."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        known = ", ".join(sorted(specs)) or "none"
        raise FieldError(f"options.{unknown[0]}", f"planner {planner!r} has no such option (its options: {known})")
    out = {}
    for name, spec in specs.items():
        value = given.get(name, spec.default)
        if spec.check is not None and name in given:
            spec.check(value)
        out[name] = value
    return out
