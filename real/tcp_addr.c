/*
 * tcp_addr.c: worker and store addresses as text ("host:port",
 * "[v6]:port") and as socket addresses (spec/tcp.md TCP-2).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_internal.h"

int tpi_tcp_split_hostport(const char *s, char *host, size_t host_len, char *port,
                           size_t port_len) {
    if (!s || !*s)
        return -1;
    const char *colon;
    const char *h = s;
    size_t hl;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return -1;
        h = s + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return -1; /* a bare IPv6 address needs brackets */
        hl = (size_t)(colon - s);
    }
    size_t pl = strlen(colon + 1);
    if (hl == 0 || hl >= host_len || pl == 0 || pl >= port_len)
        return -1;
    /* No host has a bracket (tpi_tcp_unbracket's rule too): "[[x]:1" would
     * give "[x", which formats as "[x:1", an address that does not split. */
    if (memchr(h, '[', hl) || memchr(h, ']', hl))
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    memcpy(port, colon + 1, pl + 1);
    return 0;
}

int tpi_tcp_unbracket(const char *s, char *out, size_t out_len) {
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n == 0 || n >= out_len || memchr(s, '[', n) || memchr(s, ']', n))
        return -1;
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

int tpi_tcp_parse_port(const char *s, int allow_zero, uint16_t *port) {
    if (!s || !*s || strlen(s) > 5)
        return -1;
    unsigned v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (unsigned)(*p - '0');
    }
    if (v > 65535 || (v == 0 && !allow_zero))
        return -1;
    *port = (uint16_t)v;
    return 0;
}

tp_status tpi_tcp_resolve(const char *host, uint16_t port, struct sockaddr_storage *sa,
                          socklen_t *sa_len, char *errmsg, size_t errmsg_len) {
    char serv[8];
    snprintf(serv, sizeof serv, "%u", (unsigned)port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, serv, &hints, &res);
    if (rc == EAI_NONAME) {
        /* Not a literal address: a host name, resolved once here. */
        hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
        rc = getaddrinfo(host, serv, &hints, &res);
    }
    if (rc != 0 || !res) {
        tpi_format(errmsg, errmsg_len, "cannot resolve host '%s': %s", host,
                   rc ? gai_strerror(rc) : "no address");
        if (res)
            freeaddrinfo(res);
        return TP_EINVAL;
    }
    TPI_ASSERT(res->ai_addrlen <= sizeof *sa);
    memset(sa, 0, sizeof *sa);
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *sa_len = res->ai_addrlen;
    freeaddrinfo(res);
    return TP_OK;
}

/* Whether sa is a loopback address (127/8, ::1, or v4-mapped 127/8). */
static int sa_is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int tpi_tcp_local_addr_toward(const char *host, char *out, size_t len) {
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    char err[TP_ERRMSG_LEN_MAX];
    /* Any port: connect() on a datagram socket only picks the route. */
    if (tpi_tcp_resolve(host, 9, &sa, &sa_len, err, sizeof err) != TP_OK)
        return -1;
    if (sa_is_loopback((const struct sockaddr *)&sa)) {
        tpi_format(out, len, "%s", sa.ss_family == AF_INET6 ? "::1" : "127.0.0.1");
        return 0;
    }
    int fd = socket(sa.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_storage me;
    socklen_t me_len = sizeof me;
    int ok = connect(fd, (const struct sockaddr *)&sa, sa_len) == 0 &&
             getsockname(fd, (struct sockaddr *)&me, &me_len) == 0;
    close(fd);
    const void *addr = me.ss_family == AF_INET6
                           ? (const void *)&((const struct sockaddr_in6 *)&me)->sin6_addr
                           : (const void *)&((const struct sockaddr_in *)&me)->sin_addr;
    if (!ok || !inet_ntop(me.ss_family, addr, out, (socklen_t)len))
        return -1;
    return 0;
}

void tpi_tcp_format_hostport(const char *host, uint16_t port, char *buf, size_t len) {
    if (strchr(host, ':'))
        tpi_format(buf, len, "[%s]:%u", host, (unsigned)port);
    else
        tpi_format(buf, len, "%s:%u", host, (unsigned)port);
}

void tpi_tcp_format_sockaddr(const struct sockaddr *sa, char *buf, size_t len) {
    char host[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    tpi_tcp_format_hostport(host, port, buf, len);
}
