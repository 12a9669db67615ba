"""Ingest: raw graph files (edge lists, NumPy, OGB, Planetoid, Geom-GCN, generators) streamed into
ooc datasets in bounded memory."""
