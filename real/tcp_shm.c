/*
 * tcp_shm.c: shared memory between two workers on one host (spec/tcp.md
 * TCP-22), below the agent interface and beside the TCP stream that still
 * carries everything else.
 *
 * A dialer that may use shared memory offers it on its outgoing connection
 * once the handshake is done: a probe (a memfd holding who it is, whom it
 * dialed and a fresh tag) and a record naming its pid, the probe's
 * descriptor number and the tag. The acceptor takes the probe's descriptor
 * out of the dialer with pidfd_getfd and reads it back: only the process
 * the authenticated stream comes from, on this kernel, can have put it
 * there; a dialer in another network namespace is refused first. Then,
 * for that connection, a frame of shm_min_bytes or more is
 * copied once into a slab (a memfd of the dialer's, reused) and only a
 * 24-byte record goes on the stream; the acceptor takes each slab's
 * descriptor once, maps it and keeps the mapping, hands the frame on
 * without a copy (its tensors view the slab), and when the frame is freed
 * tells the dialer the slab is free again (one frame per slab at a time). Everything kernel-side
 * (descriptors, pages) dies with the processes: no names in /dev/shm, nothing to clean up after a
 * crash.
 *
 * Threads: the slabs (tpi_shm_tx) are the loop thread's. A received
 * frame's release runs on whatever thread frees it, so the receiving side
 * (tpi_shm_rx) is reference-counted and locked, and hands slab numbers to
 * the loop through the agent's list (qmu).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tcp_internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define PROBE_MAGIC "TPSHMPRB"
#define SLAB_MAGIC "TPSHMSLB"

typedef struct slab {
    int fd;       /* -1: the slot is empty */
    uint8_t *map; /* cap bytes, MAP_SHARED */
    uint64_t cap;
    uint32_t gen; /* 1..2^24-1: tells the acceptor's mapping of it from an earlier slab's */
    int busy; /* a frame in it went out; free again on its release */
    uint64_t session; /* the connection it went out on */
} slab;

struct tpi_shm_tx {
    slab s[TPI_SHM_SLABS_MAX];
    uint32_t gen; /* the last slab's generation */
    uint64_t bytes; /* caps of the slabs held */
};

#define put32 tpi_tcp_put_u32
#define get32 tpi_tcp_get_u32

static void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* ---- Rings (TCP-28) ------------------------------------------------------------- */

/* The probe's ring fields: the ring's memfd, the data bell (the dialer
 * rings it, the acceptor polls it), the room bell (the other way), and the
 * ring's bytes (0: no ring offered). */
#define PROBE_RING_FD 40
#define PROBE_DATA_BELL 44
#define PROBE_ROOM_BELL 48
#define PROBE_RING_BYTES 52

static tpi_shm_link *link_new(void) {
    tpi_shm_link *l = calloc(1, sizeof *l);
    if (l) {
        l->fd = l->wake_fd = l->wait_fd = -1;
        l->map = MAP_FAILED;
    }
    return l;
}

void tpi_shm_link_free(tpi_shm_link *l) {
    if (!l)
        return;
    if (l->map != MAP_FAILED)
        munmap(l->map, l->map_len);
    if (l->fd >= 0)
        tpi_shm_close_untracked(l->fd);
    if (l->wake_fd >= 0)
        tpi_shm_close_untracked(l->wake_fd);
    if (l->wait_fd >= 0)
        tpi_shm_close_untracked(l->wait_fd);
    free(l);
}

void tpi_shm_link_opened(tpi_shm_link *l) {
    if (l->fd >= 0)
        tpi_shm_close_untracked(l->fd); /* taken and mapped by the acceptor: the mapping stays */
    l->fd = -1;
}

/* The dialer's ring of cap data bytes, formatted, with both bells; NULL
 * when any part cannot be had (the offer then goes without a ring). */
static tpi_shm_link *link_make(uint64_t cap) {
    tpi_shm_link *l = link_new();
    if (!l)
        return NULL;
    size_t len = (size_t)(TPI_RING_HEAD + cap);
    char err[TPI_RING_WHY_LEN];
    l->fd = memfd_create("tensorplay-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (l->fd < 0 || ftruncate(l->fd, (off_t)len) != 0 || fallocate(l->fd, 0, 0, (off_t)len) != 0 ||
        fcntl(l->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (l->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0)) == MAP_FAILED) {
        tpi_shm_link_free(l);
        return NULL;
    }
    l->map_len = len;
    l->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    l->wait_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->wake_fd < 0 || l->wait_fd < 0 ||
        tpi_ring_init(&l->ring, l->map, len, err, sizeof err) != 0) {
        tpi_shm_link_free(l);
        return NULL;
    }
    TPI_ASSERT(l->ring.cap == cap); /* cap is a power of two and the mapping its exact size */
    tpi_ring_set_bell(&l->ring, l->wake_fd);
    return l;
}

tpi_ring_status tpi_shm_ring_put(tpi_ring *r, const tp_frame *f) {
    struct iovec iov[TP_FRAME_SEG_MAX];
    TPI_ASSERT(f->nseg >= 1 && f->nseg <= TP_FRAME_SEG_MAX);
    for (int i = 0; i < f->nseg; i++) {
        iov[i].iov_base = (void *)f->seg[i].base;
        iov[i].iov_len = f->seg[i].len;
    }
    return tpi_ring_write(r, iov, f->nseg);
}

/* ---- The offer (dialer, loop thread) ------------------------------------------ */

int tpi_shm_offer(tpi_tcp_agent *a, uint32_t peer, int *probe_fd, tpi_shm_link **link,
                  uint8_t rec[TPI_TCP_RECORD_SIZE]) {
    *link = NULL;
    uint8_t nonce[TPI_TCP_NONCE_SIZE];
    if (tpi_tcp_auth_nonce(nonce) != 0)
        return -1;
    int fd = memfd_create("tensorplay-shm-probe", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    tpi_shm_link *l = a->shm_ring > 0 ? link_make(a->shm_ring) : NULL;
    if (a->shm_ring > 0 && !l)
        tpi_log(TP_LOG_DEBUG, "worker %u: no shared memory ring for worker %u: cannot make one",
                a->rank, peer);
    uint8_t probe[TPI_SHM_PROBE_SIZE] = {0};
    memcpy(probe, PROBE_MAGIC, 8);
    put32(probe + 8, a->rank);
    put32(probe + 12, peer);
    put32(probe + 16, a->world_size);
    put32(probe + 20, (uint32_t)getpid());
    memcpy(probe + 24, nonce, sizeof nonce);
    if (l) {
        put32(probe + PROBE_RING_FD, (uint32_t)l->fd);
        put32(probe + PROBE_DATA_BELL, (uint32_t)l->wake_fd);
        put32(probe + PROBE_ROOM_BELL, (uint32_t)l->wait_fd);
        put32(probe + PROBE_RING_BYTES, (uint32_t)l->map_len);
    }
    if (pwrite(fd, probe, sizeof probe, 0) != (ssize_t)sizeof probe) { /* a fresh memfd */
        tpi_shm_close_untracked(fd);
        tpi_shm_link_free(l);
        return -1;
    }
    *probe_fd = fd;
    *link = l;
    tpi_tcp_shm_encode(rec, TPI_TCP_SHM_OFFER, a->rank, (uint32_t)getpid(), (uint32_t)fd,
                       get32(nonce));
    return 0;
}

/* ---- The acceptor's side: the offer's proof, frames in, releases --------------- */

/* A slab as the acceptor maps it, whole, kept across the frames it carries
 * (no map, fault or unmap per frame): the slot table holds a reference,
 * and each frame in it one; the last unmaps. */
typedef struct rx_map {
    int refs; /* under the side's mu */
    uint32_t gen;
    uint8_t *map;
    size_t len;
} rx_map;

struct tpi_shm_rx {
    pthread_mutex_t mu;
    int refs;  /* the connection's, one per frame out, the release list's */
    int pidfd; /* the dialer's process */
    uint32_t peer, me;
    uint64_t map_max; /* the largest slab a frame of max_message_size needs */
    tpi_tcp_agent *a; /* NULL once the connection is gone: releases are dropped */
    void *conn;       /* the connection the releases go back on */
    rx_map *slot[TPI_SHM_SLABS_MAX];
    /* Slots whose frame was freed, not yet told (bit i: slot i). A slot
     * holds one frame at a time: a FRAME for a slot whose frame lives or
     * whose release is not yet told is a protocol error. */
    uint32_t released;
    int listed; /* on a->shm_released: set with mu and qmu, cleared by the loop */
    tpi_shm_rx *next;   /* that list */
};

/* Drops a reference to m (rx->mu held); unmaps at the last. */
static void map_unref_locked(rx_map *m) {
    if (--m->refs > 0)
        return;
    munmap(m->map, m->len);
    free(m);
}

/* Closes a descriptor made by memfd_create, pidfd_open or pidfd_getfd:
 * calls ThreadSanitizer does not intercept (nor libuv's raw close of its
 * sockets), so to it the number still names what another thread last
 * closed under it, and this close reads as a race with that descriptor's
 * last use (tests/tsan.supp names this function; the kernel orders the
 * two). Never inlined: the name must be in the stack. */
__attribute__((noinline)) void tpi_shm_close_untracked(int fd) {
    close(fd);
}

void tpi_shm_rx_unref(tpi_shm_rx *rx) {
    pthread_mutex_lock(&rx->mu);
    int last = --rx->refs == 0;
    pthread_mutex_unlock(&rx->mu);
    if (!last)
        return;
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++)
        TPI_ASSERT(!rx->slot[i]); /* dropped by the detach */
    tpi_shm_close_untracked(rx->pidfd);
    pthread_mutex_destroy(&rx->mu);
    free(rx);
}

/* 1 with why unless the dialer (pid, opened as pidfd) is in this process's
 * network namespace. To the network a namespace is a host of its own,
 * whose links can be cut and filtered: frames between two of them cross
 * it, as PyTorch's TensorPipe keeps its shared memory to one namespace. */
static int netns_differs(pid_t pid, int pidfd, const char **why) {
    char path[64];
    struct stat mine, theirs;
    tpi_format(path, sizeof path, "/proc/%d/ns/net", (int)pid);
    if (stat("/proc/self/ns/net", &mine) != 0 || stat(path, &theirs) != 0) {
        *why = "cannot read the dialer's network namespace (/proc/<pid>/ns/net)";
        return 1;
    }
    /* The pid named the process pidfd holds while we looked, not a later one. */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0) {
        *why = "the dialer's process ended during the proof";
        return 1;
    }
    if (mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino) {
        *why = "the dialer is in another network namespace: a host of its own to the network";
        return 1;
    }
    return 0;
}

/* A descriptor of the dialer's, taken into this process; -1 with why. */
static int take_fd(int pidfd, uint32_t fd, const char **why) {
    int got = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fd, 0);
    if (got < 0)
        *why = errno == EPERM ? "pidfd_getfd: not permitted (ptrace access to the peer denied)"
                              : "pidfd_getfd failed";
    return got;
}

/* 1 when fd (taken from the dialer) is an eventfd: a bell is written and
 * polled, so a pipe, socket or file at that number is refused. */
static int is_eventfd(int fd) {
    char path[64], target[64];
    tpi_format(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    return strcmp(target, "anon_inode:[eventfd]") == 0;
}

/* The acceptor's end of the ring a probe names (its fields at p): mapped,
 * its header checked, its bells taken; NULL with *why. */
static tpi_shm_link *link_take(tpi_tcp_agent *a, int pidfd, const uint8_t *p, const char **why) {
    uint64_t len = get32(p + PROBE_RING_BYTES);
    if (len < TPI_RING_HEAD + TPI_SHM_RING_MIN || len > TPI_RING_HEAD + TPI_SHM_RING_MAX) {
        *why = "a ring of a size outside the bounds";
        return NULL;
    }
    tpi_shm_link *l = link_new();
    if (!l) {
        *why = "out of memory";
        return NULL;
    }
    int fd = take_fd(pidfd, get32(p + PROBE_RING_FD), why);
    struct stat st;
    int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
    /* Sealed against shrinking: nobody can cut it under the mapping, so
     * reading it never raises SIGBUS (TCP-22's rule for slabs). */
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && seals >= 0 &&
        (seals & F_SEAL_SHRINK) && (uint64_t)st.st_size == len) {
        l->map = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        l->map_len = (size_t)len;
    }
    if (fd >= 0)
        tpi_shm_close_untracked(fd);
    char err[TPI_RING_WHY_LEN];
    if (fd >= 0 && l->map == MAP_FAILED) {
        *why = "the ring is not a sealed memfd of the size offered";
    } else if (fd >= 0 && tpi_ring_attach(&l->ring, l->map, l->map_len, err, sizeof err) != 0) {
        tpi_log(TP_LOG_INFO, "worker %u: %s", a->rank, err);
        *why = "the ring's header does not hold";
    } else if (fd >= 0) {
        l->wait_fd = take_fd(pidfd, get32(p + PROBE_DATA_BELL), why);
        l->wake_fd = l->wait_fd >= 0 ? take_fd(pidfd, get32(p + PROBE_ROOM_BELL), why) : -1;
        if (l->wake_fd >= 0 && (!is_eventfd(l->wait_fd) || !is_eventfd(l->wake_fd)))
            *why = "a bell that is not an eventfd";
    }
    if (*why) {
        tpi_shm_link_free(l);
        return NULL;
    }
    tpi_ring_set_bell(&l->ring, l->wake_fd);
    return l;
}

tpi_shm_rx *tpi_shm_accept(tpi_tcp_agent *a, uint32_t peer, void *conn, const uint32_t v[3],
                           const char **why, tpi_shm_link **link, const char **ring_why) {
    *why = NULL;
    *link = NULL;
    *ring_why = NULL;
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)v[0], 0);
    if (pidfd < 0) {
        *why = "pidfd_open failed: the dialer's pid is not a process here (another pid "
               "namespace or host)";
        return NULL;
    }
    if (netns_differs((pid_t)v[0], pidfd, why)) { /* before any descriptor is taken */
        tpi_shm_close_untracked(pidfd);
        return NULL;
    }
    int fd = take_fd(pidfd, v[1], why);
    uint8_t probe[TPI_SHM_PROBE_SIZE];
    struct stat st;
    /* Only a regular file is read: a descriptor number that names a pipe or
     * a device in that process is not a probe, and is not touched. */
    ssize_t n = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)
                    ? pread(fd, probe, sizeof probe, 0)
                    : -1;
    if (fd >= 0)
        tpi_shm_close_untracked(fd);
    if (fd >= 0 && (n != (ssize_t)sizeof probe || memcmp(probe, PROBE_MAGIC, 8) != 0 ||
                    get32(probe + 8) != peer || get32(probe + 12) != a->rank ||
                    get32(probe + 16) != a->world_size || get32(probe + 20) != v[0] ||
                    get32(probe + 24) != v[2]))
        *why = "the descriptor at that pid is not this connection's probe";
    tpi_shm_rx *rx = *why ? NULL : calloc(1, sizeof *rx);
    if (!rx) {
        if (!*why)
            *why = "out of memory";
        tpi_shm_close_untracked(pidfd);
        return NULL;
    }
    pthread_mutex_init(&rx->mu, NULL);
    rx->refs = 1;
    rx->pidfd = pidfd;
    rx->peer = peer;
    rx->me = a->rank;
    rx->map_max = tpi_shm_slab_size(a->max_msg);
    rx->a = a;
    rx->conn = conn;
    /* TCP-28: the ring, when offered and wanted (either end may choose
     * none: no reason then); slabs go on without it. */
    if (get32(probe + PROBE_RING_BYTES) != 0 && a->shm_ring != 0)
        *link = link_take(a, pidfd, probe, ring_why);
    return rx;
}

/* What a received frame holds until it is freed. */
typedef struct rx_hold {
    tpi_shm_rx *rx;
    rx_map *m;
    uint32_t slot;
} rx_hold;

static void hold_release(void *ctx) {
    rx_hold *h = ctx;
    tpi_shm_rx *rx = h->rx;
    pthread_mutex_lock(&rx->mu);
    map_unref_locked(h->m);
    tpi_tcp_agent *a = rx->a;
    TPI_ASSERT(!(rx->released & 1u << h->slot)); /* one frame per slot (rx_map_get) */
    rx->released |= 1u << h->slot;
    if (a) {
        pthread_mutex_lock(&a->qmu);
        if (!rx->listed && !a->stopping) {
            rx->listed = 1;
            rx->refs++;
            rx->next = a->shm_released;
            a->shm_released = rx;
            tpi_tcp_wake(a);
        }
        pthread_mutex_unlock(&a->qmu);
    }
    pthread_mutex_unlock(&rx->mu);
    free(h);
    tpi_shm_rx_unref(rx);
}

/* The mapping of slab slot of generation gen (fd in the dialer), mapped
 * now unless the table has it; a new reference, or NULL with err. */
static rx_map *rx_map_get(tpi_shm_rx *rx, uint32_t fd, uint32_t slot, uint32_t gen, char *err,
                          size_t err_len) {
    pthread_mutex_lock(&rx->mu);
    rx_map *m = rx->slot[slot];
    if ((m && m->refs > 1) || (rx->released & 1u << slot)) {
        /* The dialer writes a slot again only after our RELEASE, which
         * follows the last frame's end: this peer breaks TCP-22. */
        pthread_mutex_unlock(&rx->mu);
        tpi_format(err, err_len, "shared memory slab %u sent again before its release", slot);
        return NULL;
    }
    if (m && m->gen == gen) {
        m->refs++;
        pthread_mutex_unlock(&rx->mu);
        return m;
    }
    if (m) { /* the dialer made a new slab in this slot: the old one goes */
        rx->slot[slot] = NULL;
        map_unref_locked(m);
    }
    pthread_mutex_unlock(&rx->mu);
    const char *why = NULL;
    int sfd = take_fd(rx->pidfd, fd, &why);
    if (sfd < 0) {
        tpi_format(err, err_len, "shared memory slab %u: %s", slot, why);
        return NULL;
    }
    /* A slab sealed against shrinking only: nobody can cut the file under
     * our mapping, so reading it never raises SIGBUS. */
    struct stat st;
    void *map = MAP_FAILED;
    int seals = fcntl(sfd, F_GET_SEALS);
    if (fstat(sfd, &st) == 0 && S_ISREG(st.st_mode) && seals >= 0 && (seals & F_SEAL_SHRINK) &&
        st.st_size >= TPI_SHM_HEAD + TPI_SHM_ALIGN + TP_FRAME_HEADER_SIZE &&
        (uint64_t)st.st_size <= rx->map_max)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    tpi_shm_close_untracked(sfd);
    m = map == MAP_FAILED ? NULL : malloc(sizeof *m);
    if (!m) {
        if (map != MAP_FAILED)
            munmap(map, (size_t)st.st_size);
        tpi_format(err, err_len, "shared memory slab %u cannot be mapped (not a sealed memfd, "
                   "or of a size no frame needs)", slot);
        return NULL;
    }
    m->refs = 2; /* the table's and the caller's */
    m->gen = gen;
    m->map = map;
    m->len = (size_t)st.st_size;
    pthread_mutex_lock(&rx->mu);
    TPI_ASSERT(!rx->slot[slot]); /* only the loop thread fills the table */
    rx->slot[slot] = m;
    pthread_mutex_unlock(&rx->mu);
    return m;
}

tp_frame *tpi_shm_frame(tpi_shm_rx *rx, const uint32_t v[3], uint64_t max_msg, char *err,
                        size_t err_len) {
    uint32_t slot = v[1] & 0xffu, gen = v[1] >> 8, len = v[2];
    if (slot >= TPI_SHM_SLABS_MAX || gen == 0 || len < TP_FRAME_HEADER_SIZE) {
        tpi_format(err, err_len, "shared memory record for slot %u (generation %u), frame of %u "
                   "bytes", slot, gen, len);
        return NULL;
    }
    rx_map *m = rx_map_get(rx, v[0], slot, gen, err, err_len);
    if (!m)
        return NULL;
    const uint8_t *h = m->map;
    uint32_t at = get32(h + 36);
    size_t flen = 0;
    char herr[TP_ERRMSG_LEN_MAX];
    herr[0] = '\0';
    tp_frame *f = NULL;
    rx_hold *hold = NULL;
    if (memcmp(h, SLAB_MAGIC, 8) != 0 || get32(h + 8) != rx->peer || get32(h + 12) != rx->me ||
        get32(h + 16) != slot || get32(h + 20) != len || get64(h + 24) != m->len ||
        get32(h + 32) != gen || at < TPI_SHM_HEAD || at >= TPI_SHM_HEAD + TPI_SHM_ALIGN ||
        (uint64_t)at + len > m->len) {
        tpi_format(err, err_len, "shared memory slab %u: its header does not match the record",
                   slot);
    } else if (tp_frame_check_header(m->map + at, max_msg, &flen, herr, sizeof herr) != TP_OK ||
               flen != len) {
        tpi_format(err, err_len, "shared memory slab %u: %s", slot,
                   herr[0] == '\0' ? "its frame's length differs from the record" : herr);
    } else if (!(hold = malloc(sizeof *hold)) ||
               !(f = tp_frame_lend(m->map + at, len, hold_release, hold))) {
        tpi_format(err, err_len, "out of memory for a shared memory frame");
    }
    if (!f) {
        free(hold);
        pthread_mutex_lock(&rx->mu);
        map_unref_locked(m);
        pthread_mutex_unlock(&rx->mu);
        return NULL;
    }
    hold->rx = rx;
    hold->m = m;
    hold->slot = slot;
    pthread_mutex_lock(&rx->mu);
    rx->refs++;
    pthread_mutex_unlock(&rx->mu);
    return f;
}

void tpi_shm_rx_detach(tpi_shm_rx *rx) {
    if (!rx)
        return;
    tpi_tcp_agent *a = rx->a; /* NULL for fuzz_tcp_shm's side */
    pthread_mutex_lock(&rx->mu);
    rx->a = NULL;
    rx->conn = NULL;
    rx->released = 0;
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++) {
        if (rx->slot[i])
            map_unref_locked(rx->slot[i]);
        rx->slot[i] = NULL;
    }
    pthread_mutex_unlock(&rx->mu);
    /* Off the agent's list, if it waits there (the list's reference goes). */
    int unlisted = 0;
    if (a) {
        pthread_mutex_lock(&a->qmu);
        for (tpi_shm_rx **p = &a->shm_released; *p; p = &(*p)->next) {
            if (*p == rx) {
                *p = rx->next;
                rx->listed = 0;
                unlisted = 1;
                break;
            }
        }
        pthread_mutex_unlock(&a->qmu);
    }
    if (unlisted)
        tpi_shm_rx_unref(rx);
    tpi_shm_rx_unref(rx);
}

tpi_shm_rx *tpi_shm_released_take(tpi_tcp_agent *a) {
    pthread_mutex_lock(&a->qmu);
    tpi_shm_rx *list = a->shm_released;
    a->shm_released = NULL;
    pthread_mutex_unlock(&a->qmu);
    return list;
}

void *tpi_shm_rx_take(tpi_shm_rx *rx, tpi_shm_rx **next, uint32_t *released) {
    pthread_mutex_lock(&rx->mu);
    *next = rx->next; /* the list was taken whole: only the loop reads it */
    rx->next = NULL;
    rx->listed = 0; /* from here a release lists rx anew */
    void *conn = rx->conn;
    *released = rx->released;
    rx->released = 0;
    pthread_mutex_unlock(&rx->mu);
    return conn;
}


/* ---- Slabs (dialer, loop thread) ------------------------------------------------ */

uint64_t tpi_shm_slab_size(uint64_t frame_len) {
    uint64_t need = TPI_SHM_HEAD + TPI_SHM_ALIGN + frame_len;
    return (need + TPI_SHM_SLAB_STEP - 1) / TPI_SHM_SLAB_STEP * TPI_SHM_SLAB_STEP;
}

static void slab_drop(tpi_shm_tx *tx, int i) {
    slab *s = &tx->s[i];
    TPI_ASSERT(s->fd >= 0);
    munmap(s->map, s->cap);
    tpi_shm_close_untracked(s->fd);
    tx->bytes -= s->cap;
    s->fd = -1;
    s->map = NULL;
    s->cap = 0;
    s->busy = 0;
}

/* A fresh slab of cap bytes in slot i, its pages allocated now (a full
 * machine fails here, cleanly, not with SIGBUS on a later write); 0 or -1. */
static int slab_make(tpi_shm_tx *tx, int i, uint64_t cap) {
    slab *s = &tx->s[i];
    int fd = memfd_create("tensorplay-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)cap) != 0 || fallocate(fd, 0, 0, (off_t)cap) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        tpi_shm_close_untracked(fd);
        return -1;
    }
    void *map = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        tpi_shm_close_untracked(fd);
        return -1;
    }
    s->fd = fd;
    s->map = map;
    s->cap = cap;
    s->busy = 0;
    tx->gen = tx->gen % 0xffffffu + 1;
    s->gen = tx->gen;
    tx->bytes += cap;
    return 0;
}

/* A free slab for a frame of len bytes: the smallest free one that fits
 * without wasting more than half, else a new one, made room for by
 * dropping free ones of the wrong size (largest first), but only when that
 * room can be had: busy slabs are never dropped, so when they alone leave
 * no room (or no slot), nothing is dropped. -1 then: the frame takes TCP. */
static int slab_pick(tpi_tcp_agent *a, tpi_shm_tx *tx, uint64_t len) {
    uint64_t need = TPI_SHM_HEAD + TPI_SHM_ALIGN + len, cap = tpi_shm_slab_size(len), busy = 0;
    int best = -1, nbusy = 0;
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++) {
        slab *s = &tx->s[i];
        if (s->fd >= 0 && s->busy) {
            busy += s->cap;
            nbusy++;
        } else if (s->fd >= 0 && s->cap >= need && s->cap / 2 <= need &&
                   (best < 0 || s->cap < tx->s[best].cap)) {
            best = i;
        }
    }
    if (best >= 0)
        return best;
    if (nbusy == TPI_SHM_SLABS_MAX || busy + cap > a->shm_pool)
        return -1;
    for (;;) {
        int empty = -1, spare = -1;
        for (int i = 0; i < TPI_SHM_SLABS_MAX; i++) {
            slab *s = &tx->s[i];
            if (s->fd < 0 && empty < 0)
                empty = i;
            else if (s->fd >= 0 && !s->busy && (spare < 0 || s->cap > tx->s[spare].cap))
                spare = i;
        }
        if (empty >= 0 && tx->bytes + cap <= a->shm_pool)
            return slab_make(tx, empty, cap) == 0 ? empty : -1;
        TPI_ASSERT(spare >= 0); /* the room is there: only free slabs stand in its way */
        slab_drop(tx, spare);
    }
}

int tpi_shm_pack(tpi_tcp_agent *a, uint32_t peer, uint64_t session, const tp_frame *f,
                 uint8_t rec[TPI_TCP_RECORD_SIZE]) {
    tpi_tcp_peer *p = &a->peers[peer];
    if (f->len > UINT32_MAX || tpi_shm_slab_size(f->len) > a->shm_pool)
        return -1;
    if (!p->shm_tx) {
        p->shm_tx = calloc(1, sizeof *p->shm_tx);
        if (!p->shm_tx)
            return -1;
        for (int i = 0; i < TPI_SHM_SLABS_MAX; i++)
            p->shm_tx->s[i].fd = -1;
    }
    tpi_shm_tx *tx = p->shm_tx;
    /* The frame starts where its largest segment (a tensor's data, sent
     * from where it lay) lands on a multiple of TPI_SHM_ALIGN: the tensor
     * the receiver views is aligned for its elements as it is, never moved
     * into place (WIRE-10). */
    size_t at = 0, big_at = 0, big_len = 0;
    for (int k = 0; k < f->nseg; k++) {
        if (k > 0 && f->seg[k].len > big_len) {
            big_len = f->seg[k].len;
            big_at = at;
        }
        at += f->seg[k].len;
    }
    size_t pad = (TPI_SHM_ALIGN - (TPI_SHM_HEAD + big_at) % TPI_SHM_ALIGN) % TPI_SHM_ALIGN;
    int i = slab_pick(a, tx, f->len);
    if (i < 0)
        return -1;
    slab *s = &tx->s[i];
    uint8_t *h = s->map;
    memset(h, 0, TPI_SHM_HEAD);
    memcpy(h, SLAB_MAGIC, 8);
    put32(h + 8, a->rank);
    put32(h + 12, peer);
    put32(h + 16, (uint32_t)i);
    put32(h + 20, (uint32_t)f->len);
    put64(h + 24, s->cap);
    put32(h + 32, s->gen);
    put32(h + 36, (uint32_t)(TPI_SHM_HEAD + pad));
    uint8_t *dst = h + TPI_SHM_HEAD + pad;
    for (int k = 0; k < f->nseg; k++) {
        memcpy(dst, f->seg[k].base, f->seg[k].len);
        dst += f->seg[k].len;
    }
    s->busy = 1;
    s->session = session;
    tpi_tcp_shm_encode(rec, TPI_TCP_SHM_FRAME, a->rank, (uint32_t)s->fd,
                       (uint32_t)i | s->gen << 8, (uint32_t)f->len);
    return 0;
}

int tpi_shm_release(tpi_tcp_agent *a, uint32_t peer, uint64_t session, uint32_t slot) {
    tpi_shm_tx *tx = a->peers[peer].shm_tx;
    if (!tx || slot >= TPI_SHM_SLABS_MAX || tx->s[slot].fd < 0 || !tx->s[slot].busy ||
        tx->s[slot].session != session)
        return -1;
    tx->s[slot].busy = 0;
    return 0;
}

void tpi_shm_session_end(tpi_tcp_agent *a, uint32_t peer, uint64_t session) {
    tpi_shm_tx *tx = a->peers[peer].shm_tx;
    if (!tx)
        return;
    /* A busy slab may still be mapped by the other end, whose release can
     * no longer come: it is given up (its pages live on in that mapping). */
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++)
        if (tx->s[i].fd >= 0 && tx->s[i].busy && tx->s[i].session == session)
            slab_drop(tx, i);
}

void tpi_shm_tx_free(tpi_shm_tx *tx) {
    if (!tx)
        return;
    for (int i = 0; i < TPI_SHM_SLABS_MAX; i++)
        if (tx->s[i].fd >= 0)
            slab_drop(tx, i);
    free(tx);
}

/* ---- Options -------------------------------------------------------------------- */

tp_status tpi_shm_setup(tpi_tcp_agent *a, const tp_options *opts, char *errmsg,
                        size_t errmsg_len) {
    const char *v = tp_options_get(opts, "shm");
    a->shm_on = 1;
    if (v && *v && strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
        tpi_format(errmsg, errmsg_len, "shm '%.32s' is not on or off (TCP-22)", v);
        return TP_EINVAL;
    }
    if (v && strcmp(v, "off") == 0)
        a->shm_on = 0;
    a->shm_min = TPI_SHM_MIN_DEFAULT;
    a->shm_pool = TPI_SHM_POOL_DEFAULT;
    tp_status st = tpi_tcp_read_count(opts, "shm_min_bytes", 0, UINT32_MAX, " (TCP-22)",
                                      &a->shm_min, errmsg, errmsg_len);
    if (st == TP_OK)
        st = tpi_tcp_read_count(opts, "shm_pool_bytes", TPI_SHM_SLAB_STEP, (uint64_t)1 << 40,
                                " (TCP-22)", &a->shm_pool, errmsg, errmsg_len);
    if (st != TP_OK)
        return st;
    a->shm_ring = TPI_SHM_RING_DEFAULT;
    st = tpi_tcp_read_count(opts, "shm_ring_bytes", 0, TPI_SHM_RING_MAX, " (TCP-28)", &a->shm_ring,
                            errmsg, errmsg_len);
    if (st != TP_OK)
        return st;
    if (a->shm_ring != 0 &&
        (a->shm_ring < TPI_SHM_RING_MIN || (a->shm_ring & (a->shm_ring - 1)) != 0)) {
        tpi_format(errmsg, errmsg_len,
                   "shm_ring_bytes '%llu' is not 0 or a power of two from %llu to %llu (TCP-28)",
                   (unsigned long long)a->shm_ring, (unsigned long long)TPI_SHM_RING_MIN,
                   (unsigned long long)TPI_SHM_RING_MAX);
        return TP_EINVAL;
    }
    if (a->shm_min < TP_FRAME_HEADER_SIZE)
        a->shm_min = TP_FRAME_HEADER_SIZE;
    if (a->encrypt)
        a->shm_on = 0; /* every byte stays sealed: nothing bypasses the stream (TCP-21) */
    return TP_OK;
}

/* ---- Fuzzing the reader (fuzz/fuzz_tcp_shm.c) -------------------------------------- */

tpi_shm_rx *tpi_shm_rx_for_fuzz(int pidfd, uint32_t peer, uint32_t me, uint64_t max_msg) {
    tpi_shm_rx *rx = calloc(1, sizeof *rx);
    if (!rx)
        return NULL;
    pthread_mutex_init(&rx->mu, NULL);
    rx->refs = 1;
    rx->pidfd = pidfd;
    rx->peer = peer;
    rx->me = me;
    rx->map_max = tpi_shm_slab_size(max_msg);
    return rx; /* no agent: releases are dropped; tpi_shm_rx_detach ends it */
}
