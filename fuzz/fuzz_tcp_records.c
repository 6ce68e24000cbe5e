/*
 * fuzz_tcp_records.c: any bytes as the TCP transport's own 24-byte records,
 * hello, control and authentication (spec/tcp.md TCP-3, TCP-5, TCP-17).
 *
 * The first 24 bytes (zero-padded) are the record a peer sent. The hello
 * check also needs what the receiver expects (kind, its own id, the world
 * size, the flags): from the 11 bytes after the record when present, else
 * from the record's own fields, so a valid hello alone is accepted. Properties:
 * - nothing crashes, leaks or reads out of bounds (under ASan);
 * - a hello the check accepts names a peer (sender < world size, not the
 *   receiver) and re-encodes from the decoded fields to the same 24 bytes;
 *   a refused one says why and leaves the sender untouched;
 * - tpi_tcp_ctl_kind_of gives 0 or a known kind, and a known kind re-encodes
 *   with the record's sender to the same 24 bytes;
 * - an auth record decodes under at most one kind, and re-encodes from its
 *   payload to the same 24 bytes; a refused one leaves the payload untouched;
 * - tpi_tcp_shm_decode gives 0 or a shared memory kind (TCP-22), and a
 *   known one re-encodes from its sender and fields to the same 24 bytes;
 * - at most one of the four accepts a record, and no record any of them
 *   accepts passes a frame's header check (the magics keep them apart).
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "real/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REC TPI_TCP_RECORD_SIZE

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_tcp_records: property violated: %s\n", what);
    abort();
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Returns 1 when the hello check accepted rec. */
static int hello(const uint8_t rec[REC], const uint8_t *extra, size_t extra_len) {
    tpi_tcp_hello_kind kind;
    uint32_t me, world;
    unsigned flags;
    if (extra_len >= 11) {
        kind = extra[0] & 1 ? TPI_TCP_HELLO_ACCEPT : TPI_TCP_HELLO_OPEN;
        me = get_u32(extra + 1);
        world = get_u32(extra + 5);
        flags = (unsigned)extra[9] | (unsigned)extra[10] << 8;
    } else {
        kind = rec[5] == TPI_TCP_HELLO_ACCEPT ? TPI_TCP_HELLO_ACCEPT : TPI_TCP_HELLO_OPEN;
        me = get_u32(rec + 12);
        world = get_u32(rec + 16);
        flags = (unsigned)rec[6] | (unsigned)rec[7] << 8;
    }
    char err[TP_ERRMSG_LEN_MAX] = "";
    const uint32_t unset = 0xdeadbeef;
    uint32_t sender = unset;
    if (!tpi_tcp_hello_check(rec, kind, me, world, flags, &sender, err, sizeof err)) {
        check(err[0] != '\0', "a refused hello says why");
        check(sender == unset, "a refused hello leaves the sender untouched");
        return 0;
    }
    check(sender < world && sender != me, "an accepted hello names a peer");
    uint8_t again[REC];
    tpi_tcp_hello_encode(again, kind, sender, me, world, flags);
    check(memcmp(again, rec, REC) == 0, "an accepted hello re-encodes to the same bytes");
    return 1;
}

static int control(const uint8_t rec[REC]) {
    int kind = tpi_tcp_ctl_kind_of(rec);
    check(kind == 0 || (kind >= TPI_TCP_CTL_BYE && kind <= TPI_TCP_CTL_CLOSE),
          "a control record's kind is 0 or known");
    check(!kind || tpi_tcp_is_ctl(rec), "a control record has the control magic");
    if (!kind)
        return 0;
    uint8_t again[REC];
    tpi_tcp_ctl_encode(again, (tpi_tcp_ctl_kind)kind, get_u32(rec + 8));
    check(memcmp(again, rec, REC) == 0, "a control record re-encodes to the same bytes");
    check(tpi_tcp_ctl_kind_of(again) == kind, "encode then kind_of is the kind");
    return 1;
}

static int shm(const uint8_t rec[REC]) {
    uint32_t v[3] = {0, 0, 0};
    int kind = tpi_tcp_shm_decode(rec, v);
    check(kind == 0 || (kind >= TPI_TCP_SHM_OFFER && kind <= TPI_TCP_SHM_STREAM),
          "a shared memory record's kind is 0 or known");
    if (!kind)
        return 0;
    uint8_t again[REC];
    tpi_tcp_shm_encode(again, (tpi_tcp_ctl_kind)kind, get_u32(rec + 8), v[0], v[1], v[2]);
    check(memcmp(again, rec, REC) == 0, "a shared memory record re-encodes to the same bytes");
    return 1;
}

static int auth(const uint8_t rec[REC]) {
    static const tpi_tcp_auth_kind kinds[] = {TPI_TCP_AUTH_NONCE, TPI_TCP_AUTH_PROOF};
    int accepted = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        uint8_t payload[16];
        memset(payload, 0xa5, sizeof payload);
        if (!tpi_tcp_auth_decode(rec, kinds[i], payload)) {
            for (size_t j = 0; j < sizeof payload; j++)
                check(payload[j] == 0xa5, "a refused auth record leaves the payload untouched");
            continue;
        }
        accepted++;
        uint8_t again[REC];
        tpi_tcp_auth_encode(again, kinds[i], payload);
        check(memcmp(again, rec, REC) == 0, "an auth record re-encodes to the same bytes");
    }
    check(accepted <= 1, "an auth record decodes under one kind at most");
    return accepted;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t rec[REC] = {0};
    memcpy(rec, data, size < REC ? size : REC);
    const uint8_t *extra = size > REC ? data + REC : NULL;
    size_t extra_len = size > REC ? size - REC : 0;

    int taken = hello(rec, extra, extra_len) + control(rec) + shm(rec) + auth(rec);
    check(taken <= 1, "a record is a hello, a control, a shared memory or an auth record, "
                      "not two");
    if (taken) {
        char err[TP_ERRMSG_LEN_MAX];
        size_t len = 0;
        check(tp_frame_check_header(rec, TPI_MESSAGE_SIZE_MAX, &len, err, sizeof err) != TP_OK,
              "a transport record never passes as a frame header");
    }
    return 0;
}
