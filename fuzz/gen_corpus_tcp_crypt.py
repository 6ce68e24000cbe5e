#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tcp_crypt (fuzz/README.md).

Usage: fuzz/gen_corpus_tcp_crypt.py DIR (normally fuzz/corpus/fuzz_tcp_crypt).
Streams for mode 0 are sealed here from spec/tcp.md TCP-21's layout with
Python's `cryptography` (AES-256-GCM) and `hmac`, under the harness's fixed
keys: an implementation of the record format apart from real/tcp_crypt.c,
so the harness opening them cross-checks the key derivation, the nonce and
the associated data. The output is deterministic.
"""
import hashlib
import hmac
import os
import struct
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

JOB_KEY = b"fuzz_tcp_crypt: a fixed job key"[:32].ljust(32, b"\0")
CTX = struct.pack("<III", 2, 1, 3) + b"\x11" * 16 + b"\x22" * 16
D2A = hmac.new(JOB_KEY, b"tp/conn/seal dialer-to-acceptor v1" + CTX, hashlib.sha256).digest()
SEAL_MAX = 16384


def seal(plain, first=0):
    """plain cut into records of at most SEAL_MAX, numbered from first."""
    out, seq = b"", first
    for i in range(0, len(plain), SEAL_MAX):
        p = plain[i:i + SEAL_MAX]
        head = struct.pack("<I", len(p))
        nonce = struct.pack("<Q", seq) + b"\0" * 4
        out += head + AESGCM(D2A).encrypt(nonce, p, head)
        seq += 1
    return out


def ctl(kind, sender=2):
    return b"TPCT" + bytes([3, kind, 0, 0]) + struct.pack("<I", sender) + bytes(12)


WIRE_VERSION = 3  # common/codec.h TPI_WIRE_VERSION


def frame(body_len, typ=1):
    return b"TPRC" + bytes([WIRE_VERSION, typ, 0, 0]) + struct.pack("<I", 24 + body_len) + bytes(12) + \
        bytes((i * 7) & 0xff for i in range(body_len))


def chunk(data=b"", gen_len=None, seed=0, split=0x00):
    if gen_len is not None:
        return struct.pack("<H", 0x8000 | gen_len) + bytes([split, seed])
    return struct.pack("<H", len(data)) + bytes([split]) + data


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {}
    ping = ctl(3)
    # Mode 0: received streams, as sealed by a dialer.
    seeds["raw-ping"] = b"\x00" + seal(ping)
    seeds["raw-sizes"] = b"\x04" + seal(ping) + seal(frame(1), 1) + seal(frame(SEAL_MAX - 24), 2) + \
        seal(b"x" * SEAL_MAX, 3) + seal(bytes(range(256)) * 80, 4)
    seeds["raw-many-small-bytewise"] = b"\x20" + b"".join(seal(ctl(3), i) for i in range(40))
    seeds["raw-large-odd-reads"] = b"\x18" + seal(frame(3 * SEAL_MAX + 7))
    full = seal(ping) + seal(frame(100), 1)
    seeds["raw-truncated"] = b"\x00" + full[:len(full) - 9]
    seeds["raw-oversized"] = b"\x00" + seal(ping) + struct.pack("<I", SEAL_MAX + 1) + bytes(40)
    seeds["raw-zero-length"] = b"\x00" + struct.pack("<I", 0) + bytes(20)
    seeds["raw-huge-length"] = b"\x00" + b"\xff\xff\xff\xff" + bytes(20)
    seeds["raw-plaintext-record"] = b"\x00" + ping  # "TPCT" read as a length
    seeds["raw-wrong-number"] = b"\x00" + seal(ping, 1)
    # Mode 1: chunks the harness seals, then reads back.
    seeds["seal-small"] = b"\x01" + bytes(4) + chunk(ping) + chunk(frame(40)) + chunk(b"a")
    seeds["seal-record-edges"] = b"\x0d" + bytes(4) + chunk(gen_len=SEAL_MAX - 1, seed=1) + \
        chunk(gen_len=SEAL_MAX, seed=2, split=0x88) + chunk(gen_len=SEAL_MAX + 1, seed=3, split=0xf1)
    seeds["seal-large-split"] = b"\x19" + bytes(4) + chunk(gen_len=0x7fff, seed=9, split=0x5a) + \
        chunk(gen_len=0x7fff, seed=10, split=0xa5) + chunk(gen_len=0x7fff, seed=11)
    seeds["seal-empty-chunks"] = b"\x21" + bytes(4) + chunk(b"") + chunk(b"z") + chunk(b"")
    # Mode 2: one byte changed (offset u24, xor).
    body = chunk(ping) + chunk(frame(200)) + chunk(gen_len=20000, seed=5, split=0x33)
    seeds["flip-head"] = b"\x02" + bytes([0, 0, 0, 0x02]) + body
    seeds["flip-body"] = b"\x06" + struct.pack("<I", 50)[:3] + b"\x01" + body
    seeds["flip-tag"] = b"\x0a" + struct.pack("<I", 43)[:3] + b"\x80" + body
    seeds["flip-late"] = b"\x12" + struct.pack("<I", 17000)[:3] + b"\x40" + body
    # Mode 3: records dropped, replayed, swapped, of the other direction, cut.
    many = b"".join(chunk(ctl(3)) for _ in range(6)) + chunk(gen_len=SEAL_MAX * 2, seed=7)
    for op, name in enumerate(["drop", "replay", "swap", "other-direction", "cut"]):
        seeds["records-" + name] = bytes([0x03 | (op << 3)]) + bytes([op, 2, 0, 3]) + many
    for name, data in sorted(seeds.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
