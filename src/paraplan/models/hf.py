"""Build a transformers model from a config (`hf:` references) with random weights, no download.

`hf:qwen2?num_hidden_layers=4&hidden_size=64` makes `AutoConfig.for_model("qwen2", ...)`;
`hf:path/config.json?...` reads the file (its `model_type` picks the class) and applies the
overrides. The head is chosen by what transformers offers for the model type, in this order:
causal LM, sequence-to-sequence LM, masked LM, image classification; the input (tokens or an
image) follows from the head and the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from paraplan.errors import FieldError
from paraplan.models.ref import ModelRef
from paraplan.models.spec import InputSpec

# The decomposition adapters written for a structure (models/adapters.py), chosen by the config's
# model_type: T5's two stacks, Swin's resolutions, ResNet's stages and the families the zoo
# already cut by hand. Any other model type is cut generically (models/hf_cut.py).
ADAPTED_TYPES = {"gpt2": "gpt2", "llama": "llama", "bert": "bert", "vit": "vit", "swin": "swin",
                 "resnet": "resnet", "t5": "t5"}
DEFAULT_SEQ_LEN = 512


def _config(ref: ModelRef):
    from transformers import CONFIG_MAPPING, AutoConfig

    overrides = ref.config_overrides
    target = ref.target
    if target.endswith(".json") or "/" in target:
        path = Path(target)
        if path.is_dir() and (path / "config.json").is_file():  # a downloaded model's directory
            path = path / "config.json"
        if not path.is_file() and not target.endswith(".json") and not path.exists():
            raise FieldError("model", _hub_name_help(target))
        if path.is_dir():
            raise FieldError("model", f"hf: the directory {target!r} holds no config.json")
        if not path.is_file():
            raise FieldError("model", f"hf: no such config file {target!r}")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise FieldError("model", f"hf: cannot read {target}: {exc}") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise FieldError("model", f"hf: {target} has no model_type")
        target, data = data.pop("model_type"), {**data, **overrides}
    else:
        data = dict(overrides)
    if target not in CONFIG_MAPPING:
        import difflib

        close = difflib.get_close_matches(target, list(CONFIG_MAPPING.keys()), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise FieldError("model", f"hf: transformers has no model type {target!r}{hint}")
    _check_counts(target, CONFIG_MAPPING[target](), data, overrides)
    try:
        config = AutoConfig.for_model(target, **data)
    except (TypeError, ValueError, *_strict_errors()) as exc:  # one line: strict errors span two
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise FieldError("model", f"hf: bad config for {target}: {detail}") from None
    config.use_cache = False  # training: no key/value cache, and blocks then take no cache object
    return target, config


def _hub_name_help(target: str) -> str:
    """`hf:meta-llama/Llama-3.1-8B` names a model on the Hugging Face hub, which paraplan does not read
    (it plans offline, from shapes): say where configs come from, and the zoo's entry where it has one."""
    from paraplan.models import zoo

    keys = {_plain_name(n): n for n in zoo.names(include_tiny=False)}
    known = keys.get(_plain_name(target.rsplit("/", 1)[-1]))
    zoo_hint = f"; the zoo has its shape as {known} (`paraplan models`)" if known else ""
    return (f"hf: {target!r} is neither a config file nor a directory here: paraplan reads no model hub; give a "
            "local config (hf:path/to/config.json, or the directory holding it) or a model type with overrides "
            f"(hf:llama?num_hidden_layers=32&hidden_size=4096&...){zoo_hint}")


def _plain_name(name: str) -> str:
    """A model's name as the zoo and the hub would both spell it: "Meta-Llama-3.1-8B-Instruct" and
    "llama3.1-8b" are "llama318b" (a fine-tuned variant has its base model's shape); exact, so that
    "gpt2" never stands for "gpt2-xl" nor "Llama-3.2-1B" for "llama3.2-3b"."""
    name = name.lower().removeprefix("meta-")
    for suffix in ("-hf", "-fp8", "-instruct", "-chat", "-base"):
        name = name.removesuffix(suffix)
    return "".join(c for c in name if c.isalnum())


def _strict_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's validation error of typed configs (a float field given 1): newer versions
    raise it from the config's constructor, and it is neither a TypeError nor a ValueError."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _check_counts(target: str, defaults, data: dict, overrides: dict) -> None:
    """A whole number of zero or below where the config's default is a positive whole number (a
    layer count, a width, a head count, a vocabulary: a size or a count) is an error naming the
    key. transformers accepts n_layer=-3 and builds range(-3): no blocks at all. The rule reads the
    default, so it covers every model type's own names without a list of them; ids and indices,
    whose 0 is a value like any other, are left alone."""
    for key, value in data.items():
        if key.endswith(("_id", "_ids", "_idx", "_index")):  # token ids and indices: 0 is one (bos_token_id=0)
            continue
        default = getattr(defaults, key, None)
        if (isinstance(value, int) and not isinstance(value, bool) and value <= 0
                and isinstance(default, int) and not isinstance(default, bool) and default > 0):
            where = "" if key in overrides else " (in the config file)"
            raise FieldError("model", f"hf:{target}: {key} must be a positive whole number{where}, got {value} "
                                      f"(its default is {default})")


# Building a model on the meta device costs about 60 KiB and 1.8 ms of CPU per transformer block
# (measured here: GPT-2 with 4,000 blocks), so n_layer=10**9 would take ~56 TiB and three weeks before
# anything could refuse it. The largest published models have a few hundred blocks.
MAX_BLOCKS = 100_000


def _check_layer_count(model_type: str, config) -> None:
    """One line, before anything is built, for a config whose blocks could not be built."""
    def whole(value) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    # num_layers is num_hidden_layers' alias in some configs (T5's): one or the other, and the decoder's
    total = (whole(getattr(config, "num_hidden_layers", None)) or whole(getattr(config, "num_layers", None))) \
        + whole(getattr(config, "num_decoder_layers", None))
    depths = getattr(config, "depths", None)
    if isinstance(depths, (list, tuple)):
        total += sum(d for d in depths if isinstance(d, int) and d > 0)
    if total > MAX_BLOCKS:
        raise FieldError("model", f"hf: {model_type} with {total:,} blocks: building it would take about "
                                  f"{total * 60 / 2**30:,.0f} TiB and {total * 1.8e-3 / 3600:,.0f} hours on the meta "
                                  f"device; paraplan builds models of up to {MAX_BLOCKS:,} blocks")


def _head_class(model_type: str):
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageClassification,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
    )
    from transformers.models.auto import modeling_auto as auto

    for names, cls, kind in ((auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, AutoModelForCausalLM, "tokens"),
                             (auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, AutoModelForSeq2SeqLM, "seq2seq"),
                             (auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, AutoModelForMaskedLM, "tokens"),
                             (auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, AutoModelForImageClassification,
                              "image")):
        if model_type in names:
            return cls, kind
    raise FieldError("model", f"hf: {model_type} has no causal-LM, seq2seq-LM, masked-LM or image-classification "
                              "head in transformers")


def _max_positions(config) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _inputs(config, kind: str, ref: ModelRef) -> InputSpec:
    if kind == "image":
        size = ref.image_size or getattr(config, "image_size", None) or 224
        size = size[0] if isinstance(size, (list, tuple)) else size
        return InputSpec(kind="image", image_size=int(size), channels=int(getattr(config, "num_channels", 3)),
                         num_classes=int(config.num_labels))
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        raise FieldError("model", f"hf: {config.model_type}'s config has no vocab_size")
    limit = _max_positions(config)
    seq = ref.seq_len or min(DEFAULT_SEQ_LEN, limit or DEFAULT_SEQ_LEN)
    if limit is not None and seq > limit:
        raise FieldError("seq_len", f"{seq} is longer than {config.model_type}'s {limit} positions")
    if kind == "seq2seq":
        return InputSpec(kind="seq2seq", seq_len=seq, decoder_seq_len=seq, vocab_size=vocab)
    return InputSpec(kind="tokens", seq_len=seq, vocab_size=vocab)


def build_hf(ref: ModelRef) -> tuple[nn.Module, InputSpec, str]:
    """(model on the current default device, its input, the adapter family or "hf" for generic).

    Call under `torch.device(...)`; the caller seeds the generator.
    """
    if ref.image_size is not None and ref.seq_len is not None:
        raise FieldError("model", "give seq_len or image_size, not both")
    model_type, config = _config(ref)
    _check_layer_count(model_type, config)
    cls, kind = _head_class(model_type)
    inputs = _inputs(config, kind, ref)
    if kind == "image" and "image_size" not in ref.config_overrides and hasattr(config, "image_size"):
        config.image_size = inputs.image_size
    try:
        model = cls.from_config(config)
    except (AssertionError, ValueError, TypeError, RuntimeError) as exc:
        raise FieldError("model", f"hf: transformers cannot build {model_type} from this config: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    from paraplan.models.moe_spec import moe_parts, moe_spec
    from paraplan.models.moe_static import eager_experts, route_statically

    # a mixture of experts: described (its experts and top-k, or one line on what does not add up:
    # DeepSeek-V2's default top-k is None), measured on meta with its experts routed statically
    # (top-k of them per token, models/moe_static.py), trained for real with transformers' eager experts
    try:
        moe_spec(model)
    except ValueError as exc:
        raise FieldError("model", f"hf:{model_type} is a mixture of experts paraplan cannot describe: {exc}") from None
    # by the device the model is built for, not where its parameters are: the runtime builds on the
    # CPU with parameters on meta (runtime/rank/materialize.py), to be given values and really routed
    if torch.empty(()).device.type == "meta":
        route_statically(model)
    else:
        eager_experts(model)
        if ref.capacity_factor is not None:  # the experts drop what is over their capacity (models/moe_capacity.py)
            from paraplan.models.moe_capacity import drop_over_capacity

            drop_over_capacity(model, ref.capacity_factor)
    if ref.capacity_factor is not None and not moe_parts(model):
        raise FieldError("capacity_factor", f"hf:{model_type} has no routed experts to drop tokens from")
    family = ADAPTED_TYPES.get(model_type, "hf")
    if kind == "seq2seq" and family != "t5":
        raise FieldError("model", f"hf: paraplan cuts only T5 among encoder-decoder models, not {model_type}")
    return model, inputs, family

