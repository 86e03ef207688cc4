"""benchmarks/tpu_compile_vs_peer.py: what an optimised program's operations
read and write, from XLA's text dump."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# An entry computation as XLA dumps it: two layers' copies of one fusion, a
# Pallas kernel (no op_name), a bitcast (a view) and a tuple of results.
HLO = """HloModule jit_train_step

%fused_computation.1 (param_0: bf16[8,128]) -> bf16[8,128] {
  %param_0 = bf16[8,128]{1,0} parameter(0)
  ROOT %negate.1 = bf16[8,128]{1,0} negate(%param_0)
}

ENTRY %main.9 (Arg_0.1: f32[8,128], Arg_1.2: bf16[8,128]) -> (f32[8,128], bf16[8,128]) {
  %Arg_0.1 = f32[8,128]{1,0} parameter(0)
  %Arg_1.2 = bf16[8,128]{1,0} parameter(1)
  %fusion.3 = bf16[8,128]{1,0:T(8,128)(2,1)} fusion(%Arg_1.2), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(M)/bert/layers_0/intermediate/dot_general" stack_frame_id=1}
  %fusion.4 = bf16[8,128]{1,0:T(8,128)(2,1)} fusion(%fusion.3), kind=kLoop, calls=%fused_computation.1, metadata={op_name="jit(train_step)/jvp(M)/bert/layers_11/intermediate/dot_general" stack_frame_id=2}
  %custom-call.5 = (f32[8,128]{1,0}, f32[8,128,128]{2,1,0}) custom-call(%Arg_0.1), custom_call_target="tpu_custom_call"
  %get-tuple-element.6 = f32[8,128]{1,0} get-tuple-element(%custom-call.5), index=0
  %bitcast.7 = bf16[8,128]{1,0} bitcast(%fusion.4)
  ROOT %tuple.8 = (f32[8,128]{1,0}, bf16[8,128]{1,0}) tuple(%get-tuple-element.6, %bitcast.7)
}
"""


@pytest.fixture(scope="module")
def script():
  spec = importlib.util.spec_from_file_location(
      "tpu_compile_vs_peer", os.path.join(ROOT, "benchmarks", "tpu_compile_vs_peer.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_each_operation_reads_its_operands_and_writes_its_result(script):
  moved = {what: count for _, what, count in script.operations(HLO)}
  fusion = 8 * 128 * 2  # bf16 in, bf16 out
  assert moved["jit(train_step)/jvp(M)/bert/layers_0/intermediate/dot_general"] == 2 * fusion
  # The kernel's tuple result: both arrays, 4 + 512 KiB, and its float32 operand.
  assert moved["custom-call.5"] == 8 * 128 * 4 * 2 + 8 * 128 * 128 * 4
  assert len(moved) == 3  # parameters, views, tuples and their elements move nothing


def test_the_layers_copies_of_an_operation_count_together(script):
  largest = script.largest_operations(HLO, 2)
  assert largest[0] == ("custom-call custom-call", 1, pytest.approx(0.000532480))
  assert largest[1] == ("fusion jit(train_step)/jvp(M)/bert/layers_*/intermediate/dot_general",
                        2, pytest.approx(4 * 8 * 128 * 2 / 1e9))


def test_parts_and_passes_by_name(script):
  assert script.part_of("jit(train_step)/jvp(M)/bert/layers_3/intermediate/dot_general") == \
      "feed-forward"
  parts = script.breakdown(HLO)
  assert parts["feed-forward"]["forward"] == pytest.approx(4 * 8 * 128 * 2 / 1e9)
