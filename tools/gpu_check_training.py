"""GPU check of the training features: run on a machine with CUDA, record the output.

    python -m ooc.tools.gpu_check_training [--workdir DIR]

For every model (GCN, GraphSAGE, GAT, GIN) it trains on a generated planted-partition graph on CPU,
on CUDA in float32 and on CUDA with ``--amp`` (autocast + GradScaler), then runs layer-wise inference
(``ooc eval``) on CUDA, and prints one line per run.  It fails (exit 1) when CUDA is missing, a run
is not finite, or a CUDA run's test accuracy is more than 3 points below the CPU run's.  The CPU test
suite covers the same code paths with CUDA replaced by CPU (``tests/test_training_loop.py``:
autocast on CPU in bfloat16); this script is the only check on a real device.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import torch

    from ooc.config import TrainConfig
    from ooc.training.runs import eval_run
    from ooc.kernels.generators import planted_partition
    from ooc.ingest.convert import write_graph_dataset
    from ooc.training.loop import train
    from ooc.training.rundir import set_run_control

    p = argparse.ArgumentParser(prog="python -m ooc.tools.gpu_check_training")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("FAIL: CUDA is not available", file=sys.stderr)
        return 1
    work = Path(a.workdir or tempfile.mkdtemp(prefix="ooc-gpu-check-"))
    g = planted_partition(20000, num_classes=8, avg_degree=10, feat_dim=64, noise=4.0, seed=0,
                          train_frac=0.3)
    ds = write_graph_dataset(work / "planted", g.num_nodes, g.src, g.dst, g.features, g.labels,
                             {"train": g.train, "valid": g.valid, "test": g.test}, g.num_classes,
                             "planted", overwrite=True)
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    ok = True
    for model in ("gcn", "sage", "gat", "gin"):
        accs = {}
        for mode in ("cpu", "cuda", "cuda-amp"):
            cfg = TrainConfig(dataset=str(ds), output_dir=str(work / f"{model}-{mode}"), model=model,
                              fanouts=[10, 10], batch_size=1024, epochs=5, hidden=64, heads=4,
                              partitions=8, buffer_partitions=2, progress=False,
                              device="cpu" if mode == "cpu" else "cuda", amp=mode == "cuda-amp")
            m = train(set_run_control(cfg, overwrite=True))  # reruns replace their runs
            finite = all(math.isfinite(v) for v in m["losses"])
            accs[mode] = m["test_acc"]
            line = f"{model:5s} {mode:9s} test {m['test_acc']:.4f} val {m['val_acc']:.4f} " \
                   f"epoch {sum(m['epoch_time_s']) / len(m['epoch_time_s']):.2f} s finite {finite}"
            if mode != "cpu":
                ev = eval_run(cfg.output_dir)
                line += f" | eval test {ev['test_acc']:.4f}"
                if ev["test_acc"] < accs["cpu"] - 0.03 or m["test_acc"] < accs["cpu"] - 0.03:
                    ok = False
                    line += "  <-- below CPU"
            ok &= finite
            print(line, flush=True)
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
