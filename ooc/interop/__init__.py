"""ooc with code from outside ooc: a user's torch module as the model (:mod:`ooc.interop.custom`)."""
