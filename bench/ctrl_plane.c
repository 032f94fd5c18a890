/* ctrl_plane.c - the control plane's cost per decode step: ZeroMQ + msgpack.
 *
 * One step of the group moves, besides the model's own work:
 *   scheduler -> executor   a `step` plan (n sequences, one token each, block tables)
 *   executor -> scheduler   a `result` (n sampled tokens)
 *   scheduler -> router     one `step_tokens` event with the n new tokens (one `tokens` event
 *                           per sequence before; ARCHITECTURE.md has both figures)
 * This benchmark runs that exchange between threads over real ipc:// sockets with the proto
 * codecs (encode, send, receive, decode on both sides) and reports, per step, the wall time of
 * the whole exchange and the codec share of it. The executor side does no model work, so the
 * figure is exactly the overhead a step pays for being split into processes.
 *
 *   bench/ctrl_plane [--steps N] [--json FILE]
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/msg.h"
#include "proto/zmsg.h"

#define BLOCK 16

typedef struct {
    void *zctx;
    char exec_ep[256], router_ep[256];
    int n_seqs, ctx_len, steps;
    volatile int ready;
    double cpu_exec, cpu_router;  /* CPU seconds the executor / router threads used */
} bench_t;

/* CPU time of the calling thread, seconds: unlike wall time, not inflated by other load. */
static double s_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void s_die(const char *what)
{
    fprintf(stderr, "ctrl_plane: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

/* The executor: receive a step, decode it, answer with a result. */
static void *s_executor(void *arg)
{
    bench_t *b = arg;
    void *s = zmq_socket(b->zctx, ZMQ_ROUTER);
    if (zmq_bind(s, b->exec_ep) < 0) s_die("bind executor");
    b->ready = 1;
    msg_buf_t buf = {0};
    uint64_t *reqs = malloc(sizeof(uint64_t) * MSG_MAX_STEP_SEQS);
    int32_t *toks = malloc(sizeof(int32_t) * MSG_MAX_STEP_SEQS);
    double c0 = 0;
    for (int i = 0; i < b->steps + 10; i++) {
        if (i == 10) c0 = s_cpu();
        zmq_msg_t id, f;
        zmq_msg_init(&id);
        zmq_msg_init(&f);
        if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&f, s, 0) < 0) s_die("executor recv");
        msg_t m;
        msg_err_t err;
        if (msg_decode(MSG_FAM_EXEC_IN, zmq_msg_data(&f), zmq_msg_size(&f), &m, &err) < 0) {
            fprintf(stderr, "ctrl_plane: executor: %s\n", err.text);
            exit(1);
        }
        msg_t r;
        msg_init(&r, MSG_STEP_RESULT);
        r.has_id = true;
        r.id = m.id;
        r.u.result.instance = 1;
        r.u.result.n_seqs = m.u.step.n_seqs;
        for (int k = 0; k < m.u.step.n_seqs; k++) {
            reqs[k] = m.u.step.seqs[k].req;
            toks[k] = m.u.step.seqs[k].tokens[0] + 1;
        }
        r.u.result.reqs = reqs;
        r.u.result.tokens = toks;
        r.u.result.forward_us = 1000;
        if (zmsg_send(s, zmq_msg_data(&id), zmq_msg_size(&id), &r, &buf, 0) < 0) s_die("executor send");
        msg_free(&m);
        zmq_msg_close(&id);
        zmq_msg_close(&f);
    }
    b->cpu_exec = s_cpu() - c0;
    free(reqs);
    free(toks);
    msg_buf_free(&buf);
    zmq_close(s);
    return NULL;
}

/* The router: receive one step_tokens event per step and decode it. */
static void *s_router(void *arg)
{
    bench_t *b = arg;
    void *s = zmq_socket(b->zctx, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, "router", 6);
    if (zmq_connect(s, b->router_ep) < 0) s_die("connect router");
    b->ready = 2;
    long total = (long)b->steps + 10 + 1; /* + the hello */
    double c0 = 0;
    for (long i = 0; i < total; i++) {
        if (i == 11) c0 = s_cpu();
        msg_t m;
        msg_err_t err;
        if (zmsg_recv(s, MSG_FAM_SCHED_OUT, &m, &err, 0) < 0) {
            fprintf(stderr, "ctrl_plane: router: %s\n", err.text);
            exit(1);
        }
        msg_free(&m);
    }
    b->cpu_router = s_cpu() - c0;
    zmq_close(s);
    return NULL;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int n_seqs, ctx_len;
    double p50, p99, mean;   /* µs per step, whole exchange */
    double codec_us;         /* CPU µs per step spent in encode/decode (measured apart) */
    double cpu_us;           /* CPU µs per step of the three threads together (codec + ZeroMQ) */
    size_t plan_bytes, result_bytes;
} row_t;

static void s_step_tokens(msg_t *ev, int n, const uint64_t *reqs, const int32_t *index, const int32_t *tokens)
{
    msg_init(ev, MSG_SCHED_STEP_TOKENS);
    ev->u.step_tokens = (msg_step_tokens_t){.n = n, .reqs = reqs, .index = index, .tokens = tokens};
}

static row_t s_run(int n_seqs, int ctx_len, int steps, const char *dir)
{
    bench_t b = {0};
    b.zctx = zmq_ctx_new();
    b.n_seqs = n_seqs;
    b.ctx_len = ctx_len;
    b.steps = steps;
    snprintf(b.exec_ep, sizeof b.exec_ep, "ipc://%s/exec.sock", dir);
    snprintf(b.router_ep, sizeof b.router_ep, "ipc://%s/sched.sock", dir);

    void *to_router = zmq_socket(b.zctx, ZMQ_ROUTER);
    int one = 1;
    zmq_setsockopt(to_router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (zmq_bind(to_router, b.router_ep) < 0) s_die("bind scheduler");
    pthread_t te, tr;
    pthread_create(&te, NULL, s_executor, &b);
    while (b.ready < 1) usleep(100);
    pthread_create(&tr, NULL, s_router, &b);
    while (b.ready < 2) usleep(100);
    void *to_exec = zmq_socket(b.zctx, ZMQ_DEALER);
    if (zmq_connect(to_exec, b.exec_ep) < 0) s_die("connect executor");
    /* wait until the router's connection is routable */
    msg_buf_t buf = {0};
    msg_t hello;
    msg_init(&hello, MSG_SCHED_HELLO_REPLY);
    hello.u.hello.model = msg_str("bench");
    while (zmsg_send(to_router, "router", 6, &hello, &buf, ZMQ_DONTWAIT) < 0) usleep(1000);

    /* a decode step: each sequence one token at a position near ctx_len, its block table */
    int nb = ctx_len / BLOCK + 1;
    msg_step_seq_t *seqs = calloc((size_t)n_seqs, sizeof *seqs);
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)(n_seqs * nb));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_seqs);
    for (int i = 0; i < n_seqs; i++) {
        tok[i] = 1000 + i;
        for (int k = 0; k < nb; k++) blocks[i * nb + k] = i * nb + k;
        seqs[i] = (msg_step_seq_t){.req = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), .pos0 = ctx_len - 1, .n_tokens = 1,
                                   .tokens = &tok[i], .n_blocks = nb, .blocks = &blocks[i * nb], .sample = true,
                                   .samp = {0.7f, 0.95f, 40, 42}, .n_sampled = (uint64_t)ctx_len / 2};
    }
    int32_t *index = malloc(sizeof(int32_t) * (size_t)n_seqs); /* generated-token index per sequence */
    for (int i = 0; i < n_seqs; i++) index[i] = ctx_len / 2;
    double *lat = malloc(sizeof(double) * (size_t)steps);
    row_t row = {n_seqs, ctx_len, 0, 0, 0, 0, 0, 0, 0};
    double cpu_main = 0;
    for (int st = 0; st < steps + 10; st++) {
        if (st == 10) cpu_main = s_cpu();
        double t0 = strata_now();
        msg_t plan;
        msg_init(&plan, MSG_STEP);
        plan.has_id = true;
        plan.id = (uint64_t)st;
        plan.u.step.instance = 1;
        plan.u.step.seqs = seqs;
        plan.u.step.n_seqs = n_seqs;
        if (zmsg_send(to_exec, NULL, 0, &plan, &buf, 0) < 0) s_die("send step");
        row.plan_bytes = buf.size;
        msg_t res;
        msg_err_t err;
        if (zmsg_recv(to_exec, MSG_FAM_EXEC_OUT, &res, &err, 0) < 0) {
            fprintf(stderr, "ctrl_plane: %s\n", err.text);
            exit(1);
        }
        /* the sampled tokens to the router, one event for the step (as the scheduler does) */
        msg_t ev;
        s_step_tokens(&ev, res.u.result.n_seqs, res.u.result.reqs, index, res.u.result.tokens);
        if (zmsg_send(to_router, "router", 6, &ev, &buf, 0) < 0) s_die("send tokens");
        msg_free(&res);
        double t1 = strata_now();
        if (st >= 10) lat[st - 10] = (t1 - t0) * 1e6;
    }
    cpu_main = s_cpu() - cpu_main;
    pthread_join(te, NULL);
    pthread_join(tr, NULL);
    row.cpu_us = (cpu_main + b.cpu_exec + b.cpu_router) * 1e6 / steps;

    /* the codecs alone, for the share they take */
    int reps = 2000;
    double c0 = s_cpu();
    uint64_t *rq = malloc(sizeof(uint64_t) * (size_t)n_seqs);
    for (int i = 0; i < n_seqs; i++) rq[i] = seqs[i].req;
    for (int r = 0; r < reps; r++) {
        msg_t plan, d, res, ev;
        msg_err_t err;
        msg_init(&plan, MSG_STEP);
        plan.has_id = true;
        plan.u.step.instance = 1;
        plan.u.step.seqs = seqs;
        plan.u.step.n_seqs = n_seqs;
        msg_encode(&plan, &buf);
        msg_decode(MSG_FAM_EXEC_IN, buf.data, buf.size, &d, &err);
        msg_free(&d);
        msg_init(&res, MSG_STEP_RESULT);
        res.has_id = true;
        res.u.result.instance = 1;
        res.u.result.n_seqs = n_seqs;
        res.u.result.reqs = rq;
        res.u.result.tokens = tok;
        msg_encode(&res, &buf);
        row.result_bytes = buf.size;
        msg_decode(MSG_FAM_EXEC_OUT, buf.data, buf.size, &d, &err);
        msg_free(&d);
        s_step_tokens(&ev, n_seqs, rq, index, tok);
        msg_encode(&ev, &buf);
        msg_decode(MSG_FAM_SCHED_OUT, buf.data, buf.size, &d, &err);
        msg_free(&d);
    }
    row.codec_us = (s_cpu() - c0) * 1e6 / reps;

    qsort(lat, (size_t)steps, sizeof *lat, s_cmp);
    double sum = 0;
    for (int i = 0; i < steps; i++) sum += lat[i];
    row.mean = sum / steps;
    row.p50 = lat[steps / 2];
    row.p99 = lat[(int)(steps * 0.99)];
    free(lat);
    free(rq);
    free(seqs);
    free(blocks);
    free(tok);
    free(index);
    msg_buf_free(&buf);
    zmq_close(to_exec);
    zmq_close(to_router);
    zmq_ctx_term(b.zctx);
    return row;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"steps", required_argument, 0, 's'}, {"json", required_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int steps = 2000, c;
    const char *json = NULL;
    while ((c = getopt_long(argc, argv, "s:j:h", opts, NULL)) != -1) {
        if (c == 's') steps = atoi(optarg);
        else if (c == 'j') json = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: ctrl_plane [--steps N] [--json FILE]\n\n"
                    "Control-plane cost of one decode step (step plan + result over ipc, plus the step's\n"
                    "step_tokens event to the router): ZeroMQ + msgpack, in microseconds.\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (steps < 100) steps = 100;
    char dir[] = "/tmp/strata-ctrl-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    static const int cases[][2] = {{1, 128}, {8, 512}, {32, 512}, {64, 1024}, {256, 2048}};
    row_t rows[5];
    printf("wall: one step's exchange, end to end; cpu: CPU time of all three sides per step (ZeroMQ + msgpack);\n"
           "codec: CPU time of the encode/decode part alone. Wall times include scheduling delays under load.\n\n");
    printf("%-6s %-8s %11s %9s %10s %10s %10s %9s %9s %8s\n", "seqs", "context", "plan bytes", "result B", "p50 us",
           "p99 us", "mean us", "cpu us", "codec us", "cpu<100");
    for (int i = 0; i < 5; i++) {
        rows[i] = s_run(cases[i][0], cases[i][1], steps, dir);
        row_t *r = &rows[i];
        printf("%-6d %-8d %11zu %9zu %10.1f %10.1f %10.1f %9.1f %9.1f %8s\n", r->n_seqs, r->ctx_len, r->plan_bytes,
               r->result_bytes, r->p50, r->p99, r->mean, r->cpu_us, r->codec_us, r->cpu_us < 100 ? "yes" : "no");
    }
    char path[300];
    snprintf(path, sizeof path, "%s/exec.sock", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/sched.sock", dir);
    unlink(path);
    rmdir(dir);
    FILE *f = json ? fopen(json, "w") : stdout;
    if (!f) {
        perror(json);
        return 1;
    }
    fprintf(f, "{\"bench\": \"ctrl_plane\", \"unit\": \"us_per_step\", \"steps\": %d, \"rows\": [", steps);
    for (int i = 0; i < 5; i++)
        fprintf(f,
                "%s{\"seqs\": %d, \"context\": %d, \"plan_bytes\": %zu, \"result_bytes\": %zu, \"p50_us\": %.2f, "
                "\"p99_us\": %.2f, \"mean_us\": %.2f, \"cpu_us\": %.2f, \"codec_us\": %.2f}",
                i ? ", " : "", rows[i].n_seqs, rows[i].ctx_len, rows[i].plan_bytes, rows[i].result_bytes, rows[i].p50,
                rows[i].p99, rows[i].mean, rows[i].cpu_us, rows[i].codec_us);
    fprintf(f, "]}\n");
    if (json) fclose(f);
    return 0;
}
