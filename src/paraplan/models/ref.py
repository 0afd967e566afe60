"""A model reference: one string that names any model paraplan can build, in every subcommand.

Three kinds, each with optional `?key=value&...` settings:

    gpt2-tiny                                   a zoo name (`paraplan models`)
    hf:qwen2?num_hidden_layers=4&hidden_size=64 a transformers model type with config overrides
    hf:path/to/config.json?num_hidden_layers=4  a transformers config file, with overrides
    path/to/file.py:build_fn                    a user's function returning (model, sample batch)

Settings that paraplan itself reads (not passed to a transformers config):
    seq_len   the sequence length of language models (the zoo's default otherwise)
    layers    the dotted path of the model's list of repeated blocks, where paraplan cannot find it
    expert_imbalance  a mixture of experts' busiest expert-parallel rank's expert work over the
              average (models/spec.py: DEFAULT_EXPERT_IMBALANCE; 1 for forced balance)
    expert_routing    which experts a mixture of experts' tokens reach, where it changes what crosses the
              network (costs/deepep.py): `uniform` (the default: real routing's expectation, and
              Megatron's forced balance by random logits) or `round-robin` (NeMo Automodel's
              FakeBalancedGate: token t to experts t*k ... t*k + k - 1 mod E)
    capacity_factor   a mixture of experts' expert capacity: each expert takes at most factor x its
              even share of a forward's routed copies, the rest dropped (models/moe_capacity.py);
              without it, dropless
For transformers vision models `image_size` is both a config field and the input size.

The canonical text (`ModelRef.text`) is what a plan stores as its `model`, so `paraplan simulate`
and `paraplan train` rebuild exactly the model the plan was made for. Pure: no torch, no files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, quote

from paraplan.errors import FieldError

ZOO, HF, FILE = "zoo", "hf", "file"
# Settings paraplan reads itself; everything else in an hf: reference goes to the config.
OWN_SETTINGS = ("seq_len", "image_size", "layers", "expert_imbalance", "expert_routing", "capacity_factor")
EXPERT_ROUTINGS = ("uniform", "round-robin")
_FILE_REF = re.compile(r"^(?P<path>.+\.py):(?P<fn>[A-Za-z_][A-Za-z0-9_]*)$")
_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Value = str | int | float | bool | None | list


@dataclass(frozen=True)
class ModelRef:
    kind: str  # zoo | hf | file
    target: str  # zoo name, hf model type or config path, or "path.py:fn"
    settings: tuple[tuple[str, Value], ...] = ()

    def get(self, key: str, default: Value = None) -> Value:
        for k, v in self.settings:
            if k == key:
                return v
        return default

    @property
    def seq_len(self) -> int | None:
        return self.get("seq_len")

    @property
    def image_size(self) -> int | None:
        return self.get("image_size")

    @property
    def layers_path(self) -> str | None:
        return self.get("layers")

    @property
    def capacity_factor(self) -> float | None:
        value = self.get("capacity_factor")
        return None if value is None else float(value)

    @property
    def expert_imbalance(self) -> float | None:
        value = self.get("expert_imbalance")
        return None if value is None else float(value)

    @property
    def expert_routing(self) -> str | None:
        return self.get("expert_routing")

    @property
    def config_overrides(self) -> dict[str, Value]:
        """hf: the settings that go to the transformers config (image_size included)."""
        return {k: v for k, v in self.settings if k not in OWN_SETTINGS or k == "image_size"}

    def with_settings(self, **values: Value) -> ModelRef:
        """This reference with settings added or replaced (None leaves a setting as it is)."""
        settings = list(self.settings)
        for key, value in values.items():
            if value is None:
                continue
            _check_setting(self.kind, key, value)
            settings = [(k, v) for k, v in settings if k != key] + [(key, value)]
        return replace(self, settings=tuple(settings))

    @property
    def text(self) -> str:
        base = self.target if self.kind != HF else f"hf:{self.target}"
        if not self.settings:
            return base
        return base + "?" + "&".join(f"{k}={quote(_format(v), safe=',.-_/[]:')}" for k, v in self.settings)

    def __str__(self) -> str:
        return self.text


def _format(value: Value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _parse_value(text: str) -> Value:
    """`4` -> 4, `true` -> True, `[2,2]` -> [2, 2], anything else stays a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _check_setting(kind: str, key: str, value: Value) -> None:
    if not _SETTING.match(key):
        raise FieldError("model", f"bad setting name {key!r}")
    if key in ("seq_len", "image_size") and not (isinstance(value, int) and not isinstance(value, bool)
                                                 and value > 0):
        raise FieldError(key, f"must be a positive whole number, got {value!r}")
    if key == "expert_imbalance" and not (isinstance(value, int | float) and not isinstance(value, bool)
                                          and 1 <= value <= 100):
        raise FieldError(key, f"the busiest expert rank's work over the average: at least 1, got {value!r}")
    if key == "expert_routing" and value not in EXPERT_ROUTINGS:
        raise FieldError(key, f"one of {', '.join(EXPERT_ROUTINGS)}, got {value!r}")
    if key == "capacity_factor" and not (isinstance(value, int | float) and not isinstance(value, bool)
                                         and 0 < value <= 1000):
        raise FieldError(key, f"an expert's capacity over its even share of the routed tokens: above 0, got {value!r}")
    if key == "layers" and not (isinstance(value, str) and re.match(r"^[A-Za-z0-9_.]+$", value)):
        raise FieldError("model", f"layers must be a dotted module path such as model.blocks, got {value!r}")
    if kind != HF and key not in OWN_SETTINGS:
        raise FieldError("model", f"unknown setting {key!r} (a {kind} model takes {', '.join(OWN_SETTINGS)}; "
                                  "config overrides belong to hf: references)")


def parse(text: str) -> ModelRef:
    """Parse a model reference; raises FieldError('model', ...) naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise FieldError("model", "empty model reference")
    text = text.strip()
    base, _, query = text.partition("?")
    if base.startswith("hf:"):
        kind, target = HF, base[3:]
        if not target:
            raise FieldError("model", "hf: needs a model type (hf:qwen2) or a config file (hf:path/config.json)")
    elif _FILE_REF.match(base):
        kind, target = FILE, base
    elif base.endswith(".py") or ".py:" in base:
        raise FieldError("model", f"expected path/to/file.py:build_fn, got {base!r}")
    else:
        kind, target = ZOO, base
    ref = ModelRef(kind, target)
    if query:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
        if not pairs:
            raise FieldError("model", f"cannot read the settings {query!r}: expected key=value&key=value")
        for key, raw in pairs:
            if ref.get(key) is not None:
                raise FieldError("model", f"setting {key!r} given twice")
            ref = ref.with_settings(**{key: _parse_value(raw)})
    return ref
