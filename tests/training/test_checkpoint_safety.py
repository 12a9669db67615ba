"""Checkpoints carry a checksum of their content; a corrupt, truncated, empty, crafted or foreign
one is a clean error naming the file, and --resume falls back to the previous checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from ooc.training.checkpoint import (CheckpointError, content_digest, load_checkpoint,
                                     previous_path, save_checkpoint)


def _obj(step: int) -> dict:
    return {"format": 1, "model": {"w": torch.arange(256, dtype=torch.float32) * step,
                                   "b": torch.tensor(step, dtype=torch.int64)},
            "state": {"step": step, "losses": [0.5, 0.25]}, "rng": {"python": [3, [1, 2], None]}}


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte inside a tensor's storage (the zip CRC no longer matches; torch.load does not
    check it)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    b = bytearray(path.read_bytes())
    b[start + info.file_size // 2] ^= 0xFF
    path.write_bytes(bytes(b))


def test_round_trip_and_digest_is_layout_independent(tmp_path: Path) -> None:
    p = tmp_path / "checkpoint.pt"
    save_checkpoint(_obj(1), p)
    got = load_checkpoint(p)
    assert got["state"] == {"step": 1, "losses": [0.5, 0.25]}
    assert torch.equal(got["model"]["w"], torch.arange(256, dtype=torch.float32))
    assert content_digest(got) == content_digest(_obj(1)) != content_digest(_obj(2))
    assert not previous_path(p).exists()
    save_checkpoint(_obj(2), p)
    assert load_checkpoint(previous_path(p))["state"]["step"] == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, capsys) -> None:
    p = tmp_path / "checkpoint.pt"
    save_checkpoint(_obj(1), p)
    save_checkpoint(_obj(2), p)
    _flip_tensor_byte(p)
    with pytest.raises(CheckpointError, match=f"{p}: corrupt checkpoint: its content does not match"):
        load_checkpoint(p, fallback=False)
    assert load_checkpoint(p)["state"]["step"] == 1
    err = capsys.readouterr().err
    assert f"warning: {p}: corrupt checkpoint" in err and f"using the previous checkpoint {previous_path(p)}" in err
    _flip_tensor_byte(previous_path(p))
    with pytest.raises(CheckpointError, match="the previous checkpoint is unusable too"):
        load_checkpoint(p)


class _Payload:
    def __reduce__(self):  # would run a command if unpickled without weights_only
        return (os.system, ("touch /tmp/ooc-pwned",))


@pytest.mark.parametrize("kind, says", [
    ("empty", "checkpoint is empty (0 bytes)"),
    ("truncated", "not a readable checkpoint: truncated, corrupt or not written by ooc"),
    ("crafted", "holds objects other than tensors and plain values"),
    ("foreign", "not an ooc checkpoint (format 1)"),
    ("text", "not a readable checkpoint"),
])
def test_bad_checkpoints_are_clean_errors(tmp_path: Path, kind: str, says: str) -> None:
    p = tmp_path / "checkpoint.pt"
    save_checkpoint(_obj(1), p)
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "truncated":
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif kind == "crafted":
        torch.save({"format": 1, "x": _Payload()}, p)
    elif kind == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, p)
    else:
        p.write_text("hello")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(p, fallback=False)
    assert str(e.value).startswith(f"{p}: ") and says in str(e.value)
    assert "weights_only=False" not in str(e.value) and "\n" not in str(e.value)
    assert not Path("/tmp/ooc-pwned").exists()


def test_resume_from_a_corrupt_checkpoint(tmp_path: Path, planted_dataset: Path) -> None:
    run = tmp_path / "run"
    args = ["train", str(planted_dataset), "--model", "sage", "--fanout", "5", "--batch-size", "256",
            "--hidden", "8", "--epochs", "2", "--partitions", "4", "--buffer-partitions", "2",
            "--output-dir", str(run), "--no-progress"]
    cli = [sys.executable, "-m", "ooc.tools.cli"]
    r = subprocess.run(cli + args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ck = run / "checkpoint.pt"
    assert previous_path(ck).exists()  # epoch 0's, kept when epoch 1's was written
    _flip_tensor_byte(ck)
    r = subprocess.run(cli + ["train", "--resume", str(run), "--epochs", "3", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"warning: {ck}: corrupt checkpoint" in r.stderr and "using the previous checkpoint" in r.stderr
    os.remove(previous_path(ck))
    _flip_tensor_byte(ck)
    r = subprocess.run(cli + ["train", "--resume", str(run), "--epochs", "4", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{ck}: corrupt checkpoint" in r.stderr


STOP = """
import sys, time
from ooc.util.signals import stop_on_signals, Terminated
try:
    with stop_on_signals(grace_s=float(sys.argv[1])):
        open(sys.argv[2], "w").close()
        if sys.argv[3] == "python":
            time.sleep(60)
        else:  # a long call the main thread cannot leave: only the watchdog can stop it
            import numpy as np
            from numba import njit
            @njit(nogil=True)
            def spin(n):
                s = 0
                for i in range(n):
                    s += i % 7
                return s
            spin(1 << 62)
except Terminated:
    print("terminated cleanly")
    sys.exit(143)
"""


@pytest.mark.parametrize("where", ["python", "native"])
def test_sigterm_stops_promptly(tmp_path: Path, where: str) -> None:
    import time
    marker = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", STOP, "1.0", str(marker), where],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    time.sleep(0.3 if where == "python" else 2.0)  # (numba compiles first)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 143 and time.time() - t0 < 5
    out, err = proc.communicate()
    if where == "python":
        assert "terminated cleanly" in out
    else:
        assert "still busy after 1 s; stopping now" in err


@pytest.mark.parametrize("sig,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, None)])
def test_a_signal_during_the_checkpoint_write_acts_once_it_is_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int, raised: type | None) -> None:
    """A SIGINT inside ``torch.save``'s zip writer made it fail with a RuntimeError ("unexpected
    pos") and a traceback instead of the command's interrupt.  The signal is held until the
    checkpoint is written (here it arrives half-way through ``torch.save``), then raised as its
    handler would (KeyboardInterrupt; Terminated under stop_on_signals): the new checkpoint is
    complete and loads."""
    from ooc.util.signals import Terminated, stop_on_signals
    real_save = torch.save

    def save_with_a_signal(obj: object, f: object) -> None:
        os.kill(os.getpid(), sig)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", save_with_a_signal)
    path = tmp_path / "checkpoint.pt"
    with stop_on_signals():
        with pytest.raises(raised or Terminated):
            save_checkpoint(_obj(7), path)
    monkeypatch.setattr(torch, "save", real_save)
    got = load_checkpoint(path)
    assert got["state"]["step"] == 7 and torch.equal(got["model"]["w"], _obj(7)["model"]["w"])
