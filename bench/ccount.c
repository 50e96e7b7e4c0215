/*
 * ccount: a C counting receiver for the benchmarks.
 *
 *   ccount ENDPOINT COUNT [IDLE_SECONDS] [--stay]
 *
 * Binds a PULL socket on ENDPOINT with RCVHWM 0 (no bound: it never pushes back
 * on the sender) and counts events: a frame's events are the occurrences of
 * {"message": in it.  That is exact for zmqpush's wire format (an object, or an
 * array of objects) since a raw '"' never occurs inside an escaped string, and
 * it also counts what json.dumps sends with its default separators
 * ({"message": "...), as bench/naive.py does.  Nothing is parsed or validated
 * (bench/sink.py does that).  The environment variable CCOUNT_NEEDLE, when
 * set, is counted instead: e.g. {"level": for bench/corpus.py --json lines
 * merged by zmqpush --json, which carry no "message".
 *
 * Ends when COUNT events have arrived (0: no limit), when IDLE_SECONDS (default
 * 10; 0: never) pass without a frame, or on SIGTERM/SIGINT, and then prints
 *   received N events in S s
 * on stdout, S running from the first frame to the last, and on stderr
 *   ccount: F frames, first at T0, last at T1 (CLOCK_MONOTONIC)
 * (Python's time.monotonic() reads the same clock).  Once bound it prints
 *   ccount: bound ENDPOINT
 * on stderr with the actual endpoint (so tcp://127.0.0.1:* picks a free port).
 * CCOUNT_BINDS=N binds ENDPOINT N times (N ports with tcp://127.0.0.1:*), one
 * line each: one socket then stands for N receivers (bench/receivers.py).
 *
 * With --stay, reaching COUNT prints those lines at once but keeps the socket
 * open until SIGTERM/SIGINT or IDLE_SECONDS without a frame: a sender that is
 * still closing then sees no receiver go away (zmqpush would replay what may
 * have been in flight).  Events arriving after that are reported at exit as
 *   then M more events
 * Build: cc -O2 -o ccount ccount.c -lzmq
 */
#define _GNU_SOURCE     /* memmem */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static const char *needle = "{\"message\":";
static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned long long events_in(const char *data, size_t len)
{
    const size_t n = strlen(needle);
    unsigned long long count = 0;
    const char *end = data + len, *p = data;

    while ((p = memmem(p, end - p, needle, n)) != NULL) {
        count++;
        p += n;
    }
    return count;
}

static void report(unsigned long long received, unsigned long long frames,
                   double first, double last)
{
    printf("received %llu events in %.3f s\n", received, last - first);
    fflush(stdout);
    fprintf(stderr, "ccount: %llu frames, first at %.6f, last at %.6f (CLOCK_MONOTONIC)\n",
            frames, first, last);
    fflush(stderr);
}

int main(int argc, char **argv)
{
    int stay = argc > 3 && strcmp(argv[argc - 1], "--stay") == 0;
    if (stay)
        argc--;
    if (argc < 3 || argc > 4) {
        fputs("usage: ccount ENDPOINT COUNT [IDLE_SECONDS] [--stay]\n", stderr);
        return 2;
    }
    if (getenv("CCOUNT_NEEDLE") && *getenv("CCOUNT_NEEDLE"))
        needle = getenv("CCOUNT_NEEDLE");
    const char *endpoint = argv[1];
    unsigned long long want = strtoull(argv[2], NULL, 10), received = 0, frames = 0;
    unsigned long long reported = 0;
    double idle = argc > 3 ? atof(argv[3]) : 10.0, first = 0, last = 0;
    int hwm = 0, linger = 0, done = 0;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;   /* no SA_RESTART: zmq_poll returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_PULL);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    int binds = getenv("CCOUNT_BINDS") ? atoi(getenv("CCOUNT_BINDS")) : 1;
    for (int i = 0; i < (binds > 0 ? binds : 1); i++) {
        if (zmq_bind(sock, endpoint) < 0) {
            fprintf(stderr, "ccount: %s: %s\n", endpoint, zmq_strerror(errno));
            return 1;
        }
        char bound[256];
        size_t bound_len = sizeof bound;
        zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &bound_len);
        fprintf(stderr, "ccount: bound %s\n", bound);
    }
    fflush(stderr);

    zmq_msg_t msg;
    zmq_msg_init(&msg);
    zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
    long timeout = idle > 0 ? (long)(idle * 1000) : -1;
    while (!stopping && !(done && !stay)) {
        int rc = zmq_poll(&item, 1, timeout);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "ccount: zmq_poll: %s\n", zmq_strerror(errno));
            break;
        }
        if (rc == 0)
            break;              /* idle */
        int got = 0;
        while (!(want && received >= want && !stay)
               && zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) >= 0) {
            if (first == 0)
                first = now();
            received += events_in(zmq_msg_data(&msg), zmq_msg_size(&msg));
            frames++;
            got = 1;
        }
        if (got && !done)
            last = now();
        if (!done && want && received >= want) {
            report(received, frames, first, last);
            reported = received;
            done = 1;
        }
    }
    zmq_msg_close(&msg);
    if (!done)
        report(received, frames, first, last);
    else if (received > reported)
        printf("then %llu more events\n", received - reported);
    fflush(stdout);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}
