"""The data path of a run: budget, partition buffer (shared per machine), plans, loader."""
