"""The searcher's on-disk spill queue: order, durability across restarts, the bound, the lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.searcher.spill import SpillLockedError, SpillQueue


def test_fifo_order_and_removal(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        q.put(f"group-{i}".encode())
    assert len(q) == 5 and q.nbytes == 5 * len(b"group-0")
    first = q.peek(3)
    assert [e.payload for e in first] == [b"group-0", b"group-1", b"group-2"]
    q.remove(first)
    assert [e.payload for e in q.peek(10)] == [b"group-3", b"group-4"]
    assert len(q) == 2 and q.nbytes == 2 * len(b"group-0")
    q.close()


def test_survives_restart_and_keeps_numbering(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1 << 20)
    for i in range(3):
        q.put(bytes([i]))
    q.remove(q.peek(1))
    q.close()
    (tmp_path / ".tmp-000000000099").write_bytes(b"half-written")  # a crash mid-write
    q2 = SpillQueue(tmp_path, max_bytes=1 << 20)
    assert [e.payload for e in q2.peek(10)] == [bytes([1]), bytes([2])]
    assert not list(tmp_path.glob(".tmp-*"))
    q2.put(b"new")  # goes after the old entries, never overwrites one
    assert [e.payload for e in q2.peek(10)] == [bytes([1]), bytes([2]), b"new"]
    q2.close()


def test_order_holds_beyond_ten_thousand_entries(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1 << 30)
    q._next = 9_998  # numbering crosses a digit boundary: names are zero-padded, order is numeric
    for i in range(4):
        q.put(str(i).encode())
    q.close()
    q2 = SpillQueue(tmp_path, max_bytes=1 << 30)
    assert [e.payload for e in q2.peek(10)] == [b"0", b"1", b"2", b"3"]
    q2.close()


def test_bound_reports_full(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1024)
    q.put(b"x" * 1000)
    assert not q.full()
    q.put(b"x" * 100)
    assert q.full()
    q.remove(q.peek(1))
    assert not q.full()
    q.close()


def test_second_process_cannot_share_the_queue(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1024)
    with pytest.raises(SpillLockedError, match="in use by another searcher"):
        SpillQueue(tmp_path, max_bytes=1024)
    q.close()
    SpillQueue(tmp_path, max_bytes=1024).close()  # free again once released


def test_unreadable_entry_is_quarantined_not_lost(tmp_path: Path) -> None:
    q = SpillQueue(tmp_path, max_bytes=1 << 20)
    q.put(b"a")
    q.put(b"b")
    entries = q.peek(2)
    q.quarantine(entries[0], "test")
    assert [e.payload for e in q.peek(10)] == [b"b"]
    assert (tmp_path / "bad" / entries[0].path.name).read_bytes() == b"a"
    assert q.bad_entries == 1
    q.close()
