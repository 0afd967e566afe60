"""`paraplan inspect`: a model's layer table (parameters, FLOPs, activations, times on one device)."""

from __future__ import annotations

import json

from paraplan.cli.args import JSON_HELP, LAYERS_HELP, MODEL_HELP, add_sizes
from paraplan.cli.ui import BARS
from paraplan.errors import ParaplanError, require_positive


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="the layer table of a model: params, FLOPs, activations, times")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--layers", default=None, help=LAYERS_HELP)
    p.add_argument("--batch", type=int, default=1, help="micro-batch size for the times")
    p.add_argument("--cluster", default="csimd-v100-10gbe", help="preset name or TOML file (`paraplan clusters`)")
    p.add_argument("--device", type=int, default=0, help="which device of the cluster to time on")
    add_sizes(p)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run)


def run(args) -> int:
    from paraplan.costs.analytic import analytic_costs
    from paraplan.hardware import load_cluster
    from paraplan.report.tables import console, layers_table
    from paraplan.workload import measured_model, size_note

    require_positive(args.batch, "--batch")
    cluster = load_cluster(args.cluster)
    if not 0 <= args.device < cluster.n_devices:
        raise ParaplanError(f"--device: {cluster.name} has devices 0..{cluster.n_devices - 1}, got {args.device}")
    built, spec = measured_model(args.model, seq_len=args.seq_len, image_size=args.image_size, layers=args.layers,
                                 watch=BARS)
    other = 1 if cluster.n_devices > 1 else 0
    link = cluster.link(args.device, (args.device + other) % cluster.n_devices) if other else cluster.nodes[0].intra_link
    device = cluster.device(args.device)
    costs = analytic_costs(spec, device, link)
    if args.json:
        fwd, bwd, send_f, send_b = costs.arrays(args.batch)
        print(json.dumps({
            "model": spec.name, "family": spec.family, "parameters": spec.param_count, "batch": args.batch,
            "cluster": cluster.name, "device": device.name, "inputs": spec.inputs.describe(),
            "input_note": size_note(built, seq_len=args.seq_len, image_size=args.image_size),
            "layers": [{"index": layer.index, "name": layer.name, "kind": layer.kind, "parameters": layer.param_count,
                        "param_bytes": layer.param_bytes, "shared_param_bytes": layer.shared_param_bytes,
                        "forward_flops_per_sample": layer.forward_flops.per_sample,
                        "backward_flops_per_sample": layer.backward_flops.per_sample,
                        "output_bytes_per_sample": layer.output_bytes.per_sample,
                        "saved_bytes_per_sample": layer.saved_bytes.per_sample,
                        "forward_s": float(fwd[i]), "backward_s": float(bwd[i]),
                        "send_forward_s": float(send_f[i]), "send_backward_s": float(send_b[i])}
                       for i, layer in enumerate(spec.layers)],
        }, indent=2))
    else:
        console().print(layers_table(spec, costs, args.batch, f"{device.name} ({cluster.name})"))
        console().print(f"input: {size_note(built, seq_len=args.seq_len, image_size=args.image_size)}")
    return 0
