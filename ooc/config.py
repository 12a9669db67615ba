"""Training configuration: one dataclass, saved with every run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["TrainConfig", "parse_fanouts"]


def parse_fanouts(text: str | list[int]) -> list[int]:
    """``"10,10"`` -> ``[10, 10]``; ``-1`` means all neighbours.

    Raises:
        ValueError: an entry is not an integer, is 0 or below -1, or the list is empty.
    """
    if isinstance(text, list):
        vals = [int(v) for v in text]
    else:
        try:
            vals = [int(v) for v in str(text).split(",") if v.strip() != ""]
        except ValueError:
            raise ValueError(f"fanouts must be comma-separated integers, got {text!r}") from None
    if not vals:
        raise ValueError("at least one fanout is needed")
    for v in vals:
        if v == 0 or v < -1:
            raise ValueError(f"fanout {v} invalid: use a positive count or -1 for all neighbours")
    return vals


@dataclass
class TrainConfig:
    """Every option of a training run (see ``ooc train --help``).

    ``fanouts[0]`` is sampled around the seeds (the output layer), as in DGL and PyG; the model has
    ``len(fanouts)`` layers.  ``buffer_partitions`` of ``partitions`` feature partitions stay resident.
    """

    dataset: str = ""
    output_dir: str = "runs/latest"
    model: str = "sage"
    fanouts: list[int] = field(default_factory=lambda: [10, 10])
    batch_size: int = 256
    eval_batch_size: int = 1024
    epochs: int = 10
    lr: float = 0.01
    weight_decay: float = 5e-4
    hidden: int = 64
    dropout: float = 0.5
    seed: int = 0
    partitions: int = 4
    buffer_partitions: int = 2
    io_threads: int = 1
    prefetch: int = 2
    replace: bool = False
    feat_norm: str = "none"
    topology: str = "memory"
    eval_every: int = 1
    progress: bool = True
    sampler: str = "neighbor"
    layer_size: int = 512
    num_clusters: int = 32
    clusters_per_batch: int = 4
    walk_length: int = 2

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        """Raise ValueError on inconsistent options."""
        if self.model not in ("sage", "gcn"):
            raise ValueError(f"model must be sage or gcn, got {self.model!r}")
        self.fanouts = parse_fanouts(self.fanouts)
        for name in ("batch_size", "eval_batch_size", "epochs", "partitions", "buffer_partitions",
                     "hidden", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.buffer_partitions > self.partitions:
            raise ValueError(f"--buffer-partitions {self.buffer_partitions} exceeds --partitions "
                             f"{self.partitions}")
        if self.feat_norm not in ("none", "row"):
            raise ValueError(f"feat_norm must be none or row, got {self.feat_norm!r}")
        if self.topology not in ("memory", "mmap"):
            raise ValueError(f"topology must be memory or mmap, got {self.topology!r}")
        from ooc.samplers import SAMPLERS
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        for name in ("layer_size", "num_clusters", "clusters_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.walk_length < 0:
            raise ValueError(f"walk_length must be >= 0, got {self.walk_length}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
