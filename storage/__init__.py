"""On-disk datasets: Zarr v3 arrays + LMDB catalog, written atomically, verified on read."""
