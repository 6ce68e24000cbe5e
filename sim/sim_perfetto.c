/*
 * sim_perfetto.c: a run as Chrome trace-event JSON, which Perfetto and
 * chrome://tracing open (spec/sim.md SIM-12).
 *
 * One process per host ("host N"), with three threads: the worker's calls
 * (tid 0), its network (tid 1: a short slice per frame sent or delivered,
 * joined by a flow arrow from sender to receiver) and its faults (tid 2).
 * Calls are async slices from issue to end, named for their function and
 * closed with their status; faults and dropped frames are instants; "calls in flight" is a
 * counter per host. Times are virtual microseconds with ns precision. The
 * output is deterministic like the text trace: same seed, same bytes.
 */
#include <stdio.h>

#include "sim_internal.h"

#define TID_CALLS 0
#define TID_NET 1
#define TID_FAULTS 2

static FILE *out(const tp_sim *sim) {
    return sim->cfg.perfetto;
}

/* The separator before each event: none before the first. */
static void sep(tp_sim *sim) {
    fputs(sim->pf_events++ ? ",\n" : "\n", out(sim));
}

static double us(uint64_t ns) {
    return (double)ns / 1000.0;
}

void tpi_sim_pf_begin(tp_sim *sim) {
    if (!out(sim))
        return;
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", out(sim));
    for (uint32_t h = 0; h < sim->cfg.hosts; h++)
        tpi_sim_pf_host(sim, h);
}

void tpi_sim_pf_host(tp_sim *sim, uint32_t h) {
    if (!out(sim))
        return;
    static const char *const threads[] = {"calls", "network", "faults"};
    const tpi_sim_host *host = &sim->hosts[h];
    sep(sim);
    if (host->incarnation) /* a restart (SIM-5): which rank it took over */
        fprintf(out(sim),
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"tid\":0,"
                "\"args\":{\"name\":\"host %u (rank %u, incarnation %u)\"}}",
                h, h, host->rank, host->incarnation);
    else
        fprintf(out(sim),
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"tid\":0,"
                "\"args\":{\"name\":\"host %u\"}}",
                h, h);
    for (int t = 0; t < 3; t++) {
        sep(sim);
        fprintf(out(sim),
                "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%d,"
                "\"args\":{\"name\":\"%s\"}}",
                h, t, threads[t]);
    }
}

void tpi_sim_pf_end(tp_sim *sim) {
    if (!out(sim))
        return;
    fputs("\n]}\n", out(sim));
}

/* A call's async slice: begin at issue, end with its status. The id joins
 * them: the host in the high bits, the call id below. */
void tpi_sim_pf_call(tp_sim *sim, uint32_t host, uint64_t id, const char *fn, int begin,
                     tp_status st, uint32_t in_flight) {
    if (!out(sim))
        return;
    unsigned long long aid = ((unsigned long long)host << 40) | (id & 0xffffffffffull);
    sep(sim);
    if (begin)
        fprintf(out(sim),
                "{\"ph\":\"b\",\"cat\":\"call\",\"name\":\"%s\",\"id\":\"0x%llx\",\"pid\":%u,"
                "\"tid\":%d,\"ts\":%.3f,\"args\":{\"call\":%llu}}",
                fn[0] ? fn : "call", aid, host, TID_CALLS, us(sim->now_ns),
                (unsigned long long)id);
    else
        fprintf(out(sim),
                "{\"ph\":\"e\",\"cat\":\"call\",\"name\":\"%s\",\"id\":\"0x%llx\",\"pid\":%u,"
                "\"tid\":%d,\"ts\":%.3f,\"args\":{\"status\":\"%s\"}}",
                fn[0] ? fn : "call", aid, host, TID_CALLS, us(sim->now_ns), tp_status_name(st));
    sep(sim);
    fprintf(out(sim),
            "{\"ph\":\"C\",\"name\":\"calls in flight\",\"pid\":%u,\"tid\":%d,\"ts\":%.3f,"
            "\"args\":{\"calls\":%u}}",
            host, TID_CALLS, us(sim->now_ns), in_flight);
}

/* A frame leaving or arriving: a 1 ns slice on the network thread named for
 * what happened (TPI_SIM_PF_*), and the flow arrow's start or end bound to
 * it. Every delivery has a send with its id: a duplicate gets its own send
 * slice when the copy is made, and a frame lost at the sender starts no
 * arrow (its drop is an instant, tpi_sim_pf_drop). */
void tpi_sim_pf_msg(tp_sim *sim, uint32_t host, uint64_t msg, int how, size_t len,
                    unsigned type) {
    static const char *const names[] = {"deliver", "send", "send (duplicate)",
                                        "send (held back)", "send (lost)"};
    TPI_ASSERT(how >= TPI_SIM_PF_DELIVER && how <= TPI_SIM_PF_SEND_LOST);
    if (!out(sim))
        return;
    sep(sim);
    fprintf(out(sim),
            "{\"ph\":\"X\",\"cat\":\"net\",\"name\":\"%s type %u\",\"pid\":%u,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":0.001,\"args\":{\"msg\":%llu,\"bytes\":%zu}}",
            names[how], type, host, TID_NET, us(sim->now_ns), (unsigned long long)msg, len);
    if (how == TPI_SIM_PF_SEND_LOST)
        return;
    sep(sim);
    fprintf(out(sim),
            "{\"ph\":\"%s\",\"cat\":\"net\",\"name\":\"frame\",\"id\":%llu,\"pid\":%u,"
            "\"tid\":%d,\"ts\":%.3f%s}",
            how != TPI_SIM_PF_DELIVER ? "s" : "f", (unsigned long long)msg, host, TID_NET,
            us(sim->now_ns), how != TPI_SIM_PF_DELIVER ? "" : ",\"bp\":\"e\"");
}

/* A frame that never arrived, as an instant on the network thread of the
 * host it was meant for, saying why (the text trace's drop word). */
void tpi_sim_pf_drop(tp_sim *sim, uint32_t host, uint64_t msg, const char *why) {
    if (!out(sim))
        return;
    sep(sim);
    fprintf(out(sim),
            "{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"net\",\"name\":\"dropped (%s)\",\"pid\":%u,"
            "\"tid\":%d,\"ts\":%.3f,\"args\":{\"msg\":%llu}}",
            why, host, TID_NET, us(sim->now_ns), (unsigned long long)msg);
}

/* A fault, as an instant on the host it concerns (a, and b when a pair). */
void tpi_sim_pf_fault(tp_sim *sim, const char *what, uint32_t a, uint32_t b) {
    if (!out(sim))
        return;
    for (int k = 0; k < (b == UINT32_MAX ? 1 : 2); k++) {
        sep(sim);
        uint32_t host = k ? b : a;
        if (b == UINT32_MAX)
            fprintf(out(sim),
                    "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"fault\",\"name\":\"%s\",\"pid\":%u,"
                    "\"tid\":%d,\"ts\":%.3f}",
                    what, host, TID_FAULTS, us(sim->now_ns));
        else
            fprintf(out(sim),
                    "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"fault\",\"name\":\"%s %u-%u\","
                    "\"pid\":%u,\"tid\":%d,\"ts\":%.3f}",
                    what, a, b, host, TID_FAULTS, us(sim->now_ns));
    }
}
