/*
 * tcp_thread.h: how the library starts its own threads (TCP-1), shared by
 * the TCP backend and the etcd store's lease keepalive (store/etcd_store.c).
 */
#ifndef TP_REAL_TCP_THREAD_H
#define TP_REAL_TCP_THREAD_H

#include <pthread.h>

/* pthread_create with every asynchronous signal blocked in the new thread,
 * so SIGINT and SIGTERM reach the application's threads and SIGPIPE never
 * kills us; faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT) stay
 * deliverable so a crash, or a sanitizer, reports as usual. pthread_create's
 * return value. Any thread. */
int tpi_tcp_thread_create(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
