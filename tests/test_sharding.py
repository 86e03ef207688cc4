"""Meshes from config sizes."""

import jax
import pytest

from bertjax import sharding


def test_mesh_shape_resolves_one_wildcard():
  assert sharding.mesh_shape([-1, 1, 1], 8) == (8, 1, 1)
  assert sharding.mesh_shape([2, -1, 2], 8) == (2, 2, 2)
  assert sharding.mesh_shape([1, 2, 4], 8) == (1, 2, 4)


@pytest.mark.parametrize("sizes,message", [
    ([3, -1, 1], "do not divide the 8 devices"),
    ([2, 2, 1], "cover 4 devices, but there are 8"),
    ([-1, -1, 1], "at most one may be -1"),
    ([0, 1, 1], "each must be positive"),
    ([8, 1], "needs 3 sizes"),
])
def test_mesh_errors_say_what_to_change(sizes, message):
  with pytest.raises(ValueError, match=message):
    sharding.mesh_shape(sizes, 8)


def test_mesh_and_batch_sharding():
  mesh = sharding.make_mesh([2, 2, -1])
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.batch_shards(mesh) == 4
  batch = jax.device_put(jax.numpy.zeros((8, 3)), sharding.batch_sharding(mesh))
  assert batch.sharding.spec == jax.P(("data", "fsdp"))
