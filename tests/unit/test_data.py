"""runtime/rank/data.py: `paraplan train --data` batches from a token file or an .npz, deterministic in
(seed, step), and every bad file refused in one line before any directory or rank exists."""

import numpy as np
import pytest
import torch

from paraplan.cli import main
from paraplan.errors import FieldError
from paraplan.models import source
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import write_plan
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.rank.data import batch_source, check_data, check_file

GPT2 = source.build("gpt2-tiny", device="meta")  # tokens: sequence 32, vocabulary 512
LENET = source.build("lenet-5", device="meta")  # images: 1 x 32 x 32, 10 classes
GPT2_PLAN = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="1f1b",
                 grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))


def _tokens(tmp_path, ids, dtype="uint16", name="train.bin"):
    path = tmp_path / name
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def _images(tmp_path, n=20, shape=(1, 32, 32), name="images.npz", save=np.savez, **arrays):
    """Image i is filled with the value i and labelled i % 10, so a batch shows which rows it took."""
    path = tmp_path / name
    inputs = np.broadcast_to(np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1), (n, *shape)).copy()
    save(path, **{"inputs": inputs, "labels": np.arange(n) % 10, **arrays})
    return str(path)


# ---- token files ----------------------------------------------------------------------------------

def test_token_windows_are_shifted_slices_of_the_file_the_same_at_every_call(tmp_path):
    ids = np.arange(1000) % 512
    path = _tokens(tmp_path, ids)
    batches = batch_source(GPT2, 8, 3, path)
    x, y = batches(5)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        offset = next(o for o in range(len(ids) - 32) if list(ids[o:o + 32]) == row_x)  # a slice of the file
        assert row_y == list(ids[offset + 1:offset + 33])  # the targets: the next token of each input
    again_x, again_y = batch_source(GPT2, 8, 3, path)(5)  # another process opening the file
    assert torch.equal(x, again_x) and torch.equal(y, again_y)
    assert not torch.equal(x, batches(6)[0])  # each step its own windows
    assert not torch.equal(x, batch_source(GPT2, 8, 4, path)(5)[0])  # and each seed


def test_uint32_files_give_the_same_batches_as_uint16(tmp_path):
    ids = (np.arange(2000) * 7) % 512
    small = batch_source(GPT2, 8, 0, _tokens(tmp_path, ids, "uint16", "a.bin"), "uint16")
    wide = batch_source(GPT2, 8, 0, _tokens(tmp_path, ids, "uint32", "b.bin"), "uint32")
    for step in range(3):
        assert all(torch.equal(a, b) for a, b in zip(small(step), wide(step), strict=True))
    # the uint32 file read as uint16 is twice as long and full of zeros: not the same data
    assert not torch.equal(small(0)[0], batch_source(GPT2, 8, 0, str(tmp_path / "b.bin"), "uint16")(0)[0])


def test_a_file_of_exactly_one_window_is_enough(tmp_path):
    x, y = batch_source(GPT2, 4, 0, _tokens(tmp_path, np.arange(33)))(0)
    assert x.tolist() == [list(range(32))] * 4 and y.tolist() == [list(range(1, 33))] * 4


def test_without_data_the_synthetic_batches_are_unchanged():
    for step in (0, 7):
        ours = batch_source(GPT2, 8, 2, None)(step)
        assert all(torch.equal(a, b) for a, b in zip(ours, GPT2.batch(8, seed=2 * 7919 + step), strict=True))


@pytest.mark.parametrize("ids,dtype,needle", [
    (np.arange(32), "uint16", "holds 32 tokens; one window of sequence length 32 needs 33"),
    ([1, 2, 3, 600] * 20, "uint16", "holds token id 600 (at position 3) but gpt2-tiny's vocabulary has 512 ids"),
    ([5] * 40 + [70000], "uint32", "holds token id 70000 (at position 40)"),
])
def test_bad_token_files_are_refused(tmp_path, ids, dtype, needle):
    path = _tokens(tmp_path, ids, dtype)
    with pytest.raises(FieldError, match="data") as err:
        check_data(path, dtype, GPT2.inputs, "gpt2-tiny")
    assert needle in str(err.value)


def test_a_token_file_needs_a_language_model(tmp_path):
    with pytest.raises(FieldError, match="needs a language model; lenet-5 takes image: 1x32x32"):
        check_data(_tokens(tmp_path, np.arange(100)), "uint16", LENET.inputs, "lenet-5")


# ---- through the command line: one line, exit 2, nothing written ----------------------------------

def _train(tmp_path, monkeypatch, capsys, *extra):
    monkeypatch.chdir(tmp_path)  # a default run directory would be ./runs
    plan = tmp_path / "plan.json"
    write_plan(GPT2_PLAN, plan)
    code = main(["train", "--plan", str(plan), "--json", *map(str, extra)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()
    return err


def test_a_truncated_token_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "odd.bin"
    path.write_bytes(bytes(1001))
    err = _train(tmp_path, monkeypatch, capsys, "--data", path)
    assert f"--data: {path} is 1001 bytes, not a multiple of 2 (uint16 token ids): truncated" in err
    # 1002 bytes are a whole number of uint16 ids, but not of uint32 ones
    path.write_bytes(bytes(1002))
    assert "not a multiple of 4 (uint32" in _train(tmp_path, monkeypatch, capsys, "--data", path,
                                                   "--data-dtype", "uint32")


def test_a_missing_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    err = _train(tmp_path, monkeypatch, capsys, "--data", tmp_path / "nowhere.bin")
    assert "--data:" in err and "nowhere.bin does not exist" in err
    assert "is not a file" in _train(tmp_path, monkeypatch, capsys, "--data", tmp_path)


def test_a_token_id_beyond_the_vocabulary_is_refused_before_the_ranks(tmp_path, monkeypatch, capsys):
    path = _tokens(tmp_path, [7] * 100 + [512])
    err = _train(tmp_path, monkeypatch, capsys, "--data", path, "--out-dir", tmp_path / "run")
    assert "--data:" in err and "token id 512 (at position 100)" in err and "(0..511)" in err
    assert not (tmp_path / "run").exists()


def test_the_api_refuses_bad_data_before_making_its_directory(tmp_path):
    import paraplan

    (tmp_path / "odd.bin").write_bytes(bytes(3))
    with pytest.raises(FieldError, match="not a multiple of 2"):
        paraplan.train(GPT2_PLAN, data=str(tmp_path / "odd.bin"), out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(FieldError, match="data_dtype: unknown 'int8'"):
        TrainConfig(plan=GPT2_PLAN, model="gpt2-tiny", data="x.bin", data_dtype="int8")


# ---- .npz arrays ----------------------------------------------------------------------------------

def test_image_batches_take_every_row_once_per_epoch(tmp_path):
    batches = batch_source(LENET, 8, 1, _images(tmp_path))  # 20 rows, 8 a step: 5 steps are 2 epochs
    seen = []
    for step in range(5):
        x, y = batches(step)
        assert x.shape == (8, 1, 32, 32) and x.dtype == torch.float32 and y.shape == (8,) and y.dtype == torch.int64
        rows = x[:, 0, 0, 0].long()
        assert torch.equal(x, rows.float().reshape(8, 1, 1, 1).expand(8, 1, 32, 32))  # whole images
        assert torch.equal(y, rows % 10)  # each with its own label
        seen += rows.tolist()
    assert sorted(seen[:20]) == sorted(seen[20:40]) == list(range(20))
    assert seen[:20] != seen[20:40] and seen[:20] != list(range(20))  # shuffled, differently each epoch
    again = batch_source(LENET, 8, 1, _images(tmp_path, name="copy.npz"))
    assert all(torch.equal(a, b) for a, b in zip(again(3), batches(3), strict=True))


def test_compressed_archives_give_the_same_batches(tmp_path):
    stored = batch_source(LENET, 16, 0, _images(tmp_path))
    packed = batch_source(LENET, 16, 0, _images(tmp_path, name="packed.npz", save=np.savez_compressed))
    assert all(torch.equal(a, b) for a, b in zip(stored(2), packed(2), strict=True))


def test_token_arrays_for_a_language_model(tmp_path):
    path = tmp_path / "tokens.npz"
    rows = np.arange(6 * 33).reshape(6, 33) % 512
    np.savez(path, inputs=rows[:, :-1], labels=rows[:, 1:])
    assert check_data(str(path), "uint16", GPT2.inputs, "gpt2-tiny") == f"{path}: 6 samples"
    x, y = batch_source(GPT2, 4, 0, str(path))(0)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("arrays,needle", [
    ({"inputs": np.zeros((4, 3, 28, 28), np.float32)},
     "'inputs' is (4, 3, 28, 28) float32; lenet-5 expects (N, 1, 32, 32) float images"),
    ({"inputs": np.zeros((20, 1, 32, 32), np.uint8)}, "'inputs' is (20, 1, 32, 32) uint8; lenet-5 expects"),
    ({"labels": np.zeros((20, 1), np.int64)}, "'labels' is (20, 1) int64; lenet-5 expects (N) int class ids below 10"),
    ({"labels": np.zeros(19, np.int64)}, "'inputs' has 20 samples but 'labels' 19"),
    ({"labels": np.arange(20)}, "'labels' holds class 10 (at position 10) but lenet-5 has 10 classes (0..9)"),
])
def test_bad_image_archives_name_what_was_expected(tmp_path, arrays, needle):
    with pytest.raises(FieldError) as err:
        check_data(_images(tmp_path, **arrays), "uint16", LENET.inputs, "lenet-5")
    assert needle in str(err.value)


def test_archives_that_are_not_inputs_and_labels_are_refused(tmp_path):
    np.savez(tmp_path / "x.npz", images=np.zeros((2, 1, 32, 32), np.float32))
    with pytest.raises(FieldError, match="holds images; expected arrays 'inputs' and 'labels'"):
        check_data(str(tmp_path / "x.npz"), "uint16", LENET.inputs, "lenet-5")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(FieldError, match="does not read as an .npz archive"):
        check_data(str(tmp_path / "junk.npz"), "uint16", LENET.inputs, "lenet-5")
    np.save(tmp_path / "inputs.npy", np.zeros(3))
    with pytest.raises(FieldError, match="a .npy file holds one array"):
        check_file(str(tmp_path / "inputs.npy"))


def test_the_vocabulary_check_reads_a_file_in_chunks(tmp_path, monkeypatch):
    from paraplan.runtime.rank import data

    monkeypatch.setattr(data, "SCAN_ROWS", 7)  # 61 ids: 9 chunks, the offender in the 8th
    good = _tokens(tmp_path, [1] * 61, name="good.bin")
    assert check_data(good, "uint16", GPT2.inputs, "gpt2-tiny") == f"{good}: 61 uint16 tokens"
    with pytest.raises(FieldError, match=r"token id 513 \(at position 50\)"):
        check_data(_tokens(tmp_path, [1] * 50 + [513] + [1] * 10), "uint16", GPT2.inputs, "gpt2-tiny")
