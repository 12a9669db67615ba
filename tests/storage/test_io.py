"""Disk reads of the out-of-core engine (ooc.storage.io): request planning with exact answers, rows read back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ooc.storage.io import AIO_STAGING_BYTES, ALIGN, MISS_RUN_BYTES, DiskRows, aligned_empty, plan_runs
from ooc.storage.rawarray import RawArray, write_array


def _store(tmp_path: Path, rows: int = 20000, dim: int = 256, chunk_rows: int = 4096) -> tuple:
    x = np.random.default_rng(3).normal(size=(rows, dim)).astype(np.float16)  # 512-byte rows
    write_array(tmp_path / "x", x, chunk_rows=chunk_rows)
    return x, RawArray(tmp_path / "x")


def test_plan_runs_merges_rows_on_the_same_or_adjacent_pages() -> None:
    # 512-byte rows, 8 per 4 KiB page; chunk files of 64 rows (32 KiB)
    ids = np.array([0, 1, 7, 8, 20, 40, 63, 64, 65, 100])
    c, s, z, f = plan_runs(ids, 512, 64 * 512, ALIGN, gap=0)
    # pages 0,0,0,1,2 (touching: one request) | 5 | 7 || chunk file 1: pages 0,0 | 4
    assert c.tolist() == [0, 0, 0, 1, 1]
    assert s.tolist() == [0, 20480, 28672, 0, 16384]
    assert z.tolist() == [12288, 4096, 4096, 4096, 4096]
    assert f.tolist() == [0, 5, 6, 7, 9, 10]


def test_plan_runs_reads_through_gaps_up_to_the_threshold() -> None:
    ids = np.array([0, 1, 7, 8, 20, 40, 63, 64, 65, 100])
    # gap 8 KiB: page 5 is 8 KiB after the end of pages 0-2 -> joins, page 7
    # is 4 KiB after -> joins; a request never crosses a chunk file; in chunk 1 page 4 is 12 KiB away
    c, s, z, f = plan_runs(ids, 512, 64 * 512, ALIGN, gap=8192)
    assert c.tolist() == [0, 1, 1]
    assert s.tolist() == [0, 0, 16384]
    assert z.tolist() == [32768, 4096, 4096]
    assert f.tolist() == [0, 7, 9, 10]
    # 16 KiB: chunk 1's two pages merge too
    c, s, z, f = plan_runs(ids, 512, 64 * 512, ALIGN, gap=16384)
    assert (c.tolist(), s.tolist(), z.tolist(), f.tolist()) == ([0, 1], [0, 0], [32768, 20480],
                                                                [0, 7, 10])


def test_plan_runs_caps_the_request_size() -> None:
    ids = np.arange(0, 64, 8)  # one row on each of 8 consecutive pages
    c, s, z, f = plan_runs(ids, 512, 1 << 20, ALIGN, gap=0, max_run=3 * ALIGN)
    assert s.tolist() == [0, 12288, 24576]
    assert z.tolist() == [12288, 12288, 8192]
    assert f.tolist() == [0, 3, 6, 8]
    with pytest.raises(ValueError):
        plan_runs(ids, 512, 1 << 20, ALIGN, max_run=2048)


def test_plan_runs_buffered_reads_are_byte_exact() -> None:
    # align 1: only the rows' bytes; gap 0 merges consecutive rows only, 48 B skips one row, 96 B two
    ids = np.array([3, 4, 5, 7, 10])
    c, s, z, f = plan_runs(ids, 48, 1 << 20, 1, gap=0)
    assert (s.tolist(), z.tolist(), f.tolist()) == ([144, 336, 480], [144, 48, 48], [0, 3, 4, 5])
    c, s, z, f = plan_runs(ids, 48, 1 << 20, 1, gap=48)
    assert (s.tolist(), z.tolist(), f.tolist()) == ([144, 480], [240, 48], [0, 4, 5])
    c, s, z, f = plan_runs(ids, 48, 1 << 20, 1, gap=96)
    assert (s.tolist(), z.tolist(), f.tolist()) == ([144], [384], [0, 5])


def test_range_requests_split_for_concurrency_and_at_chunk_files(tmp_path: Path) -> None:
    x, ra = _store(tmp_path, chunk_rows=4096)  # 2 MiB chunk files
    rows = DiskRows(ra, direct=True, threads=4, piece=1 << 20)
    if not rows.direct:
        pytest.skip("file system refuses O_DIRECT")
    assert rows.range_threads == 4
    # rows [100, 4196): bytes [51200, 2148352) -> pages [49152, 2150400), crossing the chunk file at
    # 2 MiB: [49152, 2097152) in 4 near-equal page-aligned requests of <= 1 MiB, then the 52 KiB
    # rest as one request (requests are split no smaller than 64 KiB)
    req = rows.range_requests(100, 4196)
    assert req == [(49152, 512000), (561152, 512000), (1073152, 512000), (1585152, 512000),
                   (2097152, 53248)]
    assert sum(n for _, n in req) == rows.span(100, 4196)[1]
    rows.close()


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("gap", [0, 4096, 65536])
def test_gather_returns_the_store_rows(tmp_path: Path, direct: bool, gap: int) -> None:
    x, ra = _store(tmp_path)
    rows = DiskRows(ra, direct=direct, threads=3, gap=gap, max_run=64 << 10)
    rng = np.random.default_rng(4)
    for ids in [rng.integers(0, 20000, 3000),                        # duplicates
                rng.permutation(20000)[:2500],                       # unique, unsorted
                np.array([19999, 0, 4095, 4096, 8191, 12288]),       # chunk edges, last row
                np.array([7])]:
        before = rows.counters.bytes_read
        got, nbytes = rows.gather(ids)
        assert np.array_equal(got, x[ids])
        uniq = np.unique(ids)
        c, s, z, f = rows.plan(uniq)
        assert nbytes == int(z.sum()) == rows.counters.bytes_read - before
        assert nbytes >= uniq.shape[0] * 512
    out = np.empty((5, 256), dtype=np.float16)
    got, _ = rows.gather(np.array([5, 4, 3, 2, 1]), out=out)
    assert got is out and np.array_equal(out, x[[5, 4, 3, 2, 1]])
    with pytest.raises(IndexError):
        rows.gather(np.array([20000]))
    rows.close()


def test_gather_coalescing_reads_fewer_requests(tmp_path: Path) -> None:
    x, ra = _store(tmp_path)
    ids = np.random.default_rng(5).permutation(20000)[:1500]
    counts = {}
    for gap in (0, 16384):
        rows = DiskRows(ra, direct=True, threads=4, gap=gap)
        if not rows.direct:
            pytest.skip("file system refuses O_DIRECT")
        got, nbytes = rows.gather(ids)
        assert np.array_equal(got, x[ids])
        counts[gap] = (rows.counters.requests, nbytes)
        rows.close()
    assert counts[16384][0] < counts[0][0]   # fewer requests ...
    assert counts[16384][1] > counts[0][1]   # ... for more bytes


@pytest.mark.parametrize("direct", [False, True])
def test_read_range_async_in_place(tmp_path: Path, direct: bool) -> None:
    x, ra = _store(tmp_path)
    rows = DiskRows(ra, direct=direct, threads=4, piece=64 << 10)
    raw = x.view(np.uint8).reshape(-1)
    for a, b in [(0, 20000), (101, 8200), (4095, 4097), (19999, 20000), (5, 5)]:
        off, n, shift = rows.span(a, b)
        dst = aligned_empty(n + ALIGN)
        r = rows.read_range_async(a, b, dst)
        assert r.wait() == n
        assert np.array_equal(dst[shift:shift + (b - a) * 512], raw[a * 512:b * 512])
    with pytest.raises(ValueError):
        rows.read_range(0, 100, aligned_empty(100))
    rows.close()


@pytest.mark.parametrize("chunk_rows", [2048, 5003])
@pytest.mark.parametrize("direct", [False, True])
def test_read_range_of_a_file_that_ends_inside_a_page(tmp_path: Path, direct: bool,
                                                      chunk_rows: int) -> None:
    """5,003 int32 ids (20,012 bytes, not a page multiple) in 8 KiB chunk files or in one of exactly its rows: a range
    ending at the last row is a span past EOF, read in requests that start inside the file (with
    one chunk file, whose size is then not a page multiple, a request starting at EOF made the
    read fail as if the file were truncated)."""
    x = np.arange(5003, dtype=np.int32)
    write_array(tmp_path / "ix", x, chunk_rows=chunk_rows)
    ra = RawArray(tmp_path / "ix")
    assert ra.num_chunks == (3 if chunk_rows == 2048 else 1) and ra.nbytes % ALIGN
    rows = DiskRows(ra, direct=direct, threads=4, piece=4096, aio_depth=0)
    last = ra.num_chunks - 1
    for a, b in [(4500, 5003), (4096, 5003), (0, 5003), (5002, 5003), (1000, 4200)]:
        off, n, shift = rows.span(a, b)
        req = rows.range_requests(a, b)
        assert sum(k for _, k in req) == n and all(o < ra.nbytes for o, _ in req)
        assert all(o // ra.chunk_bytes in ((o + k - 1) // ra.chunk_bytes, last) for o, k in req)
        dst = aligned_empty(n + ALIGN)
        rows.read_range(a, b, dst)
        assert np.array_equal(dst[shift:shift + (b - a) * 4].view(np.int32), x[a:b])
    rows.close()


def test_truncated_chunk_is_an_error(tmp_path: Path) -> None:
    x, ra = _store(tmp_path)
    path = ra.chunk_path(1)
    with open(path, "r+b") as fh:
        fh.truncate(100 * 512)
    rows = DiskRows(RawArray(tmp_path / "x"), direct=False, threads=2)
    with pytest.raises(OSError):
        rows.gather(np.array([4096 + 200]))
    with pytest.raises(OSError):
        rows.read_range(4096, 8192, aligned_empty(4 << 20))
    rows.close()


def test_native_aio_and_pread_threads_read_the_same(tmp_path: Path) -> None:
    x, ra = _store(tmp_path)
    aio = DiskRows(ra, direct=True, gap=16384, aio_depth=4)
    if not aio.aio:
        pytest.skip("no O_DIRECT or native AIO here")
    thr = DiskRows(ra, direct=True, threads=3, gap=16384, aio_depth=0)
    assert not thr.aio
    rng = np.random.default_rng(6)
    for ids in [rng.integers(0, 20000, 4000), rng.permutation(20000)[:3000], np.array([19999])]:
        a, na = aio.gather(ids)
        b, nb = thr.gather(ids)
        assert np.array_equal(a, x[ids]) and np.array_equal(b, x[ids])
        assert na == nb
    assert aio.counters.requests == thr.counters.requests
    aio.close()
    thr.close()


def test_aio_staging_stays_bounded_as_requests_in_flight_grow(tmp_path: Path) -> None:
    """More requests in flight make each AIO slot (and request) smaller, never the staging larger
    than AIO_STAGING_BYTES, and at least 4 pages; the rows read are the same at every depth."""
    x, ra = _store(tmp_path)
    ids = np.random.default_rng(7).integers(0, 20000, 5000)
    runs = {}
    for depth in (32, 128, 1024):
        rows = DiskRows(ra, direct=True, gap=16384, aio_depth=depth)
        if not rows.aio:
            pytest.skip("no O_DIRECT or native AIO here")
        runs[depth] = rows.max_run
        assert rows._aio.staging.nbytes == depth * rows.max_run
        assert np.array_equal(rows.gather(ids)[0], x[ids])
        rows.close()
    assert runs == {32: MISS_RUN_BYTES, 128: AIO_STAGING_BYTES // 128, 1024: 4 * ALIGN}
    assert 128 * runs[128] <= AIO_STAGING_BYTES
    from ooc.config import MAX_IO_DEPTH
    assert MAX_IO_DEPTH * 4 * ALIGN == AIO_STAGING_BYTES  # the most --io-depth allows stays bounded


def test_truncated_chunk_is_an_error_with_native_aio(tmp_path: Path) -> None:
    x, ra = _store(tmp_path)
    with open(ra.chunk_path(1), "r+b") as fh:
        fh.truncate(100 * 512)
    rows = DiskRows(RawArray(tmp_path / "x"), direct=True, aio_depth=8)
    if not rows.aio:
        pytest.skip("no O_DIRECT or native AIO here")
    assert np.array_equal(rows.gather(np.array([4096 + 99]))[0], x[[4096 + 99]])
    with pytest.raises(OSError):
        rows.gather(np.array([5, 4096 + 200, 9000]))
    rows.close()


def test_gathers_align_to_the_smallest_direct_block_the_file_accepts(tmp_path: Path) -> None:
    """Where the device's logical block (512 B) is smaller than a page, a gather request of one
    512-byte row reads 512 bytes, not 4 KiB; the rows are the same at every block size; ranges
    stay page aligned."""
    x, ra = _store(tmp_path)
    probe = DiskRows(ra, direct=True, gap=0)
    if not probe.direct:
        pytest.skip("file system refuses O_DIRECT")
    if probe.gather_align == ALIGN:
        pytest.skip("this device's direct reads need whole pages")
    assert probe.gather_align in (512, 1024, 2048)
    assert probe.align == ALIGN and probe.span(1, 2) == (0, ALIGN, 512)  # ranges: whole pages
    probe.close()
    ids = np.arange(3, 20000, 97)  # rows 97 apart: one request each
    for aio_depth in (8, 0):
        got = {}
        for block in (512, ALIGN):
            rows = DiskRows(ra, direct=True, gap=0, aio_depth=aio_depth, gather_align=block)
            out, nbytes = rows.gather(ids)
            assert np.array_equal(out, x[ids])
            got[block] = (nbytes, rows.counters.requests)
            rows.close()
        assert got[512] == (ids.shape[0] * 512, ids.shape[0])
        assert got[ALIGN] == (ids.shape[0] * ALIGN, ids.shape[0])


def test_gathers_of_rows_straddling_direct_blocks(tmp_path: Path) -> None:
    """300-byte rows cross 512-byte blocks: each request covers its rows' whole blocks, the rows
    read back exactly, and the last chunk's end (not a block multiple) reads short but whole."""
    x = np.random.default_rng(4).integers(0, 255, size=(7000, 300), dtype=np.uint8)
    write_array(tmp_path / "y", x)  # one chunk file of 2,100,000 bytes
    ra = RawArray(tmp_path / "y")
    rows = DiskRows(ra, direct=True, gap=0, gather_align=512)
    if not rows.direct:
        pytest.skip("file system refuses O_DIRECT")
    ids = np.array([0, 1, 2, 500, 3333, 6998, 6999])
    out, nbytes = rows.gather(ids)
    assert np.array_equal(out, x[ids])
    _, _, size, _ = rows.plan(np.unique(ids))
    # rows 0-2: bytes [0, 900) -> 1,024; 500: [150000, 150300) -> [149504, 150528): 1,024;
    # 3333: [999900, 1000200) -> [999424, 1000448): 1,024; 6998-6999: [2099400, 2100000) -> 1,024
    assert size.tolist() == [1024, 1024, 1024, 1024] and nbytes == 4096
    rows.close()
    with pytest.raises(ValueError, match="gather_align 100"):
        DiskRows(ra, direct=True, gather_align=100)
