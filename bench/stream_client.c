/* stream_client.c - http_overhead.py's client in C: n streams of one path, each arrival stamped.
 *
 * A Python client spends tens of microseconds on an arrival, and that time lands in the figures
 * of whichever path it happened to read second; this one spends about a microsecond. It runs
 * one process per call, for one path:
 *   - http: n POST requests (one TCP connection each, opened before the start), read with epoll;
 *   - zmq: n `generate` requests on one DEALER (proto/PROTOCOL.md), read with zmq_poll.
 * Each request is sent at its time (CLOCK_MONOTONIC seconds, the clock of Python's
 * time.perf_counter), or all at the start time. Every read is stamped with the time its poll
 * returned and kept raw; nothing is parsed while the streams run but what tells a stream's end
 * (the last chunk of a chunked body; a zmq frame's type and id).
 *
 * The spec comes as one JSON object on stdin:
 *   {"kind": "http"|"zmq", "port": P, "n": N, "start": T, "at": [T0, ...] | null,
 *    "timeout": S, "body": "<the HTTP request's JSON>"  (http),
 *    "prompt": "...", "max_tokens": M, "id_base": B     (zmq: greedy, ignore_eos, streamed)}
 * and the streams go to stdout, in order, each as
 *   "S <send time>\n" then per read "A <time> <bytes>\n" and the bytes, then "E\n".
 * Exit codes: 0 ok, 1 runtime failure (message on stderr), 2 usage. */
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/strata.h"
#include "proto/msg.h"
#include "proto/zmsg.h"

typedef struct {
    double t;
    size_t off, len;           /* into the stream's bytes */
} s_read_t;

typedef struct {
    int fd;                    /* http */
    double t_send;
    char *bytes;
    size_t len, cap;
    s_read_t *reads;
    size_t n_reads, cap_reads;
    bool done;
} s_stream_t;

static int s_keep(s_stream_t *s, double t, const void *p, size_t n)
{
    if (s->len + n > s->cap) {
        size_t c = s->cap ? s->cap * 2 : 4096;
        while (c < s->len + n) c *= 2;
        char *b = realloc(s->bytes, c);
        if (!b) return -1;
        s->bytes = b, s->cap = c;
    }
    if (s->n_reads == s->cap_reads) {
        size_t c = s->cap_reads ? s->cap_reads * 2 : 256;
        s_read_t *r = realloc(s->reads, c * sizeof *r);
        if (!r) return -1;
        s->reads = r, s->cap_reads = c;
    }
    memcpy(s->bytes + s->len, p, n);
    s->reads[s->n_reads++] = (s_read_t){t, s->len, n};
    s->len += n;
    return 0;
}

/* The last chunk of a chunked body ends the stream. */
static bool s_http_end(s_stream_t *s)
{
    return s->len >= 7 && !memcmp(s->bytes + s->len - 7, "\r\n0\r\n\r\n", 7);
}

static void s_wait_until(double t)
{
    for (;;) {
        const double d = t - strata_now();
        if (d <= 0) return;
        if (d > 0.0003) {
            struct timespec ts = {0, (long)((d - 0.0002) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

static int s_fail(const char *what)
{
    fprintf(stderr, "stream_client: %s: %s\n", what, strerror(errno));
    return 1;
}

static int s_http(s_stream_t *st, int n, int port, const char *body, const double *at, double start, double deadline)
{
    char head[256];
    const size_t blen = strlen(body);
    const int hl = snprintf(head, sizeof head,
                            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\n\r\n", blen);
    char *req = malloc((size_t)hl + blen);
    if (!req) return s_fail("out of memory");
    memcpy(req, head, (size_t)hl);
    memcpy(req + hl, body, blen);
    const int ep = epoll_create1(0);
    if (ep < 0) return s_fail("epoll_create1");
    for (int i = 0; i < n; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(0x7f000001)};
        const int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) return s_fail("connect");
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        st[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) return s_fail("epoll_ctl");
    }
    for (int i = 0; i < n; i++) {
        s_wait_until(at ? at[i] : start);
        st[i].t_send = strata_now();
        for (size_t o = 0; o < (size_t)hl + blen;) {
            ssize_t w = send(st[i].fd, req + o, (size_t)hl + blen - o, 0);
            if (w < 0 && errno != EINTR) return s_fail("send");
            if (w > 0) o += (size_t)w;
        }
    }
    free(req);
    char buf[1 << 16];
    struct epoll_event evs[256];
    for (int left = n; left > 0;) {
        const int k = epoll_wait(ep, evs, 256, 100);
        const double t = strata_now();
        if (t > deadline) {
            fprintf(stderr, "stream_client: http streams not done in time (%d left)\n", left);
            return 1;
        }
        if (k < 0 && errno != EINTR) return s_fail("epoll_wait");
        for (int e = 0; e < k; e++) {
            s_stream_t *s = &st[evs[e].data.u32];
            if (s->done) continue;
            ssize_t r = recv(s->fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0 || s_keep(s, t, buf, (size_t)r) < 0 || s_http_end(s)) {
                s->done = true;
                left--;
                epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
            }
        }
    }
    close(ep);
    for (int i = 0; i < n; i++) close(st[i].fd);
    return 0;
}

static int s_zmq(s_stream_t *st, int n, int port, const char *prompt, int max_tokens, uint64_t id_base, const double *at,
                 double start, double deadline)
{
    void *ctx = zmq_ctx_new(), *d = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    if (!d) return s_fail("zmq_socket");
    const int zero = 0, hwm = 1000000;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVHWM, &hwm, sizeof hwm);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    if (zmq_connect(d, ep) != 0) return s_fail("zmq_connect");
    msg_buf_t b = {0};
    usleep(50000); /* the connection up before the start */
    for (int i = 0; i < n; i++) {
        msg_t m;
        msg_init(&m, MSG_GENERATE);
        m.has_id = true;
        m.id = id_base + (uint64_t)i;
        m.u.generate.prompt = (msg_str_t){prompt, strlen(prompt)};
        m.u.generate.max_tokens = max_tokens;
        m.u.generate.ignore_eos = true;
        m.u.generate.stream = true;
        if (msg_encode(&m, &b) != 0) {
            fprintf(stderr, "stream_client: cannot encode the generate request\n");
            return 1;
        }
        s_wait_until(at ? at[i] : start);
        st[i].t_send = strata_now();
        if (zmq_send(d, b.data, b.size, 0) < 0) return s_fail("zmq_send");
    }
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    for (int left = n; left > 0;) {
        const int k = zmq_poll(&it, 1, 100);
        const double t = strata_now();
        if (t > deadline) {
            fprintf(stderr, "stream_client: zmq streams not done in time (%d left)\n", left);
            return 1;
        }
        if (k < 0 && errno != EINTR) return s_fail("zmq_poll");
        while (k > 0) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, d, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&f);
                break;
            }
            msg_t m;
            msg_err_t err;
            const int rc = msg_decode(MSG_FAM_REPLY, zmq_msg_data(&f), zmq_msg_size(&f), &m, &err);
            if (m.has_id && m.id >= id_base && m.id < id_base + (uint64_t)n) {
                s_stream_t *s = &st[m.id - id_base];
                if (!s->done) {
                    if (s_keep(s, t, zmq_msg_data(&f), zmq_msg_size(&f)) < 0) return s_fail("out of memory");
                    if (rc != 0 || m.type == MSG_DONE || m.type == MSG_ERROR) {
                        s->done = true;
                        left--;
                    }
                }
            }
            msg_free(&m);
            zmq_msg_close(&f);
        }
    }
    msg_buf_free(&b);
    zmq_close(d);
    zmq_ctx_term(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "usage: stream_client < SPEC.json   (the spec: the comment at the top of bench/stream_client.c)\n");
        return strcmp(argv[1], "-h") && strcmp(argv[1], "--help") ? 2 : 0;
    }
    json_error_t je;
    json_t *spec = json_loadf(stdin, 0, &je);
    if (!spec) {
        fprintf(stderr, "stream_client: the spec on stdin: %s (line %d)\n", je.text, je.line);
        return 2;
    }
    const char *kind = json_string_value(json_object_get(spec, "kind"));
    const int port = (int)json_integer_value(json_object_get(spec, "port"));
    const int n = (int)json_integer_value(json_object_get(spec, "n"));
    const double start = json_number_value(json_object_get(spec, "start"));
    const double timeout = json_number_value(json_object_get(spec, "timeout"));
    json_t *ja = json_object_get(spec, "at");
    if (!kind || (strcmp(kind, "http") && strcmp(kind, "zmq")) || port <= 0 || port > 65535 || n <= 0 ||
        (json_is_array(ja) && json_array_size(ja) != (size_t)n)) {
        fprintf(stderr, "stream_client: the spec needs kind http|zmq, port, n > 0 and at most n times in at\n");
        return 2;
    }
    double *at = NULL;
    if (json_is_array(ja)) {
        at = malloc((size_t)n * sizeof *at);
        if (!at) return s_fail("out of memory");
        for (int i = 0; i < n; i++) at[i] = json_number_value(json_array_get(ja, (size_t)i));
    }
    s_stream_t *st = calloc((size_t)n, sizeof *st);
    if (!st) return s_fail("out of memory");
    const double deadline = strata_now() + (timeout > 0 ? timeout : 600);
    int rc;
    if (!strcmp(kind, "http")) {
        const char *body = json_string_value(json_object_get(spec, "body"));
        if (!body) {
            fprintf(stderr, "stream_client: http needs body\n");
            return 2;
        }
        rc = s_http(st, n, port, body, at, start, deadline);
    } else {
        const char *prompt = json_string_value(json_object_get(spec, "prompt"));
        const int mt = (int)json_integer_value(json_object_get(spec, "max_tokens"));
        if (!prompt || mt < 1) {
            fprintf(stderr, "stream_client: zmq needs prompt and max_tokens >= 1\n");
            return 2;
        }
        rc = s_zmq(st, n, port, prompt, mt, (uint64_t)json_integer_value(json_object_get(spec, "id_base")), at, start,
                   deadline);
    }
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        printf("S %.9f\n", st[i].t_send);
        for (size_t r = 0; r < st[i].n_reads; r++) {
            printf("A %.9f %zu\n", st[i].reads[r].t, st[i].reads[r].len);
            fwrite(st[i].bytes + st[i].reads[r].off, 1, st[i].reads[r].len, stdout);
        }
        printf("E\n");
        free(st[i].bytes);
        free(st[i].reads);
    }
    free(st);
    free(at);
    json_decref(spec);
    return fflush(stdout) == 0 ? 0 : 1;
}
