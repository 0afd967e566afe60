"""paraplan/workload.py: the one way from a request (model, cluster, costs, batch, limits) to the
built model, its spec, its cost model and the PlanRequest; sizes.py: '16GiB'."""

import pytest

from paraplan.errors import FieldError, ParaplanError
from paraplan.sizes import SizeError, gib_bytes, memory_bytes, size_gib
from paraplan.workload import Watch, cost_model, measured_model, workload


def test_sizes():
    assert size_gib("16GiB") == 16.0 and size_gib("12 GB") == 12.0 and size_gib("512MiB") == 0.5
    assert size_gib("2") == 2.0 and size_gib("1TB") == 1024.0
    for bad in ("abc", "16 parsecs", "0GiB", "9" * 400):
        with pytest.raises(SizeError):
            size_gib(bad)
    assert gib_bytes(1.5) == 3 * 2**29
    assert memory_bytes(None) is None and memory_bytes(123) == 123 and memory_bytes("1GiB") == 2**30
    with pytest.raises(FieldError, match="^memory: expected bytes or a size like 16GiB"):
        memory_bytes("lots")


def test_a_workload_holds_the_model_its_costs_and_the_request():
    w = workload("lenet-5", "local", batch=8, memory="1GiB", stages=1, options={"seed": 3})
    assert w.built.ref == "lenet-5" and w.spec.n_layers == w.costs.model.n_layers and w.operators is None
    assert w.costs.cluster is w.cluster and w.costs.source.startswith("analytic preset")
    r = w.request
    assert (r.model_name, r.cluster_name, r.batch, r.n_stages, r.memory_bytes) == ("lenet-5", "local", 8, 1, 2**30)
    assert dict(r.options) == {"seed": 3}
    assert all(slot.spec.memory_bytes == 2**30 for slot in r.costs.cluster.devices)  # the budget, in the request
    assert workload("lenet-5", w.cluster).request is None  # no batch, no request; a Cluster taken as it is


def test_operators_required_or_optional():
    w = workload("lenet-5", "local", operators="required")
    assert w.operators is not None and w.costs.operators is w.operators
    with pytest.raises(ValueError):
        workload("lenet-5", "local", operators="yes")


def test_the_watch_sees_the_slow_steps():
    seen = []

    class Recording(Watch):
        def progress(self, description, total):
            seen.append((description, total))
            return super().progress(description, total)

    built, spec = measured_model("lenet-5", watch=Recording())
    assert seen == [(f"measuring {built.name} on meta", 2 * len(built.layers()))]
    assert spec == measured_model("lenet-5")[1]


def test_an_operator_profile_of_another_model_is_refused(tmp_path):
    import json

    from paraplan.profiling.operator_file import FORMAT_VERSION, KIND

    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"kind": KIND, "format_version": FORMAT_VERSION, "model": "gpt2-tiny",
                                "device_name": "cpu", "seconds": {}}))
    w = workload("lenet-5", "local")
    with pytest.raises(ParaplanError, match="an operator profile of gpt2-tiny, not lenet-5$"):
        cost_model(w.spec, w.cluster, profile=path)


def test_an_operator_profile_with_a_negative_time_is_refused(tmp_path):
    """Split parts of an operator must never cost less than the whole (planners/bound.py's operator
    family relies on it): a negative fixed time would make them."""
    import json

    from paraplan.profiling.operator_file import FORMAT_VERSION, KIND, read_operator_profile

    path = tmp_path / "ops.json"
    path.write_text(json.dumps({"kind": KIND, "format_version": FORMAT_VERSION, "model": "lenet-5",
                                "device_name": "cpu", "seconds": {"conv1": [-1e-4, 2e-5]}}))
    with pytest.raises(ParaplanError, match=r"seconds\['conv1'\]: expected \[fixed_s, per_sample_s\], two seconds >= 0"):
        read_operator_profile(path)
