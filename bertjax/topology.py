"""Cloud TPU slices by their gcloud names, as devices to compile for on any host.

`parse("v4-32")` gives the slice `launch/create.sh --accelerator-type=v4-32`
creates: its chip grid, chips, hosts (TPU VMs, one JAX process each) and HBM
per chip. `devices(slice)` asks libtpu (`jax.experimental.topologies`) for
that slice's devices, one per chip as on the TPU VMs, so a CPU-only machine can
compile the real step for it ahead of time (`bertjax.tools.compile`).

gcloud's suffix counts TensorCores on v4 and v5p (two per chip: v4-32 is 16
chips) and chips on v5e and v6e (v5litepod-16 is 16 chips). Figures are Google's
(cloud.google.com/tpu/docs/v4, v5e, v5p, v6e).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

from bertjax import errors


GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation as gcloud and libtpu name it.

  Attributes:
    name: libtpu's name (`v4:2x2x4`'s `v4`).
    gcloud_prefixes: Accelerator-type prefixes (`v5litepod-16`'s `v5litepod`).
    cores_per_unit: TensorCores per unit of the gcloud suffix (2 where it counts
      cores, 1 where it counts chips).
    hbm_bytes: HBM per chip.
    single_host_chips: The largest slice served by one VM.
    shapes: Chip grids of the slices by chip count, as Google lists them.
    chip_config: libtpu's chip configuration ("megacore": one JAX device per
      chip, as JAX on a TPU VM sees it).
  """

  name: str
  gcloud_prefixes: tuple[str, ...]
  cores_per_unit: int
  hbm_bytes: int
  single_host_chips: int
  shapes: dict[int, tuple[int, ...]]
  chip_config: str

  def host_bounds(self, shape: Sequence[int]) -> tuple[int, int, int]:
    """Chips of one VM along each axis of the grid."""
    if math.prod(shape) <= self.single_host_chips:
      return tuple(list(shape) + [1] * (3 - len(shape)))  # type: ignore[return-value]
    return (2, 2, 1)  # 4 chips a VM: v4 and v5p hosts, the v5e and v6e *-4t VMs


_CUBES = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
          128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 768: (8, 8, 12),
          1024: (8, 8, 16), 2048: (8, 16, 16)}
_GRIDS = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
          128: (8, 16), 256: (16, 16)}

GENERATIONS = {
    # 32 GiB HBM2 a chip; 2 TensorCores a chip, one JAX device (megacore).
    "v4": Generation("v4", ("v4",), 2, 32 * GiB, 4, _CUBES, "megacore"),
    # 95 GiB HBM2e a chip (Google's table gives GiB); 2 TensorCores a chip.
    "v5p": Generation("v5p", ("v5p",), 2, 95 * GiB, 4,
                      {**_CUBES, 4096: (16, 16, 16), 6144: (16, 16, 24)}, "megacore"),
    # 16 GB HBM2e a chip, one TensorCore; 8-chip slices are one VM.
    "v5e": Generation("v5e", ("v5litepod", "v5e"), 1, 16 * GiB, 8, _GRIDS, "default"),
    # Trillium: 32 GB HBM a chip, one TensorCore; 8-chip slices are one VM.
    "v6e": Generation("v6e", ("v6e",), 1, 32 * GiB, 8, _GRIDS, "default"),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  """One slice: what gcloud calls it and what it holds."""

  accelerator_type: str  # as given: "v4-32", or libtpu's "v4:2x2x4"
  generation: Generation
  shape: tuple[int, ...]  # chips along each axis of the grid

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def hosts(self) -> int:
    return max(1, self.chips // math.prod(self.generation.host_bounds(self.shape)))

  @property
  def topology_name(self) -> str:
    """libtpu's name of the grid: `v4:2x2x4`."""
    return f"{self.generation.name}:{'x'.join(str(n) for n in self.shape)}"

  @property
  def wraps(self) -> tuple[bool, bool, bool]:
    """Torus links per axis: v4/v5p slices of whole 4x4x4 cubes, and the full
    16-chip sides of v5e/v6e pods."""
    if len(self.shape) == 3:
      whole_cubes = all(n % 4 == 0 for n in self.shape)
      return (whole_cubes,) * 3
    return (self.shape[0] == 16, self.shape[1] == 16, False)


def known_types() -> list[str]:
  """Every accelerator type `parse` knows, smallest first per generation."""
  names = []
  for generation in GENERATIONS.values():
    prefix = generation.gcloud_prefixes[0]
    names += [f"{prefix}-{chips * generation.cores_per_unit}"
              for chips in sorted(generation.shapes)]
  return names


def _known_ranges() -> str:
  ranges = []
  for generation in GENERATIONS.values():
    prefix, sizes = generation.gcloud_prefixes[0], sorted(generation.shapes)
    ranges.append(f"{prefix}-{sizes[0] * generation.cores_per_unit} to "
                  f"{prefix}-{sizes[-1] * generation.cores_per_unit}")
  return ", ".join(ranges)


def parse(accelerator_type: str) -> Slice:
  """The slice of a gcloud accelerator type (`v4-32`, `v5litepod-16`, `v6e-8`)
  or of libtpu's grid name (`v4:2x2x4`, `v5e:4x4`).

  Raises:
    ValueError: an unknown type, in one line naming the known ones.
  """
  name = accelerator_type.strip().lower()
  grid = re.fullmatch(r"(v4|v5p|v5e|v6e):(\d+(?:x\d+){1,2})", name)
  if grid:
    generation = GENERATIONS[grid.group(1)]
    shape = tuple(int(n) for n in grid.group(2).split("x"))
    dims = len(next(iter(generation.shapes.values())))
    if len(shape) == dims and all(n > 0 for n in shape):
      return Slice(accelerator_type, generation, shape)
  typed = re.fullmatch(r"([a-z0-9]+)-(\d+)", name)
  if typed:
    for generation in GENERATIONS.values():
      if typed.group(1) in generation.gcloud_prefixes:
        units = int(typed.group(2))
        chips, remainder = divmod(units, generation.cores_per_unit)
        if not remainder and chips in generation.shapes:
          return Slice(accelerator_type, generation, generation.shapes[chips])
  raise errors.UsageError(
      f"unknown --topology={accelerator_type!r}: set a gcloud accelerator type "
      f"({_known_ranges()}, in the sizes gcloud lists) or a libtpu grid such as "
      "v4:2x2x4")


def devices(tpu_slice: Slice, num_slices: int = 1) -> list[Any]:
  """The slice's devices (one per chip) from libtpu, `num_slices` copies of it
  joined over the data-center network; nothing runs on them."""
  from jax.experimental import topologies

  return list(topologies.get_topology_desc(
      topology_name=tpu_slice.topology_name, platform="tpu",
      chip_config_name=tpu_slice.generation.chip_config,
      chips_per_host_bounds=tpu_slice.generation.host_bounds(tpu_slice.shape),
      num_slices=num_slices, wrap=tpu_slice.wraps).devices)

