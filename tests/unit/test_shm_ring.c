/*
 * test_shm_ring.c: the shared-memory ring (real/shm_ring.c, spec/tcp.md
 * TCP-26). One process: records in and out, wrap-around through pad
 * records, full, too big, empty, closed, a randomized run against a FIFO
 * model; headers the reader refuses; a hostile writer (bytes scribbled over
 * the counters and records, between reads and while the reader reads) that
 * never crashes or holds the reader; a hostile reader the writer survives.
 * Two processes over a sealed memfd: 1,000,000 records of random lengths
 * checked by content and order, with no spin and with 50 us of spin; a
 * reader whose writer died returns at its deadline and finds the death
 * through a pidfd within one wait.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "real/shm_ring.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define MS 1000000ull

/* ---- Helpers ----------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The bytes of record i (any length): both processes make them alike. */
static void fill(uint8_t *p, size_t len, uint64_t i) {
    uint64_t s = i * 0x2545f4914f6cdd1dull + 7;
    for (size_t k = 0; k < len; k += 8) {
        uint64_t v = splitmix(&s);
        memcpy(p + k, &v, len - k < 8 ? len - k : 8);
    }
}

/* Record i's length: mostly small (the frames a ring is for), one in
 * sixteen up to 8 KiB. */
static size_t len_of(uint64_t i) {
    uint64_t s = i ^ 0xabcdef12345ull, v = splitmix(&s);
    return v % 16 == 0 ? (size_t)((v >> 8) % 8193) : (size_t)((v >> 8) % 257);
}

typedef struct mem {
    uint8_t *p;
    size_t size;
} mem;

/* A private buffer of exactly size bytes, aligned for a ring. */
static mem mem_new(size_t size) {
    mem m = {NULL, size};
    void *p = NULL;
    /* posix_memalign: any size, unlike aligned_alloc */
    assert_int_equal(posix_memalign(&p, TPI_RING_LINE, size), 0);
    m.p = p;
    memset(m.p, 0, size);
    return m;
}

/* A sealed memfd of size bytes mapped shared, as TCP-22's slabs: the
 * mapping survives fork into the other process. */
static mem mem_shared(size_t size) {
    int fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    close(fd);
    mem m = {p, size};
    return m;
}

/* A child's pidfd; -1 only where pidfd_open is missing (valgrind 3.19
 * does not know it). */
static int child_pidfd(pid_t pid) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    assert_true(fd >= 0 || errno == ENOSYS);
    return fd;
}

/* Whether child pid has exited: its pidfd, as the transport will ask, or
 * without one the child's exit seen and left unreaped. */
static int child_gone(pid_t pid, int pidfd) {
    if (pidfd >= 0)
        return tpi_ring_peer_gone(pidfd);
    siginfo_t si;
    memset(&si, 0, sizeof si);
    return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

static tpi_ring_status put(tpi_ring *w, const void *p, size_t len) {
    struct iovec v = {(void *)p, len};
    return w->writer ? tpi_ring_write(w, &v, 1) : TPI_RING_CORRUPT;
}

static void pair(mem m, tpi_ring *w, tpi_ring *r) {
    char err[200];
    assert_int_equal(tpi_ring_init(w, m.p, m.size, err, sizeof err), 0);
    assert_int_equal(tpi_ring_attach(r, m.p, m.size, err, sizeof err), 0);
    assert_int_equal(w->cap, r->cap);
}

/* ---- One process ------------------------------------------------------------------- */

static void test_write_read_basic(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 4096 + 100); /* the capacity rounds down to 4096 */
    tpi_ring w, r;
    pair(m, &w, &r);
    assert_int_equal(w.cap, 4096);
    uint8_t buf[4096];
    size_t len = 99;
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_EMPTY);
    assert_int_equal(len, 99);
    assert_int_equal(put(&w, "hello", 5), TPI_RING_OK);
    assert_int_equal(put(&w, "", 0), TPI_RING_OK); /* an empty record is a record */
    struct iovec v[3] = {{"ab", 2}, {NULL, 0}, {"cdefghijk", 9}};
    assert_int_equal(tpi_ring_write(&w, v, 3), TPI_RING_OK);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_int_equal(len, 0);
    /* A buffer too small: the length, and the record stays. */
    assert_int_equal(tpi_ring_read(&r, buf, 10, &len), TPI_RING_TOOBIG);
    assert_int_equal(len, 11);
    assert_int_equal(tpi_ring_read(&r, buf, 11, &len), TPI_RING_OK);
    assert_int_equal(len, 11);
    assert_memory_equal(buf, "abcdefghijk", 11);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_EMPTY);
    assert_string_equal(tpi_ring_why(&r), "");
    /* Head and tail meet, 8-byte steps: 8+8, 8+0, 8+16. */
    assert_int_equal(r.pos, 48);
    assert_int_equal(w.pos, 48);
    free(m.p);
}

/* A reader attached later (another thread or process taking the reading
 * end over) starts at the shared head: what the first reader consumed is
 * not read again, and both ends' counters agree. */
static void test_reader_attached_later_starts_at_the_head(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 4096);
    tpi_ring w, r1, r2;
    pair(m, &w, &r1);
    for (int i = 0; i < 3; i++) {
        char rec[8];
        snprintf(rec, sizeof rec, "rec%d", i);
        assert_int_equal(put(&w, rec, strlen(rec)), TPI_RING_OK);
    }
    uint8_t buf[64];
    size_t len = 0;
    assert_int_equal(tpi_ring_read(&r1, buf, sizeof buf, &len), TPI_RING_OK);
    assert_true(len == 4 && memcmp(buf, "rec0", 4) == 0);
    char err[200];
    memset(&r2, 0xa5, sizeof r2); /* whatever the memory held */
    assert_int_equal(tpi_ring_attach(&r2, m.p, m.size, err, sizeof err), 0);
    assert_int_equal(r2.pos, r1.pos);
    assert_int_equal(tpi_ring_read(&r2, buf, sizeof buf, &len), TPI_RING_OK);
    assert_true(len == 4 && memcmp(buf, "rec1", 4) == 0);
    assert_int_equal(tpi_ring_read(&r2, buf, sizeof buf, &len), TPI_RING_OK);
    assert_true(len == 4 && memcmp(buf, "rec2", 4) == 0);
    assert_int_equal(tpi_ring_read(&r2, buf, sizeof buf, &len), TPI_RING_EMPTY);
    assert_int_equal(r2.pos, w.pos);
    free(m.p);
}

static void test_too_big_and_full(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint64_t max = TPI_RING_RECORD_MAX(w.cap);
    assert_int_equal(max, 504);
    static uint8_t big[2048], buf[2048];
    fill(big, sizeof big, 1);
    assert_int_equal(put(&w, big, max + 1), TPI_RING_TOOBIG);
    struct iovec v[2] = {{big, max}, {big, 1}}; /* too big in sum only */
    assert_int_equal(tpi_ring_write(&w, v, 2), TPI_RING_TOOBIG);
    assert_int_equal(w.pos, 0);
    /* The largest record fits an empty ring at every position. */
    size_t len;
    for (int k = 0; k < 300; k++) {
        assert_int_equal(put(&w, big, max), TPI_RING_OK);
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
        assert_int_equal(len, max);
        assert_memory_equal(buf, big, max);
        assert_int_equal(put(&w, big, (size_t)k % 24), TPI_RING_OK); /* move the position */
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
        assert_int_equal(len, (size_t)k % 24);
    }
    /* Fill with 120-byte records (128 each): 8 of them fill 1024. */
    while (r.pos % 1024) {
        assert_int_equal(put(&w, big, 0), TPI_RING_OK);
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    }
    for (int k = 0; k < 8; k++)
        assert_int_equal(put(&w, big + k, 120), TPI_RING_OK);
    assert_int_equal(put(&w, big, 0), TPI_RING_FULL);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_memory_equal(buf, big, 120);
    assert_int_equal(put(&w, big, 121), TPI_RING_FULL); /* 136 > 128 free */
    assert_int_equal(put(&w, big + 8, 120), TPI_RING_OK);
    for (int k = 1; k < 9; k++) {
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
        assert_int_equal(len, 120);
        assert_memory_equal(buf, big + k, 120);
    }
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_EMPTY);
    free(m.p);
}

static void test_wrap_pad_record(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint8_t a[600], buf[600];
    fill(a, sizeof a, 2);
    size_t len;
    /* 3 x 304 = 912: the next 304 does not fit in the 112 left, so a pad
     * of 112 goes first and the record starts at 0; it needs the reader to
     * have freed 304 + 112 - 112 = the first record's room. */
    for (int k = 0; k < 3; k++)
        assert_int_equal(put(&w, a, 296), TPI_RING_OK);
    assert_int_equal(put(&w, a + 1, 296), TPI_RING_FULL);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_int_equal(put(&w, a + 1, 296), TPI_RING_OK);
    assert_int_equal(w.pos, 912 + 112 + 304);
    uint32_t pad_len, kind;
    memcpy(&pad_len, w.data + 912, 4);
    memcpy(&kind, w.data + 916, 4);
    assert_int_equal(kind, TPI_RING_KIND_PAD);
    assert_int_equal(pad_len, 104);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
        assert_memory_equal(buf, a, 296);
    }
    /* The pad and the record after it go in one read. */
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_int_equal(len, 296);
    assert_memory_equal(buf, a + 1, 296);
    assert_int_equal(r.pos, w.pos);
    /* A record ending exactly at the end needs no pad. */
    mem m2 = mem_new(TPI_RING_HEAD + 1024);
    pair(m2, &w, &r);
    assert_int_equal(put(&w, a, 504), TPI_RING_OK);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    assert_int_equal(put(&w, a, 504), TPI_RING_OK);
    assert_int_equal(w.pos, 1024);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
    free(m.p);
    free(m2.p);
}

typedef struct cb_got {
    uint8_t buf[8192];
    size_t len;
    int calls;
} cb_got;

static void got_cb(void *ctx, const uint8_t *p, size_t len) {
    cb_got *g = ctx;
    assert_true(len <= sizeof g->buf);
    memcpy(g->buf, p, len);
    g->len = len;
    g->calls++;
}

/* Random writes and reads (both read calls) on rings of every size class,
 * checked against a FIFO of record numbers. */
static void test_randomized_model(void **state) {
    (void)state;
    uint64_t rs = 42;
    for (int round = 0; round < 40; round++) {
        size_t cap = (size_t)TPI_RING_CAP_MIN << (round % 4);
        mem m = mem_new(TPI_RING_HEAD + cap);
        tpi_ring w, r;
        pair(m, &w, &r);
        uint64_t max = TPI_RING_RECORD_MAX(cap), written = 0, readn = 0;
        static uint8_t in[8192], exp[8192];
        size_t lens[4096];
        int pads = 0;
        for (int op = 0; op < 5000; op++) {
            uint64_t v = splitmix(&rs);
            if (v % 3 != 0) {
                size_t len = (size_t)((v >> 8) % (max + 1));
                if (v % 7 == 0)
                    len = (size_t)((v >> 8) % 17);
                fill(in, len, written);
                struct iovec iov[2] = {{in, len / 3}, {in + len / 3, len - len / 3}};
                uint64_t before = w.pos;
                tpi_ring_status st = tpi_ring_write(&w, iov, 2);
                uint64_t used = written == readn ? 0 : w.pos - r.pos;
                if (st == TPI_RING_OK) {
                    lens[written++ % 4096] = len;
                    pads += (w.pos - before) != 8 + ((len + 7) & ~(size_t)7);
                } else {
                    assert_int_equal(st, TPI_RING_FULL);
                    assert_true(used > 0); /* an empty ring takes any record up to max */
                }
                assert_true(written - readn <= 4096);
            } else {
                size_t len = 0;
                tpi_ring_status st;
                cb_got g = {.calls = 0};
                if (v % 2)
                    st = tpi_ring_read(&r, g.buf, sizeof g.buf, &len);
                else if ((st = tpi_ring_read_cb(&r, got_cb, &g)) == TPI_RING_OK)
                    len = g.len, assert_int_equal(g.calls, 1);
                if (readn == written) {
                    assert_int_equal(st, TPI_RING_EMPTY);
                    continue;
                }
                assert_int_equal(st, TPI_RING_OK);
                assert_int_equal(len, lens[readn % 4096]);
                fill(exp, len, readn);
                assert_memory_equal(g.buf, exp, len);
                readn++;
            }
        }
        assert_true(pads > 0);
        assert_string_equal(tpi_ring_why(&r), "");
        free(m.p);
    }
}

static void test_close_both_ways(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint8_t buf[64];
    size_t len;
    assert_int_equal(put(&w, "x", 1), TPI_RING_OK);
    tpi_ring_close(&w);
    assert_int_equal(tpi_ring_wait(&r, 0, tpi_ring_now_ns()), TPI_RING_OK);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK); /* written before */
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_CLOSED);
    /* at once: */
    assert_int_equal(tpi_ring_wait(&r, 0, tpi_ring_now_ns() + 1000 * MS), TPI_RING_OK);
    tpi_ring_close(&r);
    assert_int_equal(put(&w, "y", 1), TPI_RING_CLOSED);
    free(m.p);
}

static void test_init_refusals(void **state) {
    (void)state;
    char err[200];
    tpi_ring w;
    mem m = mem_new(TPI_RING_HEAD + 2048);
    assert_int_equal(tpi_ring_init(&w, m.p, TPI_RING_HEAD + 1023, err, sizeof err), -1);
    assert_non_null(strstr(err, "at least"));
    assert_int_equal(tpi_ring_init(&w, m.p + 8, TPI_RING_HEAD + 1024, err, sizeof err), -1);
    assert_non_null(strstr(err, "aligned"));
    assert_int_equal(tpi_ring_init(&w, m.p, m.size, err, sizeof err), 0);
    assert_int_equal(w.cap, 2048);
    free(m.p);
}

/* A header changed in one field is refused, with why. */
static void test_attach_refuses_bad_header(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 4096);
    char err[300];
    struct {
        size_t at, width;
        uint64_t value;
        const char *why;
    } cases[] = {
        {0, 1, 'X', "bad magic"},
        {7, 1, 0, "bad magic"},
        {8, 4, 2, "another version"},
        {12, 4, 256, "another header size"},
        {16, 8, 4095, "not a power of two"},
        {16, 8, 512, "not a power of two"},
        {16, 8, (uint64_t)1 << 32, "not a power of two"},
        {16, 8, 8192, "past the mapping's end"},
        {16, 8, (uint64_t)1 << 63, "not a power of two"},
        {40, 1, 1, "reserved bytes set"},
        {127, 1, 1, "reserved bytes set"},
        {400, 1, 1, "reserved bytes set"},
        {256, 8, 12, "multiple of 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpi_ring w, r;
        assert_int_equal(tpi_ring_init(&w, m.p, m.size, err, sizeof err), 0);
        assert_int_equal(tpi_ring_attach(&r, m.p, m.size, err, sizeof err), 0);
        memcpy(m.p + cases[i].at, &cases[i].value, cases[i].width);
        err[0] = '\0';
        assert_int_equal(tpi_ring_attach(&r, m.p, m.size, err, sizeof err), -1);
        if (!strstr(err, cases[i].why) || !strstr(err, "refused"))
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].why);
    }
    /* All zero (a mapping nobody formatted), too small, misaligned. */
    memset(m.p, 0, m.size);
    tpi_ring r;
    assert_int_equal(tpi_ring_attach(&r, m.p, m.size, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad magic"));
    assert_int_equal(tpi_ring_attach(&r, m.p, 600, err, sizeof err), -1);
    assert_int_equal(tpi_ring_attach(&r, m.p + 64, 2048, err, sizeof err), -1);
    free(m.p);
}

/* The largest ring: a mapping of 4 GiB and more gets TPI_RING_CAP_MAX,
 * and a reader attaches to a ring of exactly that capacity. Only the
 * header is touched, so a 4 KiB buffer stands for the mapping. */
static void test_capacity_at_the_most(void **state) {
    (void)state;
    mem m = mem_new(4096);
    char err[200];
    tpi_ring w, r;
    assert_int_equal(tpi_ring_init(&w, m.p, TPI_RING_HEAD + ((size_t)1 << 32), err, sizeof err), 0);
    assert_true(w.cap == TPI_RING_CAP_MAX);
    assert_int_equal(tpi_ring_attach(&r, m.p, TPI_RING_HEAD + TPI_RING_CAP_MAX, err, sizeof err),
                     0);
    assert_true(r.cap == TPI_RING_CAP_MAX);
    free(m.p);
}

/* A mapping too small, or misaligned, is refused for that, before its
 * header is read (a mapping of 600 bytes has no room for a ring). */
static void test_attach_small_or_misaligned(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 4096);
    char err[300];
    tpi_ring w, r;
    assert_int_equal(tpi_ring_init(&w, m.p, m.size, err, sizeof err), 0);
    assert_int_equal(tpi_ring_attach(&r, m.p, 600, err, sizeof err), -1);
    assert_non_null(strstr(err, "a mapping of 600 bytes"));
    assert_int_equal(tpi_ring_attach(&r, m.p + 64, 2048, err, sizeof err), -1);
    assert_non_null(strstr(err, "a mapping of 2048 bytes"));
    free(m.p);
}

/* The reader's bounds on a record, each alone: a record claiming more than
 * is published (alone, and after a pad), a pad of the wrong length. Each is
 * CORRUPT, never a read past the tail. The wrap is test_wrap_pad_record's:
 * at 912 a pad of 112 (length 104), then a record of 296 at 0, 416 bytes
 * published past the reader. */
static void test_reader_record_bounds_each(void **state) {
    (void)state;
    uint8_t in[296], buf[2048];
    size_t len;
    memset(in, 7, sizeof in);
    for (int c = 0; c < 3; c++) {
        mem m = mem_new(TPI_RING_HEAD + 1024);
        tpi_ring w, r;
        pair(m, &w, &r);
        uint32_t bad;
        if (c == 0) { /* one 16-byte record, its length made 100 */
            assert_int_equal(put(&w, in, 16), TPI_RING_OK);
            bad = 100;
            memcpy(w.data, &bad, 4);
        } else {
            for (int k = 0; k < 3; k++)
                assert_int_equal(put(&w, in, 296), TPI_RING_OK);
            assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
            assert_int_equal(put(&w, in, 296), TPI_RING_OK); /* the pad, then at 0 */
            for (int k = 0; k < 2; k++)
                assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_OK);
            assert_int_equal(w.pos - r.pos, 416);
            if (c == 1) { /* the record after the pad: 400 bytes, past the 304 published */
                bad = 400;
                memcpy(w.data, &bad, 4);
            } else { /* the pad: 103 bytes, not the 104 to the end */
                bad = 103;
                memcpy(w.data + 912, &bad, 4);
            }
        }
        assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_CORRUPT);
        free(m.p);
    }
}

/* A sleeping reader is woken when the writer closes (and the other way):
 * it does not sleep to its deadline. */
typedef struct waker {
    tpi_ring *r;
    uint64_t woke_at;
    tpi_ring_status st;
} waker;

static void *closed_reader_thread(void *p) {
    waker *k = p;
    k->st = tpi_ring_wait(k->r, 0, tpi_ring_now_ns() + 5000 * MS);
    k->woke_at = tpi_ring_now_ns();
    return NULL;
}

static void test_close_wakes_a_sleeper(void **state) {
    (void)state;
    for (int side = 0; side < 2; side++) {
        mem m = mem_new(TPI_RING_HEAD + 1024);
        tpi_ring w, r;
        pair(m, &w, &r);
        uint8_t fill_[504] = {0};
        if (side == 1) /* a writer that waits for room */
            for (int k = 0; k < 2; k++)
                assert_int_equal(put(&w, fill_, sizeof fill_), TPI_RING_OK);
        waker k = {side == 0 ? &r : &w, 0, TPI_RING_TIMEOUT};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, closed_reader_thread, &k), 0);
        usleep(50000); /* asleep by now */
        uint64_t sent = tpi_ring_now_ns();
        tpi_ring_close(side == 0 ? &w : &r);
        pthread_join(t, NULL);
        assert_int_equal(k.st, TPI_RING_OK);
        assert_true(k.woke_at - sent < 1000 * MS);
        free(m.p);
    }
}

/* CPU a thread used, in ns. */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A wait with nothing coming sleeps: 200 ms of waiting costs a few ms of
 * CPU at most, with no spin and with a spin asked far past
 * TPI_RING_SPIN_NS_MAX (1 ms). Its sleep flag is down again after it, so a
 * write then costs the writer no wake-up: the futex word stays as it was. */
static void test_wait_sleeps_and_lowers_its_flag(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint64_t spins[2] = {0, 10000 * MS};
    for (int i = 0; i < 2; i++) {
        uint64_t c0 = thread_cpu_ns();
        assert_int_equal(tpi_ring_wait(&r, spins[i], tpi_ring_now_ns() + 200 * MS),
                         TPI_RING_TIMEOUT);
        uint64_t used = thread_cpu_ns() - c0;
        if (used > 50 * MS)
            fail_msg("a 200 ms wait (spin %llu ns) used %.1f ms of CPU",
                     (unsigned long long)spins[i], used / 1e6);
    }
    uint32_t reader_sleeps, data_seq_before, data_seq_after;
    memcpy(&reader_sleeps, m.p + 2 * TPI_RING_LINE + 12, 4);
    assert_int_equal(reader_sleeps, 0);
    memcpy(&data_seq_before, m.p + TPI_RING_LINE + 8, 4);
    assert_int_equal(put(&w, "x", 1), TPI_RING_OK);
    memcpy(&data_seq_after, m.p + TPI_RING_LINE + 8, 4);
    assert_int_equal(data_seq_after, data_seq_before); /* nobody asleep: no wake-up */
    free(m.p);
}

/* peer_gone looks once, whatever errno held before: a live process is not
 * gone (it does not loop on an EINTR it did not get). */
static void test_peer_gone_of_a_live_process(void **state) {
    (void)state;
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) {
        skip(); /* valgrind 3.19 does not know pidfd_open */
        return;
    }
    errno = EINTR;
    assert_int_equal(tpi_ring_peer_gone(pidfd), 0);
    close(pidfd);
}

/* ---- A hostile peer ----------------------------------------------------------------- */

/* Writes random records, then scribbles over the writer's line and the
 * data: random bytes anywhere, or a chosen counter or record header set to
 * a random or edge value. The reader then reads until it stops: it must
 * stop (each OK consumes at least 8 of at most cap published bytes), stay
 * in bounds (the buffer is exact: ASan sees a stray byte), and once
 * CORRUPT say why and stay so. */
static void test_hostile_writer_scribbles(void **state) {
    (void)state;
    uint64_t rs = 7;
    static const uint64_t edges[] = {
        0,          1,
        7,          8,
        1016,       1024,
        1025,       4096,
        UINT32_MAX, (uint64_t)UINT32_MAX + 1,
        UINT64_MAX, UINT64_MAX - 7,
    };
    int corrupt_seen = 0, ok_seen = 0;
    for (int round = 0; round < 20000; round++) {
        size_t cap = (size_t)TPI_RING_CAP_MIN << (round % 3);
        mem m = mem_new(TPI_RING_HEAD + cap);
        tpi_ring w, r;
        pair(m, &w, &r);
        static uint8_t in[4096], buf[4096];
        size_t len;
        int nw = (int)(splitmix(&rs) % 12);
        for (int k = 0; k < nw; k++) {
            size_t l = (size_t)(splitmix(&rs) % (TPI_RING_RECORD_MAX(cap) + 1));
            if (put(&w, in, l) != TPI_RING_OK)
                break;
        }
        for (int k = 0; k < (int)(splitmix(&rs) % 3); k++) /* some read before */
            (void)tpi_ring_read(&r, buf, sizeof buf, &len);
        int ns = 1 + (int)(splitmix(&rs) % 4);
        for (int k = 0; k < ns; k++) {
            uint64_t v = splitmix(&rs), x = v % 4 == 0 ? edges[(v >> 8) % 12] : splitmix(&rs);
            switch ((v >> 4) % 5) {
            case 0: /* the tail */
                memcpy(m.p + TPI_RING_LINE, &x, 8);
                break;
            case 1: /* a record header's length or kind, at an 8-byte boundary */
                memcpy(m.p + TPI_RING_HEAD + (x >> 20) % (cap / 8) * 8 + ((v >> 12) & 4), &x, 4);
                break;
            case 2: /* the closed flag, the futex words */
                memcpy(m.p + TPI_RING_LINE + 8 + (v >> 12) % 3 * 4, &x, 4);
                break;
            case 3: /* line 0, our counter's line: the reader never reads them again */
                memcpy(m.p + (v >> 12) % 2 * 2 * TPI_RING_LINE + (x % 120), &x, 8);
                break;
            default: /* any byte of the data */
                m.p[TPI_RING_HEAD + x % cap] = (uint8_t)(x >> 32);
            }
        }
        int reads = 0;
        tpi_ring_status st;
        while ((st = tpi_ring_read(&r, buf, (round % 5 == 0) ? 64 : sizeof buf, &len)) ==
               TPI_RING_OK) {
            assert_true(len <= TPI_RING_RECORD_MAX(cap));
            assert_true(++reads <= (int)(cap / 8));
            ok_seen++;
        }
        if (st == TPI_RING_TOOBIG)
            assert_true(len <= TPI_RING_RECORD_MAX(cap) && len > 64);
        if (st == TPI_RING_CORRUPT) {
            corrupt_seen++;
            assert_true(strlen(tpi_ring_why(&r)) > 0);
            assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_CORRUPT);
            assert_int_equal(tpi_ring_wait(&r, 0, tpi_ring_now_ns() + 1000 * MS), TPI_RING_OK);
        } else {
            assert_true(st == TPI_RING_EMPTY || st == TPI_RING_CLOSED || st == TPI_RING_TOOBIG);
            /* a wait returns at once or at its deadline */
            uint64_t t0 = tpi_ring_now_ns();
            st = tpi_ring_wait(&r, 1000, t0 + MS / 10);
            assert_true(st == TPI_RING_OK || st == TPI_RING_TIMEOUT);
            assert_true(tpi_ring_now_ns() - t0 < 1000 * MS);
        }
        free(m.p);
    }
    assert_true(corrupt_seen > 1000);
    assert_true(ok_seen > 1000);
}

/* The reader's line scribbled: the writer says CORRUPT, FULL or OK, never
 * writes outside the data (the buffer is exact). */
static void test_hostile_reader_scribbles(void **state) {
    (void)state;
    uint64_t rs = 9;
    int corrupt_seen = 0;
    for (int round = 0; round < 5000; round++) {
        mem m = mem_new(TPI_RING_HEAD + 1024);
        tpi_ring w, r;
        pair(m, &w, &r);
        static uint8_t in[600];
        for (int k = 0; k < 20; k++) {
            uint64_t x = splitmix(&rs);
            if (k % 4 == 1)
                memcpy(m.p + 2 * TPI_RING_LINE, &x, 8); /* head */
            tpi_ring_status st = put(&w, in, (size_t)(x % 505));
            assert_true(st == TPI_RING_OK || st == TPI_RING_FULL || st == TPI_RING_CORRUPT ||
                        st == TPI_RING_CLOSED);
            if (st == TPI_RING_CORRUPT) {
                corrupt_seen++;
                assert_int_equal(put(&w, in, 0), TPI_RING_CORRUPT);
                break;
            }
        }
        free(m.p);
    }
    assert_true(corrupt_seen > 1000);
}

/* The reader's head, each check alone: one that claims less than the ring
 * is unread but is not on a record boundary (a multiple of
 * TPI_RING_ALIGN) is as impossible as one further behind than the ring is
 * long; both are refused (CORRUPT, and for good). */
static void test_reader_head_checked_alone(void **state) {
    (void)state;
    static uint8_t in[16];
    for (int c = 0; c < 2; c++) {
        mem m = mem_new(TPI_RING_HEAD + 1024);
        tpi_ring w, r;
        pair(m, &w, &r);
        assert_int_equal(put(&w, in, sizeof in), TPI_RING_OK); /* the tail is 24 bytes on */
        uint64_t head = c == 0 ? 20 : (uint64_t)0 - 1024; /* 4 behind, odd; 1,048 behind */
        memcpy(m.p + 2 * TPI_RING_LINE, &head, 8);
        assert_int_equal(put(&w, in, sizeof in), TPI_RING_CORRUPT);
        assert_int_equal(put(&w, in, 0), TPI_RING_CORRUPT);
        head = 0; /* the word made right again: the ring stays broken */
        memcpy(m.p + 2 * TPI_RING_LINE, &head, 8);
        assert_int_equal(put(&w, in, sizeof in), TPI_RING_CORRUPT);
        free(m.p);
    }
}

/* The reader's side of the same rule: a tail the writer could not have
 * written (not on a record boundary) makes the ring CORRUPT, and putting
 * the word right afterwards does not mend it: the reader never
 * resynchronises on bytes the peer may still be writing. */
static void test_reader_corrupt_for_good(void **state) {
    (void)state;
    static uint8_t in[16];
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    assert_int_equal(put(&w, in, sizeof in), TPI_RING_OK); /* the tail is 24 */
    uint8_t out[64];
    size_t len = 0;
    uint64_t tail = 28;
    memcpy(m.p + TPI_RING_LINE, &tail, 8);
    assert_int_equal(tpi_ring_read(&r, out, sizeof out, &len), TPI_RING_CORRUPT);
    assert_string_not_equal(tpi_ring_why(&r), "");
    tail = 24;
    memcpy(m.p + TPI_RING_LINE, &tail, 8);
    assert_int_equal(tpi_ring_read(&r, out, sizeof out, &len), TPI_RING_CORRUPT);
    assert_int_equal(tpi_ring_wait(&r, 0, tpi_ring_now_ns()),
                     TPI_RING_OK); /* nothing to wait for */
    free(m.p);
}

/* TCP-26's layout: a record's payload is followed by zeros to a multiple
 * of 8, whatever the data area held before (the reader may hand on a
 * record where it lies, padding and all). */
static void test_record_padding_is_zeros(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    memset(m.p + TPI_RING_HEAD, 0xaa, 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    assert_int_equal(put(&w, "a", 1), TPI_RING_OK);
    assert_int_equal(put(&w, "bcdefghij", 9), TPI_RING_OK);
    const uint8_t *d = m.p + TPI_RING_HEAD;
    assert_int_equal(d[8], 'a');
    for (int i = 9; i < 16; i++)
        assert_int_equal(d[i], 0);
    assert_memory_equal(d + 24, "bcdefghij", 9);
    for (int i = 33; i < 40; i++)
        assert_int_equal(d[i], 0);
    free(m.p);
}

/* tpi_ring_wake bumps the other end's futex word whether it sleeps or not
 * (the transport's nudge: "look again"), once per call: the writer's
 * wake-up moves data_seq, the reader's space_seq. */
static void test_wake_bumps_the_peers_word(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint32_t before, after;
    memcpy(&before, m.p + TPI_RING_LINE + 8, 4);
    tpi_ring_wake(&w);
    memcpy(&after, m.p + TPI_RING_LINE + 8, 4);
    assert_int_equal(after, before + 1);
    memcpy(&before, m.p + 2 * TPI_RING_LINE + 8, 4);
    tpi_ring_wake(&r);
    tpi_ring_wake(&r);
    memcpy(&after, m.p + 2 * TPI_RING_LINE + 8, 4);
    assert_int_equal(after, before + 2);
    free(m.p);
}

/* A scribbler in another process writes random words over the counters
 * and records without pause while this process reads and waits: every
 * call returns, within its deadline plus scheduling. */
static void test_hostile_writer_concurrent(void **state) {
    (void)state;
    size_t cap = 4096;
    mem m = mem_shared(TPI_RING_HEAD + cap);
    tpi_ring w, r;
    pair(m, &w, &r);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint64_t s = 3, until = tpi_ring_now_ns() + 400 * MS;
        uint8_t in[600] = {0};
        while (tpi_ring_now_ns() < until) {
            for (int k = 0; k < 64; k++) {
                uint64_t x = splitmix(&s);
                if (x % 3 == 0)
                    (void)put(&w, in, (size_t)(x % 600)); /* honest records between */
                else if (x % 3 == 1)
                    memcpy(m.p + TPI_RING_LINE + (x >> 8) % 5 * 4, &x, 4);
                else
                    memcpy(m.p + TPI_RING_HEAD + (x >> 8) % (cap / 4) * 4, &x, 4);
            }
        }
        _exit(0);
    }
    static uint8_t buf[4096];
    uint64_t end = tpi_ring_now_ns() + 2000 * MS, worst = 0;
    int corrupt = 0;
    long calls = 0;
    char err[200];
    while (tpi_ring_now_ns() < end) {
        uint64_t t0 = tpi_ring_now_ns();
        size_t len;
        tpi_ring_status st = tpi_ring_read(&r, buf, sizeof buf, &len);
        if (st == TPI_RING_OK)
            assert_true(len <= TPI_RING_RECORD_MAX(cap));
        else if (st == TPI_RING_EMPTY || st == TPI_RING_CLOSED)
            (void)tpi_ring_wait(&r, 2000, t0 + MS);
        else if (st == TPI_RING_CORRUPT) {
            /* start over on the same memory, still under fire */
            corrupt++;
            if (tpi_ring_attach(&r, m.p, m.size, err, sizeof err) != 0)
                (void)tpi_ring_wait(&r, 0, t0 + MS);
        }
        uint64_t took = tpi_ring_now_ns() - t0;
        worst = took > worst ? took : worst;
        calls++;
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    print_message("  hostile writer: %ld calls, %d corrupt, longest call %.1f ms\n", calls, corrupt,
                  (double)worst / MS);
    assert_true(corrupt > 0);
    assert_true(worst < 500 * MS); /* 1 ms deadlines; the rest is the scheduler */
    munmap(m.p, m.size);
}

/* ---- Two processes -------------------------------------------------------------------- */

#define RECORDS 1000000

/* The writer's process: records in one to three pieces, waiting for room
 * in 100 ms slices and watching the reader's process between them; exits
 * 0, or 1..3 on a failure (a reader gone or stuck for 10 s). */
static int child_writer(tpi_ring *w, uint64_t spin_ns, long records) {
    static uint8_t in[8192];
    pid_t ppid = getppid();
    int parent = (int)syscall(SYS_pidfd_open, ppid, 0);
    for (long i = 0; i < records; i++) {
        size_t len = len_of((uint64_t)i), a = len / 3, b = len / 2;
        fill(in, len, (uint64_t)i);
        struct iovec one[1] = {{in, len}}, two[2] = {{in, a}, {in + a, len - a}},
                     three[3] = {{in, a}, {in + a, b - a}, {in + b, len - b}};
        const struct iovec *iov = i % 3 == 0 ? one : i % 3 == 1 ? two : three;
        int stuck = 0;
        for (;;) {
            tpi_ring_status st = tpi_ring_write(w, iov, (int)(i % 3) + 1);
            if (st == TPI_RING_OK)
                break;
            if (st != TPI_RING_FULL)
                return 1;
            if (tpi_ring_wait(w, spin_ns, tpi_ring_now_ns() + 100 * MS) == TPI_RING_TIMEOUT &&
                ((parent >= 0 ? tpi_ring_peer_gone(parent) : getppid() != ppid) || ++stuck > 100))
                return 2;
        }
    }
    tpi_ring_close(w);
    return 0;
}

static void run_two_processes(uint64_t spin_ns) {
    const char *env = getenv("TP_RING_RECORDS");
    long records = env ? atol(env) : RECORDS;
    size_t cap = (size_t)1 << 16;
    mem m = mem_shared(TPI_RING_HEAD + cap);
    tpi_ring w, r;
    pair(m, &w, &r);
    uint64_t t0 = tpi_ring_now_ns();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(child_writer(&w, spin_ns, records));
    }
    int pidfd = child_pidfd(pid);
    static uint8_t buf[8192], exp[8192];
    long got = 0, waits = 0, timeouts = 0;
    cb_got g;
    for (;;) {
        size_t len = 0;
        tpi_ring_status st;
        if (got % 2) {
            st = tpi_ring_read(&r, buf, sizeof buf, &len);
        } else if ((st = tpi_ring_read_cb(&r, got_cb, &g)) == TPI_RING_OK) {
            assert_true(g.len <= sizeof buf);
            memcpy(buf, g.buf, g.len);
            len = g.len;
        }
        if (st == TPI_RING_OK) {
            size_t want = len_of((uint64_t)got);
            if (len != want)
                fail_msg("record %ld: %zu bytes, expected %zu", got, len, want);
            fill(exp, len, (uint64_t)got);
            if (memcmp(buf, exp, len) != 0)
                fail_msg("record %ld: its bytes differ", got);
            got++;
            continue;
        }
        if (st == TPI_RING_CLOSED)
            break;
        if (st != TPI_RING_EMPTY)
            fail_msg("read: %s (%s) after %ld records", tpi_ring_status_name(st), tpi_ring_why(&r),
                     got);
        waits++;
        if (tpi_ring_wait(&r, spin_ns, tpi_ring_now_ns() + 100 * MS) == TPI_RING_TIMEOUT) {
            timeouts++;
            if (child_gone(pid, pidfd) &&
                tpi_ring_read(&r, buf, sizeof buf, &len) == TPI_RING_EMPTY)
                fail_msg("the writer died after %ld records", got);
        }
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(got, records);
    if (pidfd >= 0) /* readable once it exited, reaped or not */
        assert_int_equal(tpi_ring_peer_gone(pidfd), 1);
    double s = (double)(tpi_ring_now_ns() - t0) / 1e9;
    print_message("  spin %llu ns: %ld records in %.2f s (%.0f/s), %ld waits, %ld timeouts\n",
                  (unsigned long long)spin_ns, got, s, (double)got / s, waits, timeouts);
    if (pidfd >= 0)
        close(pidfd);
    munmap(m.p, m.size);
}

static void test_two_processes_no_spin(void **state) {
    (void)state;
    run_two_processes(0);
}

static void test_two_processes_spin_50us(void **state) {
    (void)state;
    run_two_processes(50000);
}

/* A writer that dies (SIGKILL, mid-stream, without closing) leaves a
 * reader that wakes at each deadline, reads what was published, never
 * anything half-written, and sees the death through the pidfd. The child
 * notes the time it dies at in a page of its own. */
static void test_dead_writer(void **state) {
    (void)state;
    mem m = mem_shared(TPI_RING_HEAD + 4096);
    mem note = mem_shared(4096);
    tpi_ring w, r;
    pair(m, &w, &r);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t in[100] = {1, 2, 3};
        for (int k = 0; k < 5; k++)
            (void)put(&w, in, sizeof in);
        usleep(150000); /* the reader is asleep by now */
        /* half a record: its header and bytes, but no tail */
        memcpy(w.data + w.pos % w.cap, "\x10\0\0\0DATA", 8);
        uint64_t t = tpi_ring_now_ns();
        memcpy(note.p, &t, 8);
        __atomic_store_n((uint32_t *)(void *)(note.p + 8), 1u, __ATOMIC_RELEASE);
        kill(getpid(), SIGKILL);
        _exit(9);
    }
    int pidfd = child_pidfd(pid);
    uint8_t buf[200];
    size_t len;
    int got = 0;
    uint64_t found = 0, slice = 50 * MS;
    for (int turn = 0; turn < 200 && !found; turn++) {
        while (tpi_ring_read(&r, buf, sizeof buf, &len) == TPI_RING_OK)
            got++;
        uint64_t t0 = tpi_ring_now_ns();
        tpi_ring_status st = tpi_ring_wait(&r, 0, t0 + slice);
        uint64_t t1 = tpi_ring_now_ns();
        if (st == TPI_RING_TIMEOUT) {
            assert_true(t1 >= t0 + slice);
            assert_true(t1 < t0 + slice + 500 * MS);
        }
        if (child_gone(pid, pidfd))
            found = t1;
    }
    assert_true(found);
    assert_int_equal(got, 5);
    assert_int_equal(tpi_ring_read(&r, buf, sizeof buf, &len), TPI_RING_EMPTY);
    uint64_t died;
    assert_int_equal(__atomic_load_n((uint32_t *)(void *)(note.p + 8), __ATOMIC_ACQUIRE), 1);
    memcpy(&died, note.p, 8);
    print_message("  the writer's death seen %.1f ms after it (wait slices of 50 ms)\n",
                  (double)(found - died) / MS);
    assert_true(found >= died && found - died < slice + 500 * MS);
    /* A wait with nobody to wake it ends at its deadline. */
    uint64_t t0 = tpi_ring_now_ns();
    assert_int_equal(tpi_ring_wait(&r, 50000, t0 + 200 * MS), TPI_RING_TIMEOUT);
    uint64_t took = tpi_ring_now_ns() - t0;
    assert_true(took >= 200 * MS && took < 700 * MS);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (pidfd >= 0)
        close(pidfd);
    munmap(m.p, m.size);
    munmap(note.p, note.size);
}

/* The other way: a writer waiting for room from a reader that died. */
static void test_dead_reader(void **state) {
    (void)state;
    mem m = mem_shared(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t buf[600];
        size_t len;
        (void)tpi_ring_wait(&r, 0, tpi_ring_now_ns() + 2000 * MS);
        (void)tpi_ring_read(&r, buf, sizeof buf, &len);
        _exit(0);
    }
    int pidfd = child_pidfd(pid);
    /* Two records of 512 bytes fill the ring; the child reads one and
     * exits, so a third fits and a fourth waits for good: the waits end at
     * their deadlines until the pidfd tells. */
    uint8_t in[500] = {0};
    int ok = 0, timeouts = 0;
    while (!child_gone(pid, pidfd) || timeouts == 0) {
        tpi_ring_status st = put(&w, in, 500);
        if (st == TPI_RING_OK) {
            ok++;
            continue;
        }
        assert_int_equal(st, TPI_RING_FULL);
        if (tpi_ring_wait(&w, 0, tpi_ring_now_ns() + 50 * MS) == TPI_RING_TIMEOUT)
            timeouts++;
        assert_true(timeouts < 100);
    }
    assert_int_equal(ok, 3);
    waitpid(pid, NULL, 0);
    if (pidfd >= 0)
        close(pidfd);
    munmap(m.p, m.size);
}

/* A sleeping reader thread is woken by a write long before its deadline. */

static void *reader_thread(void *p) {
    waker *k = p;
    k->st = tpi_ring_wait(k->r, 0, tpi_ring_now_ns() + 5000 * MS);
    k->woke_at = tpi_ring_now_ns();
    return NULL;
}

static void test_wake_is_prompt(void **state) {
    (void)state;
    mem m = mem_new(TPI_RING_HEAD + 1024);
    tpi_ring w, r;
    pair(m, &w, &r);
    waker k = {&r, 0, TPI_RING_TIMEOUT};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_thread, &k), 0);
    usleep(50000);
    uint64_t sent = tpi_ring_now_ns();
    assert_int_equal(put(&w, "z", 1), TPI_RING_OK);
    pthread_join(t, NULL);
    assert_int_equal(k.st, TPI_RING_OK);
    assert_true(k.woke_at - sent < 1000 * MS);
    free(m.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read_basic),
        cmocka_unit_test(test_reader_attached_later_starts_at_the_head),
        cmocka_unit_test(test_too_big_and_full),
        cmocka_unit_test(test_wrap_pad_record),
        cmocka_unit_test(test_randomized_model),
        cmocka_unit_test(test_close_both_ways),
        cmocka_unit_test(test_init_refusals),
        cmocka_unit_test(test_attach_refuses_bad_header),
        cmocka_unit_test(test_capacity_at_the_most),
        cmocka_unit_test(test_attach_small_or_misaligned),
        cmocka_unit_test(test_reader_record_bounds_each),
        cmocka_unit_test(test_close_wakes_a_sleeper),
        cmocka_unit_test(test_wait_sleeps_and_lowers_its_flag),
        cmocka_unit_test(test_peer_gone_of_a_live_process),
        cmocka_unit_test(test_hostile_writer_scribbles),
        cmocka_unit_test(test_hostile_reader_scribbles),
        cmocka_unit_test(test_reader_head_checked_alone),
        cmocka_unit_test(test_reader_corrupt_for_good),
        cmocka_unit_test(test_record_padding_is_zeros),
        cmocka_unit_test(test_wake_bumps_the_peers_word),
        cmocka_unit_test(test_hostile_writer_concurrent),
        cmocka_unit_test(test_two_processes_no_spin),
        cmocka_unit_test(test_two_processes_spin_50us),
        cmocka_unit_test(test_dead_writer),
        cmocka_unit_test(test_dead_reader),
        cmocka_unit_test(test_wake_is_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
