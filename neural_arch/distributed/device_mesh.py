"""A device mesh: the job's ranks laid out as an n-dimensional grid, one process group per axis.

``init_device_mesh((2, 2, 2), mesh_dim_names=("dp", "tp", "pp"))`` numbers the world's ranks
row-major (the last axis fastest): rank 5 of eight sits at (1, 0, 1). Along each axis the ranks
that differ only in that coordinate form one group, an ordinary ``new_group`` subgroup, so data,
tensor and pipeline parallelism each talk over their own group with the usual collectives:

    mesh = init_device_mesh((2, 2, 2), mesh_dim_names=("dp", "tp", "pp"))
    tp_group = mesh.get_group("tp")          # the 2 ranks that share this rank's dp and pp
    mesh.get_local_rank("pp")                # this rank's pipeline stage

Every rank must call ``init_device_mesh`` with the same arguments (``new_group`` checks that the
members agree). torch's spelling ``init_device_mesh("cpu", shape, mesh_dim_names=...)`` works
too: the device type is accepted and has no effect on where the groups communicate.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .group.world import ProcessGroup, get_rank, get_world_size, new_group

Dim = Union[int, str]


class DeviceMesh:
    """The grid of ranks, this rank's coordinate in it, and this rank's group along each axis."""

    def __init__(self, mesh: np.ndarray, mesh_dim_names: Tuple[str, ...],
                 groups: Tuple[ProcessGroup, ...], device_type: str = "cpu") -> None:
        self.mesh = mesh
        self.mesh_dim_names = mesh_dim_names
        self.device_type = device_type
        self._groups = groups
        rank = get_rank()
        where = np.argwhere(mesh == rank)
        if len(where) != 1:
            raise ValueError(f"rank {rank} appears {len(where)} times in mesh {mesh.tolist()}")
        self._coordinate = tuple(int(c) for c in where[0])

    # ----- the grid --------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.mesh.shape)

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    def size(self, mesh_dim: Optional[Dim] = None) -> int:
        """Ranks along ``mesh_dim`` (by name or index); the whole mesh when None."""
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._axis(mesh_dim)])

    def get_coordinate(self) -> Tuple[int, ...]:
        """This rank's index along every axis, in axis order."""
        return self._coordinate

    def get_local_rank(self, mesh_dim: Optional[Dim] = None) -> int:
        """This rank's index along ``mesh_dim`` = its rank in that axis's group."""
        return self._coordinate[self._axis(mesh_dim, "get_local_rank")]

    def get_group(self, mesh_dim: Optional[Dim] = None) -> ProcessGroup:
        """The group of ranks that share this rank's coordinates on every other axis."""
        return self._groups[self._axis(mesh_dim, "get_group")]

    def get_all_groups(self) -> Tuple[ProcessGroup, ...]:
        return self._groups

    def is_first_along(self, *mesh_dims: Dim) -> bool:
        """Whether this rank has coordinate 0 on each of ``mesh_dims``: the one rank of its
        slice that should log, print or write a file for the slice."""
        return all(self.get_local_rank(d) == 0 for d in mesh_dims)

    def _axis(self, mesh_dim: Optional[Dim], what: str = "size") -> int:
        if mesh_dim is None:  # a 1-D mesh's only dimension, as torch
            if self.ndim != 1:
                raise ValueError(f"{what} needs a mesh_dim for a {self.ndim}-D mesh "
                                 f"{self.mesh_dim_names}")
            return 0
        if isinstance(mesh_dim, str):
            if mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh has no dimension {mesh_dim!r}; its dimensions are "
                               f"{self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        axis = int(mesh_dim)
        if not -self.ndim <= axis < self.ndim:
            raise IndexError(f"mesh dimension {axis} out of range for a {self.ndim}-D mesh")
        return axis % self.ndim

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.shape))
        return f"DeviceMesh({dims}, coordinate={self._coordinate})"


def _check_shape(mesh_shape: Sequence[int], names: Tuple[str, ...], world: int) -> Tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in mesh_shape)
    except TypeError:
        raise TypeError(f"mesh_shape must be a sequence of ints, got {mesh_shape!r}") from None
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"mesh_shape must be non-empty positive sizes, got {shape}")
    if math.prod(shape) != world:
        raise ValueError(f"mesh_shape {shape} holds {math.prod(shape)} ranks but the world has "
                         f"{world}; the sizes must multiply to the world size")
    if len(names) != len(shape):
        raise ValueError(f"mesh_dim_names {names} has {len(names)} names for the "
                         f"{len(shape)} dimensions of mesh_shape {shape}")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh_dim_names must be distinct, got {names}")
    return shape


def init_device_mesh(*args, mesh_shape: Optional[Sequence[int]] = None,
                     mesh_dim_names: Optional[Sequence[str]] = None) -> DeviceMesh:
    """A ``DeviceMesh`` of ``mesh_shape`` over the whole world, ranks row-major.

    Spelled ``init_device_mesh(shape, mesh_dim_names=...)`` or torch's
    ``init_device_mesh(device_type, shape, mesh_dim_names=...)``. Without names the dimensions
    are called ``"dim0"``, ``"dim1"``, ... . Every rank calls it the same way; it creates one
    group per axis slice (all ranks take part in creating every group, as ``new_group`` needs).
    """
    device_type = "cpu"
    if args and isinstance(args[0], str):
        device_type, args = args[0], args[1:]
    if len(args) > 1 or (args and mesh_shape is not None):
        raise TypeError("init_device_mesh takes one mesh_shape (and optionally a device type "
                        "before it)")
    if args:
        mesh_shape = args[0]
    if mesh_shape is None:
        raise TypeError("init_device_mesh needs a mesh_shape, e.g. (2, 2, 2)")
    if isinstance(mesh_shape, int):
        mesh_shape = (mesh_shape,)
    given = len(tuple(mesh_shape)) if hasattr(mesh_shape, "__len__") else 0
    names = (tuple(str(n) for n in mesh_dim_names) if mesh_dim_names is not None
             else tuple(f"dim{i}" for i in range(given)))
    shape = _check_shape(mesh_shape, names, get_world_size())
    mesh = np.arange(math.prod(shape)).reshape(shape)
    me = get_rank()
    groups = []
    for axis in range(len(shape)):
        # Each row of this view is one slice along ``axis``; every rank creates every slice's
        # group in the same order (new_group is collective over the world).
        slices = np.moveaxis(mesh, axis, -1).reshape(-1, shape[axis])
        mine: Optional[ProcessGroup] = None
        for ranks in slices:
            group = new_group([int(r) for r in ranks])
            if me in ranks:
                mine = group
        groups.append(mine)
    return DeviceMesh(mesh, names, tuple(groups), device_type)


__all__ = ["DeviceMesh", "init_device_mesh"]
