#!/usr/bin/env python3
"""Writes the seed corpus (fuzz/corpus/<target>/seed-*): one valid input per
message kind, so the fuzzers start past the first checks. Run again after a
wire format changes; inputs libFuzzer found are added beside these."""
import hashlib
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def b(v):
    return u64(len(v)) + v


def keys(ks):
    return u32(len(ks)) + b"".join(b(k) for k in ks)


def frame(body):
    return u64(len(body)) + body


NOT = 0xFFFFFFFFFFFFFFFF
REQUESTS = {
    "set": bytes([1]) + b(b"k") + b(b"v"),
    "get": bytes([2]) + u64(0) + b(b"k"),
    "add": bytes([3]) + b(b"c") + u64(5),
    "compare_set": bytes([4]) + b(b"k") + b(b"") + b(b"x"),
    "wait": bytes([5]) + u64(0) + keys([b"a", b"b"]),
    "check": bytes([6]) + keys([b"k"]),
    "delete_key": bytes([7]) + b(b"k"),
    "num_keys": bytes([8]),
    "append": bytes([9]) + b(b"k") + b(b"tail"),
    "multi_get": bytes([10]) + u64(0) + keys([b"k", b"c"]),
    "multi_set": bytes([11]) + u32(2) + b(b"a") + b(b"1") + b(b"b") + b(b"2"),
    "list_keys": bytes([12]),
    "queue_push": bytes([13]) + b(b"q") + b(b"e"),
    "queue_pop": bytes([14]) + u64(0) + b(b"q"),
    "queue_len": bytes([15]) + b(b"q"),
    "get_no_timeout": bytes([2]) + u64(NOT) + b(b"missing"),
}
RESPONSES = {
    "done": bytes([0]),
    "value": bytes([1]) + b(b"v"),
    "int": bytes([2]) + u64(7),
    "bool": bytes([3, 1]),
    "count": bytes([4]) + u64(42),
    "values": bytes([5]) + u32(2) + b(b"a") + b(b""),
    "keys": bytes([6]) + u32(1) + b(b"x"),
    "timed_out": bytes([16]),
    "not_a_counter": bytes([17]) + b(b"k") + b(b"abc"),
    "failed": bytes([18]) + b(b"bad"),
}


def hello(token=b"", version=1, flags=1):
    return b"TCMSTORE" + u32(version) + u32(flags) + u32(len(token)) + token


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def main():
    set_k = REQUESTS["set"]
    for name, body in REQUESTS.items():
        write("store_server", name, bytes([0]) + frame(set_k) + frame(body))
        write("store_codec", "request-" + name, bytes([0]) + body)
    everything = b"".join(frame(body) for body in REQUESTS.values())
    write("store_server", "every_request", bytes([0]) + everything)
    write("store_server", "token", bytes([2]) + frame(REQUESTS["num_keys"]))
    write("store_server", "raw_hello", bytes([1]) + hello() + frame(set_k))
    write("store_server", "raw_hello_token", bytes([3]) + hello(b"fuzz-token") + frame(set_k))
    write("store_server", "wrong_version", bytes([1]) + hello(version=9))
    for name, body in RESPONSES.items():
        write("store_codec", "reply-" + name, bytes([1]) + body)

    mesh = 0x123456789ABCDEF0
    # A version-2 hello from rank 2 (connecting side, role 0) of the fuzz
    # target's mesh, without a token and with the target's token "fuzz".
    for name, token in [("hello", None), ("hello_token", b"fuzz")]:
        context = u64(mesh) + u32(4) + u32(2) + bytes([0])
        digest = hashlib.sha256(b"tensorcomm job token tag v1\0")
        if token is None:
            digest.update(bytes([0]))
        else:
            digest.update(bytes([1]) + u64(len(token)) + token)
        digest.update(context)
        has_token = u32(0 if token is None else 1)
        body = b"TCMH" + u32(2) + u64(mesh) + u32(4) + u32(2) + u32(0) + has_token + digest.digest()
        write("transport_frames", name, bytes([0]) + body)
    p2p = b""
    for channel, tag, payload in [(0, 7, b"hello"), (1, 0, b""), (2, 3, b"\x01" * 16)]:
        p2p += b"TCP2" + bytes([channel, 0, 0, 0]) + u64(tag) + u64(len(payload)) + payload
    write("transport_frames", "p2p_messages", bytes([1]) + p2p)

    # kind 1 (all_reduce), SUM, f32 (dtype code 1), root 0, seq 3, 4 elements.
    fp = bytes([1, 1, 1, 0]) + u32(0) + u64(3) + u64(4) + u64(0xABCDEF)
    write("fingerprint", "fingerprint", bytes([0]) + fp)
    head = lambda tag: bytes([1, tag, 1, 0]) + u32(1) + u64(3)
    text = lambda t: struct.pack("<H", len(t)) + t
    write("fingerprint", "report_mismatch", bytes([1]) + head(1) + u32(2) + bytes([0]) + fp + bytes([1]) + text(b"ring"))
    write("fingerprint", "report_closed", bytes([1]) + head(2) + u32(2) + text(b"it closed"))
    write("fingerprint", "report_timeout", bytes([1]) + head(3) + u32(2) + u64(1500))
    write("fingerprint", "report_missing", bytes([1]) + head(4) + u64(1500) + u32(2) + u32(1) + u32(3))

    piece = lambda s: bytes([len(s)]) + s
    write("init_method", "tcp", piece(b"tcp://10.1.2.3:29500?rank=1&world_size=4"))
    write("init_method", "tcp_v6", piece(b"tcp://[::1]:29500/?rank=0&world_size=1&local_rank=0"))
    write("init_method", "file", piece(b"file:///tmp/x?rank=0&world_size=2"))
    env = bytes([0]) + piece(b"node0") + bytes([1]) + piece(b"29500") + bytes([6]) + piece(b"3") + bytes([7]) + piece(b"8") + bytes([8]) + piece(b"1")
    write("init_method", "env", piece(b"env://") + env)

    for i, s in enumerate([b"64K", b" 2m ", b"12", b"1G", b"16M"]):
        write("size", str(i), s)

    # 2-d, sizes [3, 4], 1 dense dim, nnz 2: indices [0, 2], values [2, 4].
    sparse = bytes([2, 3, 4, 1, 2, 0, 2])
    peer = u64(1) + u64(1) + u64(3) + u64(4) + u64(1) + u64(5) * 4
    write("sparse", "matrix", sparse + peer)
    write("sparse", "coords", bytes([3, 5, 5, 5, 0, 3]) + bytes([1, 2, 1, 0, 0, 0, 4, 4, 4]))

    # sparse_all_reduce: world (2 + b % 3), rank, then this rank's tensor as
    # the body reads it (ndim, sizes, dense_dim, nnz, dtype 0 = i64,
    # coordinates), then what the peers send: each peer's metadata (nnz,
    # sparse_dim, sizes), then each peer's entries (coordinates, values).
    own = bytes([2, 3, 4, 1, 2, 0, 0, 2])  # [3, 4], 1 dense dim, rows 0 and 2
    meta = lambda nnz: u64(nnz) + u64(1) + u64(3) + u64(4)
    row = lambda i, v: u64(i) + b"".join(u64(v + k) for k in range(4))
    write("sparse_all_reduce", "two_ranks", bytes([0, 0]) + own + meta(1) + row(2, 10))
    three = meta(2) + meta(0) + u64(1) + u64(2) + b"".join(u64(7) for _ in range(8))
    write("sparse_all_reduce", "three_ranks", bytes([1, 1]) + own + three)
    empty = bytes([2, 0]) + bytes([1, 5, 0, 0, 1]) + (u64(0) + u64(1) + u64(5)) * 3
    write("sparse_all_reduce", "four_ranks_empty", empty)
    # A peer announcing 2^40 entries and vanishing after one coordinate:
    # the rank must fail, not reserve 40 TiB (the bug the smoke run found).
    write("sparse_all_reduce", "announces_2_40", bytes([0, 0]) + own + meta(1 << 40) + u64(2))


if __name__ == "__main__":
    main()
