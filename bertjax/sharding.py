"""The device mesh and how arrays lie on it.

Model code names logical axes only (`batch`, `embed`, `heads`, ...); the rules
table of the config maps them onto the mesh axes `data`, `fsdp` and `tensor`.
Batches are split over `data` and `fsdp` together.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np

from bertjax import errors

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolves one -1 in (data, fsdp, tensor) sizes against the device count.

  Raises:
    ValueError: the sizes cannot cover the devices, saying what would.
  """
  sizes = [int(s) for s in sizes]
  if len(sizes) != len(MESH_AXES):
    raise errors.UsageError(f"mesh needs {len(MESH_AXES)} sizes for {MESH_AXES}, got {sizes}")
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise errors.UsageError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: each must be positive, "
                            "and at most one may be -1 (the rest of the devices)")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise errors.UsageError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} do not divide the "
                              f"{num_devices} devices; choose sizes whose product divides "
                              f"{num_devices}")
    sizes[sizes.index(-1)] = num_devices // known
  elif known != num_devices:
    raise errors.UsageError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} cover {known} devices, but "
                            f"there are {num_devices}; make their product {num_devices} or set one "
                            "to -1")
  return tuple(sizes)


def make_mesh(sizes: Sequence[int], devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
  """A (data, fsdp, tensor) mesh over all devices (or `devices`).

  Over several TPU slices (multi-slice: devices with different `slice_index`)
  the data axis spans the slices, so only the gradient sums cross the slower
  data-center network, and fsdp and tensor stay within each slice.

  Raises:
    ValueError: the sizes do not fit the devices (or the data axis the slices).
  """
  devices = list(devices) if devices is not None else jax.devices()
  shape = mesh_shape(sizes, len(devices))
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  slices = len({getattr(device, "slice_index", 0) for device in devices})
  if slices == 1:
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
  from jax.experimental import mesh_utils

  if shape[0] % slices:
    raise errors.UsageError(f"mesh.data={shape[0]} does not divide over the {slices} slices: set "
                            f"--config.mesh.data to a multiple of {slices} (or -1)")
  within_slice = (shape[0] // slices, shape[1], shape[2])
  grid = mesh_utils.create_hybrid_device_mesh(within_slice, (slices, 1, 1), devices)
  return jax.sharding.Mesh(np.asarray(grid), MESH_AXES, axis_types=axis_types)


def batch_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Leading (batch) axis split over `data` and `fsdp`; the rest replicated."""
  return jax.NamedSharding(mesh, jax.P(BATCH_AXES))


def batch_shards(mesh: jax.sharding.Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  return jax.NamedSharding(mesh, jax.P())


def logical_shardings(abstract_tree: Any, mesh: jax.sharding.Mesh, rules) -> Any:
  """NamedShardings for a tree of (boxed) abstract arrays from their logical axes.

  Leaves without logical axes (step counters, RNG keys) are replicated.
  """
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)
