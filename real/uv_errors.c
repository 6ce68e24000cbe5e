/*
 * uv_errors.c: libuv and errno codes become tp_status here, at the edge of
 * real/ (STYLE 3). Messages keep the system's own text (uv_strerror,
 * strerror) next to the address they concern; only statuses cross into
 * common/.
 */
#include <errno.h>

#include "tcp_internal.h"

tp_status tpi_errno_status(int err, tp_status fallback) {
    switch (err) {
    case 0:
        return TP_OK;
    case EADDRINUSE:
        return TP_EADDRINUSE;
    case ECONNREFUSED:
        return TP_ECONNREFUSED;
    case ENOMEM:
    case ENOBUFS:
        return TP_ENOMEM;
    case ETIMEDOUT:
        return TP_ETIMEDOUT;
    case EINVAL:
    case EAFNOSUPPORT:
        return TP_EINVAL;
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EIO:
        return TP_EIO;
    default:
        return fallback;
    }
}

tp_status tpi_uv_status(int uverr, tp_status fallback) {
    if (uverr == UV_EOF)
        return TP_EIO;
    /* On Unix a libuv error is a negated errno. */
    return uverr < 0 ? tpi_errno_status(-uverr, fallback) : TP_OK;
}

int tpi_uv_err_means_dead(int uverr) {
    /* The process at the other end closed (or its kernel did, for it) or no
     * process listens at its address: it is gone. A timeout or an
     * unreachable network says nothing about the process (TCP-6). */
    switch (uverr) {
    case UV_EOF:
    case UV_ECONNREFUSED:
    case UV_ECONNRESET:
    case UV_EPIPE:
        return 1;
    default:
        return 0;
    }
}
