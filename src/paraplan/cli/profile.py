"""`paraplan profile` (layers, or with --operators every operator of an iteration) and
`paraplan profile-links`: the commands that measure this machine's compute and links."""

from __future__ import annotations

import json

from paraplan.cli.args import JSON_HELP, LAYERS_HELP, MODEL_HELP, add_sizes, check_output, parse_sizes
from paraplan.cli.ui import progress_task
from paraplan.errors import ParaplanError, require_positive
from paraplan.models.failures import PROFILE_ADVICE, model_step


def add_profile(sub) -> None:
    p = sub.add_parser("profile", help="measure every layer's forward and backward time at several batch sizes")
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument("--module", default=None, help="the same as the model argument (kept for older scripts)")
    p.add_argument("--layers", default=None, help=LAYERS_HELP)
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", help="micro-batch sizes to time, comma-separated")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run the layers")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 gives stable medians)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per layer and size (the median is kept)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    add_sizes(p)
    p.add_argument("--no-checks", action="store_true", help="skip the step and repeatability checks")
    p.add_argument("--out", default="profile.json", help="write the profile JSON here")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--operators", action="store_true",
                   help="time every operator of one training iteration (FD-DPS planners) instead of the layers; "
                        "--batch-sizes gives the two batches of the affine fit (default 2,4)")
    p.set_defaults(func=run)


def add_profile_links(sub) -> None:
    p = sub.add_parser("profile-links", help="measure send/recv and all-reduce between real processes")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="torch.distributed backend")
    p.add_argument("--nproc", type=int, default=2, help="processes to start")
    p.add_argument("--max-bytes", type=int, default=256 * 2**20, help="largest message, in bytes")
    p.add_argument("--cluster", default="local", help="the cluster whose links are replaced")
    p.add_argument("--out", default="cluster.toml", help="write the measured cluster file here")
    p.add_argument("--json", action="store_true", help="print JSON (schema paraplan.profile-links/1) instead of a table")
    p.set_defaults(func=run_links)


def run(args) -> int:
    import torch

    from paraplan.profiling.profile_file import write_profile
    from paraplan.profiling.profiler import (
        allocator_error,
        check_batches_fit,
        out_of_memory,
        run_profile,
        workload,
    )
    from paraplan.report.tables import console, profile_report

    sizes = parse_sizes(args.batch_sizes)
    require_positive(args.threads, "--threads")
    require_positive(args.repeats, "--repeats")
    if args.warmup < 0:
        raise ParaplanError(f"--warmup must not be negative, got {args.warmup}")
    check_output("--out", args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ParaplanError("--device cuda: no GPU is visible on this machine")
    if (args.model is None) == (args.module is None):
        raise ParaplanError("give one model: a zoo name, hf:TYPE?key=value or path/to/file.py:build_fn "
                            "(--module is the same as the model argument)")
    device = torch.device(args.device)
    reference, layers = args.model or args.module, getattr(args, "layers", None)
    if args.operators:
        return _operator_profile(args, device, sizes)
    # the largest batch against the memory available, before real weights and batches are allocated
    check_batches_fit(reference, device, sizes, seq_len=args.seq_len, image_size=args.image_size, layers=layers)
    steps = (args.warmup + args.repeats) * len(sizes)
    with model_step(reference, f"profiling it on {device}", PROFILE_ADVICE):  # any other failure: one line
        try:
            work = workload(reference, device, seq_len=args.seq_len, image_size=args.image_size, layers=layers)
            with progress_task(f"profiling {work.name} on {device}", steps) as advance:
                profile = run_profile(work, device, sizes, args.threads, args.warmup, args.repeats,
                                      step_check=not args.no_checks, repeat_check=not args.no_checks,
                                      progress=advance)
        except (RuntimeError, MemoryError) as exc:  # the estimate is a floor: the allocator may still refuse
            if not out_of_memory(exc):
                raise
            raise allocator_error(exc, f"profiling at batch sizes up to {max(sizes):,}") from None
    write_profile(profile, args.out)
    if args.json:
        from paraplan.profiling.profile_file import profile_to_dict

        print(json.dumps(profile_to_dict(profile), indent=1))
    else:
        for renderable in profile_report(profile):
            console().print(renderable)
        console().print(f"profile written to {args.out}")
    return 0


def _operator_profile(args, device, sizes) -> int:
    """Time every operator of one training iteration (profiling/operators.py) at two batches."""
    import platform

    from paraplan.models import source
    from paraplan.profiling.operator_file import operator_profile_to_dict, write_operator_profile
    from paraplan.profiling.operators import profile_operators
    from paraplan.profiling.profiler import allocator_error, check_batches_fit, out_of_memory
    from paraplan.report.tables import console

    batches = (2, 4) if args.batch_sizes == "1,2,4,8,16,32,64" else tuple(sizes)
    if len(batches) != 2 or batches[0] >= batches[1]:
        raise ParaplanError(f"--batch-sizes: --operators fits a line through two batches, e.g. 2,4; got {args.batch_sizes}")
    built = source.build(args.model or args.module, device="meta", seq_len=args.seq_len, image_size=args.image_size,
                         layers=getattr(args, "layers", None))
    check_batches_fit(args.model or args.module, device, batches, seq_len=args.seq_len, image_size=args.image_size,
                      layers=getattr(args, "layers", None))
    with model_step(built.ref, f"timing its operators on {device}", PROFILE_ADVICE):
        try:
            with progress_task(f"timing the operators of {built.name} on {device}", None) as advance:
                times = profile_operators(built, batches, device, repeats=args.repeats, threads=args.threads,
                                          progress=advance)
        except (RuntimeError, MemoryError) as exc:
            if not out_of_memory(exc):
                raise
            raise allocator_error(exc, f"timing operators at batch {batches[1]:,}") from None
    name = platform.processor() or platform.machine() if device.type == "cpu" else __import__("torch").cuda.get_device_name()
    data = operator_profile_to_dict(times, device_name=name, threads=args.threads, repeats=args.repeats)
    write_operator_profile(data, args.out)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        total = [sum(a.fixed + a.per_sample * b for a in times.seconds.values()) for b in batches]
        console().print(f"{len(times.seconds)} operators of {built.ref} timed on {device} ({times.distinct_calls} "
                        f"distinct kernels): one iteration {total[0] * 1e3:.2f} ms at batch {batches[0]}, "
                        f"{total[1] * 1e3:.2f} ms at batch {batches[1]}"
                        + (f"; {len(times.unmeasured)} could not be timed (priced 0)" if times.unmeasured else "")
                        + f"; profile written to {args.out}")
    return 0


def run_links(args) -> int:
    from dataclasses import replace

    from paraplan.hardware import load_cluster
    from paraplan.hardware.cluster import Cluster, LinkSpec
    from paraplan.hardware.cluster_write import write_cluster_file
    from paraplan.profiling.links import profile_links
    from paraplan.report.tables import console, links_report

    check_output("--out", args.out)
    base = load_cluster(args.cluster)
    with console(stderr=True).status(f"measuring {args.backend} links between {args.nproc} processes"):
        links = profile_links(args.backend, args.nproc, args.max_bytes)
    measured = LinkSpec(bandwidth_bytes_per_s=links.p2p.bandwidth_bytes_per_s, latency_s=links.p2p.latency_s)
    nodes = tuple(replace(n, intra_link=measured, network=measured if len(base.nodes) == 1 else n.network)
                  for n in base.nodes)
    cluster = Cluster(name=f"{base.name}-measured", nodes=nodes,
                      description=f"{base.description}; links measured by paraplan profile-links ({args.backend}, "
                                  f"{args.nproc} processes): alpha {links.p2p.latency_s * 1e6:.1f} us, "
                                  f"beta {links.p2p.bandwidth_bytes_per_s / 1e9:.3f} GB/s")
    write_cluster_file(cluster, args.out)
    if getattr(args, "json", False):
        from dataclasses import asdict

        print(json.dumps({"schema": "paraplan.profile-links/1", "out": args.out, "backend": args.backend,
                          "nproc": args.nproc, **{k: v for k, v in asdict(links).items()}}, indent=2))
        return 0
    console().print(links_report(links))
    console().print(f"cluster written to {args.out}")
    return 0
