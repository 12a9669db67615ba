"""Sampling: seeds -> message-flow graphs (node-wise, LABOR, LADIES, ClusterGCN, GraphSAINT)."""
