"""Exact layer-wise full-neighbour inference over the whole graph, out of core (the tasks' layer-wise
evaluation, ``ooc eval``, ``ooc predict``).

Sampled inference (``fanout -1`` around each batch of seeds) recomputes the L-hop neighbourhood of
every batch, which on a large graph is most of the graph per batch.  Layer-wise inference computes
each layer once for *all* nodes, as in DGL's and PyG's ``inference`` examples and GraphSAGE's
appendix: for layer ``l`` and each batch of destination nodes ``[a, b)`` (in id order, partition by
partition), take all in-neighbours (one full-neighbour block), gather their layer-``l`` inputs and run
:meth:`~ooc.models.GNN.layer_forward`.  Layer 0 reads the features through the partition buffer (the
batch's partition resident, the next one prefetched, other rows read from disk); every layer's output
for all nodes is appended, partition by partition, to an uncompressed Zarr array
(:class:`~ooc.storage.rawarray.RawArrayWriter`) and read back through a memory map
(:class:`~ooc.storage.rawarray.RawArray`) as the next layer's input.  Host memory holds one batch's
neighbourhood, never a layer.  The result equals sampled inference with ``fanout -1`` up to float
rounding (tested).

Predictions are written in original id order: when the dataset holds ``nodes/perm`` (``perm[i]`` =
original id of internal node ``i``), rows are mapped back through it.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from ooc.models import GNN, to_torch_blocks
from ooc.util.progress import progress as progress_bar
from ooc.storage.rawarray import RawArray, RawArrayWriter

if TYPE_CHECKING:  # pragma: no cover
    from ooc.data.path import DataPath

__all__ = ["layerwise_inference", "LayerOutput", "write_rows_in_original_order", "IN_MEMORY_LIMIT",
           "layers_in_memory"]

log = logging.getLogger("ooc.inference")

#: Layers smaller than this are kept in memory when no output folder is given.
IN_MEMORY_LIMIT = 1 << 30


def layers_in_memory(num_nodes: int, width: int, staging: int | None, kept: int = 2) -> bool:
    """Whether layer-wise inference may keep its layer outputs (``kept`` of them, float32
    [num_nodes, width] each) in memory: below :data:`IN_MEMORY_LIMIT` each, and under a memory
    budget within ``staging``, the budget's share for batches in flight, which stands idle while a
    run evaluates (None: no budget).  Otherwise they go to Zarr arrays in the run's folder."""
    one = int(num_nodes) * int(width) * 4
    if one > IN_MEMORY_LIMIT:
        return False
    return staging is None or kept * one <= int(staging)


@dataclass
class LayerOutput:
    """One layer's output for all N nodes: an in-memory array or an on-disk Zarr array."""

    array: np.ndarray | RawArray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows ``ids`` (any order)."""
        if isinstance(self.array, RawArray):
            return self.array.gather(ids)[0]
        return self.array[ids]

    def read(self, start: int, stop: int) -> np.ndarray:
        if isinstance(self.array, RawArray):
            return self.array.read(start, stop)
        return self.array[start:stop]

    def close(self) -> None:
        if isinstance(self.array, RawArray):
            self.array.close()


@torch.no_grad()
def layerwise_inference(model: GNN, data: "DataPath", batch_size: int = 1024,
                        out_dir: str | os.PathLike | None = None, device: torch.device | str = "cpu",
                        keep: tuple[int, ...] | None = None, progress: bool = False) -> dict[int, LayerOutput]:
    """Run ``model`` layer by layer over every node with full neighbourhoods.

    Args:
        model: the GNN (put in eval mode here).
        data: the run's data path: topology ``indptr``/``indices`` (the graph messages flow on),
            ``degrees``, partition ``offsets`` and the loader whose buffer serves layer-0 features.
        batch_size: destination nodes per block.
        out_dir: folder for the per-layer Zarr arrays ``layer{i}`` (created; must not hold them).
            ``None``: in memory (refused for a layer above :data:`IN_MEMORY_LIMIT` bytes).
        device: where the model runs.
        keep: layer indices whose outputs are returned (default: the last two); intermediate ones
            are deleted as soon as the next layer is done.
        progress: show a progress bar.

    Returns:
        ``{layer index: LayerOutput}`` for the kept layers; row ``v`` is node ``v`` (internal ids).

    Raises:
        ValueError: ``out_dir`` is None and a layer would exceed :data:`IN_MEMORY_LIMIT`.

    Shapes:
        layer ``i`` output: [N, model.dims[i+1]] float32.
    """
    model.eval()
    device = torch.device(device)
    n = data.num_nodes
    L = model.num_layers
    keep = tuple(range(max(L - 2, 0), L)) if keep is None else tuple(keep)
    sampler = data.eval_sampler([-1])
    degrees, loops = data.graph.degrees, data.graph.loops
    offsets = np.asarray(data.offsets, dtype=np.int64)
    num_parts = offsets.shape[0] - 1
    widest = max(model.dims[1:]) * 4 * n
    root = Path(out_dir) if out_dir is not None else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    on_disk = root is not None
    if not on_disk and widest > IN_MEMORY_LIMIT:
        raise ValueError(f"a layer of {widest / 2**30:.1f} GiB needs an out_dir for its Zarr array")
    outputs: dict[int, LayerOutput] = {}
    prev: LayerOutput | None = None
    bar = progress_bar(total=L * n, enabled=progress, unit="node", desc="inference")
    try:
        for i in range(L):
            width = model.dims[i + 1]
            if on_disk:
                path = root / f"layer{i}"  # type: ignore[operator]
                if path.exists():
                    shutil.rmtree(path)
                writer: RawArrayWriter | None = RawArrayWriter(path, np.float32, (width,), expected_rows=n)
                mem = None
            else:
                writer, mem = None, np.empty((n, width), dtype=np.float32)
            for p in range(num_parts):
                a, b = int(offsets[p]), int(offsets[p + 1])
                # layer 0: the partition's rows in one sequential read unless resident (the buffer
                # is not moved: a shared buffer's other ranks may be reading it)
                window = data.partition_rows(p) if i == 0 else None
                for s in range(a, b, batch_size):
                    e = min(s + batch_size, b)
                    dst = np.arange(s, e, dtype=np.int64)
                    sg = sampler.sample(dst, 0)  # all neighbours: no randomness
                    block = to_torch_blocks(sg, degrees, loops)[0]
                    ids = sg.nodes[: block.num_src]
                    if i == 0 and window is None:
                        h = data.features(ids)
                    elif i == 0:
                        inside = (ids >= a) & (ids < b)
                        raw = np.empty((ids.shape[0], *window.shape[1:]), dtype=window.dtype)
                        raw[inside] = window[ids[inside] - a]
                        if not inside.all():
                            raw[~inside] = data.buffer.gather(ids[~inside])[0]
                        h = data.to_input(raw)
                    else:
                        h = torch.from_numpy(np.ascontiguousarray(prev.gather(ids)))  # type: ignore[union-attr]
                    if device.type != "cpu":
                        block, h = block.to(device), h.to(device)
                    out = model.layer_forward(i, block, h).float().cpu().numpy()
                    if writer is not None:
                        writer.append(out)
                    else:
                        mem[s:e] = out  # type: ignore[index]
                    bar.update(e - s)
            if writer is not None:
                writer.close()
                cur = LayerOutput(RawArray(root / f"layer{i}"))  # type: ignore[operator]
            else:
                cur = LayerOutput(mem)  # type: ignore[arg-type]
            if prev is not None and (i - 1) not in keep:
                prev.close()
                if on_disk:
                    shutil.rmtree(root / f"layer{i - 1}", ignore_errors=True)  # type: ignore[operator]
            if i in keep:
                outputs[i] = cur
            prev = cur
    finally:
        bar.close()
    return outputs


def write_rows_in_original_order(source: Callable[[np.ndarray], np.ndarray], n: int, width: tuple[int, ...],
                                 dtype: np.dtype, sink: Callable[[np.ndarray], None],
                                 perm: np.ndarray | None, chunk: int = 65536) -> None:
    """Stream ``n`` rows to ``sink`` in original id order.

    Args:
        source: ``internal ids -> rows``.
        perm: int64 [N], ``perm[i]`` = original id of internal node ``i`` (``None``: identity).
        sink: called with consecutive row blocks (original ids ``0, 1, ...``).
    """
    inv = None
    if perm is not None:
        perm = np.asarray(perm, dtype=np.int64)
        if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError(f"nodes/perm is not a permutation of 0..{n - 1}")
        inv = np.empty(n, dtype=np.int64)
        inv[perm] = np.arange(n, dtype=np.int64)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        ids = np.arange(s, e, dtype=np.int64) if inv is None else inv[s:e]
        sink(np.ascontiguousarray(source(ids), dtype=dtype).reshape((e - s, *width)))
