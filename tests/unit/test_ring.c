/* test_ring.c - the executor-prefetcher job ring (store/ring.h) with real processes:
 *   - a job round trip: descriptor, rows in, rows out, counters;
 *   - a job that does not fit the geometry is refused by the server, never handed on;
 *   - a server restart bumps the generation: a job posted to the old one is never answered
 *     by the new one, and its stale result is never taken;
 *   - a dead server (kill -9) and a stopped one (SIGSTOP) end the client's wait within the
 *     stale limit, not the timeout;
 *   - a new client continues the job numbers of the last one.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/ring.h"
#include "tests/unit/check.h"

static char g_name[SHM_NAME_MAX];
static const ring_geom_t G = {.hidden = 8, .max_rows = 16, .max_items = 4};

/* A server process: answers n_jobs jobs (-1: forever) with y = 2 * x + layer, then exits 0. */
static pid_t s_server(int n_jobs)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    ring_t r;
    strata_errbuf_t eb = {{0}};
    if (ring_serve_open(&r, g_name, &G, 0, -1, &eb) < 0) {
        fprintf(stderr, "server: %s\n", eb.msg);
        _exit(3);
    }
    ring_job_t j;
    ring_item_t items[RING_MAX_ITEMS];
    for (int done = 0; n_jobs < 0 || done < n_jobs;) {
        if (ring_serve_wait(&r, &j, items, NULL, 100) <= 0) continue;
        for (int i = 0; i < j.n_items; i++)
            for (int k = items[i].row0 * G.hidden; k < (items[i].row0 + items[i].n) * G.hidden; k++)
                r.y[k] = 2 * r.x[k] + (float)j.layer;
        ring_serve_done(&r, &j, 0, 1000, 4096, NULL);
        done++;
    }
    ring_close(&r);
    _exit(0);
}

/* Wait until a server took the ring over (its generation moved past gen0). */
static int s_attach_gen(ring_t *c, uint64_t gen0)
{
    strata_errbuf_t eb = {{0}};
    for (int i = 0; i < 400; i++) {
        if (!c->ctl && ring_attach(c, g_name, &G, &eb) < 0) {
            usleep(5000);
            continue;
        }
        if (__atomic_load_n(&c->ctl->gen, __ATOMIC_ACQUIRE) > gen0 && ring_peer_up(c, 250)) return 0;
        usleep(5000);
    }
    return -1;
}

static void s_post(ring_t *c, int layer, int rows)
{
    c->ctl->items[0] = (ring_item_t){.expert = 1, .row0 = 0, .n = rows};
    for (int k = 0; k < rows * G.hidden; k++) c->x[k] = (float)k;
    for (int k = 0; k < rows * G.hidden; k++) c->y[k] = NAN; /* poisoned: unwritten rows show */
    ring_post(c, layer, 1, rows, 0, 7);
}

static bool s_rows_ok(const ring_t *c, int layer, int rows)
{
    for (int k = 0; k < rows * G.hidden; k++)
        if (c->y[k] != 2.0f * (float)k + (float)layer) return false;
    return true;
}

int main(void)
{
    snprintf(g_name, sizeof g_name, "/strata-test%d-ring-0", (int)getpid());
    shm_remove(g_name);
    ring_t c = {0};
    ring_result_t res;

    /* round trip */
    pid_t srv = s_server(-1);
    T_CHECK(s_attach_gen(&c, 0) == 0, "a server took the ring");
    uint64_t gen1 = c.ctl->gen;
    s_post(&c, 3, 5);
    int rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == 0 && res.seq == c.seq && res.gen == gen1 && res.bytes == 4096, "round trip: rc %d seq %llu", rc,
            (unsigned long long)res.seq);
    T_CHECK(s_rows_ok(&c, 3, 5), "output rows");
    T_CHECK(c.ctl->served == 1, "served counter %llu", (unsigned long long)c.ctl->served);

    /* a descriptor that does not fit: refused by the server with EINVAL_INPUT */
    c.ctl->items[0] = (ring_item_t){.expert = 0, .row0 = 14, .n = 5}; /* rows 14..18 of 16 */
    ring_post(&c, 1, 1, 16, 0, 8);
    rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(res.error, "geometry"), "out-of-range item refused: %d (%s)", rc, res.error);
    c.ctl->items[0] = (ring_item_t){.expert = 0, .row0 = 0, .n = 1};
    ring_post(&c, 1, G.max_items + 1, 1, 0, 9); /* too many items */
    rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == STRATA_EINVAL_INPUT, "too many items refused: %d", rc);
    c.n_hints = RING_MAX_HINTS + 1; /* too many read-ahead hints */
    ring_post(&c, 1, 1, 1, 0, 9);
    rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == STRATA_EINVAL_INPUT && c.n_hints == 0, "too many hints refused: %d", rc);

    /* kill -9 while a job is outstanding: the wait ends early with EIO */
    kill(srv, SIGSTOP);
    usleep(20000);
    s_post(&c, 2, 4);
    double t0 = strata_now();
    rc = ring_wait(&c, 50, 100, 5000, &res);
    double waited = strata_now() - t0;
    T_CHECK(rc == STRATA_EIO && waited < 1.0, "stopped server: rc %d after %.2f s (stale limit 0.1 s, timeout 5 s)", rc, waited);
    T_CHECK(!ring_peer_up(&c, 100), "a stopped server is down");
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    t0 = strata_now();
    rc = ring_wait(&c, 50, 60000, 5000, &res);
    T_CHECK(rc == STRATA_EIO && strata_now() - t0 < 1.0, "dead server: rc %d", rc);
    uint64_t stale_seq = c.seq;

    /* a new server: a new generation; the job posted to the old one is never answered */
    srv = s_server(-1);
    T_CHECK(s_attach_gen(&c, gen1) == 0, "the new server took the ring over");
    uint64_t gen2 = c.ctl->gen;
    T_CHECK(gen2 == gen1 + 1, "generation %llu -> %llu", (unsigned long long)gen1, (unsigned long long)gen2);
    usleep(50000);
    T_CHECK(c.ctl->done != (uint32_t)stale_seq, "the old job was not answered by the new server");
    /* a job stamped with the old generation is not served either */
    c.ctl->items[0] = (ring_item_t){.expert = 1, .row0 = 0, .n = 1};
    c.seq++;
    c.ctl->job = (ring_job_t){.seq = c.seq, .gen = gen1, .layer = 1, .n_items = 1, .n_rows = 1};
    c.gen = gen1;
    __atomic_store_n(&c.ctl->req, (uint32_t)c.seq, __ATOMIC_RELEASE);
    rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == STRATA_EIO, "a job for the old generation ends as lost: %d", rc);
    s_post(&c, 5, 16);
    rc = ring_wait(&c, 50, 250, 2000, &res);
    T_CHECK(rc == 0 && res.gen == gen2 && s_rows_ok(&c, 5, 16), "the new server answers: rc %d", rc);

    /* a new client goes on from the ring's job numbers */
    uint64_t last = c.seq;
    ring_close(&c);
    strata_errbuf_t eb = {{0}};
    T_CHECK(ring_attach(&c, g_name, &G, &eb) == 0 && c.seq == last, "seq continues: %llu vs %llu", (unsigned long long)c.seq,
            (unsigned long long)last);
    ring_geom_t other = G;
    other.hidden = 16;
    ring_t d;
    T_CHECK(ring_attach(&d, g_name, &other, &eb) == STRATA_EVERSION, "another geometry is refused: %s", eb.msg);
    s_post(&c, 6, 2);
    T_CHECK(ring_wait(&c, 50, 250, 2000, &res) == 0 && s_rows_ok(&c, 6, 2), "second client");

    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    ring_close(&c);
    shm_remove(g_name);
    return t_done("test_ring");
}
