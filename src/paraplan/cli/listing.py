"""`paraplan models` and `paraplan clusters`: what there is to plan with."""

from __future__ import annotations

import json

from paraplan.cli.args import JSON_HELP
from paraplan.cli.ui import progress_task


def add_models(sub) -> None:
    p = sub.add_parser("models", help="the model zoo with parameter counts")
    p.add_argument("--no-tiny", action="store_true", help="leave out the tiny CPU variants")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run_models)


def add_clusters(sub) -> None:
    p = sub.add_parser("clusters", help="the cluster presets")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run_clusters)


def run_models(args) -> int:
    from paraplan.models import source, zoo
    from paraplan.report.tables import console, models_table

    rows = []
    names = zoo.names(include_tiny=not args.no_tiny)
    with progress_task("building on meta", len(names)) as advance:
        for name in names:
            built = source.build(name, device="meta")  # a mixture of experts' entry: its transformers config
            params = sum(p.numel() for p in built.module.parameters())
            rows.append((name, built.family, params, len(built.layers()), _size(built.inputs), zoo.entry(name).source))
            advance()
    if args.json:
        print(json.dumps([{"model": r[0], "family": r[1], "parameters": r[2], "layers": r[3], "size": r[4],
                           "source": r[5]} for r in rows], indent=2))
    else:
        console().print(models_table(rows))
    return 0


def _size(inputs) -> str:
    """What a zoo entry is planned at unless told otherwise: its sequence length (seq2seq: encoder /
    decoder) or image size (`--seq-len` / `--image-size` change it)."""
    if inputs.kind == "image":
        return f"{inputs.image_size}x{inputs.image_size}"
    if inputs.kind == "seq2seq":
        return f"{inputs.seq_len}/{inputs.decoder_seq_len}"
    return str(inputs.seq_len) if inputs.seq_len else "-"


def run_clusters(args) -> int:
    from paraplan.hardware import load_cluster, preset_names
    from paraplan.report.tables import clusters_table, console

    clusters = [load_cluster(n) for n in preset_names()]
    if args.json:
        from paraplan.hardware.cluster_write import cluster_to_dict

        print(json.dumps([cluster_to_dict(c) for c in clusters], indent=2))
    else:
        console().print(clusters_table(clusters))
    return 0
