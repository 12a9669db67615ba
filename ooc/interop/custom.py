"""A user's torch module as the model: ``ooc train --model MODULE:CLASS``.

What ooc calls, exactly:

- **Import**: ``importlib.import_module(MODULE)``, then ``getattr(module, CLASS)`` (``CLASS`` may be
  dotted, ``pkg.models:Outer.Net``).  The module must be importable by the Python that runs ``ooc``:
  installed, or its folder on ``PYTHONPATH`` (``PYTHONPATH=. ooc train ... --model mynets:Net``);
  the current directory is not searched otherwise.  ``CLASS`` must be a ``torch.nn.Module`` subclass.
- **Construction**: ``CLASS(in_dim=F, hidden=H, out_dim=C, num_layers=L, **options)`` with keyword
  arguments: ``F`` the input width (feature columns plus ``--embedding``), ``H`` = ``--hidden``,
  ``C`` the output width (classes; for ``--task link`` the embedding width ``--hidden``), ``L`` =
  the number of ``--fanout`` entries; ``dropout=--dropout`` is added when the constructor has a
  ``dropout`` parameter (or ``**kwargs``); ``options`` = ``model.options`` (``--model-options
  '{heads: 4}'``).  ``torch.manual_seed(--seed)`` is set before, so initial weights follow the seed.
- **Forward**: ``forward(blocks: list[TorchBlock], x: Tensor) -> Tensor``: ``L`` blocks
  (:class:`ooc.models.TorchBlock`, input layer first; block ``i`` maps ``blocks[i].num_src`` source
  nodes to ``blocks[i].num_dst`` destinations, which are the first ``num_dst`` sources; edges
  ``src``/``dst`` are int64 local ids; ``src_ids`` the global node ids), ``x`` float32
  [blocks[0].num_src, F]; returns float32 [blocks[-1].num_dst, C], one row per seed (logits).
  ``ooc.interop.pyg.pyg_adjs(blocks)`` gives PyG's ``edge_index``/``size`` per block.
- **Layer-wise inference** (``--eval-mode layerwise``, ``--task link``, ``ooc eval``, ``ooc
  predict``): also ``layer_forward(i: int, block: TorchBlock, h: Tensor) -> Tensor``, layer ``i``
  alone ([num_src, dims[i]] -> [num_dst, dims[i+1]]; ``forward`` must be the composition of these
  calls), and attributes ``num_layers`` (= L) and ``dims`` (L + 1 widths, ``dims[0] = F``).  Without
  them those uses are refused before anything runs.

Checked before training (:func:`check_model_config` from :meth:`ooc.config.TrainConfig.validate`,
:func:`build_custom_model`): the import, the class, the constructor's and ``forward``'s parameters,
``layer_forward`` where needed, and one forward pass on a 2-node test batch whose output must be
[1, C] (run under ``torch.no_grad`` in eval mode with the random state restored afterwards, so it
does not change the run).  Every failure is a ``ValueError`` naming ``MODULE:CLASS`` and what is
missing (``ooc train`` exits 2 with it).
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

import torch
from torch import nn

from ooc.models import MODELS, TorchBlock

if TYPE_CHECKING:  # pragma: no cover
    from ooc.config import TrainConfig

__all__ = ["is_custom", "load_model_class", "check_model_config", "build_custom_model",
           "layerwise_reason", "require_layerwise"]

_REQUIRED = ("in_dim", "hidden", "out_dim", "num_layers")
_CALL = "CLASS(in_dim, hidden, out_dim, num_layers[, dropout], **model.options)"


def is_custom(name: str) -> bool:
    """Whether a ``model`` value names a user's class (``MODULE:CLASS``) instead of a built-in."""
    return ":" in name


def load_model_class(spec: str) -> type[nn.Module]:
    """Import ``MODULE:CLASS`` and return the class.

    Raises:
        ValueError: not ``MODULE:CLASS``, the module cannot be imported (with the import error), it
            has no such attribute, or the attribute is not a ``torch.nn.Module`` subclass.
    """
    mod_name, _, cls_name = spec.partition(":")
    if not mod_name or not cls_name or ":" in cls_name:
        raise ValueError(f"--model {spec!r}: expected MODULE:CLASS (e.g. mynets:SAGE) or one of "
                         f"{', '.join(MODELS)}")
    try:
        obj: object = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or whatever the module raises while importing
        raise ValueError(f"--model {spec}: cannot import module {mod_name!r} ({type(e).__name__}: "
                         f"{e}); the module must be importable: install it or put its folder on "
                         "PYTHONPATH") from None
    for part in cls_name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--model {spec}: module {mod_name!r} has no {cls_name!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise ValueError(f"--model {spec}: {cls_name} is not a torch.nn.Module subclass")
    return obj


def layerwise_reason(cfg: "TrainConfig") -> str | None:
    """Why a run needs ``layer_forward`` (layer-wise inference during training), or None."""
    if cfg.task == "link":
        return "--task link (its evaluation is layer-wise inference of all embeddings)"
    if cfg.eval_mode == "layerwise":
        return "--eval-mode layerwise"
    return None


def _check_signatures(spec: str, cls: type[nn.Module], options: dict) -> bool:
    """Check the constructor and ``forward`` against the contract; True when the constructor takes
    ``dropout``."""
    name = cls.__qualname__
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no introspectable signature: try the call as documented
        return False
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in _REQUIRED if n not in named and not var_kw]
    if missing:
        raise ValueError(f"--model {spec}: {name}.__init__ lacks parameter(s) {', '.join(missing)}; "
                         f"ooc constructs it as {_CALL}")
    unknown = [k for k in options if k not in named and not var_kw]
    if unknown:
        raise ValueError(f"--model {spec}: {name}.__init__ takes no {', '.join(map(repr, unknown))} "
                         "(given in model.options)")
    takes_dropout = var_kw or "dropout" in named
    given = set(_REQUIRED) | set(options) | ({"dropout"} if takes_dropout else set())
    required = [n for n, p in params.items() if p.default is p.empty and n not in given
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise ValueError(f"--model {spec}: {name}.__init__ requires {', '.join(required)}, which ooc "
                         "does not pass; give a default or set it in model.options")
    fwd = inspect.signature(cls.forward).parameters
    pos = [p for n, p in fwd.items() if n != "self" and p.kind in (p.POSITIONAL_ONLY,
                                                                   p.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in fwd.values())
    extra = [p.name for p in pos[2:] if p.default is p.empty] + \
        [n for n, p in fwd.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if (len(pos) < 2 and not var_pos) or extra:
        raise ValueError(f"--model {spec}: {name}.forward must take (blocks, x) and nothing else "
                         "required; ooc calls forward(blocks: list[TorchBlock], x: Tensor) -> "
                         "Tensor [num_seeds, out_dim]")
    return takes_dropout


def check_model_config(cfg: "TrainConfig") -> None:
    """The model options of ``cfg`` before anything runs: a built-in name, or an importable
    ``MODULE:CLASS`` with the documented constructor and ``forward`` (and ``layer_forward`` when
    :func:`layerwise_reason` says the run needs it).

    Raises:
        ValueError: naming the option or the class and what is missing.
    """
    if not is_custom(cfg.model):
        if cfg.model not in MODELS:
            from ooc.config import option_flag
            raise ValueError(f"{option_flag('model')} must be one of {', '.join(MODELS)} or "
                             f"MODULE:CLASS, got {cfg.model!r}")
        if cfg.model_options:
            raise ValueError("model.options applies to --model MODULE:CLASS (the built-in models "
                             "have their own options)")
        return
    cls = load_model_class(cfg.model)
    _check_signatures(cfg.model, cls, cfg.model_options)
    why = layerwise_reason(cfg)
    if why is not None and not callable(getattr(cls, "layer_forward", None)):
        raise ValueError(f"--model {cfg.model}: {why} needs {cls.__qualname__}.layer_forward(i, "
                         "block, h) and attributes num_layers and dims; the class has no "
                         "layer_forward (use --eval-mode sampled for node tasks)")


def require_layerwise(model: nn.Module, spec: str, why: str) -> None:
    """Refuse layer-wise inference of a model that cannot do it.

    Raises:
        ValueError: ``model`` lacks ``layer_forward``, ``num_layers`` or ``dims``, naming them.
    """
    inner = getattr(model, "model", model)  # a node-embedding wrapper delegates to its model
    missing = [a for a in ("layer_forward", "num_layers", "dims") if not hasattr(inner, a)]
    if missing:
        raise ValueError(f"--model {spec}: {why} needs {type(inner).__qualname__}."
                         f"{', '.join(missing)} (layer-wise inference calls layer_forward(i, block, "
                         "h) for every layer, num_layers and dims give the layers' widths)")


def _test_blocks(num_layers: int) -> list[TorchBlock]:
    """``num_layers`` blocks over 2 nodes (edges 1 -> 0 and 0 -> 1), the last with 1 destination."""
    blocks = []
    for i in range(num_layers):
        last = i == num_layers - 1
        src, dst = ([1], [0]) if last else ([1, 0], [0, 1])
        b = TorchBlock.from_edges(2, 1 if last else 2, src, dst, deg_src=torch.ones(2))
        b.src_ids = torch.arange(2)
        blocks.append(b)
    return blocks


def build_custom_model(cfg: "TrainConfig", in_dim: int, out_dim: int) -> nn.Module:
    """Construct ``cfg.model`` (``MODULE:CLASS``) as documented in the module docstring and check it
    on a 2-node test batch.

    Args:
        in_dim: input width F (features plus ``--embedding``); out_dim: output width C.

    Returns:
        The module (in training mode).

    Raises:
        ValueError: construction fails, the test forward fails or returns another shape than
            [1, out_dim], or a needed attribute (``layer_forward``/``num_layers``/``dims`` for
            layer-wise runs, ``layers`` for ``weight_decay_scope: first``) is missing.
    """
    spec = cfg.model
    cls = load_model_class(spec)
    takes_dropout = _check_signatures(spec, cls, cfg.model_options)
    kw: dict = dict(in_dim=in_dim, hidden=cfg.hidden, out_dim=out_dim, num_layers=len(cfg.fanouts))
    if takes_dropout:
        kw["dropout"] = cfg.dropout
    kw.update(cfg.model_options)
    try:
        model = cls(**kw)
    except Exception as e:
        raise ValueError(f"--model {spec}: {cls.__qualname__}(" + ", ".join(f"{k}={v!r}" for k, v in
                                                                          kw.items())
                         + f") failed: {type(e).__name__}: {e}") from None
    why = layerwise_reason(cfg)
    if why is not None:
        require_layerwise(model, spec, why)
    if cfg.weight_decay_scope == "first" and cfg.weight_decay and not hasattr(model, "layers"):
        raise ValueError(f"--model {spec}: weight_decay_scope first decays {cls.__qualname__}."
                         "layers[0], which it does not have")
    blocks = _test_blocks(len(cfg.fanouts))
    x = torch.zeros(2, in_dim)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model.eval()
        try:
            out = model(blocks, x)
        except Exception as e:
            raise ValueError(f"--model {spec}: forward(blocks, x) failed on a 2-node test batch "
                             f"({len(blocks)} blocks, x [2, {in_dim}]): {type(e).__name__}: {e}") from None
        finally:
            model.train()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, out_dim):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"--model {spec}: forward(blocks, x) returned {got} on a 2-node test batch "
                         f"with 1 seed; expected a Tensor [num_seeds, out_dim] = (1, {out_dim})")
    return model
