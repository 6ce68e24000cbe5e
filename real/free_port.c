/*
 * free_port.c: a TCP port nobody uses now (see free_port.h).
 */
#include "free_port.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

unsigned tpi_ephemeral_low(void) {
    unsigned lo = 32768, a, b;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (f) {
        if (fscanf(f, "%u %u", &a, &b) == 2 && a <= b && b <= 65535)
            lo = a;
        fclose(f);
    }
    return lo;
}

/* Whether a stream socket can bind ai's address with port now (without
 * SO_REUSEADDR: a port whose connections linger in TIME_WAIT is taken). */
static int bindable(const struct addrinfo *ai, unsigned port) {
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && bind(fd, (const struct sockaddr *)&sa, ai->ai_addrlen) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int tpi_free_port(const char *addr, unsigned *port, char *err, size_t errlen) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(addr, "0", &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", addr, gai_strerror(rc));
        return -1;
    }
    unsigned lo = tpi_ephemeral_low();
    for (int i = 0; lo > TPI_FREE_PORT_LOW + 1000 && i < TPI_FREE_PORT_TRIES; i++) {
        uint32_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            break;
        unsigned p = TPI_FREE_PORT_LOW + r % (lo - TPI_FREE_PORT_LOW);
        if (bindable(res, p)) {
            freeaddrinfo(res);
            *port = p;
            return 0;
        }
    }
    /* No room below the range, or none free there: the kernel's choice. */
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        snprintf(err, errlen, "cannot find a free port on %s: %s", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    *port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                     : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    close(fd);
    freeaddrinfo(res);
    return 0;
}
