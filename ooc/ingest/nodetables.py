"""Node tables keyed by node id: label tables (integer, boolean or named classes) and JSON features.

Both are read in blocks and report bad input as :class:`~ooc.ingest.readers.InputError` naming the
file, the line and the column.  Ids stay external here (integers as parsed, or string tokens); the
converter maps them like the edge list's ids (``--ids dense|map|string``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ooc.ingest.readers import InputError, _is_number, open_text, read_string_pairs
from ooc.ingest.streaming import FileSink, SpoolWriter, build_csc_streaming

__all__ = ["LabelTable", "read_label_table", "labels_from_tokens", "labels_from_array",
           "JsonFeatures", "MAX_CLASSES", "UNLABELLED_TOKENS", "parse_int_ids", "keyed_feature_rows",
           "is_json"]

MAX_CLASSES = 1 << 20
"""Distinct label values a label column may hold (more means it is probably not a label column)."""

UNLABELLED_TOKENS = frozenset({"", "-1", "nan", "none", "null", "na"})
"""Label fields (compared in lower case) that mark a node as unlabelled (label -1)."""

_TRUE, _FALSE = frozenset({"true"}), frozenset({"false"})


@dataclass
class LabelTable:
    """The rows of a label table.

    Attributes:
        ids: int64 [R] external integer ids, or (string ids) a list of R tokens.
        labels: int64 [R] class index, -1 = unlabelled.
        lines: int64 [R] 1-based line of every row.
        class_names: names of classes ``0..K-1`` when the labels were booleans (``False``,
            ``True``) or names (sorted in byte order); ``None`` for integer labels.
    """

    ids: np.ndarray | list[str]
    labels: np.ndarray
    lines: np.ndarray
    class_names: list[str] | None


def _int_or_none(tok: str) -> int | None:
    """``"3"`` / ``"3.0"`` -> 3; anything that is not an integral number -> None."""
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        f = float(tok)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def labels_from_tokens(distinct: Sequence[str], where: Callable[[str], str],
                       column: str) -> tuple[np.ndarray, list[str] | None]:
    """Class index of every distinct label token, and the class names (``None`` for integers).

    Rules: tokens in :data:`UNLABELLED_TOKENS` are unlabelled (-1); if every other token is an
    integral number the labels are those integers (``"2"`` and ``"2.0"`` are class 2); if every
    one is ``true``/``false`` (any case) they are classes 0 (``False``) and 1 (``True``); if none is
    a number they are class names, numbered in sorted (byte) order.

    Args:
        distinct: the distinct tokens.
        where: ``where(token)`` -> ``"FILE:LINE"`` of a row holding it (for errors).
        column: how errors name the label column, e.g. ``"label column 'target'"``.

    Returns:
        ``(codes int64 [len(distinct)], class_names or None)``.

    Raises:
        InputError: a negative or fractional number, or numbers mixed with names.
    """
    codes = np.full(len(distinct), -1, dtype=np.int64)
    named = [i for i, t in enumerate(distinct) if t.strip().lower() not in UNLABELLED_TOKENS]
    if not named:
        return codes, None
    low = {i: distinct[i].strip().lower() for i in named}
    if all(v in _TRUE or v in _FALSE for v in low.values()):
        for i, v in low.items():
            codes[i] = 1 if v in _TRUE else 0
        return codes, ["False", "True"]
    numeric = [i for i in named if _is_number(distinct[i])]
    if len(numeric) == len(named):
        for i in named:
            v = _int_or_none(distinct[i])
            if v is None or v < 0:
                what = "negative" if v is not None else "not an integer class"
                raise InputError(f"{where(distinct[i])}: {column}: {distinct[i]!r} is {what} (labels "
                                 "are integers >= 0, true/false, or class names; -1 or empty = "
                                 "unlabelled)")
            codes[i] = v
        return codes, None
    if numeric:
        i = numeric[0]
        other = next(j for j in named if j not in set(numeric))
        raise InputError(f"{where(distinct[i])}: {column} mixes numbers ({distinct[i]!r}) and names "
                         f"({distinct[other]!r}); labels are integers, true/false, or class names")
    names = sorted((distinct[i] for i in named), key=lambda t: t.encode())
    rank = {t: k for k, t in enumerate(names)}
    for i in named:
        codes[i] = rank[distinct[i]]
    return codes, names


def parse_int_ids(tokens: Sequence[str], where: Callable[[int], str], column: str) -> np.ndarray:
    """int64 ids of integer tokens.

    Raises:
        InputError: a token that is not an integer (naming ``where(row)`` and ``column``).
    """
    try:
        return np.asarray(tokens, dtype=np.str_).astype(np.int64)
    except (ValueError, OverflowError):
        for i, t in enumerate(tokens):
            try:
                int(t)
            except ValueError:
                raise InputError(f"{where(i)}: {column}: {t!r} is not an integer id (use --ids "
                                 "string for names)") from None
        raise


def read_label_table(path: str | os.PathLike, columns: Sequence[int | str] = (0, 1),
                     string_ids: bool = False, sep: str | None = None, comments: str = "#%",
                     header: bool | str = "auto", block_lines: int = 1 << 18) -> LabelTable:
    """Read a label table: one row per node, an id column and a label column.

    Labels may be integers, booleans or class names (see :func:`labels_from_tokens`); a header row
    is used when the columns are named, else auto-detected (a first line without any number; never
    with ``string_ids``).  Memory: 24 B per row plus one block of text.

    Args:
        path: text file (``.gz`` ok).
        columns: ``(id column, label column)``, 0-based indices or header names.
        string_ids: keep the ids as tokens (``--ids string``) instead of parsing integers.

    Returns:
        The :class:`LabelTable`.

    Raises:
        InputError: wrong field count, an id that is not an integer, bad labels (file, line, column).
    """
    p = Path(path)
    named = any(isinstance(c, str) and not str(c).isdigit() for c in columns)
    hdr: bool | str = True if named else (False if string_ids else header)
    id_col = f"id column {columns[0]!r}" if named else f"id column {int(columns[0]) + 1}"
    lab_col = f"label column {columns[1]!r}" if named else f"label column {int(columns[1]) + 1}"
    codes: dict[str, int] = {}
    ids: list[np.ndarray] | list[str] = []
    code_blocks: list[np.ndarray] = []
    line_blocks: list[np.ndarray] = []
    first_line: dict[str, int] = {}
    for rows, lines in read_string_pairs(p, list(columns), sep, comments, hdr,
                                         block_lines=block_lines, with_lines=True):
        toks = [r[1] for r in rows]
        block = np.empty(len(rows), dtype=np.int64)
        for i, t in enumerate(toks):
            c = codes.get(t)
            if c is None:
                if len(codes) >= MAX_CLASSES:
                    raise InputError(f"{p}:{lines[i]}: {lab_col} holds more than {MAX_CLASSES:,} "
                                     "distinct values; is it the label column?")
                c = codes[t] = len(codes)
                first_line[t] = lines[i]
            block[i] = c
        code_blocks.append(block)
        line_blocks.append(np.asarray(lines, dtype=np.int64))
        id_toks = [r[0] for r in rows]
        if string_ids:
            ids.extend(id_toks)  # type: ignore[arg-type]
        else:
            ids.append(parse_int_ids(id_toks, lambda i, L=lines: f"{p}:{L[i]}", id_col))  # type: ignore[arg-type]
    distinct = list(codes)
    values, names = labels_from_tokens(distinct, lambda t: f"{p}:{first_line[t]}", lab_col)
    all_codes = np.concatenate(code_blocks)
    return LabelTable(ids=ids if string_ids else np.concatenate(ids),  # type: ignore[arg-type]
                      labels=values[all_codes], lines=np.concatenate(line_blocks), class_names=names)


def labels_from_array(arr: np.ndarray, where: str) -> tuple[np.ndarray, list[str] | None]:
    """Labels [N] from an array in node order: integers (-1 = unlabelled), booleans, integral floats
    (NaN = unlabelled) or strings (class names), by the rules of :func:`labels_from_tokens`.

    Returns:
        ``(int64 [N] labels, class names or None)``.

    Raises:
        InputError: not one-dimensional, or values that are not labels (``where`` names the file).
    """
    a = np.asarray(arr)
    if a.ndim != 1:
        raise InputError(f"{where}: label array of shape {a.shape}, expected (N,)")
    if a.dtype.kind == "b":
        return a.astype(np.int64), ["False", "True"]
    if a.dtype.kind in "iu":
        lab = a.astype(np.int64)
        if lab.size and lab.min() < -1:
            i = int(np.argmax(lab < -1))
            raise InputError(f"{where}: node {i} has label {lab[i]}: labels are -1 (unlabelled) or "
                             "class ids 0..C-1")
        return lab, None
    if a.dtype.kind == "f":
        ok = np.isfinite(a)
        bad = ok & ((a < -1) | (a != np.round(a)))
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{where}: row {i}: label {a[i]} is not a class index")
        return np.where(ok, a, -1).astype(np.int64), None
    if a.dtype.kind in "US":
        toks = a.astype(np.str_)
        distinct, inverse = np.unique(toks, return_inverse=True)
        codes, names = labels_from_tokens([str(t) for t in distinct],
                                          lambda t: f"{where}: row {int(np.argmax(toks == t))}",
                                          "labels")
        return codes[inverse.reshape(-1)], names
    raise InputError(f"{where}: labels of dtype {a.dtype} (expected integers, booleans or strings)")


# ---------------------------------------------------------------------------- JSON features
FEATURE_FORMATS = ("auto", "dense", "indices")


class JsonFeatures:
    """Node features in one JSON object keyed by node id, read entry by entry in bounded memory.

    Two layouts (MUSAE and similar releases)::

        {"0": [3, 17, 250], "1": [17], ...}        indices: the active (1.0) feature ids of each node
        {"0": [0.5, -1.25, 2.0], "1": [...], ...}   dense: the D values of each node

    ``auto`` decides after one pass: any non-integer value means dense (every list must then have
    the same length D); lists of non-negative integers of different lengths mean indices (D = the
    largest id + 1, or ``feat_dim``); integer lists that all have the same length are dense if one
    of them repeats a value, and otherwise ambiguous (an error asks for ``feature_format``).

    Args:
        path: the ``.json`` file (``.json.gz`` ok).
        feature_format: ``auto``, ``dense`` or ``indices``.
        feat_dim: D for ``indices`` (ids must be below it).
        block_chars: characters read at a time; max_entry_chars: a larger entry is an error.

    Raises:
        InputError: (from :meth:`scan` and :meth:`entries`) malformed JSON, a value that is not a
            list of numbers, lists of different lengths for dense features (file and line).
    """

    def __init__(self, path: str | os.PathLike, feature_format: str = "auto",
                 feat_dim: int | None = None, block_chars: int = 8 << 20,
                 max_entry_chars: int = 64 << 20) -> None:
        if feature_format not in FEATURE_FORMATS:
            raise ValueError(f"--feature-format must be one of {FEATURE_FORMATS}, got {feature_format!r}")
        self.path = Path(path)
        self.requested = feature_format
        self.feat_dim = feat_dim
        self.block_chars = int(block_chars)
        self.max_entry_chars = int(max_entry_chars)
        self.format: str | None = None if feature_format == "auto" else feature_format
        self.dim: int | None = None
        self.num_rows = 0

    # ------------------------------------------------------------ the JSON object, entry by entry
    def _items(self) -> Iterator[tuple[str, Any, int]]:
        """Yield ``(key, value, line)`` of the top-level object, one entry in memory at a time."""
        dec = json.JSONDecoder()
        p = self.path
        with open_text(p) as fb:
            import io
            f = io.TextIOWrapper(fb, encoding="utf-8", errors="strict")
            buf = ""
            pos = 0
            line = 1
            eof = False

            def more() -> bool:
                nonlocal buf, pos, eof
                if eof:
                    return False
                try:
                    chunk = f.read(self.block_chars)
                except UnicodeDecodeError as e:
                    raise InputError(f"{p}: not UTF-8 text ({e})") from None
                if not chunk:
                    eof = True
                    return False
                buf = buf[pos:] + chunk
                pos = 0
                return True

            def skip_ws() -> str:
                nonlocal pos, line
                while True:
                    while pos < len(buf) and buf[pos] in " \t\r\n":
                        if buf[pos] == "\n":
                            line += 1
                        pos += 1
                    if pos < len(buf):
                        return buf[pos]
                    if not more():
                        return ""

            def fail(msg: str) -> InputError:
                return InputError(f"{p}:{line}: {msg}")

            if skip_ws() != "{":
                raise fail("expected a JSON object {\"node id\": [...], ...}")
            pos += 1
            if skip_ws() == "}":
                return
            while True:
                if skip_ws() != '"':
                    raise fail("expected a quoted node id")
                start_line = line
                values: list[Any] = []
                for what in ("key", "value"):
                    while True:
                        try:
                            obj, end = dec.raw_decode(buf, pos)
                            break
                        except json.JSONDecodeError as e:
                            if len(buf) - pos > self.max_entry_chars or not more():
                                raise InputError(f"{p}:{line + buf.count(chr(10), pos, e.pos)}: "
                                                 f"malformed JSON ({e.msg})") from None
                    line += buf.count("\n", pos, end)
                    pos = end
                    values.append(obj)
                    if what == "key":
                        if skip_ws() != ":":
                            raise fail("expected ':' after the node id")
                        pos += 1
                        skip_ws()
                yield values[0], values[1], start_line
                c = skip_ws()
                pos += 1
                if c == "}":
                    return
                if c != ",":
                    raise fail("expected ',' or '}' after an entry")

    # ------------------------------------------------------------ pass 1: keys and layout
    def scan(self, block: int = 1 << 16) -> Iterator[tuple[list[str], np.ndarray]]:
        """Pass 1: yield blocks ``(keys, lines)`` and decide the layout and D (``format``, ``dim``,
        set when the iteration ends).

        Raises:
            InputError: see the class.
        """
        p = self.path
        any_float = False
        repeats = False
        min_len, max_len, max_id = None, None, -1
        len_line: tuple[int, int] | None = None  # (length, line) of the first entry
        bad_len: tuple[int, int] | None = None
        keys: list[str] = []
        lines: list[int] = []
        n = 0
        for key, val, ln in self._items():
            if not isinstance(val, list):
                raise InputError(f"{p}:{ln}: node {key!r}: expected a list of numbers, found "
                                 f"{type(val).__name__}")
            for v in val:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise InputError(f"{p}:{ln}: node {key!r}: feature list holds {v!r} (numbers only)")
                if isinstance(v, float):
                    any_float = True
                elif v > max_id:
                    max_id = v
            k = len(val)
            if len_line is None:
                len_line = (k, ln)
            elif k != len_line[0] and bad_len is None:
                bad_len = (k, ln)
            min_len = k if min_len is None else min(min_len, k)
            max_len = k if max_len is None else max(max_len, k)
            if not repeats and not any_float and len(set(val)) != k:
                repeats = True
            keys.append(key)
            lines.append(ln)
            n += 1
            if len(keys) >= block:
                yield keys, np.asarray(lines, dtype=np.int64)
                keys, lines = [], []
        if keys:
            yield keys, np.asarray(lines, dtype=np.int64)
        self.num_rows = n
        fmt = self.format
        if fmt is None:
            if any_float or (min_len == max_len and repeats):
                fmt = "dense"
            elif min_len != max_len or n <= 1:
                fmt = "indices"
            else:
                raise InputError(f"{p}: every feature list holds {min_len} integers without repeats: "
                                 "pass --feature-format indices (active feature ids) or dense "
                                 "(values)")
        if fmt == "dense":
            if bad_len is not None:
                raise InputError(f"{p}:{bad_len[1]}: {bad_len[0]} feature values, but the first entry "
                                 f"(line {len_line[1]}) has {len_line[0]}")
            self.dim = int(len_line[0]) if len_line else 0
        else:
            if any_float:
                raise InputError(f"{p}: --feature-format indices, but the lists hold fractional "
                                 "numbers")
            if self.feat_dim is not None and max_id >= self.feat_dim:
                raise InputError(f"{p}: feature id {max_id} >= --feat-dim {self.feat_dim}")
            self.dim = int(self.feat_dim if self.feat_dim is not None else max_id + 1)
        self.format = fmt

    # ------------------------------------------------------------ pass 2: entries
    def entries(self, block_values: int = 1 << 22) -> Iterator[tuple[list[str], np.ndarray, np.ndarray,
                                                                      np.ndarray, np.ndarray]]:
        """Pass 2 (after :meth:`scan`): yield blocks ``(keys, lines, row, cols, vals)``: entry ``row[j]``
        of the block (an index into ``keys``) has value ``vals[j]`` (float32) in column ``cols[j]``
        (int64); zeros of dense rows are left out.

        Raises:
            InputError: see the class (negative feature ids).
        """
        if self.format is None or self.dim is None:
            raise RuntimeError("JsonFeatures.entries() before scan()")
        p = self.path
        dense = self.format == "dense"
        keys: list[str] = []
        lines: list[int] = []
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        held = 0
        for key, val, ln in self._items():
            if dense:
                v = np.asarray(val, dtype=np.float32)
                c = np.flatnonzero(v)
                v = v[c]
            else:
                c = np.asarray(val, dtype=np.int64)
                if c.size and c.min() < 0:
                    raise InputError(f"{p}:{ln}: node {key!r}: negative feature id {int(c.min())}")
                v = np.ones(c.shape[0], dtype=np.float32)
            rows.append(np.full(c.shape[0], len(keys), dtype=np.int64))
            cols.append(c.astype(np.int64))
            vals.append(v)
            keys.append(key)
            lines.append(ln)
            held += c.shape[0] + 1
            if held >= block_values:
                yield (keys, np.asarray(lines, dtype=np.int64), np.concatenate(rows),
                       np.concatenate(cols), np.concatenate(vals))
                keys, lines, rows, cols, vals, held = [], [], [], [], [], 0
        if keys:
            yield (keys, np.asarray(lines, dtype=np.int64), np.concatenate(rows), np.concatenate(cols),
                   np.concatenate(vals))


def is_json(path: object) -> bool:
    """Whether ``path`` names a JSON file (``.json`` or ``.json.gz``)."""
    return isinstance(path, (str, Path)) and str(path).lower().endswith((".json", ".json.gz"))


def keyed_feature_rows(table: JsonFeatures, num_nodes: int,
                       resolve: Callable[[list[str], Callable[[int], str]], np.ndarray],
                       workdir: Path, memory_budget: int, chunk_edges: int,
                       record: dict) -> Iterator[tuple[int, np.ndarray]]:
    """Dense feature rows in node order from a keyed table, in bounded memory.

    The entries (in any key order) are spooled to ``workdir`` as (column, node, value) triples and
    sorted by node with the streaming CSC build (:func:`ooc.ingest.streaming.build_csc_streaming`,
    within ``memory_budget``); rows are then assembled block by block (~32 MB each).  Nodes
    without an entry get an all-zero row.  Scratch: 20 B per non-zero value, plus 1 B per node.

    Args:
        table: the table, after :meth:`JsonFeatures.scan`.
        num_nodes: N.
        resolve: ``resolve(keys, where)`` -> int64 internal ids (``where(i)`` names entry i).
        record: filled with ``rows`` (nodes given a row) and ``missing_rows`` for the manifest.

    Yields:
        ``(first node, float32 [m, D] rows)``.

    Raises:
        InputError: a key that is not a node, or a node with two entries (file and line).
    """
    dim = int(table.dim or 0)
    seen = np.zeros(num_nodes, dtype=np.bool_)
    spool = SpoolWriter(workdir, "features", has_weight=True)
    p = table.path
    for keys, lines, row, cols, vals in table.entries():
        where = (lambda i, L=lines: f"{p}:{L[i]}")
        ids = np.asarray(resolve(keys, where), dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        rep = np.flatnonzero(ids[order][1:] == ids[order][:-1])
        again = np.flatnonzero(seen[ids])
        if rep.size or again.size:
            i = int(min(order[rep[0] + 1] if rep.size else len(keys),
                        again[0] if again.size else len(keys)))
            raise InputError(f"{where(i)}: node {keys[i]!r} has a second feature row")
        seen[ids] = True
        spool.append(cols, ids[row], vals)
    given = int(seen.sum())
    del seen
    record.update({"rows": given, "missing_rows": int(num_nodes - given)})
    source = spool.close(chunk_edges)
    col_sink = FileSink(workdir / "features.cols")
    val_sink = FileSink(workdir / "features.vals")
    indptr, _ = build_csc_streaming(source, num_nodes, col_sink, val_sink, workdir, dedup=True,
                                    memory_budget=memory_budget, index_nodes=max(dim, 1))
    col_sink.close()
    val_sink.close()
    for f in ("src", "dst", "w"):
        Path(f"{source.prefix}.{f}").unlink(missing_ok=True)
    step = max(1, (32 << 20) // max(4 * dim, 1))
    for a in range(0, num_nodes, step):
        b = min(num_nodes, a + step)
        lo, hi = int(indptr[a]), int(indptr[b])
        out = np.zeros((b - a, dim), dtype=np.float32)
        if hi > lo:
            r = np.repeat(np.arange(b - a), np.diff(indptr[a:b + 1]))
            out[r, col_sink.read(lo, hi)] = val_sink.read(lo, hi)
        yield a, out
