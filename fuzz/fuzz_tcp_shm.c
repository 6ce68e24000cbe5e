/*
 * fuzz_tcp_shm.c: any bytes as a shared memory slab and the FRAME record
 * that names it (spec/tcp.md TCP-22), read by the acceptor's side.
 *
 * Input: byte 0 picks the record's slot (low 4 bits) and whether the slab
 * is sealed against shrinking (bit 4); bytes 1..3 its generation; bytes
 * 4..7 the frame length the record claims; the rest is the slab's content
 * (at least the header and one frame header's room, zero-padded), written
 * into a memfd of this process, which takes it back with pidfd_getfd as
 * a worker takes a peer's. Properties:
 * - nothing crashes, leaks, reads out of bounds or raises SIGBUS;
 * - an unsealed slab is refused;
 * - a frame handed on lies inside the slab, has the record's length and
 *   passes tp_frame_check_header (its own length the record's);
 * - the same record again, while that frame lives or after it was freed
 *   but before its release was told, is refused (a slot holds one frame
 *   at a time);
 * - a refusal says why.
 * A violated property aborts, which the fuzzer reports as a crash.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/limits.h"
#include "real/tcp_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSG ((uint64_t)1 << 20)

static void check(int ok, const char *what) {
    if (ok)
        return;
    fprintf(stderr, "fuzz_tcp_shm: property violated: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8 || size > (1u << 20))
        return 0;
    uint32_t slot = data[0] & 0x0f, sealed = data[0] & 0x10;
    uint32_t gen = (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16;
    uint32_t len = (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 |
                   (uint32_t)data[7] << 24;
    size_t body = size - 8, cap = TPI_SHM_HEAD + TPI_SHM_ALIGN + TP_FRAME_HEADER_SIZE;
    if (body > cap)
        cap = body;
    int fd = memfd_create("fuzz-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (fd < 0 || pidfd < 0 || ftruncate(fd, (off_t)cap) != 0 ||
        (body && pwrite(fd, data + 8, body, 0) != (ssize_t)body) ||
        (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
        if (fd >= 0)
            close(fd);
        if (pidfd >= 0)
            close(pidfd);
        return 0; /* the machine, not the input */
    }
    tpi_shm_rx *rx = tpi_shm_rx_for_fuzz(pidfd, 1, 0, MAX_MSG);
    check(rx != NULL, "an rx side");
    uint32_t v[3] = {(uint32_t)fd, slot | gen << 8, len};
    char err[TP_ERRMSG_LEN_MAX] = "";
    tp_frame *f = tpi_shm_frame(rx, v, MAX_MSG, err, sizeof err);
    if (f) {
        check(sealed, "only a sealed slab is read");
        check(f->nseg == 1 && f->len == len && f->seg[0].len == len, "the record's length");
        size_t flen = 0;
        char herr[TP_ERRMSG_LEN_MAX];
        check(tp_frame_check_header(f->seg[0].base, MAX_MSG, &flen, herr, sizeof herr) ==
                      TP_OK &&
                  flen == len,
              "a frame handed on passes the header check");
        char err2[TP_ERRMSG_LEN_MAX] = "";
        check(tpi_shm_frame(rx, v, MAX_MSG, err2, sizeof err2) == NULL && err2[0] != '\0',
              "a slot sent again while its frame lives is refused");
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < len; i++) /* every byte is mapped */
            sum ^= ((const uint8_t *)f->seg[0].base)[i];
        (void)sum;
        if (getenv("FUZZ_SHM_VERBOSE")) fprintf(stderr, "handed on %u bytes\n", len);
        tp_frame_free(f);
        check(tpi_shm_frame(rx, v, MAX_MSG, err2, sizeof err2) == NULL,
              "a slot sent again before its release was told is refused");
    } else {
        check(err[0] != '\0', "a refusal says why");
        if (getenv("FUZZ_SHM_VERBOSE")) fprintf(stderr, "refused: %s\n", err);
    }
    tpi_shm_rx_detach(rx); /* closes pidfd */
    close(fd);
    return 0;
}
