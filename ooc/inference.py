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
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from ooc.models import GNN, to_torch_blocks
from ooc.util.progress import progress as progress_bar
from ooc.util.sizes import format_bytes
from ooc.storage.rawarray import RawArray, RawArrayWriter

if TYPE_CHECKING:  # pragma: no cover
    from ooc.data.path import DataPath

__all__ = ["layerwise_inference", "LayerOutput", "Propagated", "KeptInputsError", "write_rows_in_original_order",
           "IN_MEMORY_LIMIT", "layers_in_memory"]

log = logging.getLogger("ooc.inference")

#: Layers smaller than this are kept in memory when no output folder is given.
IN_MEMORY_LIMIT = 1 << 30
#: Layer 0's sequential reads of consecutive partitions, without a memory bound (bytes).
WINDOW_BYTES = 64 << 20
#: Most ranges of partitions whose cut rows layer 0 gathers (one coalesced gather each, up to a pass
#: over the feature file) and holds while it computes them; beyond it they are gathered batch by batch.
MAX_HALO_PHASES = 4


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
    """One layer's output: an in-memory array or an on-disk Zarr array, for all N nodes or (``ids``)
    for a sorted subset of them, row ``k`` holding node ``ids[k]``."""

    array: np.ndarray | RawArray
    ids: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of node ``ids`` (identity for an all-node output).

        Raises:
            KeyError: a node whose output this layer did not compute."""
        if self.ids is None:
            return ids
        pos = np.searchsorted(self.ids, ids)
        bad = (pos >= self.ids.shape[0]) | (self.ids[np.minimum(pos, self.ids.shape[0] - 1)] != ids)
        if bad.any():
            raise KeyError(f"node {int(ids[bad][0])}: its output was not computed (not a target's "
                           "neighbourhood)")
        return pos

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows of nodes ``ids`` (any order)."""
        pos = self.rows_of(np.asarray(ids, dtype=np.int64))
        if isinstance(self.array, RawArray):
            return self.array.gather(pos)[0]
        return self.array[pos]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the stored array (node ids only for an all-node output)."""
        if isinstance(self.array, RawArray):
            return self.array.read(start, stop)
        return self.array[start:stop]

    def close(self) -> None:
        if isinstance(self.array, RawArray):
            self.array.close()

    def discard(self) -> None:
        """Close it and remove its on-disk array, if it has one (a scratch layer no longer read)."""
        self.close()
        if isinstance(self.array, RawArray):
            shutil.rmtree(self.array.path, ignore_errors=True)


class Propagated:
    """Layer 0's inputs for one set of targets, kept between layer-wise passes of one run.

    Where layer 0 factors into a parameter-free propagation and a per-node function
    (:meth:`~ooc.models.GNN.propagates`: SAGE-mean/sum, GCN, GIN), its output for the nodes the
    targets need depends on the features only through each such node's own stored row and its
    propagated neighbourhood (SGC's and SIGN's precomputed features).  The first pass computes
    them while it reads the feature rows and writes them under ``root``; a later pass with the
    same targets and the same kind of layer 0 reads ``|dests[0]| * (row bytes + 4 * in_dim)``
    bytes sequentially instead of the feature rows of every partition holding a needed node and
    their cut rows (a pass over most of the feature file), and skips layer 0's sampling.

    Files (rows in ``dests[0]`` order): ``rows`` (stored dtype), ``propagated`` (float32), and
    ``dests.npz`` (:func:`needed_nodes` of the targets); nothing of it is held in memory between
    passes.  Valid for one dataset and one training run: the owner (a task) keeps it for
    the run and never across datasets.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.key: tuple | None = None
        self.crc: tuple[int, int] = (0, 0)  # CRC-32 of the rows and propagated files, as written
        self.read_bytes = 0  # of the kept inputs, by the last pass (0: it read the features)
        self.written_bytes = 0  # by the last pass
        self._said: set[tuple] = set()

    def say_once(self, key: tuple, msg: str, *args: object) -> None:
        """Log ``msg`` the first time for ``key`` (the same evaluation runs every epoch)."""
        if key not in self._said:
            self._said.add(key)
            log.info(msg, *args)

    @staticmethod
    def key_of(model: GNN, targets: np.ndarray) -> tuple:
        """What the stored inputs depend on besides the dataset: the targets and layer 0's kind."""
        import hashlib
        conv = model.layers[0]
        h = hashlib.blake2b(np.ascontiguousarray(targets, dtype=np.int64).tobytes(), digest_size=16)
        return (h.hexdigest(), type(conv).__name__, getattr(conv, "aggregator", ""),
                getattr(conv, "self_loops", None), getattr(conv, "normalize", None), model.dims[0])

    def ready(self, key: tuple) -> bool:
        """Whether the stored inputs are complete and for ``key`` (:meth:`key_of`)."""
        return self.key == key

    def dests(self) -> list[np.ndarray]:
        """The stored pass's :func:`needed_nodes` (layer 0 first)."""
        with np.load(self.root / "dests.npz") as z:
            return [z[f"d{i}"] for i in range(len(z.files))]

    def open(self) -> tuple[RawArray, RawArray]:
        """The stored rows and propagated rows (close both)."""
        return RawArray(self.root / "rows"), RawArray(self.root / "propagated")

    def commit(self, key: tuple, dests: list[np.ndarray], crc: tuple[int, int]) -> None:
        """Mark the files written by a pass as complete for ``key``; ``crc``: the CRC-32 of the
        bytes appended to ``rows`` and ``propagated``, checked as a later pass reads them."""
        np.savez(self.root / "dests.npz", **{f"d{i}": d for i, d in enumerate(dests)})
        self.key, self.crc = key, crc

    def clear(self) -> None:
        """Forget and delete the stored inputs."""
        self.key = None
        shutil.rmtree(self.root, ignore_errors=True)


class KeptInputsError(Exception):
    """The kept layer-0 inputs could not be read back as written (missing, short, or another
    CRC-32): the pass is run again from the features, which rebuilds them."""


def needed_nodes(sampler, targets: np.ndarray, num_layers: int, batch_size: int = 4096
                 ) -> list[np.ndarray]:
    """The nodes whose layer outputs the full-neighbourhood outputs of ``targets`` need.

    Args:
        sampler: a full-neighbour sampler (``sample(dst, 0)``: a one-layer subgraph whose
            ``nodes`` hold ``dst`` and all their in-neighbours).
        targets: int64 node ids (any order, duplicates allowed).
        num_layers: L >= 1.
        batch_size: destinations per sampler call.

    Returns:
        ``dests`` of length L, sorted unique int64 ids: ``dests[L - 1]`` the targets, ``dests[i]``
        ``dests[i + 1]`` and their in-neighbours (the nodes whose layer-``i`` output is needed;
        layer 0 reads the feature rows of ``dests[0]`` and their in-neighbours).
    """
    cur = np.unique(np.asarray(targets, dtype=np.int64))
    dests = [cur]
    for _ in range(num_layers - 1):
        parts = [cur]
        for s in range(0, cur.shape[0], batch_size):
            parts.append(np.asarray(sampler.sample(cur[s:s + batch_size], 0).nodes, dtype=np.int64))
        cur = np.unique(np.concatenate(parts))
        dests.insert(0, cur)
    return dests


@torch.no_grad()
def layerwise_inference(model: GNN, data: "DataPath", batch_size: int = 1024,
                        out_dir: str | os.PathLike | None = None, device: torch.device | str = "cpu",
                        keep: tuple[int, ...] | None = None, progress: bool = False,
                        targets: np.ndarray | None = None, memory: int | None = None,
                        propagated: "Propagated | None" = None) -> dict[int, LayerOutput]:
    """Run ``model`` layer by layer with full neighbourhoods (see :func:`_layerwise`, which has the
    arguments); kept layer-0 inputs that cannot be read back as written (:class:`KeptInputsError`)
    are dropped with a warning and the pass runs again from the features, rebuilding them."""
    args = (model, data, batch_size, out_dir, device, keep, progress, targets, memory)
    if propagated is not None:
        propagated.read_bytes = propagated.written_bytes = 0
        try:
            return _layerwise(*args, propagated)
        except KeptInputsError as err:
            log.warning("layer-wise inference: layer 0's kept inputs in %s %s; reading the features "
                        "instead (they are written again)", propagated.root, err)
            propagated.clear()
    return _layerwise(*args, propagated)


def _layerwise(model: GNN, data: "DataPath", batch_size: int = 1024,
                        out_dir: str | os.PathLike | None = None, device: torch.device | str = "cpu",
                        keep: tuple[int, ...] | None = None, progress: bool = False,
                        targets: np.ndarray | None = None, memory: int | None = None,
                        propagated: Propagated | None = None) -> dict[int, LayerOutput]:
    """Run ``model`` layer by layer with full neighbourhoods, over every node or over what
    ``targets`` need.

    Args:
        model: the GNN (put in eval mode here).
        data: the run's data path: topology ``indptr``/``indices`` (the graph messages flow on),
            ``degrees``, partition ``offsets`` and the loader whose buffer serves layer-0 features.
        batch_size: destination nodes per block (fewer where a block would take more than a
            quarter of ``memory``).
        out_dir: folder for the per-layer Zarr arrays ``layer{i}`` (created; must not hold them).
            ``None``: in memory (refused for a layer above :data:`IN_MEMORY_LIMIT` bytes).  With
            ``memory``, only where the layers do not fit it.
        device: where the model runs.
        keep: layer indices whose outputs are returned (default: the last two); intermediate ones
            are deleted as soon as the next layer is done.
        progress: show a progress bar.
        targets: int64 node ids whose last-layer outputs are wanted (None: every node).  Layer
            ``i`` then computes only the nodes within ``L - 1 - i`` hops of them
            (:func:`needed_nodes`), and layer 0 reads only the partitions holding such nodes.
        memory: bytes this pass may hold (the parts of a budget idle while a run evaluates), or
            None (no bound; layer 0 reads up to :data:`WINDOW_BYTES` at once).  Spent in order on
            a block in flight (its rows stored and as float32, its output), two consecutive layers'
            outputs (else they go to ``out_dir``), the layer-0 inputs outside the partition of the
            destinations that read them (the cut rows, with ``targets``: gathered once, sorted and
            coalesced, before layer 0; else batch by batch), and layer 0's sequential reads of
            consecutive partitions (at least one partition each).
        propagated: with ``targets``, where layer 0's inputs for them are kept between passes
            (:class:`Propagated`): filled by this pass where layer 0 factors and the kept inputs
            are at most half the feature file, read instead of the features when already filled
            for the same targets.  The outputs equal those without it up to float rounding.

    Returns:
        ``{layer index: LayerOutput}`` for the kept layers; row ``v`` is node ``v`` (internal ids),
        or with ``targets`` row ``k`` is node ``LayerOutput.ids[k]``.

    Raises:
        ValueError: ``out_dir`` is None and a layer would exceed :data:`IN_MEMORY_LIMIT`.

    Shapes:
        layer ``i`` output: [N or len(ids), model.dims[i+1]] float32.
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
    dests: list[np.ndarray | None] = [None] * L
    halo: LayerOutput | None = None
    row_bytes = data.buffer.row_bytes
    cut: dict[int, np.ndarray] = {}
    key = None
    # (a user's model, MODULE:CLASS, has layer_forward but no propagation contract: never kept)
    if targets is not None and propagated is not None and isinstance(model, GNN) and model.propagates(0):
        key = Propagated.key_of(model, targets)
    cached = key is not None and propagated.ready(key)  # type: ignore[union-attr]
    if cached:
        try:
            dests = propagated.dests()  # type: ignore[union-attr,assignment]
        except (OSError, ValueError, KeyError) as err:
            raise KeptInputsError(f"(dests.npz: {err})") from None
    elif targets is not None:
        dests = needed_nodes(sampler, targets, L, max(batch_size, 4096))  # type: ignore[assignment]
        owner = np.searchsorted(offsets, dests[0], side="right") - 1  # type: ignore[arg-type]
        cut = _cut_inputs(sampler, dests[0], owner, offsets, max(batch_size, 4096))  # type: ignore[arg-type]
    # keep layer 0's inputs for the next pass where they are at most half the feature file
    kept_bytes = int(dests[0].shape[0]) * (row_bytes + 4 * model.dims[0]) if key is not None else 0  # type: ignore[union-attr]
    build = key is not None and not cached and kept_bytes <= n * row_bytes // 2
    if key is not None and not cached:
        propagated.clear()  # type: ignore[union-attr]
        if build:
            propagated.say_once(key, "layer-wise inference keeps layer 0's inputs of %d nodes (%s) in %s: "  # type: ignore[union-attr]
                                "later passes over the same targets read them instead of the features",
                                int(dests[0].shape[0]), format_bytes(kept_bytes), propagated.root)  # type: ignore[union-attr]
        else:
            propagated.say_once(key, "layer-wise inference does not keep layer 0's inputs: %d nodes' rows "  # type: ignore[union-attr]
                                "and float32 aggregates (%s) are more than half the feature file (%s)",
                                int(dests[0].shape[0]), format_bytes(kept_bytes), format_bytes(n * row_bytes))
    rows = [n if d is None else int(d.shape[0]) for d in dests]
    sizes = [r * w * 4 for r, w in zip(rows, model.dims[1:])]
    widest = max(sizes)
    # memory, in order: a block in flight (its rows stored and as float32, its output, ids),
    # two consecutive layers' outputs, the cut rows, then layer 0's sequential reads
    ip = data.graph.indptr
    branching = 1.0 + float(ip[-1]) / max(n, 1) if ip is not None else 1.0
    per_dest = int(branching * (row_bytes + 4 * model.dims[0] + 4 * max(model.dims[1:]) + 24))
    if memory is not None:  # a block takes at most a quarter of the memory (at least 64 nodes)
        batch_size = max(64, min(batch_size, memory // 4 // max(per_dest, 1)))
    block_bytes = batch_size * per_dest
    layers = max([sizes[0]] + [sizes[i - 1] + sizes[i] for i in range(1, L)])
    fits = widest <= IN_MEMORY_LIMIT and (memory is None or block_bytes + layers <= memory)
    left = None if memory is None else memory - block_bytes - (layers if fits else 0)
    # the cut rows: one range of partitions whose cut rows fit at a time (one coalesced gather
    # each), else batch by batch
    phases = _halo_phases(cut, num_parts, row_bytes, left) if targets is not None and not cached else None
    if phases is not None and left is not None:
        left -= max(int(c.shape[0]) for _, _, c in phases) * row_bytes
    if phases is None:
        phases = [(0, num_parts, None)]  # type: ignore[list-item]
    window_cap = WINDOW_BYTES if left is None else max(0, left)
    root = Path(out_dir) if out_dir is not None and (memory is None or not fits) else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    on_disk = root is not None
    if not on_disk and widest > IN_MEMORY_LIMIT:
        raise ValueError(f"a layer of {widest / 2**30:.1f} GiB needs an out_dir for its Zarr array")
    outputs: dict[int, LayerOutput] = {}
    prev: LayerOutput | None = None
    bar = progress_bar(total=sum(rows), enabled=progress, unit="node", desc="inference")
    try:
        for i in range(L):
            width = model.dims[i + 1]
            d_i = dests[i]
            if on_disk:
                path = root / f"layer{i}"  # type: ignore[operator]
                if path.exists():
                    shutil.rmtree(path)
                writer: RawArrayWriter | None = RawArrayWriter(path, np.float32, (width,),
                                                               expected_rows=rows[i])
                mem = None
            else:
                writer, mem = None, np.empty((rows[i], width), dtype=np.float32)
            done = 0
            if i == 0 and cached:  # the kept inputs, read in order, instead of the features
                try:
                    rows_in, agg_in = propagated.open()  # type: ignore[union-attr]
                except OSError as err:
                    raise KeptInputsError(f"({err})") from None
                crc = [0, 0]
                try:
                    for s in range(0, rows[0], batch_size):
                        e = min(s + batch_size, rows[0])
                        try:
                            raw_rows, raw_agg = rows_in.read(s, e), agg_in.read(s, e)
                        except OSError as err:
                            raise KeptInputsError(f"({err})") from None
                        crc[0] = zlib.crc32(raw_rows, crc[0])
                        crc[1] = zlib.crc32(raw_agg, crc[1])
                        propagated.read_bytes += raw_rows.nbytes + raw_agg.nbytes  # type: ignore[union-attr]
                        h_dst = data.to_input(raw_rows)
                        agg = torch.from_numpy(raw_agg)
                        if device.type != "cpu":
                            h_dst, agg = h_dst.to(device), agg.to(device)
                        done = _emit(model.layer_from_propagated(0, h_dst, agg).float().cpu().numpy(),
                                     writer, mem, done, bar)
                finally:
                    rows_in.close()
                    agg_in.close()
                if tuple(crc) != propagated.crc:  # type: ignore[union-attr]
                    raise KeptInputsError("(their CRC-32 differs from what was written)")
            kept_rows = kept_agg = None
            kept_crc = [0, 0]
            if i == 0 and build:
                propagated.root.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
                feats = data.buffer.features
                kept_rows = RawArrayWriter(propagated.root / "rows", feats.dtype,  # type: ignore[union-attr]
                                           tuple(feats.shape[1:]), expected_rows=rows[0])
                kept_agg = RawArrayWriter(propagated.root / "propagated", np.float32,  # type: ignore[union-attr]
                                          (model.dims[0],), expected_rows=rows[0])
            # layer 0 reads runs of partitions (none resident) in one sequential read each, up to
            # `window` bytes, each phase's cut rows held; later layers read the previous output,
            # in blocks across partitions
            groups = [] if i == 0 and cached else \
                [(p, q, c) for p0, q0, c in phases for p, q in _groups(data, offsets, row_bytes, window_cap, p0, q0)] \
                if i == 0 else [(0, num_parts, None)]
            for p, q, c in groups:
                if i == 0 and c is not None and (halo is None or halo.ids is not c):
                    halo = None  # the previous phase's rows go first
                    halo = LayerOutput(data.buffer.gather(c)[0], c)
                a, b = int(offsets[p]), int(offsets[q])
                if d_i is None:
                    here = None
                    count = b - a
                else:
                    lo, hi = np.searchsorted(d_i, [a, b])
                    here = d_i[lo:hi]
                    count = int(hi - lo)
                if count == 0:
                    continue
                # (the buffer is not moved: a shared buffer's other ranks may be reading it)
                window = data.partition_rows(p, q) if i == 0 else None
                for s in range(0, count, batch_size):
                    e = min(s + batch_size, count)
                    dst = np.arange(a + s, a + e, dtype=np.int64) if here is None else here[s:e]
                    sg = sampler.sample(dst, 0)  # all neighbours: no randomness
                    block = to_torch_blocks(sg, degrees, loops)[0]
                    ids = sg.nodes[: block.num_src]
                    if i == 0:
                        raw = _layer0_rows(data, ids, a, b, window, halo)
                        h = data.to_input(raw)
                    else:
                        h = torch.from_numpy(np.ascontiguousarray(prev.gather(ids)))  # type: ignore[union-attr]
                    if device.type != "cpu":
                        block, h = block.to(device), h.to(device)
                    if kept_agg is not None:  # layer 0, its inputs kept: the same layer in two parts
                        agg = model.layer_propagate(0, block, h)
                        out = model.layer_from_propagated(0, h[: block.num_dst], agg).float().cpu().numpy()
                        own = np.ascontiguousarray(raw[: block.num_dst])
                        agg_np = np.ascontiguousarray(agg.float().cpu().numpy())
                        kept_rows.append(own)  # type: ignore[union-attr]
                        kept_agg.append(agg_np)
                        kept_crc[0] = zlib.crc32(own, kept_crc[0])
                        kept_crc[1] = zlib.crc32(agg_np, kept_crc[1])
                        propagated.written_bytes += own.nbytes + agg_np.nbytes  # type: ignore[union-attr]
                        del agg, agg_np
                    else:
                        out = model.layer_forward(i, block, h).float().cpu().numpy()
                    done = _emit(out, writer, mem, done, bar)
                del window
            if kept_agg is not None:
                kept_rows.close()  # type: ignore[union-attr]
                kept_agg.close()
                propagated.commit(key, dests, (kept_crc[0], kept_crc[1]))  # type: ignore[union-attr,arg-type]
            if writer is not None:
                writer.close()
                cur = LayerOutput(RawArray(root / f"layer{i}"), d_i)  # type: ignore[operator]
            else:
                cur = LayerOutput(mem, d_i)  # type: ignore[arg-type]
            if i == 0 and halo is not None:
                halo = None
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


def _emit(out: np.ndarray, writer: RawArrayWriter | None, mem: np.ndarray | None, done: int,
          bar) -> int:
    """Append a block's output rows to the layer (its Zarr writer, else its in-memory array at row
    ``done``); returns the rows written so far."""
    if writer is not None:
        writer.append(out)
    else:
        mem[done:done + out.shape[0]] = out  # type: ignore[index]
    bar.update(out.shape[0])
    return done + out.shape[0]


def _groups(data: "DataPath", offsets: np.ndarray, row_bytes: int, cap: int, start: int, stop: int
            ) -> list[tuple[int, int]]:
    """Runs ``[p, q)`` of consecutive partitions in ``[start, stop)`` that layer 0 reads in one
    sequential read each: none resident and at most ``cap`` bytes together (a resident or larger
    partition alone)."""
    out: list[tuple[int, int]] = []
    p, n = start, stop
    while p < n:
        q = p + 1
        if data.buffer.slot_of[p] < 0:
            while (q < n and data.buffer.slot_of[q] < 0
                   and (int(offsets[q + 1]) - int(offsets[p])) * row_bytes <= cap):
                q += 1
        out.append((p, q))
        p = q
    return out


def _cut_inputs(sampler, dests: np.ndarray, owner: np.ndarray, offsets: np.ndarray,
                batch_size: int) -> dict[int, np.ndarray]:
    """Per partition ``p``, the sorted unique layer-0 inputs of its destinations lying outside it
    (``owner``: each destination's partition, ``dests`` sorted)."""
    cut: dict[int, np.ndarray] = {}
    bounds = np.flatnonzero(np.diff(owner)) + 1
    for seg in np.split(np.arange(dests.shape[0]), bounds):
        if seg.shape[0] == 0:
            continue
        p = int(owner[seg[0]])
        a, b = int(offsets[p]), int(offsets[p + 1])
        got = []
        for s in range(0, seg.shape[0], batch_size):
            nodes = np.asarray(sampler.sample(dests[seg[s:s + batch_size]], 0).nodes, dtype=np.int64)
            got.append(nodes[(nodes < a) | (nodes >= b)])
        cut[p] = np.unique(np.concatenate(got))
    return cut


def _halo_phases(cut: dict[int, np.ndarray], num_parts: int, row_bytes: int, cap: int | None
                 ) -> list[tuple[int, int, np.ndarray]] | None:
    """Consecutive partition ranges ``(p, q, cut rows)`` whose cut rows fit ``cap`` bytes each
    (None: one range), at most :data:`MAX_HALO_PHASES` of them; None when they would be more
    (the cut rows are then gathered batch by batch)."""
    if not cut:
        return [(0, num_parts, np.empty(0, dtype=np.int64))]
    whole = np.unique(np.concatenate(list(cut.values())))
    if cap is None or whole.shape[0] * row_bytes <= cap:
        return [(0, num_parts, whole)]
    if cap < row_bytes:
        return None
    bounds: list[tuple[int, int]] = []
    start, held = 0, 0
    for p in range(num_parts):
        k = int(cut[p].shape[0]) if p in cut else 0
        if held and (held + k) * row_bytes > cap:  # (ids repeated across partitions counted twice)
            bounds.append((start, p))
            start, held = p, 0
        held += k
    bounds.append((start, num_parts))
    parts = [[cut[p] for p in range(a, b) if p in cut] for a, b in bounds]
    if len(bounds) > MAX_HALO_PHASES or any(sum(c.shape[0] for c in cs) * row_bytes > cap for cs in parts):
        return None
    return [(a, b, np.unique(np.concatenate(cs)) if cs else np.empty(0, dtype=np.int64))
            for (a, b), cs in zip(bounds, parts)]


def _layer0_rows(data: "DataPath", ids: np.ndarray, a: int, b: int, window: np.ndarray | None,
                 halo: LayerOutput | None) -> np.ndarray:
    """Stored feature rows of ``ids`` for a block of partition ``[a, b)``: its own rows from
    ``window`` (its sequential read) or the buffer, the others from ``halo`` or the buffer."""
    if window is None and halo is None:
        return data.buffer.gather(ids)[0]
    inside = (ids >= a) & (ids < b)
    feats = data.buffer.features
    raw = np.empty((ids.shape[0], *feats.shape[1:]), dtype=feats.dtype)
    raw[inside] = window[ids[inside] - a] if window is not None else data.buffer.gather(ids[inside])[0]
    if not inside.all():
        out = ids[~inside]
        raw[~inside] = halo.gather(out) if halo is not None else data.buffer.gather(out)[0]
    return raw


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
