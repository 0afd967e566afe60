"""Build any model paraplan can name (models/ref.py): the one entry point for every subcommand.

    build("gpt2-tiny"), build("hf:qwen2?num_hidden_layers=4&hidden_size=64"), build("net.py:make")

On "meta" nothing is allocated; elsewhere parameters are seeded by `seed`. The returned
BuiltModel carries its canonical reference (`built.ref`), which a plan stores so that simulate and
train rebuild the same model with the same sizes and the same cut.
"""

from __future__ import annotations

import torch

from paraplan.errors import FieldError
from paraplan.models import ref as refs
from paraplan.models import zoo
from paraplan.models.built import BuiltModel
from paraplan.models.failures import BUILD_ADVICE, MEASURE_ADVICE, model_step
from paraplan.models.ref import ModelRef

_RECIPES: dict[str, object] = {}  # hf generic cuts by reference text: recording one costs a meta forward


def resolve(reference: str | ModelRef, seq_len: int | None = None, image_size: int | None = None,
            layers: str | None = None) -> ModelRef:
    """The reference with the command line's sizes and block path folded in."""
    ref = refs.parse(reference) if isinstance(reference, str) else reference
    ref = ref.with_settings(seq_len=seq_len, image_size=image_size, layers=layers)
    if ref.kind == refs.ZOO:
        entry = zoo.entry(ref.target)  # unknown names fail here, with close matches
        if ref.layers_path is not None:
            raise FieldError("layers", f"{entry.name} is a zoo model: paraplan already knows how to cut it")
        ref = ModelRef(refs.ZOO, entry.name, ref.settings)
        zoo.with_sizes(entry.inputs, ref.seq_len, ref.image_size)  # checks they apply
    return ref


def build(reference: str | ModelRef, device: str | torch.device = "meta", seed: int = 0,
          seq_len: int | None = None, image_size: int | None = None, layers: str | None = None) -> BuiltModel:
    ref = resolve(reference, seq_len, image_size, layers)
    # a failure inside transformers' or the user's code: one line naming the model and the step
    with model_step(ref.text, f"building it on {torch.device(device).type}", BUILD_ADVICE):
        if ref.kind == refs.ZOO and zoo.entry(ref.target).hf:
            # a mixture of experts by its transformers config (models/zoo.py `_moe`), the zoo name its reference
            torch.manual_seed(seed)
            hf = refs.parse(zoo.entry(ref.target).hf).with_settings(**dict(ref.settings))
            built = _build_hf(hf, device)
            return BuiltModel(ref.target, built.family, built.module, built.inputs, ref=ref.text, recipe=built.recipe)
        if ref.kind == refs.ZOO:
            built = zoo.build(ref.target, device=device, seq_len=ref.seq_len, image_size=ref.image_size, seed=seed)
            return BuiltModel(built.name, built.family, built.module, built.inputs, ref=ref.text)
        torch.manual_seed(seed)
        if ref.kind == refs.HF:
            return _build_hf(ref, device)
        return _build_file(ref, device)


def _build_hf(ref: ModelRef, device) -> BuiltModel:
    from paraplan.models.hf import build_hf

    with zoo.quiet(), torch.device(device):
        module, inputs, family = build_hf(ref)
    recipe = None
    if ref.layers_path is not None:
        family = "hf"  # the user named the blocks: cut generically there
    if family == "hf":
        with model_step(ref.text, "running its forward on the meta device to cut it into layers", MEASURE_ADVICE):
            recipe = _hf_recipe(ref, module if torch.device(device).type == "meta" else None, inputs)
    return BuiltModel(ref.text, family, module, inputs, ref=ref.text, layers_path=ref.layers_path, recipe=recipe)


def _hf_recipe(ref: ModelRef, meta_module, inputs):
    if ref.text in _RECIPES:
        return _RECIPES[ref.text]
    from paraplan.models.hf import build_hf
    from paraplan.models.hf_cut import check_rebuilt, hf_layers, meta_safe_masks, record
    from paraplan.models.inputs import make_batch

    if meta_module is None:
        with zoo.quiet(), torch.device("meta"):
            meta_module = build_hf(ref)[0]
    meta_module.train()
    example, _ = make_batch(inputs, 2, device="meta")
    seen: dict = {}  # the recording forward's block calls and output, for the checks (no forward of their own)
    with zoo.quiet():
        recipe = record(meta_module, example, ref.layers_path, seen)
        check_rebuilt(meta_module, recipe, seen["calls"])
        with torch.no_grad(), meta_safe_masks():
            out = example
            for _, _, layer in hf_layers(meta_module, recipe):
                out = layer(out)
    expected = seen["output"]
    if tuple(out.shape) != tuple(expected.shape):
        raise FieldError("model", f"cannot cut {type(meta_module).__name__} into layers: the cut gives "
                                  f"{tuple(out.shape)}, the model {tuple(expected.shape)}")
    _RECIPES[ref.text] = recipe
    return recipe


def _build_file(ref: ModelRef, device) -> BuiltModel:
    from paraplan.models import user_module
    from paraplan.models.spec import InputSpec

    if ref.seq_len is not None or ref.image_size is not None:
        raise FieldError("model", "a module from a file takes its sizes from its sample batch, not seq_len/image_size")
    with torch.device(device):
        module, inputs, targets = user_module.load(ref)
    spec = InputSpec(kind="sample", description=user_module.describe(inputs, targets))
    return BuiltModel(ref.text, "module", module, spec, ref=ref.text, layers_path=ref.layers_path,
                      sample=(inputs, targets))
