"""``ooc bench sample``: sampled edges per second of ooc's node-wise sampler beside its peers.

One run builds each graph once, writes its CSC and seed batches to ``--workdir`` and times, on the
same graph, seeds and cores:

- ``ooc``: :class:`ooc.sampling.samplers.NeighborSampler` (Numba, ``--threads`` threads);
- ``torch-ref``: :func:`ooc.sampling.reference.torch_neighbor_sample` (vectorised pure PyTorch);
- ``dgl``: DGL's ``dgl.dataloading.NeighborSampler.sample_blocks`` (the CPU sampler + ``to_block``),
  given the fanouts reversed (DGL lists them input layer first), so every sampler draws ``fanouts[0]``
  around the seeds and samples the same number of edges;
- ``pyg``: PyG's ``torch_sparse.neighbor_sample`` (``torch.ops.torch_sparse``).

Peers run in their own Python (``--dgl-python`` / ``--pyg-python``, or the current interpreter when the
package imports there), each in a subprocess so their threads and allocators do not mix; a peer that is
not installed is skipped with a message (see docs/benchmarks.md for how to install them).  Every
sampler gets one warm-up batch (Numba JIT, lazy initialisation) outside the timing, then
``--repeats`` timed passes over ``--batches`` batches; the best pass is reported (the machines are
shared, so the best pass is the least disturbed one) and all passes are kept in the JSON output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

__all__ = ["add_sample_parser", "bench_sample", "load_github_social"]

_PEER = textwrap.dedent(r'''
    import glob, importlib.util, json, os, sys, time
    import numpy as np
    import torch
    kind, d, fanouts, threads, repeats = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    indptr = torch.from_numpy(np.load(os.path.join(d, "indptr.npy")).astype(np.int64))
    indices = torch.from_numpy(np.load(os.path.join(d, "indices.npy")).astype(np.int64))
    batches = [torch.from_numpy(b) for b in np.load(os.path.join(d, "seeds.npy"))]
    n = indptr.shape[0] - 1
    if kind == "dgl":
        import dgl
        g = dgl.graph(("csc", (indptr, indices, torch.arange(indices.shape[0]))), num_nodes=n)
        g = g.formats("csc")
        # DGL lists fanouts input layer first; ooc and PyG list them output layer first
        s = dgl.dataloading.NeighborSampler(list(reversed(fanouts)))
        version = "dgl " + dgl.__version__
        def run(seeds):
            return sum(b.num_edges() for b in s.sample_blocks(g, seeds)[2])
    else:
        dd = os.path.dirname(importlib.util.find_spec("torch_sparse").origin)
        torch.ops.load_library(glob.glob(os.path.join(dd, "_neighbor_sample_cpu*.so"))[0])
        import importlib.metadata as md
        version = "torch_sparse " + md.version("torch-sparse")
        op = torch.ops.torch_sparse.neighbor_sample
        def run(seeds):
            return int(op(indptr, indices, seeds, fanouts, False, True)[1].numel())
    run(batches[0])
    passes = []
    for r in range(repeats):
        t = time.perf_counter(); e = 0
        for b in batches:
            e += run(b)
        passes.append({"seconds": time.perf_counter() - t, "edges": e})
    print(json.dumps({"version": version, "passes": passes}))
''')


def load_github_social(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """GitHub social network (MUSAE) ``edges.csv`` (header ``id_1,id_2``) as a symmetric CSC.

    Returns:
        ``(indptr int64 [N+1], indices int32 [2E])`` (each undirected edge in both directions).
    """
    from ooc.kernels.graph import build_csc
    e = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64)
    n = int(e.max()) + 1
    src = np.concatenate([e[:, 0], e[:, 1]])
    dst = np.concatenate([e[:, 1], e[:, 0]])
    return build_csc(src, dst, n, dedup=True)


def _passes_summary(passes: list[dict], batches: int) -> dict:
    best = min(passes, key=lambda p: p["seconds"])
    return {"edges_per_s": best["edges"] / best["seconds"], "batches_per_s": batches / best["seconds"],
            "edges_per_batch": best["edges"] / batches, "passes": passes}


def _time_ooc(indptr: np.ndarray, indices: np.ndarray, batches: np.ndarray, fanouts: list[int],
              repeats: int) -> dict:
    from ooc.kernels.rng import batch_key
    from ooc.sampling.samplers import NeighborSampler
    s = NeighborSampler(indptr, indices, fanouts)
    s.sample(batches[0], key=batch_key(0, 99, 0))  # JIT / workspace warm-up
    passes = []
    for r in range(repeats):
        t = time.perf_counter()
        e = 0
        for i, b in enumerate(batches):
            e += s.sample(b, key=batch_key(0, r, i)).num_sampled_edges
        passes.append({"seconds": time.perf_counter() - t, "edges": e})
    return passes


def _time_torch(indptr: np.ndarray, indices: np.ndarray, batches: np.ndarray, fanouts: list[int],
                repeats: int) -> dict:
    import torch
    from ooc.sampling.reference import torch_neighbor_sample
    ip = torch.from_numpy(indptr)
    ix = torch.from_numpy(indices.astype(np.int64))
    g = torch.Generator().manual_seed(0)
    bt = [torch.from_numpy(b) for b in batches]
    torch_neighbor_sample(ip, ix, bt[0], fanouts, g)
    passes = []
    for r in range(repeats):
        t = time.perf_counter()
        e = 0
        for b in bt:
            _, blocks = torch_neighbor_sample(ip, ix, b, fanouts, g)
            e += sum(int(x[2].shape[0]) for x in blocks)
        passes.append({"seconds": time.perf_counter() - t, "edges": e})
    return passes


def _peer_python(kind: str, explicit: str | None) -> tuple[str | None, str]:
    """The interpreter that has the peer, or ``None`` and why not."""
    module = "dgl" if kind == "dgl" else "torch_sparse"
    env = "OOC_DGL_PYTHON" if kind == "dgl" else "OOC_PYG_PYTHON"
    cands = [c for c in (explicit, os.environ.get(env), sys.executable) if c]
    for py in cands:
        if not Path(py).exists():
            continue
        r = subprocess.run([py, "-c", f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('{module}') else 1)"],
                           capture_output=True)
        if r.returncode == 0:
            return py, ""
    return None, (f"no interpreter with {module} (tried {', '.join(cands)}); "
                  f"install it as docs/benchmarks.md says and pass --{kind}-python or ${env}")


def _run_peer(kind: str, py: str, workdir: Path, fanouts: list[int], threads: int, repeats: int,
              timeout: float) -> dict:
    script = workdir / "peer_runner.py"
    script.write_text(_PEER)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), DGLBACKEND="pytorch")
    r = subprocess.run([py, str(script), kind, str(workdir), ",".join(map(str, fanouts)), str(threads),
                        str(repeats)], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{kind} runner failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _graph(name: str, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str]:
    if name == "github":
        path = Path(args.github_csv)
        if not path.exists():
            raise FileNotFoundError(f"{path}: GitHub social edges.csv not found (--github-csv)")
        ip, ix = load_github_social(path)
        return ip, ix, f"github_social (MUSAE, {path})"
    if name == "powerlaw":
        from ooc.kernels.powerlaw import powerlaw_csc
        ip, ix = powerlaw_csc(args.nodes, args.edges, beta=args.beta, seed=0, threads=args.threads)
        return ip, ix, f"power-law (beta={args.beta}, seed 0)"
    if name == "er":
        from ooc.kernels.graph import build_csc
        rng = np.random.default_rng(0)
        n, m = args.er_nodes, args.er_nodes * args.er_degree
        dst = rng.integers(0, n, m)
        src = rng.integers(0, n, m)
        ip, ix = build_csc(src, dst, n)
        return ip, ix, f"Erdos-Renyi (avg in-degree {args.er_degree}, numpy seed 0)"
    raise ValueError(f"unknown graph {name!r}")


def _cached_graph(name: str, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str]:
    """:func:`_graph`, kept in ``--graph-cache DIR/KEY/{indptr,indices}.npy`` when a cache is given
    (KEY names the generator's parameters; written to a temporary folder, then renamed), so a
    synthetic graph that takes many minutes to generate is built once for several timed runs."""
    cache = getattr(args, "graph_cache", None)
    if not cache or name == "github":
        return _graph(name, args)
    key = (f"powerlaw-{args.nodes}-{args.edges}-{args.beta}" if name == "powerlaw"
           else f"er-{args.er_nodes}-{args.er_degree}" if name == "er" else name)
    d = Path(cache) / key
    if (d / "indices.npy").exists():
        desc = (d / "desc.txt").read_text()
        return np.load(d / "indptr.npy"), np.load(d / "indices.npy"), desc + f" (cached in {d})"
    ip, ix, desc = _graph(name, args)
    tmp = Path(cache) / f".{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "indptr.npy", ip)
    np.save(tmp / "indices.npy", ix)
    (tmp / "desc.txt").write_text(desc)
    os.replace(tmp, d)
    return ip, ix, desc


def bench_sample(args: argparse.Namespace) -> dict:
    """Run the benchmark (see the module docstring); returns and prints the results."""
    import numba
    import torch
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(["ooc"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
               "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
               "threads": args.threads, "fanouts": fanouts, "batch_size": args.batch_size,
               "batches": args.batches, "repeats": args.repeats,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "graphs": []}
    # every sampler, peers included (they inherit this environment), runs under the same policy
    print(f"OMP_WAIT_POLICY={results['omp_wait_policy'] or '(unset)'} for ooc and every peer; "
          f"{args.threads} threads", flush=True)
    for name in args.graphs.split(","):
        t0 = time.perf_counter()
        indptr, indices, desc = _cached_graph(name, args)
        n = indptr.shape[0] - 1
        print(f"[{name}] {desc}: {n:,} nodes, {int(indptr[-1]):,} edges "
              f"(built in {time.perf_counter() - t0:.1f} s)", flush=True)
        if getattr(args, "build_only", False):
            del indptr, indices
            continue
        rng = np.random.default_rng(1)
        need = args.batches * args.batch_size
        seeds = np.concatenate([rng.permutation(n) for _ in range(-(-need // n))])[:need]
        batches = seeds.reshape(args.batches, args.batch_size).astype(np.int64)
        np.save(workdir / "indptr.npy", indptr)
        np.save(workdir / "indices.npy", indices)
        np.save(workdir / "seeds.npy", batches)
        g = {"graph": name, "description": desc, "nodes": n, "edges": int(indptr[-1]), "samplers": {}}
        g["samplers"]["ooc"] = _passes_summary(_time_ooc(indptr, indices, batches, fanouts,
                                                         args.repeats), args.batches)
        print(f"  ooc        {g['samplers']['ooc']['edges_per_s'] / 1e6:8.2f} M edges/s "
              f"{g['samplers']['ooc']['batches_per_s']:7.2f} batches/s", flush=True)
        if not args.no_torch:
            g["samplers"]["torch-ref"] = _passes_summary(
                _time_torch(indptr, indices, batches, fanouts, args.repeats), args.batches)
            print(f"  torch-ref  {g['samplers']['torch-ref']['edges_per_s'] / 1e6:8.2f} M edges/s "
                  f"{g['samplers']['torch-ref']['batches_per_s']:7.2f} batches/s", flush=True)
        del indptr, indices
        for kind in ("dgl", "pyg"):
            py, why = _peer_python(kind, getattr(args, f"{kind}_python"))
            if py is None:
                print(f"  {kind} skipped: {why}", flush=True)
                g["samplers"][kind] = {"skipped": why}
                continue
            try:
                out = _run_peer(kind, py, workdir, fanouts, args.threads, args.repeats, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"  {kind} failed: {e}", flush=True)
                g["samplers"][kind] = {"skipped": f"failed: {e}"}
                continue
            s = _passes_summary(out["passes"], args.batches)
            s["version"] = out["version"]
            g["samplers"][kind] = s
            print(f"  {kind:<10} {s['edges_per_s'] / 1e6:8.2f} M edges/s {s['batches_per_s']:7.2f} "
                  f"batches/s ({out['version']})", flush=True)
        peers = [v["edges_per_s"] for k, v in g["samplers"].items() if k != "ooc" and "edges_per_s" in v]
        if peers:
            g["speedup_vs_best_peer"] = g["samplers"]["ooc"]["edges_per_s"] / max(peers)
            print(f"  ooc / best peer: {g['speedup_vs_best_peer']:.2f}x", flush=True)
        results["graphs"].append(g)
        for f in ("indptr.npy", "indices.npy", "seeds.npy"):
            (workdir / f).unlink(missing_ok=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


_DESCRIPTION = """\
Sampled edges per second (and batches per second) of ooc's node-wise sampler beside a vectorised
PyTorch reference, DGL's CPU sampler and PyG's torch_sparse.neighbor_sample, on the same CSC graph, the
same seed batches, fanouts and thread count; the JIT / set-up warm-up is not timed, the best of
--repeats passes is reported.  A peer that is not installed is skipped with a message (see
docs/benchmarks.md, "Samplers", for how to install DGL and torch_sparse)."""


def add_sample_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``sample`` on the subparsers of ``ooc bench``."""
    s = bsub.add_parser("sample", help="sampled edges/s and batches/s, ooc vs torch reference, DGL, PyG",
                        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--graphs", default="github,powerlaw",
                   help="comma list of github, powerlaw, er (default: github,powerlaw)")
    s.add_argument("--github-csv", default=str(_default_github()),
                   help="GitHub social edges.csv (default: the shared data folder)")
    s.add_argument("--nodes", type=int, default=10_000_000, help="power-law nodes (default 10M)")
    s.add_argument("--edges", type=int, default=200_000_000, help="power-law edges (default 200M)")
    s.add_argument("--beta", type=float, default=3.0, help="power-law skew (default 3: tail 2.5)")
    s.add_argument("--er-nodes", type=int, default=1_000_000, help="Erdős–Rényi nodes (default 1M)")
    s.add_argument("--er-degree", type=int, default=20, help="Erdős–Rényi average degree (default 20)")
    s.add_argument("--fanouts", default="15,10,5", help="output layer first (default 15,10,5)")
    s.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    s.add_argument("--batches", type=int, default=20, help="timed batches per pass (default 20)")
    s.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported (default 3)")
    s.add_argument("--threads", type=int, default=2, help="threads for every sampler (default 2)")
    s.add_argument("--dgl-python", default=None, help="python with dgl (or $OOC_DGL_PYTHON)")
    s.add_argument("--pyg-python", default=None, help="python with torch_sparse (or $OOC_PYG_PYTHON)")
    s.add_argument("--no-torch", action="store_true", help="skip the PyTorch reference sampler")
    s.add_argument("--timeout", type=float, default=3600, help="seconds per peer run")
    s.add_argument("--workdir", default="bench-work", help="scratch folder for the shared graph files")
    s.add_argument("--graph-cache", default=None,
                   help="keep generated graphs (power-law, ER) here and reuse them in later runs")
    s.add_argument("--build-only", action="store_true",
                   help="only build (and cache) the graphs; time nothing")
    s.add_argument("--json", default=None, help="write the results here")
    s.set_defaults(func=lambda a: (bench_sample(a), 0)[1])


def _default_github() -> Path:
    for base in (os.environ.get("OOC_SHARED_DATA"), Path(__file__).resolve().parents[1].parent / "shared" / "data",
                 "/work/shared/data"):
        if base and (Path(base) / "github_social").exists():
            return Path(base) / "github_social" / "edges.csv"
    return Path("shared/data/github_social/edges.csv")
