"""A phase's warmup sizes counted a run of equal sizes at a time, against
`Phase.parts` asked step by step."""

import itertools

from bertjax.phases import Phase


def test_runs_of_equal_sizes_are_the_steps_sizes_in_order():
  for batch, start, ramp_steps, end in itertools.product(
      (8, 32, 40), (8, 32), (0, 1, 2, 3, 7, 12, 300), (5, 12, 400)):
    if start > batch:
      continue
    phase = Phase(0, 2, end, 128, 20, batch, ramp_start=start, ramp_steps=ramp_steps)
    for begin in range(0, min(end, 40) + 2):
      for stop in (begin + 1, begin + 5, end, end + 3):
        runs = phase.part_runs(begin, stop)
        expanded = [parts for parts, steps in runs for _ in range(steps)]
        assert expanded == [phase.parts(s) for s in range(max(begin, 2), min(stop, end))]
        assert all(steps > 0 for _, steps in runs)
