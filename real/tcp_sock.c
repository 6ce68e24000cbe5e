/*
 * tcp_sock.c: plain sockets with deadlines, for the rendezvous store's
 * client and server (spec/tcp.md TCP-9..11). Sockets are non-blocking and
 * every wait is a poll() bounded by a deadline on CLOCK_MONOTONIC, so a
 * store operation can never hang; sends use MSG_NOSIGNAL so a closed peer
 * is an EPIPE, not a SIGPIPE.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"

/*
 * TCP-27: libuv never closes a stream on descriptors 0 to 2 (uv_close leaves
 * them open, so the peer never sees the end), and whatever writes to stdout
 * or stderr would write into a socket there. A worker fills the holes with
 * /dev/null before it makes any socket, as setuid programs' C libraries do;
 * not close-on-exec, as stdio is inherited.
 */
void tpi_stdio_reserve(void) {
    for (int fd = 0; fd <= STDERR_FILENO; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            continue;
        int got = open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
        if (got >= 0 && got != fd)
            close(got); /* another thread took the hole first */
    }
}

int tpi_fd_above_stdio(int fd) {
    if (fd > STDERR_FILENO)
        return fd;
    int up = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    int e = errno;
    /* /dev/null takes its place at once (dup2 closes it): a hole left there
     * is the next descriptor made, libuv's own included (its spare for
     * EMFILE, which uv_loop_close then refuses to close: an abort). */
    int null = open("/dev/null", fd == STDIN_FILENO ? O_RDONLY : O_WRONLY);
    if (null < 0 || dup2(null, fd) != fd)
        close(fd);
    if (null >= 0)
        close(null);
    errno = e;
    return up;
}

static int wait_fd(int fd, short events, uint64_t deadline_ns) {
    for (;;) {
        int timeout_ms = -1;
        if (deadline_ns != UINT64_MAX) {
            uint64_t now = tpi_tcp_now_ns();
            if (now >= deadline_ns)
                return -ETIMEDOUT;
            uint64_t ms = tpi_tcp_ms_ceil(deadline_ns - now);
            timeout_ms = ms > 60000 ? 60000 : (int)ms;
        }
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, timeout_ms);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return -errno;
    }
}

/*
 * Whether fd is connected to itself: a connect to a local port nobody listens
 * on (a store not up yet) may be given that very port as its own ephemeral
 * one, and TCP's simultaneous open then connects the socket to itself. It
 * would echo the store handshake back as a valid answer, and hold the port
 * the store server is about to bind.
 */
static int connected_to_self(int fd) {
    struct sockaddr_storage me, peer;
    socklen_t me_len = sizeof me, peer_len = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&me, &me_len) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &peer_len) != 0)
        return 0; /* not connected after all: the first read or write says so */
    return me_len == peer_len && memcmp(&me, &peer, me_len) == 0;
}

int tpi_sock_connect(const struct sockaddr *sa, socklen_t sa_len, int timeout_ms) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = 0;
    if (connect(fd, sa, sa_len) != 0) {
        if (errno != EINPROGRESS) {
            int err = errno;
            close(fd);
            return -err;
        }
        rc = wait_fd(fd, POLLOUT, tpi_tcp_now_ns() + (uint64_t)timeout_ms * 1000000ull);
        if (rc == 0) {
            int err = 0;
            socklen_t len = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
                err = errno;
            rc = -err;
        }
    }
    if (rc == 0 && connected_to_self(fd))
        rc = -ECONNREFUSED; /* nobody listens there: the caller retries */
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

int tpi_sock_send_all(int fd, const void *p, size_t n, uint64_t deadline_ns) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k > 0) {
            b += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int rc = wait_fd(fd, POLLOUT, deadline_ns);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int tpi_sock_recv_all(int fd, void *p, size_t n, uint64_t deadline_ns) {
    uint8_t *b = p;
    while (n > 0) {
        ssize_t k = recv(fd, b, n, 0);
        if (k > 0) {
            b += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return TPI_SOCK_EOF;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int rc = wait_fd(fd, POLLIN, deadline_ns);
        if (rc < 0)
            return rc;
    }
    return 0;
}

const char *tpi_sock_strerror(int rc) {
    if (rc == TPI_SOCK_EOF)
        return "connection closed by the other end";
    if (rc == -ETIMEDOUT)
        return "timed out";
    return strerror(rc < 0 ? -rc : rc);
}
