"""The input size a model is planned at, and where it came from, in a few words (issue 46).

`paraplan plan --model llama2-7b` plans at a sequence length of 32, CSIMD Table V's setting,
which the paper reproductions need, and said nothing about it: a user planning Llama 2 7B at
4,096 tokens got a plan for 32. Every command that prices a model (plan, inspect, simulate) now
says the length and where it came from: the flag, the model reference's own `seq_len`, the zoo
entry's setting (naming its source), transformers' default capped at the config's positions, or a
user module's sample. Pure: reads the reference text and the built model's InputSpec.
"""

from __future__ import annotations

from paraplan.models import ref as refs
from paraplan.models.spec import InputSpec


def built_note(built, *, seq_len: int | None = None, image_size: int | None = None) -> str:
    """`input_note` of a BuiltModel (models/built.py), the flags the command line was given
    (`seq_len`, `image_size`: the --seq-len / --image-size values, None when not given)."""
    source = ""
    ref = refs.parse(built.ref or built.name)
    if ref.kind == refs.ZOO:
        from paraplan.models import zoo

        source = zoo.entry(ref.target).source
    flag = "--seq-len" if seq_len is not None else "--image-size" if image_size is not None else None
    return input_note(built.ref or built.name, built.inputs, flag=flag, zoo_source=source)


def input_note(reference: str, inputs: InputSpec, *, flag: str | None = None, zoo_source: str = "") -> str:
    """One line: "seq 32 (the zoo's setting for llama2-7b: CSIMD Table V ...; --seq-len N to change)".
    `flag` names the command-line flag that set the size, when one did ("--seq-len")."""
    ref = refs.parse(reference)
    if inputs.kind == "sample":
        shapes = (inputs.description or "").removeprefix("sample: ") or "the sample's shapes"
        return f"{shapes} (your build function's sample)"
    image = inputs.kind == "image"
    size = f"image {inputs.image_size}x{inputs.image_size}" if image else f"seq {inputs.seq_len}"
    if inputs.kind == "seq2seq":
        size += f", decoder {inputs.decoder_seq_len}"
    setting, change = ("image_size", "--image-size N") if image else ("seq_len", "--seq-len N")
    if flag:
        return f"{size} ({flag})"
    if ref.get(setting) is not None:
        return f"{size} (the model reference's {setting}={ref.get(setting)})"
    if ref.kind == refs.ZOO:
        where = f": {zoo_source}" if zoo_source else ""
        return f"{size} (the zoo's setting for {ref.target}{where}; {change} to change)"
    if ref.kind == refs.HF:
        why = ("the config's image size" if image else
               "paraplan's default for hf: models, 512, capped at the config's positions")
        return f"{size} ({why}; {change} or {setting}=N in the reference to change)"
    return f"{size} ({change} to change)"
