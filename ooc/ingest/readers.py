"""Streaming readers of raw inputs: delimited text tables (plain or gzip) and NumPy edge arrays.

Every reader yields bounded chunks and reports bad input as :class:`InputError` naming the file and
the 1-based line (text) or row (arrays), so ``ooc convert`` can exit non-zero with a useful message.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ooc.kernels import textparse as tp

__all__ = ["InputError", "TextTable", "TableBlock", "NumpyEdges", "open_text", "read_string_pairs",
           "load_array", "check_input_file", "MAX_LINE_BYTES"]

_BLOCK_BYTES = 16 << 20


class InputError(ValueError):
    """Malformed input; the message names the file and the line or row."""


#: Longest line accepted in a text input (bytes): a longer one is an error naming it, so a binary
#: or runaway file (a 2 GiB "line" without a newline) fails at once instead of being buffered.
MAX_LINE_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


def check_input_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path if it is a readable file.

    Raises:
        InputError: it does not exist, or is a directory (each said as such).
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    return p


def open_text(path: str | os.PathLike) -> io.BufferedIOBase:
    """Open a text input for binary reading: gzip data (recognised by its magic bytes, whatever
    the file's name) is decompressed on the fly, and a UTF-8 byte-order mark is skipped.

    Raises:
        InputError: the file does not exist or is a directory, or is not valid gzip data.
    """
    p = check_input_file(path)
    f = open(p, "rb", buffering=0)
    if f.read(2) == _GZIP_MAGIC:
        f.close()
        g = gzip.open(p, "rb")
        try:
            head = g.read(3)
        except (OSError, EOFError) as e:
            g.close()
            raise InputError(f"{p}: starts like gzip data but is not readable as gzip ({e})") from None
        if head != _BOM:
            g.seek(0)
        return g  # type: ignore[return-value]
    f.seek(0)
    if f.read(3) != _BOM:
        f.seek(0)
    return f


@dataclass
class TableBlock:
    """Parsed rows of one block: ``ints`` int64 [R, n_int], ``floats`` float64 [R, n_float], and
    ``lines`` int64 [R], the 1-based input line of every row."""

    ints: np.ndarray
    floats: np.ndarray
    lines: np.ndarray


def _split_fields(line: str, sep: str | None) -> list[str]:
    line = line.strip()
    if sep is None:
        return [t for t in re.split(r"[ \t]*,[ \t]*|[ \t]+", line)]
    return [t.strip() for t in line.split(sep)]


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


class TextTable:
    """A delimited numeric text table read in blocks by the Numba kernel :func:`parse_block`.

    Args:
        path: the file (``.gz`` decompressed on the fly).
        columns: the fields to read, each a 0-based index or (with a header) a column name.
        kinds: per selected column, ``"int"`` (non-negative id or label) or ``"float"``.
        sep: separator character; ``None`` = runs of spaces/tabs or a comma.
        comments: characters starting a comment line.
        header: ``"auto"`` (a first data line without any numeric field is a header), ``True``, ``False``.
        skip_rows: lines skipped at the start, before comment and header handling.
        block_bytes: bytes per parse block (bounded memory).

    Raises:
        InputError: missing file, unknown column name, no header when names are used.
    """

    def __init__(self, path: str | os.PathLike, columns: Sequence[int | str], kinds: Sequence[str],
                 sep: str | None = None, comments: str = "#%", header: bool | str = "auto",
                 skip_rows: int = 0, block_bytes: int = _BLOCK_BYTES) -> None:
        self.path = Path(path)
        self.sep = sep
        if sep is not None and len(sep.encode()) != 1:
            raise InputError(f"{self.path}: separator must be one byte, got {sep!r}")
        self.comments = comments
        self.skip_rows = int(skip_rows)
        self.block_bytes = max(int(block_bytes), 64)
        self.header_names: list[str] | None = None
        self._data_start_line, self._data_offset, first = self._scan_head(header)
        self.num_fields = len(first) if first is not None else -1
        idx: list[int] = []
        for c in columns:
            if isinstance(c, str) and not c.lstrip("-").isdigit():
                if self.header_names is None:
                    raise InputError(f"{self.path}: column {c!r} named but the file has no header row")
                if c not in self.header_names:
                    raise InputError(f"{self.path}: no column {c!r} in header {self.header_names}")
                idx.append(self.header_names.index(c))
            else:
                idx.append(int(c))
        self.col_index = idx
        width = max(max(idx) + 1, 1) if idx else 1
        self._kinds = np.zeros(width, dtype=np.int8)
        self._int_slot: list[int] = []
        self._float_slot: list[int] = []
        ni = nf = 0
        for ci, k in zip(idx, kinds):
            if self._kinds[ci] != tp.COL_SKIP:
                raise InputError(f"{self.path}: column {ci} selected twice")
            if k == "int":
                self._kinds[ci] = tp.COL_INT
            elif k == "float":
                self._kinds[ci] = tp.COL_FLOAT
            else:
                raise ValueError(f"unknown column kind {k!r}")
        # output slot of each selected column, in field order
        order_int = sorted(ci for ci, k in zip(idx, kinds) if k == "int")
        order_float = sorted(ci for ci, k in zip(idx, kinds) if k == "float")
        for ci, k in zip(idx, kinds):
            if k == "int":
                self._int_slot.append(order_int.index(ci))
                ni += 1
            else:
                self._float_slot.append(order_float.index(ci))
                nf += 1
        self.n_int, self.n_float = ni, nf
        self.kinds = list(kinds)

    def _scan_head(self, header: bool | str) -> tuple[int, int, list[str] | None]:
        """Find the first data line; returns (its 1-based line number, byte offset, its fields)."""
        with open_text(self.path) as f:
            line_no = 0
            offset = 0
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return line_no + 1, offset, None
                line_no += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise InputError(_too_long(self.path, line_no))
                start = offset
                offset += len(raw)
                if line_no <= self.skip_rows:
                    continue
                text = raw.decode("utf-8", errors="replace").strip()
                if not text or text[0] in self.comments:
                    continue
                fields = _split_fields(text, self.sep)
                is_header = header is True or (header == "auto" and not any(_is_number(t) for t in fields))
                if is_header and self.header_names is None:
                    self.header_names = fields
                    continue
                return line_no, start, fields

    def blocks(self) -> Iterator[TableBlock]:
        """Yield parsed blocks of at most ``block_bytes`` bytes of input each.

        Raises:
            InputError: a malformed line (file, line number, field and the line's text), or no data.
        """
        comments = np.frombuffer(self.comments.encode(), dtype=np.uint8)
        sep = -1 if self.sep is None else self.sep.encode()[0]
        expected = self.num_fields
        line_base = self._data_start_line
        any_rows = False
        with open_text(self.path) as f:
            _skip_bytes(f, self._data_offset)
            carry = b""
            while True:
                data = f.read(self.block_bytes)
                eof = not data
                buf = carry + data
                if not buf:
                    break
                if eof:
                    cut = len(buf)
                else:
                    cut = buf.rfind(b"\n") + 1
                    if cut == 0:
                        if len(buf) > MAX_LINE_BYTES:
                            raise InputError(_too_long(self.path, line_base))
                        carry = buf
                        continue
                block, carry = buf[:cut], buf[cut:]
                if len(carry) > MAX_LINE_BYTES:
                    raise InputError(_too_long(self.path, line_base + block.count(b"\n")))
                arr = np.frombuffer(block, dtype=np.uint8)
                nl = np.flatnonzero(arr == 10)
                lengths = np.diff(nl, prepend=-1)  # of every line, with its newline
                if lengths.size and int(lengths.max()) > MAX_LINE_BYTES + 1:
                    i = int(np.argmax(lengths > MAX_LINE_BYTES + 1))
                    raise InputError(_too_long(self.path, line_base + i))
                cap = int(nl.size) + 1
                oi = np.empty((cap, self.n_int), dtype=np.int64)
                of = np.empty((cap, self.n_float), dtype=np.float64)
                ol = np.empty(cap, dtype=np.int64)
                rows, lines, err, eline, efield, exp_f, found = tp.parse_block(
                    arr, self._kinds, expected, sep, comments, oi, of, ol)
                if err != tp.ERR_NONE:
                    self._raise(block, err, eline, efield, exp_f, found, line_base)
                expected = exp_f
                if rows:
                    any_rows = True
                    yield TableBlock(oi[:rows][:, self._int_slot], of[:rows][:, self._float_slot],
                                     ol[:rows] + line_base)
                line_base += lines
                if eof:
                    break
        if not any_rows:
            raise InputError(f"{self.path}: no data lines (empty file)")

    def _raise(self, block: bytes, err: int, eline: int, efield: int, expected: int, found: int,
               line_base: int) -> None:
        lines = block.split(b"\n")
        text = lines[eline].decode("utf-8", errors="replace").rstrip("\r") if eline < len(lines) else ""
        msg = tp.error_message(err, efield, expected, found)
        raise InputError(f"{self.path}:{line_base + eline}: {msg}: {text[:200]!r}")

    def read_all(self) -> TableBlock:
        """All rows in memory (for node-sized tables: labels, splits)."""
        ints, floats, lines = [], [], []
        for b in self.blocks():
            ints.append(b.ints)
            floats.append(b.floats)
            lines.append(b.lines)
        return TableBlock(np.concatenate(ints), np.concatenate(floats), np.concatenate(lines))


def _too_long(path: Path, line: int) -> str:
    return (f"{path}:{line}: line longer than {MAX_LINE_BYTES:,} bytes (no newline within it); not a "
            "text table, or a binary file")


def _skip_bytes(f: io.BufferedIOBase, n: int) -> None:
    while n > 0:
        got = f.read(min(n, 1 << 20))
        if not got:
            break
        n -= len(got)


def read_string_pairs(path: str | os.PathLike, columns: Sequence[int | str], sep: str | None = None,
                      comments: str = "#%", header: bool | str = False, skip_rows: int = 0,
                      block_lines: int = 1 << 18,
                      with_lines: bool = False) -> Iterator[tuple[list[list[str]], int | list[int]]]:
    """Yield blocks ``(rows, first_line)`` of string fields (ids that are not integers).

    Each row is the list of the selected fields, in ``columns`` order.  Same comment, blank-line,
    header and column-count rules as :class:`TextTable` (``header="auto"``: a first data line without
    any numeric field is a header); pure Python (string ids are not the billion-edge path).  With
    ``with_lines`` the second item is the list of every row's 1-based line number instead.

    Raises:
        InputError: wrong column count (file and line), unknown column, no data lines.
    """
    p = Path(path)
    names: list[str] | None = None
    idx: list[int] | None = None
    expected = -1
    any_rows = False
    with open_text(p) as fb:
        f = io.TextIOWrapper(fb, encoding="utf-8", errors="replace", newline=None)
        rows: list[list[str]] = []
        lines: list[int] = []
        first = 0
        for line_no, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), ""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(_too_long(p, line_no))
            if line_no <= skip_rows:
                continue
            text = raw.strip()
            if not text or text[0] in comments:
                continue
            fields = _split_fields(text, sep)
            if names is None and (header is True or (header == "auto" and
                                                     not any(_is_number(t) for t in fields))):
                names = fields
                header = False
                continue
            header = False
            if idx is None:
                idx = []
                for c in columns:
                    if isinstance(c, str) and not c.isdigit():
                        if names is None or c not in names:
                            raise InputError(f"{p}: no column {c!r} (header {names})")
                        idx.append(names.index(c))
                    else:
                        idx.append(int(c))
                expected = len(fields)
            if len(fields) != expected or len(fields) <= max(idx):
                raise InputError(f"{p}:{line_no}: expected {max(expected, max(idx) + 1)} fields, "
                                 f"found {len(fields)}: {text[:200]!r}")
            if not rows:
                first = line_no
            rows.append([fields[i] for i in idx])
            if with_lines:
                lines.append(line_no)
            any_rows = True
            if len(rows) >= block_lines:
                yield rows, (lines if with_lines else first)
                rows, lines = [], []
        if rows:
            yield rows, (lines if with_lines else first)
    if not any_rows:
        raise InputError(f"{p}: no data lines (empty file)")


def load_array(path: str | os.PathLike, key: str | None = None, mmap: bool = True) -> np.ndarray:
    """Load a ``.npy`` (memory-mapped) or one member of a ``.npz``.

    Raises:
        InputError: missing file, missing member, or not a NumPy file.
    """
    p = check_input_file(path)
    try:
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                if key is None:
                    if len(z.files) != 1:
                        raise InputError(f"{p}: holds {z.files}; name the member to use")
                    key = z.files[0]
                if key not in z.files:
                    raise InputError(f"{p}: no member {key!r} (has {z.files})")
                return z[key]
        return np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
    except InputError:
        raise
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"{p}: not a readable NumPy file ({e})") from None


def _pread_into(path: str, offset: int, out: np.ndarray) -> None:
    """Fill the C-contiguous ``out`` from ``path`` at byte ``offset``.

    Raises:
        InputError: the file is shorter than expected.
    """
    view = memoryview(out.reshape(-1).view(np.uint8))
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < len(view):
            got = os.preadv(fd, [view[pos:]], offset + pos)
            if got <= 0:
                raise InputError(f"{path}: truncated (expected {len(view)} bytes at offset {offset})")
            pos += got
    finally:
        os.close(fd)


class NumpyEdges:
    """A COO edge array in a ``.npy`` (memory-mapped) or ``.npz``: shape (2, E) or (E, 2), or a CSR
    pair ``indptr`` [N+1] / ``indices`` [E] (row = source).

    Args:
        path: ``.npy`` or ``.npz`` file.
        layout: ``"auto"``, ``"2xE"``, ``"Ex2"`` or ``"csr"``.  ``auto`` picks CSR when a ``.npz`` holds
            ``indptr`` and ``indices``, else the axis of length 2 (a (2, 2) array is ambiguous).
        key: ``.npz`` member holding the COO array (default: ``edge_index``, or ``src``/``dst``,
            ``row``/``col``).

    Raises:
        InputError: not an edge array, ambiguous layout, non-integer dtype.
    """

    def __init__(self, path: str | os.PathLike, layout: str = "auto", key: str | None = None) -> None:
        self.path = Path(path)
        self.indptr: np.ndarray | None = None
        self.pairs: np.ndarray | None = None
        self.src: np.ndarray | None = None
        self.dst: np.ndarray | None = None
        if self.path.suffix == ".npz":
            check_input_file(self.path)
            with np.load(self.path, allow_pickle=False) as z:
                files = set(z.files)
                if layout in ("auto", "csr") and {"indptr", "indices"} <= files:
                    self.indptr = np.asarray(z["indptr"], dtype=np.int64)
                    self.dst = np.asarray(z["indices"])
                    layout = "csr"
                elif key is not None or "edge_index" in files:
                    arr = z[key or "edge_index"]
                    self._from_coo(arr, layout)
                else:
                    for a, b in (("src", "dst"), ("row", "col")):
                        if {a, b} <= files:
                            self.src, self.dst = z[a], z[b]
                            break
                    else:
                        raise InputError(f"{self.path}: no edge arrays (expected edge_index, src/dst, "
                                         f"row/col or indptr/indices; found {sorted(files)})")
        else:
            self._from_coo(load_array(self.path), layout)
        if self.indptr is not None:
            if self.indptr.ndim != 1 or self.indptr.shape[0] < 1 or self.indptr[0] != 0 or \
                    np.any(np.diff(self.indptr) < 0) or self.indptr[-1] != self.dst.shape[0]:
                raise InputError(f"{self.path}: indptr is not a monotone offset array from 0 to "
                                 f"len(indices) = {self.dst.shape[0]}")
        for name, a in (("source", self.src), ("destination", self.dst)):
            if a is not None and a.dtype.kind not in "iu":
                raise InputError(f"{self.path}: {name} ids have dtype {a.dtype}, expected integers")
        self.layout = layout if layout == "csr" else getattr(self, "_layout", layout)
        self.num_edges = int(self.dst.shape[0])

    def _from_coo(self, arr: np.ndarray, layout: str) -> None:
        if arr.ndim != 2 or 2 not in arr.shape:
            raise InputError(f"{self.path}: edge array of shape {arr.shape}; expected (2, E) or (E, 2)")
        if layout == "auto":
            if arr.shape == (2, 2):
                raise InputError(f"{self.path}: a (2, 2) edge array is ambiguous; pass --layout")
            layout = "2xE" if arr.shape[0] == 2 else "Ex2"
        if layout == "2xE":
            if arr.shape[0] != 2:
                raise InputError(f"{self.path}: layout 2xE but shape {arr.shape}")
            self.src, self.dst = arr[0], arr[1]
            self._layout = "2xE"
            self.pairs = arr
        elif layout == "Ex2":
            if arr.shape[1] != 2:
                raise InputError(f"{self.path}: layout Ex2 but shape {arr.shape}")
            self.src, self.dst = arr[:, 0], arr[:, 1]
            self._layout = "Ex2"
            self.pairs = arr
        else:
            raise InputError(f"{self.path}: unknown layout {layout!r}")

    def pair_block(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the COO pair array as an in-memory block ([m, 2] or [2, m]).

        ``.npy`` files are read with positioned reads rather than through the memory map, so the
        pages of a many-GB input never accumulate in this process's resident set.
        """
        arr = self.pairs
        fn = getattr(arr, "filename", None)
        if fn is None or not isinstance(arr, np.memmap):
            return np.asarray(arr[:, start:stop] if self.layout == "2xE" else arr[start:stop])
        item = arr.dtype.itemsize
        m = stop - start
        if self.layout == "Ex2":
            out = np.empty((m, 2), dtype=arr.dtype)
            _pread_into(fn, arr.offset + start * 2 * item, out)
        else:
            out = np.empty((2, m), dtype=arr.dtype)
            e = arr.shape[1]
            _pread_into(fn, arr.offset + start * item, out[0])
            _pread_into(fn, arr.offset + (e + start) * item, out[1])
        return out

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Edges ``[start, stop)`` as int64 ``(src, dst)`` copies."""
        if self.indptr is not None:
            pos = np.arange(start, stop, dtype=np.int64)
            src = np.searchsorted(self.indptr, pos, side="right") - 1
            return src.astype(np.int64), np.asarray(self.dst[start:stop], dtype=np.int64)
        return (np.asarray(self.src[start:stop], dtype=np.int64),
                np.asarray(self.dst[start:stop], dtype=np.int64))

    def chunks(self, chunk_edges: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield ``(first_row, src, dst)`` int64 chunks of at most ``chunk_edges`` edges."""
        for a in range(0, self.num_edges, chunk_edges):
            b = min(a + chunk_edges, self.num_edges)
            s, d = self.read(a, b)
            yield a, s, d
