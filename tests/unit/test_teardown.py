"""runtime/launcher/teardown.py's pure parts: a rank's failure as one line (from the exception, from what the
ranks recorded, from torch's traceback text), and the pipeline stage's timing wrapper leaving no
reference cycle (the cycle kept FSDP2 ranks' DTensors alive until interpreter exit)."""

import gc
import json
import traceback
import weakref

from paraplan.errors import ParaplanError
from paraplan.runtime.launcher.launch import rank_failure
from paraplan.runtime.launcher.teardown import from_traceback, one_line, record_failure
from paraplan.runtime.measure.timeline import Recorder

# what torch.distributed.pipelining raises around an error inside a stage's forward (stage.py)
STAGE_WRAPPER = """
            [Stage 1] failed to run forward:
            args: ('Tensor(torch.Size([8, 32]), grad=False, dtype=torch.int64)',)
            kwargs: {}
            """
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                "waiting 4000ms for recv operation to complete")


def _gloo_timeout_in_a_stage() -> RuntimeError:
    try:
        try:
            raise RuntimeError(GLOO_TIMEOUT)
        except RuntimeError as exc:
            raise RuntimeError(STAGE_WRAPPER) from exc
    except RuntimeError as exc:
        return exc


def test_a_gloo_timeout_inside_a_pipeline_stage_is_one_meaningful_line():
    assert one_line(_gloo_timeout_in_a_stage()) == (
        "RuntimeError: [Stage 1] failed to run forward (caused by RuntimeError: Timed out waiting 4000ms for recv "
        "operation to complete)")


def test_a_multi_line_message_keeps_its_first_line_and_what_it_introduces():
    assert one_line(ValueError("\n  the batch was empty:\n   shape (0, 16)\n  kwargs: {}\n")) == \
        "ValueError: the batch was empty: shape (0, 16)"
    assert one_line(KeyError()) == "KeyError"
    long = one_line(RuntimeError("x" * 1000))
    assert len(long) == 300 and long.endswith("...")


def test_a_paraplan_error_in_a_rank_is_its_own_message():
    assert one_line(ParaplanError("no space left on device: /data/stage1.pt")) == \
        "no space left on device: /data/stage1.pt"


def test_the_launcher_reports_the_earliest_recorded_failure(tmp_path):
    record_failure(str(tmp_path), 1, ParaplanError("no space left on device: /data/stage1.pt"))
    later = tmp_path / "rank0.json"
    first = json.loads((tmp_path / "rank1.json").read_text())
    later.write_text(json.dumps({"rank": 0, "time": first["time"] + 1.0,
                                 "error": "RuntimeError: Connection closed by peer"}))
    assert rank_failure(tmp_path, 0, "ignored") == \
        "training stopped: rank 1 failed: no space left on device: /data/stage1.pt"


def test_without_records_the_traceback_gives_the_exception_not_its_last_line(tmp_path):
    exc = _gloo_timeout_in_a_stage()
    text = ("\n\n-- Process 1 terminated with the following error:\n"
            + "".join(traceback.format_exception(exc)))
    assert text.rstrip().splitlines()[-1].strip() == "kwargs: {}"  # what the launcher used to report
    line = rank_failure(tmp_path, 1, text)
    assert line.startswith("training stopped: rank 1 failed: RuntimeError: [Stage 1] failed to run forward:")
    assert "\n" not in line
    assert from_traceback("no exception here\n") == "no exception here"


class _Stage:
    def forward_one_chunk(self, chunk, *args):
        return ("forward", chunk, args)

    def backward_one_chunk(self, chunk, *args):
        return ("backward", chunk, args)


def test_the_timing_wrapper_leaves_no_cycle_so_the_stage_goes_with_its_last_reference():
    recorder = Recorder()
    stage = _Stage()
    recorder.wrap_stage(stage)
    assert stage.forward_one_chunk(3, "x") == ("forward", 3, ("x",))
    assert stage.backward_one_chunk(2) == ("backward", 2, ())
    assert [(e["kind"], e["micro"]) for e in recorder.events] == [("forward", 3), ("backward", 2)]
    gone = weakref.ref(stage)
    gc.disable()  # freed by its reference count, as train_rank's locals at return, not by a collection
    try:
        del stage
        assert gone() is None
    finally:
        gc.enable()
