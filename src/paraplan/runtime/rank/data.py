"""Where a training step's global batch comes from: synthetic batches (the default; models/inputs.py)
or real data (`paraplan train --data PATH`). Every runtime (stage_loop.py, dag_runtime.py, the
single-process reference.py) gets its batches from `batch_source`, so a distributed run and one
process see the same samples, and every rank reads the same global batch, then takes its part.

Two formats, told apart by the file's extension:

- a token file (any name but .npz/.npy), nanoGPT's train.bin: a flat binary of token ids, uint16 by
  default, uint32 when asked for, read through numpy.memmap (never loaded whole). Language models
  only (InputSpec kind "tokens"). A step's batch is `batch` windows of seq_len + 1 tokens at
  offsets drawn uniformly (with replacement, as nanoGPT's get_batch) by a generator seeded from
  (seed, step): inputs window[:-1], targets window[1:].
- an .npz archive (numpy.savez) with two arrays, `inputs` and `labels`, one row per sample:
  images (N, C, H, W) float with labels (N,) int in [0, num_classes), or tokens (N, seq_len) int
  with labels (N, seq_len) int below the vocabulary size. Rows are visited in epochs: epoch e is a
  permutation of all N rows seeded from (seed, e), and step s takes samples s*batch ..
  (s+1)*batch - 1 of that endless sequence, so every row is seen once per epoch and a batch larger
  than N simply spans epochs. Members saved uncompressed (numpy.savez) are memory-mapped;
  compressed ones (numpy.savez_compressed) are read into memory.

`check_data` validates a file against the model before any rank starts (the whole file's largest
token id included, read in chunks); `batch_source` then opens it in each process with only the
cheap checks. Both raise FieldError("data", ...): one line.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from paraplan.errors import FieldError
from paraplan.models.spec import InputSpec

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SCAN_ROWS = 1 << 24  # values read at once when a file's extremes are checked (32 MiB of uint16)
ARRAYS = ("inputs", "labels")


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s batch, synthetic or real (kept from the synthetic batches, so that
    runs without --data are unchanged)."""
    return seed * 7919 + step


def batch_source(built, batch: int, seed: int, data: str | None = None,
                 dtype: str = "uint16") -> Callable[[int], tuple]:
    """step -> (inputs, targets) of the whole global batch, the same on every rank and in the
    reference; `built` is the runtime's BuiltModel (its InputSpec says what a sample is)."""
    if data is None:
        return lambda step: built.batch(batch, seed=step_seed(seed, step))
    if is_array_file(data):
        return _ArrayBatches(_open_arrays(data, built.inputs, built.name), batch, seed)
    return _TokenBatches(_open_tokens(data, dtype, built.inputs, built.name), built.inputs.seq_len, batch, seed)


def check_data(path: str, dtype: str, spec: InputSpec, model: str) -> str:
    """Everything about a data file that can be known before training, checked once: the format
    fits the model, and every token id or label is in range (the whole file read, in chunks).
    Returns a one-line description of the data."""
    if is_array_file(path):
        arrays = _open_arrays(path, spec, model)
        vocabulary = f"{model}'s vocabulary has {spec.vocab_size} ids"
        if spec.kind == "tokens":
            _check_range(arrays["inputs"], spec.vocab_size, f"{path}: 'inputs'", "token id", vocabulary)
            _check_range(arrays["labels"], spec.vocab_size, f"{path}: 'labels'", "token id", vocabulary)
        else:
            _check_range(arrays["labels"], spec.num_classes, f"{path}: 'labels'", "class",
                         f"{model} has {spec.num_classes} classes")
        return f"{path}: {arrays['inputs'].shape[0]} samples"
    tokens = _open_tokens(path, dtype, spec, model)
    _check_range(tokens, spec.vocab_size, path, "token id", f"{model}'s vocabulary has {spec.vocab_size} ids")
    return f"{path}: {tokens.shape[0]} {dtype} tokens"


def check_file(path: str, dtype: str = "uint16") -> None:
    """What can be checked without the model (run first, so a missing file fails at once)."""
    _readable(path)
    if not is_array_file(path):
        _token_count(path, dtype)


def is_array_file(path: str) -> bool:
    return str(path).endswith(".npz")


def _readable(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise FieldError("data", f"{path} does not exist")
    if not p.is_file():
        raise FieldError("data", f"{path} is not a file")
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise FieldError("data", f"{path} cannot be read: {exc.strerror or exc}") from None
    if str(path).endswith(".npy"):  # else it would be read as raw token ids, header and all
        raise FieldError("data", f"{path}: a .npy file holds one array; save inputs and labels together "
                                 "with numpy.savez(PATH.npz, inputs=..., labels=...)")


# ---- token files ----------------------------------------------------------------------------------

def _token_count(path: str, dtype: str) -> int:
    if dtype not in TOKEN_DTYPES:
        raise FieldError("data_dtype", f"unknown {dtype!r}; expected one of {', '.join(TOKEN_DTYPES)}")
    size = os.path.getsize(path)
    width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    if size % width:
        raise FieldError("data", f"{path} is {size} bytes, not a multiple of {width} ({dtype} token ids): "
                                 f"truncated, or not a file of {dtype} tokens")
    return size // width


def _open_tokens(path: str, dtype: str, spec: InputSpec, model: str) -> np.ndarray:
    _readable(path)
    if spec.kind != "tokens":
        raise FieldError("data", f"{path} is read as a token file (flat token ids), which needs a language "
                                 f"model; {model} takes {spec.describe()}: give an .npz with 'inputs' and "
                                 "'labels'")
    n = _token_count(path, dtype)
    if n < spec.seq_len + 1:
        raise FieldError("data", f"{path} holds {n} tokens; one window of sequence length {spec.seq_len} "
                                 f"needs {spec.seq_len + 1}")
    return np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")


class _TokenBatches:
    """nanoGPT's get_batch: `batch` random windows of seq_len + 1 tokens, shifted by one."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch: int, seed: int):
        self.tokens, self.seq_len, self.batch, self.seed = tokens, seq_len, batch, seed

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(step_seed(self.seed, step))
        offsets = torch.randint(0, len(self.tokens) - self.seq_len, (self.batch,), generator=gen).tolist()
        window = self.seq_len + 1
        # int64 for the embedding; a copy of just these windows, the file stays mapped
        rows = torch.from_numpy(np.stack([self.tokens[o:o + window] for o in offsets]).astype(np.int64))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# ---- .npz arrays ----------------------------------------------------------------------------------

def _member(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One array of an .npz: memory-mapped where it is stored uncompressed (numpy.savez), read
    whole otherwise. np.load cannot map an .npz member, but a stored member is a plain .npy at a
    fixed offset of the archive."""
    if info.compress_type != zipfile.ZIP_STORED:
        with archive.open(info) as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # the zip local file header: its name and extra field lengths at 26..29
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError("it holds Python objects")
    if not shape or 0 in shape:  # nothing to map (numpy.memmap refuses empty maps)
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _open_arrays(path: str, spec: InputSpec, model: str) -> dict[str, np.ndarray]:
    _readable(path)
    if spec.kind not in ("tokens", "image"):
        raise FieldError("data", f"real data is read for language models and image models; {model} takes "
                                 f"{spec.describe()}")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {i.filename.removesuffix(".npy"): i for i in archive.infolist()}
            missing = [a for a in ARRAYS if a not in infos]
            if missing:
                held = ", ".join(sorted(infos)) or "nothing"
                raise FieldError("data", f"{path} holds {held}; expected arrays 'inputs' and 'labels' "
                                         "(numpy.savez(path, inputs=..., labels=...))")
            arrays = {a: _member(path, archive, infos[a]) for a in ARRAYS}
    except (zipfile.BadZipFile, ValueError, OSError, struct.error) as exc:
        raise FieldError("data", f"{path} does not read as an .npz archive of arrays: {exc}") from None
    _check_shapes(path, arrays, spec, model)
    return arrays


def _shape(shape: tuple) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _check_shapes(path: str, arrays: dict[str, np.ndarray], spec: InputSpec, model: str) -> None:
    inputs, labels = arrays["inputs"], arrays["labels"]
    if spec.kind == "image":
        want_in, in_kind = ("N", spec.channels, spec.image_size, spec.image_size), "float images"
        want_labels, label_kind = ("N",), f"int class ids below {spec.num_classes}"
        in_ok = inputs.dtype.kind == "f"
    else:
        want_in, in_kind = ("N", spec.seq_len), f"int token ids below {spec.vocab_size}"
        want_labels, label_kind = ("N", spec.seq_len), f"int token ids below {spec.vocab_size}"
        in_ok = inputs.dtype.kind in "iu"
    for name, array, want, kind, ok in (("inputs", inputs, want_in, in_kind, in_ok),
                                        ("labels", labels, want_labels, label_kind, labels.dtype.kind in "iu")):
        if array.ndim != len(want) or tuple(array.shape[1:]) != want[1:] or not ok:
            raise FieldError("data", f"{path}: '{name}' is {_shape(array.shape)} {array.dtype}; {model} expects "
                                     f"{_shape(want)} {kind}")
    if inputs.shape[0] != labels.shape[0]:
        raise FieldError("data", f"{path}: 'inputs' has {inputs.shape[0]} samples but 'labels' {labels.shape[0]}")
    if inputs.shape[0] == 0:
        raise FieldError("data", f"{path} holds no samples")


def _check_range(values: np.ndarray, upper: int, where: str, what: str, whose: str) -> None:
    """Every value in [0, upper), read SCAN_ROWS values at a time (a token file of billions of ids
    never sits in memory whole); the first offender is named with its position in the file."""
    flat = values.ravel(order="K")  # a view of a mapped file: nothing is read yet
    for start in range(0, flat.size, SCAN_ROWS):
        chunk = np.asarray(flat[start:start + SCAN_ROWS])
        if chunk.min() < 0 or chunk.max() >= upper:
            bad = int(np.argmax((chunk < 0) | (chunk >= upper)))
            raise FieldError("data", f"{where} holds {what} {int(chunk[bad])} (at position {start + bad}) but "
                                     f"{whose} (0..{upper - 1})")


class _ArrayBatches:
    """Rows of an .npz in epochs: a permutation of every row per epoch, seeded from (seed, epoch)."""

    def __init__(self, arrays: dict[str, np.ndarray], batch: int, seed: int):
        self.inputs, self.labels = arrays["inputs"], arrays["labels"]
        self.n, self.batch, self.seed = self.inputs.shape[0], batch, seed
        self.image = self.inputs.ndim == 4
        self.orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self.orders:
            if len(self.orders) > 2:  # steps move forward: older epochs are not asked for again
                self.orders.pop(min(self.orders))
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self.orders[epoch] = torch.randperm(self.n, generator=gen).numpy()
        return self.orders[epoch]

    def rows(self, step: int) -> np.ndarray:
        picked, i = [], step * self.batch
        while i < (step + 1) * self.batch:
            epoch, at = divmod(i, self.n)
            take = min((step + 1) * self.batch - i, self.n - at)
            picked.append(self._order(epoch)[at:at + take])
            i += take
        return np.concatenate(picked)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(step)
        x = np.asarray(self.inputs[rows])
        x = torch.from_numpy(x.astype(np.float32 if self.image else np.int64, copy=False))
        return x, torch.from_numpy(np.asarray(self.labels[rows]).astype(np.int64, copy=False))
