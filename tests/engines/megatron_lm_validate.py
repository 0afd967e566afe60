"""By hand (Megatron-LM's training code is not on PyPI): Megatron-LM's own argument checks on the
files `paraplan export --to megatron` writes for the engine tests' plans.

    git clone --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM
    .venv/bin/pip install six regex
    .venv/bin/python tests/engines/megatron_lm_validate.py /tmp/Megatron-LM

For each plan: Megatron-LM's `add_megatron_arguments` parses the exported arguments,
`validate_args` checks them at the plan's world size (a Hopper GPU assumed:
`get_device_arch_version` answers 9; the exported environment set), and
`core_transformer_config_from_args` builds the TransformerConfig, each of whose fields is compared
with the exported keyword argument of that name. Run on 2026-11-26 with tag core_v0.16.1: all
nine files valid, every field equal (docs/engines.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import warnings
from pathlib import Path


def exported_files() -> dict[str, dict]:
    import json

    sys.path.insert(0, str(Path(__file__).parent))
    from test_engine_configs import MODEL, make_plan, the_four

    from paraplan.engines import engine_problem, export, model_shape
    from paraplan.plans.plan import LayerStrategy

    shape = model_shape(MODEL)
    plans = dict(the_four(shape))
    plans["uneven-1f1b"] = make_plan(shape, [0, 6, 20, 34], LayerStrategy(), n_micro=8)
    plans["full-recompute-pp"] = make_plan(shape, [0, 17, 34], LayerStrategy(dp=2, recompute="full"))
    plans["sdp"] = make_plan(shape, [0, 34], LayerStrategy(sdp=8), n_micro=1, precision="fp32")
    plans["zero-1-pp"] = make_plan(shape, [0, 17, 34], LayerStrategy(dp=4, zero=1), n_micro=4, precision="fp16")
    plans["selective-tp4"] = make_plan(shape, [0, 34], LayerStrategy(dp=2, tp=4, sequence_parallel=True,
                                                                     recompute="selective"), n_micro=4)
    return {name: json.loads(export(p, "megatron", shape).text) for name, p in plans.items()
            if engine_problem(p, "megatron", shape) is None}


def validate(doc: dict) -> str:
    import megatron.training.arguments as megatron_arguments

    argv = []
    for a in doc["arguments"]:
        flag, eq, value = a.partition("=")
        argv += [flag, value] if eq else [flag]
    if "--position-embedding-type" in argv:
        argv.append("--no-rope-fusion")  # Transformer Engine's fused RoPE is not installed here
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(doc.get("environment", {}))
    if "--use-megatron-fsdp" in argv:
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # Megatron FSDP asserts it is not 1
    parser = megatron_arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    try:
        args = parser.parse_args(argv)
        args.rank, args.world_size = 0, doc["world_size"]
        with contextlib.redirect_stdout(io.StringIO()):
            megatron_arguments.validate_args(args)
        cfg = megatron_arguments.core_transformer_config_from_args(args)
    except BaseException as exc:  # argparse exits, validate_args asserts
        return f"refused: {type(exc).__name__}: {str(exc)[:200]}"
    diffs = []
    for key, value in doc["transformer_config"].items():
        got = getattr(cfg, key)
        if key in ("params_dtype", "pipeline_dtype"):
            got = str(got).replace("torch.", "")
        elif key == "activation_func":
            got = got.__name__
        elif key == "pipeline_model_parallel_layout":
            got = value if got is not None else None
        if got != value:
            diffs.append(f"{key}: exported {value!r}, Megatron-LM {got!r}")
    return (f"valid (dp {args.data_parallel_size}, vpp {args.virtual_pipeline_model_parallel_size}); "
            + ("; ".join(diffs) or "every field equal"))


def main() -> None:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, sys.argv[1])
    import megatron.training.arguments as megatron_arguments

    megatron_arguments.get_device_arch_version = lambda: 9  # the real one asks CUDA
    for name, doc in exported_files().items():
        print(f"{name}: {validate(doc)}")


if __name__ == "__main__":
    main()
