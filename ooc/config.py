"""Training configuration: one dataclass, every option, loadable from YAML and overridable.

A run is configured by, in increasing precedence:

1. the defaults below;
2. a YAML file (``ooc train --config run.yaml``), nested by section or flat::

       data:   {dataset: data/cora, partitions: 4, buffer_partitions: 1, feat_norm: row}
       model:  {name: gat, hidden: 64, heads: 8, dropout: 0.6, attn_dropout: 0.6}
       train:  {epochs: 200, lr: 0.005, patience: 100}
       run:    {seed: 0, output_dir: runs/cora-gat}

3. plain command-line flags (``--hidden 256``; every field has one, see ``ooc train --help``);
4. ``--set section.key=value`` (or ``--set key=value``), values parsed as YAML scalars / lists.

The resolved configuration is saved with the run (``RUN/config.yaml``, nested, reusable as
``--config``; ``RUN/config.json``, flat).  Each field's section is in its metadata; a field without
one (added later) lives in section ``train``.  Keys are the field names, except ``model.name`` (the
``model`` field) -- so both ``model: gcn`` (flat) and ``model: {name: gcn}`` (nested) work.
"""

from __future__ import annotations

import difflib
import io
import json
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainConfig", "read_ahead_batches", "sample_ahead_batches", "parse_fanouts", "evaluation_fanouts",
           "auto_layerwise_eval", "load_yaml", "SECTIONS", "ConfigError"]

SECTIONS = ("data", "sampler", "model", "task", "train", "eval", "run")

#: ``--mode``: see :mod:`ooc.data.path`
MODES = ("exact", "buffer", "hybrid")
#: Most disk requests in flight (``--io-depth``): up to this many a reader's AIO staging stays within
#: ``ooc.storage.io.AIO_STAGING_BYTES`` (8 MiB) at its smallest slot (16 KiB).
MAX_IO_DEPTH = 512


class ConfigError(ValueError):
    """An unknown key or a value of the wrong type in a configuration."""


def parse_fanouts(text: str | list[int]) -> list[int]:
    """``"10,10"`` -> ``[10, 10]``; ``-1`` means all neighbours.

    Raises:
        ValueError: an entry is not an integer or is empty (``"10,,5"``, ``"10,"``: one layer
            fewer than written), is 0 or below -1, or the list is empty.
    """
    if isinstance(text, (list, tuple)):
        vals = [int(v) for v in text]
    elif isinstance(text, int) and not isinstance(text, bool):
        vals = [text]
    else:
        body = str(text).strip().strip("[]").strip()
        items = body.split(",") if body else []
        if any(v.strip() == "" for v in items):
            raise ValueError(f"fanouts must be comma-separated integers, got {text!r} (an empty "
                             "entry: one per layer, e.g. 10,10)")
        try:
            vals = [int(v) for v in items]
        except ValueError:
            raise ValueError(f"fanouts must be comma-separated integers, got {text!r}") from None
    if not vals:
        raise ValueError("at least one fanout is needed")
    for v in vals:
        if v == 0 or v < -1:
            raise ValueError(f"fanout {v} invalid: use a positive count or -1 for all neighbours")
    return vals


def _batches_or_auto(value: "str | int", flag: str, least: int) -> int | None:
    """A batch count option: ``auto`` -> None, else the count (0 = off, or >= ``least``).

    Raises:
        ValueError: anything else (naming ``flag`` and the value).
    """
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n == 0 or n >= least:
        return n
    raise ValueError(f"{flag} must be auto, 0 (off) or >= {least} batches, got {value!r}")


def read_ahead_batches(value: "str | int") -> int | None:
    """``--read-ahead``: ``auto`` -> None, else the number of batches (0 = off, or >= 2).

    Raises:
        ValueError: anything else (naming the value).
    """
    return _batches_or_auto(value, "--read-ahead", 2)


def sample_ahead_batches(value: "str | int") -> int | None:
    """``--sample-ahead``: ``auto`` -> None, else the number of batches (0 = off, or >= 1).

    Raises:
        ValueError: anything else (naming the value).
    """
    return _batches_or_auto(value, "--sample-ahead", 1)


def _opt(default: Any, section: str, help: str, key: str | None = None,
         choices: tuple[str, ...] | None = None, size: bool = False, auto: bool = False) -> Any:
    """A field with its section, help and, optionally, its choices or ``size`` (a byte size such as
    ``4GB``, read with :func:`ooc.util.sizes.parse_bytes`; empty: none; ``auto``: the word
    ``auto`` is accepted too)."""
    meta: dict[str, Any] = {"section": section, "help": help}
    if auto:
        meta["auto"] = True
    if key:
        meta["key"] = key
    if choices:
        meta["choices"] = choices
    if size:
        meta["size"] = True
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d), metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda d=default: dict(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Every option of a training run (see ``ooc train --help`` and the module docstring).

    ``fanouts[0]`` is sampled around the seeds (the output layer), as in DGL and PyG; the model has
    ``len(fanouts)`` layers.  ``buffer_partitions`` of ``partitions`` feature partitions stay resident.
    """

    # data path
    dataset: str = _opt("", "data", "dataset directory written by `ooc convert`")
    partitions: int = _opt(0, "data", "node partitions: 0 = the dataset's stored partitions (ooc "
                           "partition), else 4; P = the stored ones when P of them are stored, else P "
                           "contiguous id ranges")
    buffer_partitions: int = _opt(2, "data", "feature partitions resident in host memory")
    io_threads: int = _opt(1, "data", "background partition loaders")
    prefetch: int = _opt(2, "data", "batches built ahead (0 = synchronous)")
    feat_norm: str = _opt("none", "data", "row: divide feature rows by their sum (Kipf & Welling)",
                          choices=("none", "row"))
    topology: str = _opt("auto", "data", "memory: load the CSC topology; mmap: map it; disk: keep only "
                         "indptr in memory and read neighbour lists with page-aligned reads; auto: "
                         "memory without --memory-budget, else memory or disk, whichever the "
                         "automatic budget split predicts reads less (printed with the plan)",
                         choices=("auto", "memory", "mmap", "disk"))
    hot_topology: str = _opt("auto", "data", "--topology disk: bytes of the topology kept in memory "
                             "for the hottest nodes (most often drawn, per byte), e.g. 256MB; their "
                             "lists are served from memory, the rest read from disk; counted in "
                             "--memory-budget. auto: under a budget the automatic split tries a few "
                             "sizes (none, 1/8, 1/4, 1/2 of the topology) and keeps the one it "
                             "predicts reads least, else none; empty or 0: none",
                             size=True, auto=True)
    # out-of-core data path (see ooc.data.path)
    mode: str = _opt("exact", "data", "exact: full-graph sampling, misses via cache + batched reads; "
                     "buffer: sample inside resident partitions (MariusGNN); hybrid: seeds from resident "
                     "partitions, full-graph sampling", choices=("exact", "buffer", "hybrid"))
    memory_budget: str = _opt("", "data", "host-memory budget for topology, node arrays, batches, "
                              "partition slots and cache, e.g. 4GB (empty: sizes from "
                              "--buffer-partitions / --cache-size)", size=True)
    ordering: str = _opt("comet", "data", "buffer/hybrid partition ordering: sequential or comet "
                         "(two-level randomised; partitions grouped by the training nodes' classes "
                         "where each has one)", choices=("sequential", "comet"))
    hybrid_mix: float = _opt(0.25, "data", "hybrid: fraction of each batch's seeds drawn from all "
                             "training nodes instead of the resident partitions (closer to i.i.d. "
                             "batches, more reads); 0 = seeds of resident partitions only")
    miss_features: str = _opt("auto", "data", "hybrid: where training batches get the rows of their "
                              "outermost hop that are not resident: disk (exact rows, batched reads) "
                              "or pq (decoded from the product-quantisation codes of `ooc compress`, "
                              "kept in memory within the budget; seeds, inner hops and evaluation "
                              "stay exact); auto (the default): pq where the dataset has codes and "
                              "the automatic budget split predicts faster reads with them, else disk "
                              "(always disk in exact and buffer modes, and without codes)",
                              choices=("disk", "pq", "auto"))
    cache_policy: str = _opt("sieve", "data", "CPU feature cache policy for rows outside the buffer; "
                             "belady (exact mode): Belady's MIN over batches sampled --lookahead "
                             "ahead", choices=("sieve", "clock", "lru", "belady", "none"))
    lookahead: int = _opt(16, "data", "--cache-policy belady: training batches sampled ahead, whose "
                          "rows' next uses the cache evicts by")
    read_ahead: str = _opt("auto", "data", "training batches whose rows from outside the partition "
                           "slots are read together, as one sorted coalesced gather held until those "
                           "batches are built (exact and hybrid modes, node tasks; charged to the "
                           "budget); 0 = every batch reads its own; auto: in exact mode under a "
                           "budget without --cache-size, as many as the memory a CPU cache would "
                           "get holds (else 0)")
    sample_ahead: str = _opt("auto", "data", "training batches sampled on a thread of their own "
                             "ahead of the loader thread that gathers their rows (exact and "
                             "hybrid modes, node tasks; charged to the budget); 0 = the loader "
                             "samples each batch as it builds it; auto: 1 where it applies (not "
                             "in buffer mode, which samples the state being loaded, and not with "
                             "a read-ahead window or --cache-policy belady, which sample their "
                             "windows themselves)")
    cache_size: str = _opt("", "data", "feature cache size without a budget, e.g. 256MB", size=True)
    direct_io: bool = _opt(False, "data", "read features with O_DIRECT (bypass the page cache)")
    io_depth: int = _opt(128, "data", "disk requests in flight for a batch's missing rows (Linux "
                         "native AIO with --direct-io, at most 512; else min(io_depth, 8) pread "
                         "threads); partition loads keep min(io_depth, 4) 1 MiB requests in flight")
    io_gap: int = _opt(16384, "data", "bytes of unneeded data a miss read may span to merge two rows "
                       "into one request (O_DIRECT; 0 = only rows on the same or adjacent pages)")
    shared_buffer: bool = _opt(True, "data", "data-parallel runs: local ranks share one partition "
                               "buffer per machine through shared memory (local rank 0 does the I/O)")
    verify: str = _opt("checksums", "data", "verification of the dataset on read: checksums "
                       "(structural scans when the run starts, and every chunk checked against its "
                       "blake2b checksum the first time it is read) or structure (the scans only)",
                       choices=("checksums", "structure"))
    device_cache: str = _opt("", "data", "per-device hot-feature cache size, e.g. 8GB (empty = none; "
                             "on CPU a separate tensor tier)", size=True)
    device_cache_policy: str = _opt("degree", "data", "what the device cache holds: degree (highest "
                                    "out-degree, PaGraph) or presample (most accessed in a pre-sampled "
                                    "epoch, GNNLab)", choices=("degree", "presample"))
    # sampler
    fanouts: list[int] = _opt([10, 10], "sampler",
                              "neighbours per layer, output layer first; -1 = all")
    batch_size: int = _opt(256, "sampler", "seeds (or positive edges) per training batch")
    eval_batch_size: int = _opt(1024, "sampler", "nodes per evaluation / inference batch")
    replace: bool = _opt(False, "sampler", "sample neighbours with replacement")
    sampler: str = _opt("neighbor", "sampler", "training sampler: node-wise (GraphSAGE), LABOR-0, LADIES, "
                        "ClusterGCN, GraphSAINT random walks; evaluation uses all neighbours",
                        choices=("neighbor", "labor", "ladies", "cluster", "saint"))
    layer_size: int = _opt(512, "sampler", "LADIES: nodes sampled per layer")
    num_clusters: int = _opt(32, "sampler", "ClusterGCN: clusters (METIS parts of the graph)")
    clusters_per_batch: int = _opt(4, "sampler", "ClusterGCN: clusters per batch")
    walk_length: int = _opt(2, "sampler", "GraphSAINT: random-walk length (--batch-size roots per batch)")
    # model
    model: str = _opt("sage", "model", "GNN layer type: sage, gcn, gat, gin, or MODULE:CLASS, a torch "
                      "module of yours imported from an importable module (README: Your own model)",
                      key="name")
    model_options: dict = _opt({}, "model", "MODULE:CLASS models: extra keyword arguments of the "
                               "constructor, a YAML mapping such as '{heads: 4}'", key="options")
    embedding: int = _opt(0, "model", "learnable node embeddings of width D as model input, "
                          "concatenated to the features (the whole input when the dataset has none); "
                          "0 = off")
    hidden: int = _opt(64, "model", "hidden width (GAT: all heads together)")
    dropout: float = _opt(0.5, "model", "dropout on every layer's input")
    aggregator: str = _opt("mean", "model", "GraphSAGE aggregator", choices=("mean", "sum", "max"))
    heads: int = _opt(8, "model", "GAT attention heads of hidden layers")
    out_heads: int = _opt(1, "model", "GAT attention heads of the output layer (averaged)")
    attn_dropout: float = _opt(0.0, "model", "GAT dropout on attention weights")
    feat_dropout: float = _opt(0.0, "model", "GAT dropout on the aggregated transformed features W x "
                               "(the reference GAT code's second in_drop)")
    dropout_per_head: bool = _opt(False, "model", "GAT: a separate input-dropout mask for every head "
                                  "(the reference GAT code)")
    residual: bool = _opt(False, "model", "residual connection around every layer")
    norm: str = _opt("none", "model", "normalisation after hidden layers",
                     choices=("none", "batch", "layer"))
    activation: str = _opt("relu", "model", "activation after hidden layers", choices=("relu", "elu"))
    gin_eps: float = _opt(0.0, "model", "GIN initial epsilon")
    gin_train_eps: bool = _opt(True, "model", "learn GIN's epsilon")
    init: str = _opt("torch", "model", "weights of the SAGE, GCN and GIN layers: torch (nn.Linear's "
                     "default, as PyG) or glorot (Glorot-uniform with the ReLU gain, zero biases: "
                     "DGL's SAGEConv, the GraphSAGE and GCN papers' code); GAT is always Glorot",
                     choices=("torch", "glorot"))
    # task
    task: str = _opt("node", "task", "node: node classification (multi-class, or multi-label when "
                     "labels are [N, C]); link: link prediction", choices=("node", "link"))
    decoder: str = _opt("dot", "task", "link decoder: dot product or DistMult",
                        choices=("dot", "distmult"))
    neg_ratio: int = _opt(1, "task", "link: uniform negative edges per positive in training")
    val_frac: float = _opt(0.05, "task", "link: fraction of undirected edges held out for validation")
    test_frac: float = _opt(0.10, "task", "link: fraction of undirected edges held out for test")
    split_seed: int = _opt(0, "task", "link: seed of the edge split (fixed across --repeat seeds)")
    eval_candidates: int = _opt(1000, "task",
                                "link: random candidate tails each held-out edge is ranked against")
    hits_k: list[int] = _opt([10, 20, 50], "task", "link: K of the reported Hits@K")
    # optimisation
    epochs: int = _opt(10, "train", "training epochs")
    lr: float = _opt(0.01, "train", "learning rate")
    weight_decay: float = _opt(5e-4, "train", "L2 penalty (Adam) / decoupled decay (AdamW)")
    weight_decay_scope: str = _opt("all", "train", "parameters the weight decay applies to: all, or "
                                   "first (the first layer only, as in Kipf & Welling's GCN)",
                                   choices=("all", "first"))
    optimizer: str = _opt("adam", "train", "optimiser", choices=("adam", "adamw", "sgd"))
    lr_schedule: str = _opt("none", "train", "learning-rate schedule, stepped once per epoch",
                            choices=("none", "step", "cosine", "plateau"))
    lr_step: int = _opt(50, "train", "step schedule: epochs between decays; plateau: patience")
    lr_gamma: float = _opt(0.5, "train", "step / plateau decay factor")
    patience: int = _opt(0, "train", "early stopping after N evaluations without a better "
                         "validation score (0 = off)")
    early_stop: str = _opt("score", "train", "what counts as progress for --patience and the best "
                           "model: score (a better validation score) or score_or_loss (the GAT "
                           "paper's rule: patience restarts when the validation score or loss is at "
                           "least as good as ever; the best model is the latest that is at least as "
                           "good in both)", choices=("score", "score_or_loss"))
    amp: bool = _opt(False, "train", "mixed precision (autocast + GradScaler) on CUDA; "
                     "ignored on CPU")
    device: str = _opt("auto", "train", "auto (CUDA when available), cpu or cuda[:i]")
    threads: int = _opt(0, "train", "torch intra-op threads (0 = torch's default)")
    # evaluation
    eval_every: int = _opt(1, "eval", "evaluate every N epochs")
    eval_mode: str = _opt("auto", "eval", "per-epoch evaluation: sampled (the evaluated seeds' "
                          "neighbourhoods, batch by batch), layerwise (layer by layer over what the "
                          "evaluated nodes need, each node once) or auto (layerwise for a node task "
                          "under a memory budget that does not hold every partition, with full "
                          "neighbourhoods, one process and a built-in model; else sampled)",
                          choices=("auto", "sampled", "layerwise"))
    eval_fanouts: list[int] = _opt([], "eval", "sampled evaluation: neighbours per layer, output layer "
                                   "first (empty = all neighbours, exact for the evaluated seeds; on "
                                   "large power-law graphs full 3-hop neighbourhoods reach most of the "
                                   "graph, so give e.g. the training fanouts)")
    # run
    seed: int = _opt(0, "run", "seed of Python, NumPy, torch and the samplers")
    output_dir: str = _opt("runs/latest", "run", "run directory")
    checkpoint_every: int = _opt(0, "run", "also checkpoint every N training steps (0 = only at "
                                 "epoch ends)")
    progress: bool = _opt(True, "run", "progress bar (--no-progress: none; the per-epoch lines print either way)")

    # ------------------------------------------------------------------ conversions
    def to_dict(self) -> dict:
        """Flat ``{field: value}``."""
        return asdict(self)

    def to_nested(self) -> dict:
        """``{section: {key: value}}`` in field order (the layout of ``RUN/config.yaml``)."""
        out: dict[str, dict] = {}
        for f in fields(self):
            sec = f.metadata.get("section", "train")
            out.setdefault(sec, {})[f.metadata.get("key", f.name)] = getattr(self, f.name)
        return out

    def to_yaml(self) -> str:
        import yaml
        return yaml.safe_dump(self.to_nested(), sort_keys=False, default_flow_style=False)

    def save(self, run_dir: str | Path) -> None:
        """Write ``config.yaml`` (nested) and ``config.json`` (flat) into ``run_dir`` atomically."""
        import os
        d = Path(run_dir)
        for name, text in (("config.yaml", self.to_yaml()),
                           ("config.json", json.dumps(self.to_dict(), indent=2, sort_keys=True))):
            tmp = d / f".{name}.tmp-{os.getpid()}"
            try:
                tmp.write_text(text)
                os.replace(tmp, d / name)
            finally:  # a failed write (disk full) leaves no empty temporary behind
                if tmp.exists():
                    tmp.unlink()

    # ------------------------------------------------------------------ updates
    @classmethod
    def field_types(cls) -> dict[str, Any]:
        return typing.get_type_hints(cls)

    @classmethod
    def key_map(cls) -> dict[str, str]:
        """Accepted key -> field name: ``name``, ``section.key`` and ``section.name`` spellings."""
        m: dict[str, str] = {}
        for f in fields(cls):
            sec = f.metadata.get("section", "train")
            key = f.metadata.get("key", f.name)
            m[f.name] = f.name
            m[f"{sec}.{key}"] = f.name
            m[f"{sec}.{f.name}"] = f.name
        return m

    def update(self, values: dict, source: str = "config") -> "TrainConfig":
        """Apply ``values`` (flat, dotted or nested by section) with type checking; returns self.

        Raises:
            ConfigError: unknown key (with the closest known key) or a value of the wrong type.
        """
        km = self.key_map()
        flat: dict[str, Any] = {}

        def walk(prefix: str, d: dict) -> None:
            for k, v in d.items():
                name = f"{prefix}{k}"
                if isinstance(v, dict) and (name in SECTIONS or name not in km):
                    walk(name + ".", v)
                else:
                    flat[name] = v

        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a mapping of options, got {type(values).__name__}")
        walk("", values)
        types = self.field_types()
        for k, v in flat.items():
            if k not in km:
                close = difflib.get_close_matches(k, list(km), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown option {k!r}{hint}")
            name = km[k]
            setattr(self, name, _coerce(name, types[name], v, source))
        return self

    def apply_sets(self, assignments: list[str]) -> "TrainConfig":
        """Apply ``["model.hidden=256", "lr=0.005", ...]`` (values parsed as YAML).

        Raises:
            ConfigError: an entry without ``=``, an unknown key or a badly typed value.
        """
        for a in assignments:
            if "=" not in a:
                raise ConfigError(f"--set {a!r}: expected KEY=VALUE")
            k, v = a.split("=", 1)
            try:
                val = safe_yaml(v, f"--set {a}") if v.strip() else ""
            except ConfigError as e:
                if "alias" in str(e):
                    raise
                val = v
            self.update({k.strip(): val}, source=f"--set {a}")
        return self

    @classmethod
    def from_sources(cls, yaml_path: str | Path | None = None, flags: dict | None = None,
                     sets: list[str] | None = None) -> "TrainConfig":
        """Defaults < YAML file < flags < ``--set`` (see the module docstring)."""
        cfg = cls()
        if yaml_path:
            cfg.update(load_yaml(yaml_path), source=str(yaml_path))
        if flags:
            cfg.update(flags, source="command line")
        if sets:
            cfg.apply_sets(sets)
        return cfg

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ValueError on inconsistent options."""
        for f in fields(self):
            ch = f.metadata.get("choices")
            if ch and getattr(self, f.name) not in ch:
                raise ValueError(f"{option_flag(f.name)} must be one of {', '.join(ch)}, got "
                                 f"{getattr(self, f.name)!r}")
        self.fanouts = parse_fanouts(self.fanouts)
        if self.eval_fanouts:
            self.eval_fanouts = parse_fanouts(self.eval_fanouts)
            if len(self.eval_fanouts) != len(self.fanouts):
                raise ValueError(f"--eval-fanout {','.join(map(str, self.eval_fanouts))} must have one "
                                 f"entry per layer ({len(self.fanouts)}, as --fanout "
                                 f"{','.join(map(str, self.fanouts))})")
            if self.eval_mode == "layerwise" and any(f != -1 for f in self.eval_fanouts):
                raise ValueError(f"--eval-fanout {','.join(map(str, self.eval_fanouts))} samples the "
                                 "evaluated neighbourhoods; --eval-mode layerwise uses them whole "
                                 "(drop one of the two)")
        if self.partitions < 0:
            raise ValueError(f"{option_flag('partitions')} must be >= 0 (0: the dataset's), got {self.partitions}")
        for name in ("batch_size", "eval_batch_size", "epochs", "buffer_partitions",
                     "hidden", "eval_every", "heads", "out_heads", "eval_candidates", "layer_size",
                     "num_clusters", "clusters_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{option_flag(name)} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.io_depth <= MAX_IO_DEPTH:
            raise ValueError(f"{option_flag('io_depth')} must be between 1 and {MAX_IO_DEPTH} (requests in flight; each "
                             f"holds a staging slot of at least 16 KiB), got {self.io_depth}")
        for name in ("patience", "checkpoint_every", "threads", "neg_ratio", "lr_step", "walk_length",
                     "io_gap"):
            if getattr(self, name) < 0:
                raise ValueError(f"{option_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.partitions and self.buffer_partitions > self.partitions and not self.memory_budget:
            raise ValueError(f"--buffer-partitions {self.buffer_partitions} exceeds --partitions "
                             f"{self.partitions}")
        if not self.lr >= 0:  # also NaN; 0 keeps the initial weights (torch allows it)
            raise ValueError(f"{option_flag('lr')} must be >= 0 (the learning rate), got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"{option_flag('weight_decay')} must be >= 0, got {self.weight_decay}")
        for name in ("dropout", "attn_dropout", "feat_dropout", "hybrid_mix"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{option_flag(name)} must be in [0, 1), got {getattr(self, name)}")
        if self.embedding < 0:
            raise ValueError(f"{option_flag('embedding')} must be >= 0 (0 = off), got {self.embedding}")
        from ooc.interop.custom import check_model_config
        check_model_config(self)
        if self.model == "gat" and self.hidden % self.heads:
            raise ValueError(f"gat: hidden {self.hidden} must be divisible by heads {self.heads}")
        if not (0 <= self.val_frac < 1 and 0 <= self.test_frac < 1 and
                self.val_frac + self.test_frac < 1):
            raise ValueError(f"val_frac {self.val_frac} + test_frac {self.test_frac} must be in [0, 1)")
        if self.task == "link" and self.early_stop != "score":
            raise ValueError("early_stop score_or_loss needs a validation loss: task node only")
        if self.task == "link" and self.neg_ratio < 1:
            raise ValueError("link prediction needs neg_ratio >= 1")
        if not self.dataset:
            raise ValueError("no dataset given (positional DATASET, data.dataset in --config, or "
                             "--set data.dataset=PATH)")
        validate_data_options(self)


#: command-line flags whose names are not the option's with dashes
_FLAG_NAMES = {"fanouts": "--fanout", "eval_fanouts": "--eval-fanout"}


def command_flag(name: str) -> str:
    """The ``ooc train`` flag of configuration field ``name`` (``fanouts`` -> ``--fanout``)."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def option_flag(name: str) -> str:
    """How a user names configuration field ``name``: its ``ooc train`` flag and its YAML key
    (``feat_dropout`` -> ``--feat-dropout (model.feat_dropout)``; ``fanouts`` -> ``--fanout
    (sampler.fanouts)``), for error messages; the flag alone for a name that is not a field."""
    flag = command_flag(name)
    f = {f.name: f for f in fields(TrainConfig)}.get(name)
    if f is None:
        return flag
    return f"{flag} ({f.metadata.get('section', 'train')}.{f.metadata.get('key', name)})"


def validate_data_options(cfg: "TrainConfig") -> None:
    """Check the data-path fields of a TrainConfig and every combination that cannot work.

    Raises:
        ValueError: naming the option and why.
    """
    from ooc.data.ordering import ORDERINGS
    from ooc.features.cache import LOOKAHEAD_POLICIES, POLICIES
    from ooc.sampling.samplers import check_sampler
    from ooc.util.sizes import parse_bytes
    if cfg.mode not in MODES:
        raise ValueError(f"{option_flag('mode')} must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    if cfg.ordering not in ORDERINGS:
        raise ValueError(f"{option_flag('ordering')} must be one of {', '.join(ORDERINGS)}, got {cfg.ordering!r}")
    if cfg.cache_policy not in (*POLICIES, *LOOKAHEAD_POLICIES, "none"):
        raise ValueError(f"{option_flag('cache_policy')} must be one of {', '.join(POLICIES + LOOKAHEAD_POLICIES)} or "
                         f"none, got {cfg.cache_policy!r}")
    if cfg.cache_policy in LOOKAHEAD_POLICIES and cfg.mode != "exact":
        raise ValueError(f"--cache-policy {cfg.cache_policy} needs --mode exact: it evicts by the "
                         "rows the next batches ask for, known only when the partition buffer is "
                         f"static (in {cfg.mode} mode the misses depend on the residency)")
    if cfg.cache_policy in LOOKAHEAD_POLICIES and cfg.task == "link":
        raise ValueError(f"--cache-policy {cfg.cache_policy} applies to node tasks: link prediction's "
                         "batches (positive edges and their negatives) are not sampled ahead; use "
                         "--cache-policy sieve, clock or lru")
    if cfg.prefetch < 0:
        raise ValueError(f"--prefetch must be >= 0 batches (0 = synchronous), got {cfg.prefetch}")
    if cfg.lookahead < 2:
        raise ValueError(f"--lookahead must be >= 2 batches, got {cfg.lookahead}")
    if read_ahead_batches(cfg.read_ahead):
        if cfg.mode == "buffer":
            raise ValueError("--read-ahead reads rows from outside the partition slots; buffer mode "
                             "samples only resident partitions and reads none (use --mode exact or "
                             "hybrid)")
        if cfg.task == "link":
            raise ValueError("--read-ahead applies to node tasks: link prediction's batches "
                             "(positive edges and their negatives) are not sampled ahead")
        if cfg.cache_size:
            raise ValueError(f"--read-ahead {cfg.read_ahead} and --cache-size {cfg.cache_size}: a "
                             "read-ahead window serves every row outside the partition slots, so "
                             "the cache would never be asked; use one (--read-ahead 0 keeps the "
                             "cache)")
        if cfg.cache_policy in LOOKAHEAD_POLICIES:
            raise ValueError(f"--read-ahead and --cache-policy {cfg.cache_policy} both plan the "
                             "reads of batches sampled ahead (a window read bypasses the cache, so "
                             "Belady's next uses would never be seen); use one")
    if sample_ahead_batches(cfg.sample_ahead):
        why = ("buffer mode samples the partitions of the state being loaded, known only once it is "
               "resident" if cfg.mode == "buffer" else
               "link prediction's batches (positive edges and their negatives) are sampled as they "
               "are built" if cfg.task == "link" else
               f"--read-ahead {cfg.read_ahead} samples its window itself"
               if read_ahead_batches(cfg.read_ahead) else
               f"--cache-policy {cfg.cache_policy} samples its look-ahead window itself"
               if cfg.cache_policy in LOOKAHEAD_POLICIES else "")
        if why:
            raise ValueError(f"--sample-ahead {cfg.sample_ahead}: {why} (use --sample-ahead 0 or "
                             "auto)")
    for f in fields(cfg):
        if f.metadata.get("size") and getattr(cfg, f.name) and \
                not (f.metadata.get("auto") and getattr(cfg, f.name) == "auto"):
            try:
                parse_bytes(getattr(cfg, f.name))
            except ValueError as e:
                raise ValueError(f"--{f.name.replace('_', '-')}: {e}") from None
    if cfg.memory_budget and parse_bytes(cfg.memory_budget) == 0:
        raise ValueError(f"{option_flag('memory_budget')} {cfg.memory_budget}: a budget must be "
                         "positive (leave it out to run without one)")
    if cfg.topology not in ("auto", "memory", "mmap", "disk"):
        raise ValueError(f"{option_flag('topology')} must be auto, memory, mmap or disk, got {cfg.topology!r}")
    if cfg.hot_topology not in ("", "auto") and parse_bytes(cfg.hot_topology) \
            and cfg.topology not in ("disk", "auto"):
        raise ValueError(f"--hot-topology {cfg.hot_topology} keeps the hottest lists of an on-disk "
                         f"topology in memory: it needs --topology disk or auto (with --topology "
                         f"{cfg.topology} the whole topology is already {'in memory' if cfg.topology == 'memory' else 'mapped'})")
    if cfg.miss_features not in ("disk", "pq", "auto"):
        raise ValueError(f"{option_flag('miss_features')} must be disk, pq or auto, got {cfg.miss_features!r}")
    if cfg.miss_features == "pq" and cfg.mode != "hybrid":
        raise ValueError(f"--miss-features pq applies to --mode hybrid only (got "
                         f"--mode {cfg.mode}: exact reads exact rows, buffer has no misses)")
    if cfg.hybrid_mix != TrainConfig.hybrid_mix and cfg.mode != "hybrid":
        why = ("exact batches are drawn from all training nodes" if cfg.mode == "exact" else
               "buffer batches train seeds of the resident partitions only")
        raise ValueError(f"--hybrid-mix {cfg.hybrid_mix:g} applies to --mode hybrid only (got "
                         f"--mode {cfg.mode}: {why})")
    if cfg.ordering != TrainConfig.ordering and cfg.mode == "exact":
        raise ValueError(f"--ordering {cfg.ordering} orders the partition states of --mode buffer or "
                         "hybrid (got --mode exact: its batches are drawn from all training nodes)")
    if cfg.task == "link" and cfg.topology == "disk":
        raise ValueError("--task link with --topology disk: the edge split needs every edge and the "
                         "message-passing graph of the training edges is built in memory; use "
                         "--topology memory or mmap")
    check_sampler(cfg.sampler, cfg.mode, "memory" if cfg.topology == "auto" else cfg.topology,
                  cfg.task)


#: Most YAML aliases (``*name``) a configuration may use: a few are handy, thousands are an alias
#: bomb (nested lists of aliases that expand to billions of items).
MAX_YAML_ALIASES = 100
#: Longest configuration file read (bytes).
MAX_YAML_BYTES = 1 << 20


def safe_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` of ``text`` with aliases bounded (:data:`MAX_YAML_ALIASES`), so an alias
    bomb is refused while it is parsed, before anything expands.

    Raises:
        ConfigError: not valid YAML, or too many aliases (naming ``source``).
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                _Loader.aliases += 1
                if _Loader.aliases > MAX_YAML_ALIASES:
                    mark = self.peek_event().start_mark
                    raise ConfigError(f"{source}: more than {MAX_YAML_ALIASES} YAML aliases (line "
                                      f"{mark.line + 1}): refusing what looks like an alias bomb")
            return super().compose_node(parent, index)

    stream = io.StringIO(text)
    stream.name = str(source)  # the parser's marks name the file, not "<unicode string>"
    try:
        return yaml.load(stream, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None


def load_yaml(path: str | Path) -> dict:
    """Read a YAML configuration file (``yaml.safe_load``); an empty file is ``{}``.

    Raises:
        FileNotFoundError: no such file.  ConfigError: not YAML or not a mapping.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory, not a config file")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such config file") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_YAML_BYTES:,} bytes; not a run configuration")
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is dropped
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text ({e})") from None
    data = safe_yaml(text, str(p))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of options, got {type(data).__name__}")
    return data


def _coerce(name: str, tp: Any, v: Any, source: str) -> Any:
    label = command_flag(name) if source == "command line" else name  # the flag the user typed

    def bad() -> ConfigError:
        import reprlib
        r = reprlib.Repr()  # bounded: never expands a huge (aliased) value
        r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxstring, r.maxother = 2, 6, 6, 6, 80, 80
        shown = r.repr(v)
        return ConfigError(f"{source}: {label} expects {getattr(tp, '__name__', tp)}, got {shown}")

    if tp is bool:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return v.lower() in ("true", "yes", "on", "1")
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise bad()
    if tp is int:
        if isinstance(v, bool):
            raise bad()
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str):
            try:
                return int(v)
            except ValueError:
                raise bad() from None
        raise bad()
    if tp is float:
        if isinstance(v, bool):
            raise bad()
        try:
            return float(v)
        except (TypeError, ValueError):
            raise bad() from None
    if tp is str:
        if isinstance(v, (dict, list)):
            raise bad()
        return str(v)
    if tp is dict:
        if isinstance(v, str):
            import yaml
            try:
                v = yaml.safe_load(v) if v.strip() else {}
            except yaml.YAMLError:
                raise bad() from None
        if v is None:
            return {}
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise bad()
        return dict(v)
    if typing.get_origin(tp) is list:
        if isinstance(v, (list, tuple)) and any(isinstance(x, (list, tuple, dict)) for x in v):
            # nested lists (an alias bomb's shape) are never a list of integers
            raise ConfigError(f"{source}: {label} expects a flat list of integers, got nested lists")
        if name == "fanouts" or (name == "eval_fanouts" and v not in ("", [], None)):
            try:
                return parse_fanouts(v)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{source}: {label}: {e}") from None
        try:
            if isinstance(v, str):
                v = [x for x in v.strip("[]").split(",") if x.strip()]
            if not isinstance(v, (list, tuple)):
                v = [v]
            return [int(x) for x in v]
        except (TypeError, ValueError):
            raise bad() from None
    return v


def evaluation_fanouts(cfg: "TrainConfig") -> list[int]:
    """Fanouts of sampled evaluation: ``cfg.eval_fanouts``, or ``-1`` (all neighbours) per layer
    when it is empty.  One entry per layer, output layer first."""
    return list(cfg.eval_fanouts) if cfg.eval_fanouts else [-1] * len(cfg.fanouts)


def auto_layerwise_eval(cfg: "TrainConfig", world_size: int) -> bool:
    """Whether ``--eval-mode auto`` may evaluate node classification layer-wise: full
    neighbourhoods (no ``--eval-fanout``), one process (layer-wise evaluation is not split across
    ranks) and a built-in model (a custom one may lack ``layer_forward``)."""
    from ooc.interop.custom import is_custom
    return (cfg.eval_mode == "auto" and all(f == -1 for f in evaluation_fanouts(cfg))
            and world_size == 1 and not is_custom(cfg.model))
