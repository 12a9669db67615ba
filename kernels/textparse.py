"""Numba parser for delimited numeric text tables (edge lists, label/split/feature CSVs).

One kernel, :func:`parse_block`, turns a block of bytes (whole lines) into int64 and float64 columns.
It understands what real edge lists contain: fields separated by whitespace runs, tabs or commas;
comment lines starting with ``#`` or ``%`` (SNAP and Matrix Market headers); blank lines; trailing
whitespace; ``\\r\\n`` line ends.  Every data line must have the same number of fields (the first data
line fixes it), and each parsed field must be a well-formed number, else the kernel stops and reports
the line (relative to the block) and the field, so the caller can name file and line.

Integers are parsed exactly into int64 (no float round trip: sparse 64-bit ids survive); floats accept
``[+-]digits[.digits][e[+-]digits]``, ``nan`` and ``inf``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["parse_block", "ERR_NONE", "ERR_NOT_INT", "ERR_NEGATIVE", "ERR_NOT_FLOAT", "ERR_COLUMNS",
           "ERR_OVERFLOW", "COL_SKIP", "COL_INT", "COL_FLOAT", "error_message"]

ERR_NONE = 0
ERR_NOT_INT = 1
ERR_NEGATIVE = 2
ERR_NOT_FLOAT = 3
ERR_COLUMNS = 4
ERR_OVERFLOW = 5

COL_SKIP = 0
COL_INT = 1
COL_FLOAT = 2

_MESSAGES = {
    ERR_NOT_INT: "field {field} is not an integer id",
    ERR_NEGATIVE: "field {field} is a negative id",
    ERR_NOT_FLOAT: "field {field} is not a number",
    ERR_COLUMNS: "expected {expected} fields, found {found}",
    ERR_OVERFLOW: "field {field} does not fit a signed 64-bit integer",
}


def error_message(code: int, field: int, expected: int, found: int) -> str:
    """Human-readable text of a :func:`parse_block` error code (``field`` is 1-based)."""
    return _MESSAGES[code].format(field=field, expected=expected, found=found)


@njit(cache=True, nogil=True, inline="always")
def _is_sep(c: np.uint8, sep: np.int64) -> bool:
    if sep >= 0:
        return c == sep
    return c == 32 or c == 9 or c == 44  # space, tab, comma


@njit(cache=True, nogil=True)
def _parse_int(buf: np.ndarray, a: int, b: int) -> tuple:
    """Parse buf[a:b] as a non-negative decimal integer -> (value, error code)."""
    if a >= b:
        return 0, ERR_NOT_INT
    if buf[a] == 45:  # '-'
        if a + 1 < b and 48 <= buf[a + 1] <= 57:
            return 0, ERR_NEGATIVE
        return 0, ERR_NOT_INT
    if buf[a] == 43:  # '+'
        a += 1
        if a >= b:
            return 0, ERR_NOT_INT
    v = np.int64(0)
    limit = np.int64(922337203685477580)  # (2**63 - 1) // 10
    for i in range(a, b):
        c = buf[i]
        if c < 48 or c > 57:
            return 0, ERR_NOT_INT
        d = np.int64(c - 48)
        if v > limit or (v == limit and d > 7):
            return 0, ERR_OVERFLOW
        v = v * 10 + d
    return v, ERR_NONE


@njit(cache=True, nogil=True)
def _lower(c: np.uint8) -> np.uint8:
    if 65 <= c <= 90:
        return c + 32
    return c


@njit(cache=True, nogil=True)
def _parse_float(buf: np.ndarray, a: int, b: int) -> tuple:
    """Parse buf[a:b] as a decimal float (also nan / inf) -> (value, error code)."""
    if a >= b:
        return 0.0, ERR_NOT_FLOAT
    sign = 1.0
    if buf[a] == 45:
        sign = -1.0
        a += 1
    elif buf[a] == 43:
        a += 1
    if a >= b:
        return 0.0, ERR_NOT_FLOAT
    n = b - a
    if n == 3 and _lower(buf[a]) == 110 and _lower(buf[a + 1]) == 97 and _lower(buf[a + 2]) == 110:
        return np.nan, ERR_NONE
    if (n == 3 or n == 8) and _lower(buf[a]) == 105 and _lower(buf[a + 1]) == 110 and \
            _lower(buf[a + 2]) == 102:
        return sign * np.inf, ERR_NONE
    mant = 0.0
    digits = 0
    i = a
    while i < b and 48 <= buf[i] <= 57:
        mant = mant * 10.0 + (buf[i] - 48)
        digits += 1
        i += 1
    exp10 = 0
    if i < b and buf[i] == 46:  # '.'
        i += 1
        while i < b and 48 <= buf[i] <= 57:
            mant = mant * 10.0 + (buf[i] - 48)
            exp10 -= 1
            digits += 1
            i += 1
    if digits == 0:
        return 0.0, ERR_NOT_FLOAT
    if i < b and (buf[i] == 101 or buf[i] == 69):  # e / E
        i += 1
        esign = 1
        if i < b and (buf[i] == 45 or buf[i] == 43):
            if buf[i] == 45:
                esign = -1
            i += 1
        if i >= b:
            return 0.0, ERR_NOT_FLOAT
        e = 0
        while i < b and 48 <= buf[i] <= 57:
            e = e * 10 + (buf[i] - 48)
            if e > 10000:
                e = 10000
            i += 1
        exp10 += esign * e
    if i != b:
        return 0.0, ERR_NOT_FLOAT
    if exp10 < 0:
        return sign * (mant / 10.0 ** (-exp10)), ERR_NONE
    return sign * (mant * 10.0 ** exp10), ERR_NONE


@njit(cache=True, nogil=True)
def parse_block(buf: np.ndarray, kinds: np.ndarray, expected_fields: int, sep: int,
                comments: np.ndarray, out_int: np.ndarray, out_float: np.ndarray,
                out_line: np.ndarray) -> tuple:
    """Parse whole lines of ``buf`` into numeric columns.

    Args:
        buf: uint8 [B] bytes holding whole lines (the last one may lack its newline).
        kinds: int8 [C] per field index: ``COL_SKIP``, ``COL_INT`` or ``COL_FLOAT``; fields beyond
            ``C`` are skipped.  Integer fields must be non-negative (they are ids or labels).
        expected_fields: fields per data line; ``-1`` = take the first data line's count.
        sep: byte value of the separator, or ``-1`` for "any run of spaces/tabs, or a comma".
        comments: uint8 [k] bytes that start a comment line (after leading whitespace).
        out_int: int64 [R, n_int] destination of the integer fields in field order.
        out_float: float64 [R, n_float] destination of the float fields.
        out_line: int64 [R] receives each row's 0-based line within ``buf`` (for error messages).

    Returns:
        ``(rows, lines, error, err_line, err_field, expected_fields, found_fields)``: rows parsed,
        newlines consumed, error code (``ERR_*``), the 0-based line (relative to ``buf``) and 1-based
        field of the error, the field count in force and the one found on the bad line.  Parsing
        stops at the first error, or when ``out_int``/``out_float`` are full (then ``lines`` tells where
        to resume).
    """
    n = buf.shape[0]
    cap = out_line.shape[0]
    pos = 0
    line = 0
    rows = 0
    nkinds = kinds.shape[0]
    while pos < n and rows < cap:
        # find line end
        end = pos
        while end < n and buf[end] != 10:
            end += 1
        stop = end
        if stop > pos and buf[stop - 1] == 13:
            stop -= 1
        # skip leading whitespace
        a = pos
        while a < stop and (buf[a] == 32 or buf[a] == 9):
            a += 1
        is_data = a < stop
        if is_data:
            for k in range(comments.shape[0]):
                if buf[a] == comments[k]:
                    is_data = False
        if is_data:
            # trailing whitespace
            z = stop
            while z > a and (buf[z - 1] == 32 or buf[z - 1] == 9):
                z -= 1
            field = 0
            ii = 0
            fi = 0
            i = a
            while True:
                # token [i, j)
                j = i
                while j < z and not _is_sep(buf[j], sep):
                    j += 1
                if field < nkinds:
                    kind = kinds[field]
                    if kind == COL_INT:
                        v, err = _parse_int(buf, i, j)
                        if err != ERR_NONE:
                            return rows, line, err, line, field + 1, expected_fields, 0
                        out_int[rows, ii] = v
                        ii += 1
                    elif kind == COL_FLOAT:
                        fv, err = _parse_float(buf, i, j)
                        if err != ERR_NONE:
                            return rows, line, err, line, field + 1, expected_fields, 0
                        out_float[rows, fi] = fv
                        fi += 1
                field += 1
                if j >= z:
                    break
                # consume the separator run: whitespace runs collapse, one comma may sit inside one
                if sep >= 0:
                    i = j + 1
                else:
                    k = j
                    commas = 0
                    while k < z and (buf[k] == 32 or buf[k] == 9 or buf[k] == 44):
                        if buf[k] == 44:
                            commas += 1
                            if commas > 1:
                                break
                        k += 1
                    i = k
            if expected_fields < 0:
                expected_fields = field
            if field != expected_fields or field < nkinds:
                need = expected_fields if expected_fields >= nkinds else nkinds
                return rows, line, ERR_COLUMNS, line, 0, need, field
            out_line[rows] = line
            rows += 1
        if end < n:
            line += 1
        pos = end + 1
    return rows, line, ERR_NONE, -1, 0, expected_fields, 0
