"""The reply pipe as the waiting thread reads it: lines in order with the time their bytes arrived, nothing lost
when a read ends inside a line, garbage for an over-long or unterminated line, the end of the pipe (a real pipe,
no process)."""
from __future__ import annotations

import os
import threading
import time

from kevin_exp.bench.worker_process import MAX_REPLY_BYTES, _ReplyPipe


def test_lines_come_in_order_with_the_time_their_last_bytes_arrived():
    r, w = os.pipe()
    pipe = _ReplyPipe(r)
    assert pipe.get(0.01) == _ReplyPipe.EMPTY  # nothing yet: empty, not the end
    os.write(w, b'{"op": "a"}\n{"op": "b"}\n{"op": ')
    before = time.monotonic()
    line, at = pipe.get(1.0)
    assert line == b'{"op": "a"}' and at <= time.monotonic()
    assert pipe.get(0.0)[0] == b'{"op": "b"}'
    assert pipe.get(0.01) == _ReplyPipe.EMPTY  # half a line waits for the rest

    def finish() -> None:
        time.sleep(0.05)
        os.write(w, b'"c"}\n')

    threading.Thread(target=finish).start()
    line, at = pipe.get(2.0)  # the waiting thread wakes when the bytes come
    assert line == b'{"op": "c"}' and at - before >= 0.05
    os.close(w)
    assert pipe.get(1.0) is None and pipe.get(0.0) is None  # the end, and it stays the end
    assert pipe.fd == -1  # closed by the reader at the end, as nobody will read it again


def test_an_over_long_line_and_an_unterminated_tail_are_garbage():
    r, w = os.pipe()
    pipe = _ReplyPipe(r)
    writer = threading.Thread(target=lambda: (os.write(w, b"x" * (MAX_REPLY_BYTES + 10)), os.close(w)))
    writer.start()
    assert _lines(pipe) == [b"\x00"]  # never valid JSON
    writer.join()
    r, w = os.pipe()
    os.write(w, b'{"op": "ok"}\n{"op": "cut')
    os.close(w)
    assert _lines(_ReplyPipe(r)) == [b'{"op": "ok"}', b'{"op": "cut\x00']


def _lines(pipe: _ReplyPipe) -> list[bytes]:
    lines = []
    while True:
        item = pipe.get(2.0)
        if item is None:
            return lines
        if item != _ReplyPipe.EMPTY:
            lines.append(item[0])


def test_closing_while_unread_releases_the_descriptor():
    r, w = os.pipe()
    pipe = _ReplyPipe(r)
    pipe.close()
    pipe.close()  # twice is fine
    assert pipe.get(0.0) is None
    try:
        os.fstat(r)
        assert False, "descriptor still open"
    except OSError:
        pass
    os.close(w)
