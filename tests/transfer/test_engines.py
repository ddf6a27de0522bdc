"""shm and TCP engines against a real server process on 127.0.0.1: exact bytes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from kvstore.errors import BadRequestError, NotFoundError, TooLargeError, UnavailableError
from kvstore.transfer.base import TransferEngine, TransferOp, TransferRequest, raise_first
from kvstore.transfer.serve import pattern
from kvstore.transfer.shm import ShmEngine
from kvstore.transfer.tcp import TcpConfig, TcpEngine
from tests.threads import in_threads

from .conftest import ServerProcess

MiB = 1 << 20
SEED = 7


def _engine(kind: str) -> TransferEngine:
    if kind == "shm":
        return ShmEngine()
    return TcpEngine(TcpConfig(connections=3, chunk_bytes=256 << 10, io_timeout=10))


@pytest.fixture
def server(serve: Callable[..., ServerProcess]) -> ServerProcess:
    return serve(8 * MiB, seed=SEED)


@pytest.mark.parametrize("kind", ["shm", "tcp"])
def test_read_returns_exact_bytes(kind: str, server: ServerProcess) -> None:
    expected = pattern(8 * MiB, SEED)
    local = np.zeros(3 * MiB + 17, dtype=np.uint8)
    with _engine(kind) as engine:
        buf = engine.register("local", local)
        engine.read(server.desc, 1 * MiB + 5, 3 * MiB + 11, buf, local_offset=6, timeout=20)
    assert np.array_equal(local[6:], expected[MiB + 5 : 4 * MiB + 16])
    assert not local[:6].any()


@pytest.mark.parametrize(("writer", "reader"), [("tcp", "shm"), ("shm", "tcp")])
def test_write_is_visible_to_the_other_transport(
    writer: str, reader: str, server: ServerProcess
) -> None:
    data = pattern(2 * MiB + 3, seed=99)
    back = np.zeros_like(data)
    with _engine(writer) as w, _engine(reader) as r:
        w.write(server.desc, 5 * MiB, data.nbytes, w.register("d", data), timeout=20)
        r.read(server.desc, 5 * MiB, data.nbytes, r.register("b", back), timeout=20)
    assert np.array_equal(back, data)
    check = np.zeros(MiB, dtype=np.uint8)  # neighbours untouched
    with _engine(reader) as r:
        r.read(server.desc, 4 * MiB, MiB, r.register("c", check), timeout=20)
    assert np.array_equal(check, pattern(8 * MiB, SEED)[4 * MiB : 5 * MiB])


@pytest.mark.parametrize("kind", ["shm", "tcp"])
def test_batch_of_many_reads_and_writes(kind: str, server: ServerProcess) -> None:
    rng = np.random.default_rng(3)
    expected = pattern(8 * MiB, SEED)
    block = 64 << 10
    remote_blocks = rng.permutation(64)[:48]  # blocks 0..63 of the first 4 MiB
    local = np.zeros(48 * block, dtype=np.uint8)
    with _engine(kind) as engine:
        buf = engine.register("local", local)
        reads = [
            TransferRequest(TransferOp.READ, server.desc, int(b) * block, block, buf, i * block)
            for i, b in enumerate(remote_blocks)
        ]
        assert engine.submit(reads).wait(20) == [None] * 48
        for i, b in enumerate(remote_blocks):
            assert np.array_equal(local[i * block : (i + 1) * block], expected[b * block :][:block])
        writes = [  # copy the 48 blocks to the second half, in reverse order
            TransferRequest(
                TransferOp.WRITE, server.desc, 4 * MiB + i * block, block, buf, (47 - i) * block
            )
            for i in range(48)
        ]
        raise_first(engine.submit(writes).wait(20))
        local[:] = 0
        engine.read(server.desc, 4 * MiB, 48 * block, buf, timeout=20)
    for i, b in enumerate(remote_blocks[::-1]):
        assert np.array_equal(local[i * block : (i + 1) * block], expected[b * block :][:block])


@pytest.mark.parametrize("kind", ["shm", "tcp"])
def test_local_buffer_too_small_fails_before_io(kind: str, server: ServerProcess) -> None:
    with _engine(kind) as engine:
        small = engine.register("small", bytearray(100))
        with pytest.raises(TooLargeError):
            engine.read(server.desc, 0, 101, small)
        with pytest.raises(BadRequestError, match="outside segment"):
            engine.read(server.desc, 8 * MiB - 50, 51, small)


def test_tcp_server_rejects_out_of_range_and_stays_healthy(server: ServerProcess) -> None:
    forged = replace(server.desc, size=1 << 40)  # passes the client-side check
    missing = replace(server.desc, name="no-such-segment")
    local = np.zeros(2 * MiB, dtype=np.uint8)
    with TcpEngine(TcpConfig(connections=1, io_timeout=10)) as engine:
        buf = engine.register("b", local)
        reqs = [
            TransferRequest(TransferOp.READ, forged, 8 * MiB - 10, 11, buf),
            TransferRequest(TransferOp.WRITE, forged, 9 * MiB, 2 * MiB, buf),
            TransferRequest(TransferOp.READ, missing, 0, 10, buf),
            TransferRequest(TransferOp.READ, server.desc, MiB, MiB, buf),
        ]
        results = engine.submit(reqs).wait(20)
        assert isinstance(results[0], BadRequestError) and "outside segment" in str(results[0])
        assert isinstance(results[1], BadRequestError)
        assert isinstance(results[2], NotFoundError)
        assert results[3] is None
    assert np.array_equal(local[:MiB], pattern(8 * MiB, SEED)[MiB : 2 * MiB])


def test_shm_rejects_segments_it_cannot_map(server: ServerProcess) -> None:
    with ShmEngine() as engine:
        buf = engine.register("b", bytearray(10))
        with pytest.raises(BadRequestError, match="not a shared segment"):
            engine.read(replace(server.desc, shm=False), 0, 10, buf)
        with pytest.raises(BadRequestError, match="not a shared segment"):
            engine.read(replace(server.desc, host_id="elsewhere"), 0, 10, buf)
        with pytest.raises(BadRequestError, match="not a shared segment"):
            engine.read(replace(server.desc, shm_socket=""), 0, 10, buf)
        with pytest.raises(NotFoundError):
            engine.read(replace(server.desc, name="kvt-missing-seg"), 0, 10, buf)
        with pytest.raises(UnavailableError):
            engine.read(replace(server.desc, shm_socket="@kvstore-fd-nobody"), 0, 10, buf)


def test_shm_mapping_outlives_a_killed_owner_then_the_segment_is_gone(serve) -> None:
    server = serve(MiB, seed=SEED)
    assert server.desc.shm and server.desc.shm_socket.startswith("@")
    want = pattern(MiB, SEED)
    with ShmEngine() as engine:
        local = np.zeros(4096, dtype=np.uint8)
        buf = engine.register("b", local)
        engine.read(server.desc, 0, 4096, buf)
        server.proc.kill()
        server.proc.wait(10)
        engine.read(server.desc, 8192, 4096, buf)  # our mapping keeps the memory alive
        assert np.array_equal(local, want[8192 : 8192 + 4096])
    with ShmEngine() as engine:  # nobody serves it any more: nothing to map
        buf = engine.register("b", bytearray(10))
        with pytest.raises(UnavailableError):
            engine.read(server.desc, 0, 10, buf)


def test_torch_tensor_as_local_buffer_over_tcp(server: ServerProcess) -> None:
    import torch

    tensor = torch.zeros(1024, dtype=torch.float16)  # 2 KiB
    with _engine("tcp") as engine:
        buf = engine.register("t", tensor)
        engine.read(server.desc, 4096, 2048, buf, timeout=20)
    got = tensor.view(torch.uint8).numpy()
    assert np.array_equal(got, pattern(8 * MiB, SEED)[4096 : 4096 + 2048])


@pytest.mark.parametrize(
    "kwargs", [{"connections": 0}, {"chunk_bytes": 100}, {"depth": 0}, {"io_timeout": 0}]
)
def test_tcp_config_is_validated(kwargs: dict[str, int]) -> None:
    with pytest.raises(BadRequestError):
        TcpConfig(**kwargs)


def test_tcp_small_batches_run_inline_and_concurrent_ones_on_workers(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that fits one window (a single get or put) runs on the caller's thread
    over the peer's inline socket; callers that find it busy go through the workers;
    every byte exact either way (six threads at once), and a refused request on the
    inline socket leaves it usable."""
    import threading

    from kvstore.transfer import tcp

    expected = pattern(8 * MiB, SEED)
    ran_on: list[str] = []
    run = tcp._Connection.run

    def spy(self: tcp._Connection, chunks: list[tcp._Chunk]) -> list[Exception | None]:
        ran_on.append(threading.current_thread().name)
        return run(self, chunks)

    monkeypatch.setattr(tcp._Connection, "run", spy)
    with TcpEngine(TcpConfig(connections=2, io_timeout=10)) as engine:
        local = np.zeros(2 * MiB, dtype=np.uint8)
        buf = engine.register("one", local)
        engine.read(server.desc, 3 * MiB, 2 * MiB, buf, timeout=20)
        assert np.array_equal(local, expected[3 * MiB : 5 * MiB])
        assert ran_on == [threading.current_thread().name]  # inline: no worker hand-off
        forged = replace(server.desc, size=1 << 40)
        bad = engine.submit([TransferRequest(TransferOp.READ, forged, 8 * MiB - 1, 2, buf)])
        assert isinstance(bad.wait(20)[0], BadRequestError)
        engine.read(server.desc, 0, MiB, buf, timeout=20)  # the inline socket still works
        assert np.array_equal(local[:MiB], expected[:MiB])
        ran_on.clear()

        def reader(k: int) -> None:
            mine = np.zeros(512 << 10, dtype=np.uint8)
            b = engine.register(f"r{k}", mine)
            for i in range(12):
                off = ((k * 13 + i * 7) % 15) * (512 << 10)
                engine.read(server.desc, off, mine.nbytes, b, timeout=20)
                assert np.array_equal(mine, expected[off : off + mine.nbytes])

        assert in_threads(reader, 6) == []
        ran_on.clear()
        peer = engine._peers[server.desc.endpoint]
        with peer.inline_lock:  # as if another caller were on the inline socket
            engine.read(server.desc, 2 * MiB, MiB, buf, timeout=20)
        assert ran_on == ["kvstore-tcp-worker"]
        assert np.array_equal(local[:MiB], expected[2 * MiB : 3 * MiB])


@pytest.mark.parametrize("prefault", [False, True])
def test_shm_maps_lazily_unless_asked_to_prefault(prefault: bool, server: ServerProcess) -> None:
    """ShmEngine maps a peer's segment with the background pre-fault of
    kvstore.tiers.prefault by default; without `prefault` (ClientConfig.shm_prefault,
    through make_engine's "auto") lazily, no thread; the bytes are the same."""
    from kvstore.tiers import prefault as pf
    from kvstore.transfer.select import make_engine

    if prefault and not pf.supported():
        pytest.skip("this kernel refuses MADV_POPULATE_WRITE")
    with make_engine("auto", shm_prefault=prefault) as auto:
        local = np.zeros(MiB, dtype=np.uint8)
        auto.read(server.desc, 2 * MiB, MiB, auto.register("b", local), timeout=20)
        shm = auto.engine("shm")  # type: ignore[attr-defined]
        assert isinstance(shm, ShmEngine) and shm.prefault is prefault
        (seg,) = shm._maps.values()
        done = seg.prefaulted
        if prefault:
            assert done is not None and done.wait(30)
        else:
            assert done is None
    assert np.array_equal(local, pattern(8 * MiB, SEED)[2 * MiB : 3 * MiB])
