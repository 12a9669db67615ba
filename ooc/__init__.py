"""ooc: out-of-core training of graph neural networks on graphs larger than memory."""

__version__ = "0.1.0"
