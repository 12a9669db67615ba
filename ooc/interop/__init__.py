"""ooc with code from outside ooc: a user's torch module as the model (:mod:`ooc.interop.custom`),
PyTorch Geometric layers on ooc's batches (:mod:`ooc.interop.pyg`, optional extra ``pyg``) and OGB's
evaluators for datasets converted from OGB (:mod:`ooc.interop.ogb`, optional extra ``ogb``)."""
