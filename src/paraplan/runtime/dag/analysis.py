"""An FD-DPS placement ('dag' plan) on the traced program (dag/program.py): what every rank runs, in
the plan's order, which storage versions cross between ranks, and what is refused (one line each:
names that do not resolve or cover the graph once, a backward away from its forward's device, a
split forward whose backward is not split alike, a device order that overwrites a storage before
an older version's read).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.models.op_record import BATCH_OPERAND
from paraplan.models.op_split import GATHER, PART, split_degrees
from paraplan.runtime.dag.program import EXTERNAL, Call, DagRefusal, Program

# --- the plan on the program --------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One forward step of a rank: call `call` whole (part = -1), or part `part` of `degree`, or
    the gather of its parts (part = -2)."""

    call: int
    part: int = -1
    degree: int = 1


@dataclass
class RankWork:
    items: list[Item]
    recvs: dict[tuple[int, int], tuple[int, int]]  # (storage, version) -> (source rank, tag)
    sends: dict[int, list[tuple[int, int, int]]]  # call -> [(storage, destination, tag)]
    part_sends: dict[tuple[int, int], tuple[int, int]]  # (call, part) -> (gather rank, tag)
    part_recvs: dict[tuple[int, int], tuple[int, int]]  # (call, part) -> (part rank, tag)
    uses: set[int]  # storages of parameters this rank reads


@dataclass
class Analysis:
    program: Program
    world: int
    work: list[RankWork]
    writer_rank: dict[int, int]  # computing call -> the rank holding its outputs (the gather's for a split)
    loss_rank: int
    param_users: dict[str, list[int]]  # parameter name -> ranks that read it


def _placement(plan) -> dict[str, tuple[int, int]]:
    where = {}
    for p in plan.operators:
        for pos, name in enumerate(p.ops):
            if name in where:
                raise DagRefusal(f"operator {name} is placed twice")
            where[name] = (p.device, pos)
    return where


def _base(name: str) -> str:
    for marker in (GATHER,):
        if name.endswith(marker):
            return name[: -len(marker)]
    head, sep, tail = name.rpartition(PART)
    return head if sep and tail.isdigit() else name


def check_colocation(names, forward_of, where: dict[str, tuple[int, int]]) -> str | None:
    """The runnable constraint: every backward node that belongs to a forward op runs on that
    op's device; a split forward's backward is split alike, part k with part k. None if kept."""
    degrees = split_degrees(where)
    for b, f in enumerate(forward_of):
        if f < 0:
            continue
        bname, fname = names[b], names[f]
        db, df = degrees.get(bname, 1), degrees.get(fname, 1)
        if db != df:
            return (f"backward {bname} is split in {db} but its forward {fname} in {df}: "
                    "plan with runnable=true")
        pairs = [(bname, fname)] if db == 1 else [(f"{bname}{PART}{k}", f"{fname}{PART}{k}") for k in range(db)]
        for bn, fn in pairs:
            if bn in where and fn in where and where[bn][0] != where[fn][0]:
                return (f"backward {bn} placed on device {where[bn][0]} but its forward {fn} on device "
                        f"{where[fn][0]}: plan with runnable=true")
    return None


def _check_order(work: list[RankWork], writer_rank: dict[int, int], calls: list[Call], names) -> None:
    """Every device order must run: each item after the writers of what it reads and (a gather)
    after its parts, on any rank (Kahn's algorithm over the items; a cycle would hang the ranks)."""
    position = {(r, it): i for r, w in enumerate(work) for i, it in enumerate(w.items)}
    item_of: dict[tuple[int, int], tuple[int, Item]] = {}  # (call, part) -> (rank, item)
    for (r, it) in position:
        item_of[(it.call, it.part)] = (r, it)
    deps: dict[tuple[int, Item], list[tuple[int, Item]]] = {}
    for (r, it), i in position.items():
        before = [(r, work[r].items[i - 1])] if i else []
        if it.part == -2:
            before += [item_of[(it.call, k)] for k in range(it.degree)]
        else:
            for v in calls[it.call].need.values():
                if v >= 0 and calls[v].kind == "compute":
                    before.append(item_of[(v, -1)] if (v, -1) in item_of else item_of[(v, -2)])
        deps[(r, it)] = before
    waiting = {x: len(set(d)) for x, d in deps.items()}
    after: dict = {}
    for x, d in deps.items():
        for y in set(d):
            after.setdefault(y, []).append(x)
    ready = [x for x, n in waiting.items() if n == 0]
    done = 0
    while ready:
        x = ready.pop()
        done += 1
        for y in after.get(x, ()):
            waiting[y] -= 1
            if waiting[y] == 0:
                ready.append(y)
    if done < len(deps):
        r, it = min((x for x, n in waiting.items() if n > 0), key=lambda x: (x[0], position[x]))
        raise DagRefusal(f"device {r} runs {names[calls[it.call].node]} before an operator it reads from "
                         "(the device orders do not run)")


def analyse(plan, program: Program) -> Analysis:
    where = _placement(plan)
    names = program.names
    known = set(names)
    for name in where:
        if _base(name) not in known:
            raise DagRefusal(f"operator {name} of the plan is not in the model's operator graph (was the model changed?)")
    degrees = split_degrees(where)
    for i, name in enumerate(names):
        d = degrees.get(name, 0)
        wanted = [name] if not d else [f"{name}{PART}{k}" for k in range(d)] + [f"{name}{GATHER}"]
        missing = [w for w in wanted if w not in where]
        if missing:
            raise DagRefusal(f"operator {missing[0]} is on no device of the plan")
        if d and i in program.node_call:
            call = program.calls[program.node_call[i]]
            fname = call.func.__name__.split(".")[0]
            if fname not in BATCH_OPERAND or call.kind != "compute":
                raise DagRefusal(f"operator {name} is split but it has no batch operand to slice")
    reason = check_colocation(names, program.forward_of, where)
    if reason:
        raise DagRefusal(reason)
    world = max(d for d, _ in where.values()) + 1
    items: list[list[tuple[int, Item]]] = [[] for _ in range(world)]
    writer_rank: dict[int, int] = {}
    for node, ci in program.node_call.items():
        name = names[node]
        d = degrees.get(name, 0)
        if d:
            for k in range(d):
                dev, pos = where[f"{name}{PART}{k}"]
                items[dev].append((pos, Item(ci, k, d)))
            dev, pos = where[f"{name}{GATHER}"]
            items[dev].append((pos, Item(ci, -2, d)))
        else:
            dev, pos = where[name]
            items[dev].append((pos, Item(ci)))
        writer_rank[ci] = dev
    ordered = [[it for _, it in sorted(lst, key=lambda x: x[0])] for lst in items]
    calls = program.calls
    work = [RankWork(ordered[r], {}, {}, {}, {}, set()) for r in range(world)]
    tag = [1]

    def new_tag() -> int:
        # odd: forward, the backward's gradient goes back with tag + 1; a split part's j-th output
        # uses tag + 2j (at most 8 outputs)
        tag[0] += 16
        return tag[0]

    # a deterministic order of transfers: ranks, then their items
    for r in range(world):
        w = work[r]
        needed_later: list[dict[int, int]] = []
        for it in w.items:
            needed_later.append(calls[it.call].need if it.part != -2 else {})
        for pos, it in enumerate(w.items):
            call = calls[it.call]
            if it.part == -2:
                for k in range(it.degree):
                    src = next(dev for dev in range(world) if Item(it.call, k, it.degree) in work[dev].items)
                    if src != r:
                        t = new_tag()
                        w.part_recvs[(it.call, k)] = (src, t)
                        work[src].part_sends[(it.call, k)] = (r, t)
            else:
                for sk, v in call.need.items():
                    if sk in program.param_storages:
                        w.uses.add(sk)
                    if v >= 0 and calls[v].kind == "compute" and writer_rank[v] != r and (sk, v) not in w.recvs:
                        t = new_tag()
                        src = writer_rank[v]
                        w.recvs[(sk, v)] = (src, t)
                        work[src].sends.setdefault(v, []).append((sk, r, t))
            if it.part in (-1, -2):
                for sk, new in call.writes.items():
                    if not new:  # an in-place write: no later read on this rank may want the old version
                        old = call.need.get(sk, EXTERNAL)
                        for later in needed_later[pos + 1:]:
                            if later.get(sk) == old:
                                raise DagRefusal(f"device {r} overwrites the tensor {names[call.node]} writes in place "
                                                 "before another of its operators reads the older value")
    _check_order(work, writer_rank, calls, names)
    users: dict[str, list[int]] = {}
    for sk, pname in program.param_storages.items():
        users[pname] = [r for r in range(world) if sk in work[r].uses]
    loss_tid, loss_v = program.loss
    if loss_v < 0 or calls[loss_v].kind != "compute":
        raise DagRefusal("the loss is not computed by an operator of the plan")
    return Analysis(program, world, work, writer_rank, writer_rank[loss_v], users)
