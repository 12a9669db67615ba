"""ooc with code from outside ooc: a user's torch module as the model (:mod:`ooc.interop.custom`)
and PyTorch Geometric layers on ooc's batches (:mod:`ooc.interop.pyg`, optional extra ``pyg``)."""
