/*
 * tcp_records.c: the transport's own 24-byte records, hello and control
 * (spec/tcp.md TCP-3, TCP-5). They share the frame header's size so one
 * buffer reads either; a control record's magic "TPCT" can never start a
 * frame ("TPRC"), so the two are told apart by their first four bytes.
 *
 *  hello:   0 "TPHL"  4 u8 version  5 u8 kind  6 u16 flags (AUTH, ENCRYPT)  8 u32 sender
 *          12 u32 receiver  16 u32 world size  20 u32 0
 *  control: 0 "TPCT"  4 u8 version  5 u8 kind  6 u16 0  8 u32 sender
 *          12..23 zero
 *  auth:    0 "TPAU"  4 u8 version  5 u8 kind  6 u16 0  8..23 payload (TCP-17)
 * Integers little-endian.
 */
#include <string.h>

#include "tcp_internal.h"

void tpi_tcp_put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

uint32_t tpi_tcp_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tpi_tcp_hello_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_hello_kind kind,
                          uint32_t sender, uint32_t receiver, uint32_t world_size,
                          unsigned flags) {
    memset(rec, 0, TPI_TCP_RECORD_SIZE);
    memcpy(rec, TPI_TCP_HELLO_MAGIC, 4);
    rec[4] = TPI_TCP_VERSION;
    rec[5] = (uint8_t)kind;
    rec[6] = (uint8_t)flags;
    rec[7] = (uint8_t)(flags >> 8);
    tpi_tcp_put_u32(rec + 8, sender);
    tpi_tcp_put_u32(rec + 12, receiver);
    tpi_tcp_put_u32(rec + 16, world_size);
}

static int zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int tpi_tcp_hello_check(const uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_hello_kind kind,
                        uint32_t me, uint32_t world_size, unsigned flags, uint32_t *sender,
                        char *errmsg, size_t errmsg_len) {
    if (memcmp(rec, TPI_TCP_HELLO_MAGIC, 4) != 0) {
        tpi_format(errmsg, errmsg_len, "bad hello magic %02x %02x %02x %02x", rec[0], rec[1],
                   rec[2], rec[3]);
        return 0;
    }
    if (rec[4] != TPI_TCP_VERSION) {
        tpi_format(errmsg, errmsg_len, "hello of transport version %u, expected %u", rec[4],
                   TPI_TCP_VERSION);
        return 0;
    }
    if (rec[5] != (uint8_t)kind || !zero(rec + 20, 4)) {
        tpi_format(errmsg, errmsg_len, "hello of kind %u with reserved bytes %s, expected kind %u",
                   rec[5], zero(rec + 20, 4) ? "clear" : "set", kind);
        return 0;
    }
    unsigned got = (unsigned)rec[6] | (unsigned)rec[7] << 8;
    if (got != flags) {
        unsigned diff = got ^ flags;
        const char *why = "";
        if (diff & TPI_TCP_HELLO_AUTH)
            why = flags & TPI_TCP_HELLO_AUTH ? ": the other end does not authenticate"
                                             : ": the other end authenticates, this one has "
                                               "auth=off";
        else if (diff == TPI_TCP_HELLO_ENCRYPT)
            why = flags & TPI_TCP_HELLO_ENCRYPT ? ": the other end has encrypt=off, this one "
                                                  "encrypt=on"
                                                : ": the other end has encrypt=on, this one "
                                                  "encrypt=off";
        tpi_format(errmsg, errmsg_len, "hello with flags %#x, expected %#x%s", got, flags, why);
        return 0;
    }
    uint32_t s = tpi_tcp_get_u32(rec + 8), r = tpi_tcp_get_u32(rec + 12), w = tpi_tcp_get_u32(rec + 16);
    if (w != world_size) {
        tpi_format(errmsg, errmsg_len, "hello from a world of %u workers, this one has %u", w,
                   world_size);
        return 0;
    }
    if (r != me) {
        tpi_format(errmsg, errmsg_len, "hello for worker %u reached worker %u", r, me);
        return 0;
    }
    if (s >= world_size || s == me) {
        tpi_format(errmsg, errmsg_len, "hello from worker id %u, not a peer of worker %u", s, me);
        return 0;
    }
    *sender = s;
    return 1;
}

void tpi_tcp_ctl_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_ctl_kind kind, uint32_t sender) {
    memset(rec, 0, TPI_TCP_RECORD_SIZE);
    memcpy(rec, TPI_TCP_CTL_MAGIC, 4);
    rec[4] = TPI_TCP_VERSION;
    rec[5] = (uint8_t)kind;
    tpi_tcp_put_u32(rec + 8, sender);
}

int tpi_tcp_is_ctl(const uint8_t rec[TPI_TCP_RECORD_SIZE]) {
    return memcmp(rec, TPI_TCP_CTL_MAGIC, 4) == 0;
}

int tpi_tcp_ctl_kind_of(const uint8_t rec[TPI_TCP_RECORD_SIZE]) {
    if (!tpi_tcp_is_ctl(rec) || rec[4] != TPI_TCP_VERSION || !zero(rec + 6, 2) ||
        !zero(rec + 12, 12))
        return 0;
    if (rec[5] < TPI_TCP_CTL_BYE || rec[5] > TPI_TCP_CTL_CLOSE)
        return 0;
    return rec[5];
}

void tpi_tcp_auth_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_auth_kind kind,
                         const uint8_t payload[16]) {
    memset(rec, 0, TPI_TCP_RECORD_SIZE);
    memcpy(rec, TPI_TCP_AUTH_MAGIC, 4);
    rec[4] = TPI_TCP_VERSION;
    rec[5] = (uint8_t)kind;
    memcpy(rec + 8, payload, 16);
}

int tpi_tcp_auth_decode(const uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_auth_kind kind,
                        uint8_t payload[16]) {
    if (memcmp(rec, TPI_TCP_AUTH_MAGIC, 4) != 0 || rec[4] != TPI_TCP_VERSION ||
        rec[5] != (uint8_t)kind || !zero(rec + 6, 2))
        return 0;
    memcpy(payload, rec + 8, 16);
    return 1;
}

void tpi_tcp_shm_encode(uint8_t rec[TPI_TCP_RECORD_SIZE], tpi_tcp_ctl_kind kind, uint32_t sender,
                        uint32_t x, uint32_t y, uint32_t z) {
    TPI_ASSERT(kind >= TPI_TCP_SHM_OFFER && kind <= TPI_TCP_SHM_STREAM);
    tpi_tcp_ctl_encode(rec, kind, sender);
    tpi_tcp_put_u32(rec + 12, x);
    tpi_tcp_put_u32(rec + 16, y);
    tpi_tcp_put_u32(rec + 20, z);
}

int tpi_tcp_shm_decode(const uint8_t rec[TPI_TCP_RECORD_SIZE], uint32_t v[3]) {
    if (!tpi_tcp_is_ctl(rec) || rec[4] != TPI_TCP_VERSION || !zero(rec + 6, 2))
        return 0;
    if (rec[5] < TPI_TCP_SHM_OFFER || rec[5] > TPI_TCP_SHM_STREAM)
        return 0;
    for (int i = 0; i < 3; i++)
        v[i] = tpi_tcp_get_u32(rec + 12 + 4 * i);
    return rec[5];
}
