/* test_config.c - the group config parser (common/config.c), cpulists (common/placement.c)
 * and the notify datagram parser (common/notify.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/notify.h"
#include "common/placement.h"
#include "tests/unit/check.h"

static void test_defaults(void)
{
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    int rc = config_parse(&c, "", "empty.ini", &eb);
    T_CHECK(rc == 0, "empty config: %d %s", rc, eb.msg);
    T_CHECK(!strcmp(c.name, "strata"), "name %s", c.name);
    T_CHECK(!strcmp(c.run_dir, "/tmp/strata-strata"), "run_dir %s", c.run_dir);
    T_CHECK(!strcmp(c.router.endpoint, "tcp://127.0.0.1:7757"), "router ep %s", c.router.endpoint);
    T_CHECK(!strcmp(c.scheduler.endpoint, "ipc:///tmp/strata-strata/scheduler.sock"), "sched ep %s", c.scheduler.endpoint);
    T_CHECK(!strcmp(c.executor.endpoint, "ipc:///tmp/strata-strata/executor.sock"), "exec ep %s", c.executor.endpoint);
    T_CHECK(c.n_prefetchers == 1 && c.prefetcher[0].node == 0, "default prefetcher");
    T_CHECK(!strcmp(c.prefetcher[0].endpoint, "ipc:///tmp/strata-strata/prefetcher-0.sock"), "pf ep %s", c.prefetcher[0].endpoint);
    T_CHECK(c.router.max_frame_bytes == 1048576 && c.router.max_queue == 1024 && c.router.max_inflight_per_client == 64, "router ints");
    T_CHECK(!strcmp(c.router.place.cpus, "0-1") && c.router.place.numa_node == -1, "router place");
    T_CHECK(c.scheduler.max_batch_tokens == 256 && c.scheduler.max_seqs == 64 && c.scheduler.kv_blocks == 2048 &&
                c.scheduler.block_size == 16 && c.scheduler.max_context == 0, "scheduler ints");
    T_CHECK(!strcmp(c.executor.backend, "cpu") && c.executor.threads == 0 && c.executor.gpu_mem == 0 && c.executor.prefetch_depth == -1 && !c.executor.cpu_act[0],
            "executor");
    T_CHECK(c.launcher.restart_backoff_ms == 200 && c.launcher.restart_backoff_max_ms == 10000 &&
                c.launcher.ready_timeout_s == 60 && c.launcher.watchdog_s == 30, "launcher");
    T_CHECK(c.tokenizer[0] == 0, "no tokenizer without model");
}

static void test_full(void)
{
    const char *text =
        "; a comment\n"
        "# another\n"
        "[group]\n"
        "name = g1\n"
        "model = /models/tiny   ; inline comment\n"
        "run_dir = /tmp/rd\n"
        "[router]\n"
        "endpoint = tcp://127.0.0.1:9000\n"
        "max_frame_bytes = 64K\n"
        "max_queue = 10\n"
        "max_inflight_per_client = 3\n"
        "cpus = 0\n"
        "numa_node = 0\n"
        "[scheduler]\n"
        "max_batch_tokens = 128\n"
        "max_seqs = 32\n"
        "kv_blocks = 100\n"
        "block_size = 8\n"
        "max_context = 512\n"
        "cpus = 1\n"
        "[executor]\n"
        "endpoint = ipc://{run_dir}/x/{run_dir}.sock\n"
        "backend = cuda\n"
        "threads = 4\n"
        "gpu_mem = 16GiB\n"
        "prefetch_depth = 6\n"
        "expert_cache = whole\n"
        "cpu_act = q8\n"
        "cpus = 0-1\n"
        "[prefetcher.1]\n"
        "cpus = 8-15,24\n"
        "threads = 2\n"
        "[prefetcher.0]\n"
        "cpus = 0-7\n"
        "endpoint = ipc:///tmp/p0.sock\n"
        "[launcher]\n"
        "restart_backoff_ms = 50\n"
        "restart_backoff_max_ms = 400\n"
        "ready_timeout_s = 5\n"
        "watchdog_s = 0\n";
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    int rc = config_parse(&c, text, "full.ini", &eb);
    T_CHECK(rc == 0, "full config: %d %s", rc, eb.msg);
    T_CHECK(!strcmp(c.name, "g1") && !strcmp(c.run_dir, "/tmp/rd") && !strcmp(c.model, "/models/tiny"), "group %s %s %s", c.name,
            c.run_dir, c.model);
    T_CHECK(!strcmp(c.tokenizer, "/models/tiny/tokenizer.json"), "tokenizer %s", c.tokenizer);
    T_CHECK(!strcmp(c.router.endpoint, "tcp://127.0.0.1:9000") && c.router.max_frame_bytes == 65536 && c.router.max_queue == 10 &&
                c.router.max_inflight_per_client == 3 && !strcmp(c.router.place.cpus, "0") && c.router.place.numa_node == 0,
            "router");
    T_CHECK(!strcmp(c.scheduler.endpoint, "ipc:///tmp/rd/scheduler.sock"), "sched ep %s", c.scheduler.endpoint);
    T_CHECK(c.scheduler.max_batch_tokens == 128 && c.scheduler.max_seqs == 32 && c.scheduler.kv_blocks == 100 &&
                c.scheduler.block_size == 8 && c.scheduler.max_context == 512 && !strcmp(c.scheduler.place.cpus, "1"),
            "scheduler");
    T_CHECK(!strcmp(c.executor.endpoint, "ipc:///tmp/rd/x//tmp/rd.sock"), "exec ep %s", c.executor.endpoint);
    T_CHECK(!strcmp(c.executor.backend, "cuda") && c.executor.threads == 4 && c.executor.gpu_mem == (16ll << 30) && c.executor.prefetch_depth == 6 &&
                !strcmp(c.executor.cpu_act, "q8") && !strcmp(c.executor.expert_cache, "whole"), "executor");
    T_CHECK(c.n_prefetchers == 2, "n_prefetchers %d", c.n_prefetchers);
    T_CHECK(c.prefetcher[0].node == 1 && c.prefetcher[0].place.numa_node == 1 && !strcmp(c.prefetcher[0].place.cpus, "8-15,24") &&
                c.prefetcher[0].threads == 2 && !strcmp(c.prefetcher[0].endpoint, "ipc:///tmp/rd/prefetcher-1.sock"),
            "prefetcher.1: node %d ep %s", c.prefetcher[0].node, c.prefetcher[0].endpoint);
    T_CHECK(c.prefetcher[1].node == 0 && !strcmp(c.prefetcher[1].endpoint, "ipc:///tmp/p0.sock"), "prefetcher.0");
    T_CHECK(c.launcher.restart_backoff_ms == 50 && c.launcher.restart_backoff_max_ms == 400 && c.launcher.ready_timeout_s == 5 &&
                c.launcher.watchdog_s == 0, "launcher");

    /* sections without keys still count; CRLF line ends are fine */
    rc = config_parse(&c, "[prefetcher.2]\r\n[prefetcher.5]\r\n[launcher]\r\n", "crlf.ini", &eb);
    T_CHECK(rc == 0 && c.n_prefetchers == 2 && c.prefetcher[0].node == 2 && c.prefetcher[1].node == 5 &&
                c.prefetcher[1].place.numa_node == 5,
            "empty prefetcher sections: %d n=%d %s", rc, c.n_prefetchers, eb.msg);
    /* run_dir derived from name, tokenizer given explicitly */
    rc = config_parse(&c, "[group]\nname=abc\nmodel=/m\ntokenizer=/t.json\n", "x.ini", &eb);
    T_CHECK(rc == 0 && !strcmp(c.run_dir, "/tmp/strata-abc") && !strcmp(c.tokenizer, "/t.json") &&
                !strcmp(c.scheduler.endpoint, "ipc:///tmp/strata-abc/scheduler.sock"),
            "derived: %d %s %s", rc, c.run_dir, c.tokenizer);
    /* byte suffixes */
    const struct {
        const char *v;
        int64_t want;
    } sz[] = {{"0", 0}, {"123", 123}, {"1K", 1024}, {"2M", 2 << 20}, {"3G", 3ll << 30}, {"1GiB", 1ll << 30},
              {"5MB", 5 << 20}, {"1T", 1ll << 40}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        char t[128];
        snprintf(t, sizeof t, "[executor]\ngpu_mem = %s\n", sz[i].v);
        rc = config_parse(&c, t, "sz.ini", &eb);
        T_CHECK(rc == 0 && c.executor.gpu_mem == sz[i].want, "gpu_mem %s -> %lld (%s)", sz[i].v, (long long)c.executor.gpu_mem, eb.msg);
    }
    /* a host budget: bytes, or a fraction of free memory */
    const struct {
        const char *v;
        int64_t bytes;
        double frac;
    } hm[] = {{"16G", 16ll << 30, 0}, {"1048576", 1 << 20, 0}, {"0.5", 0, 0.5}, {"50%", 0, 0.5}, {"100%", 0, 1}, {"1.0", 0, 1},
                                                 {"1.5G", 3ll << 29, 0}};
    for (size_t i = 0; i < sizeof hm / sizeof hm[0]; i++) {
        char t[128];
        snprintf(t, sizeof t, "[prefetcher.0]\nhost_mem = %s\n", hm[i].v);
        rc = config_parse(&c, t, "hm.ini", &eb);
        T_CHECK(rc == 0 && c.prefetcher[0].host_mem == hm[i].bytes && c.prefetcher[0].host_mem_frac == hm[i].frac,
                "host_mem %s -> %lld, %g (%s)", hm[i].v, (long long)c.prefetcher[0].host_mem, c.prefetcher[0].host_mem_frac, eb.msg);
    }
    rc = config_parse(&c, "[prefetcher.0]\n", "hm.ini", &eb);
    T_CHECK(rc == 0 && c.prefetcher[0].host_mem == 0 && c.prefetcher[0].host_mem_frac == 0, "no host budget by default");
}

/* Every error names the file, the line and the key. */
static void test_errors(void)
{
    const struct {
        const char *text;
        const char *want[3]; /* substrings the message must contain */
    } cases[] = {
        {"[group]\nname = x\n[routr]\nendpoint = tcp://a:1\n", {"bad.ini:3:", "routr", "unknown section"}},
        {"[group]\nname = x\n\n  [ group]\n", {"bad.ini:4:", "[ group]", "unknown section"}},
        {"[executor]\nthreads = 1\n[schedulr]\n", {"bad.ini:3:", "schedulr", "unknown section"}},
        {"[router]\nmax_queue = 5\nmax_qeue = 5\n", {"bad.ini:3:", "max_qeue", "unknown key"}},
        {"[router]\nmax_queue = five\n", {"bad.ini:2:", "max_queue", "not an integer"}},
        {"[router]\nmax_queue = 0\n", {"bad.ini:2:", "max_queue", "out of range"}},
        {"[scheduler]\n\nmax_seqs = 99999999999999999999\n", {"bad.ini:3:", "max_seqs", "not an integer"}},
        {"[executor]\ncpus = 0-3,x\n", {"bad.ini:2:", "cpus", "cpulist"}},
        {"[executor]\ncpus = 3-1\n", {"bad.ini:2:", "cpus", "range"}},
        {"[executor]\ncpus = 5000\n", {"bad.ini:2:", "cpus", "cpulist"}},
        {"[executor]\nbackend = tpu\n", {"bad.ini:2:", "backend", "cpu or cuda"}},
        {"[executor]\ncpu_act = int8\n", {"bad.ini:2:", "cpu_act", "f32 or q8"}},
        {"[executor]\nexpert_cache = half\n", {"bad.ini:2:", "expert_cache", "split or whole"}},
        {"[executor]\ngpu_mem = 12Q\n", {"bad.ini:2:", "gpu_mem", "byte count"}},
        {"[prefetcher.0]\nhost_mem = 1.5\n", {"bad.ini:2:", "host_mem", "fraction of free memory in (0, 1]"}},
        {"[prefetcher.0]\nhost_mem = 0%\n", {"bad.ini:2:", "host_mem", "fraction"}},
        {"[prefetcher.0]\nhost_mem = 150%\n", {"bad.ini:2:", "host_mem", "fraction"}},
        {"[prefetcher.0]\nhost_mem = 1000\n", {"bad.ini:2:", "host_mem", "out of range"}},
        {"[prefetcher.0]\nhost_mem = lots\n", {"bad.ini:2:", "host_mem", "byte count"}},
        {"[executor]\nbackend = cuda\n[prefetcher.0]\nhost_mem = 8G\n", {"bad.ini:", "[prefetcher.0] host_mem", "backend = cpu only"}},
        {"[executor]\nnuma_node = -2\n", {"bad.ini:2:", "numa_node", "out of range"}},
        {"[router]\nendpoint = http://x\n", {"bad.ini:2:", "endpoint", "tcp:// or ipc://"}},
        /* a port out of range was accepted and zmq listened elsewhere; none, and the router failed at start */
        {"[router]\nendpoint = tcp://127.0.0.1:99999\n", {"bad.ini:2:", "endpoint", "1-65535, got '99999'"}},
        {"[router]\nendpoint = tcp://127.0.0.1:0\n", {"bad.ini:2:", "endpoint", "1-65535"}},
        {"[router]\nendpoint = tcp://127.0.0.1:77x\n", {"bad.ini:2:", "endpoint", "1-65535"}},
        {"[router]\nendpoint = tcp://127.0.0.1\n", {"bad.ini:2:", "endpoint", "no port"}},
        {"[router]\nendpoint = tcp://[::1]\n", {"bad.ini:2:", "endpoint", "no port"}},
        {"[router]\nendpoint = tcp://:7757\n", {"bad.ini:2:", "endpoint", "no host"}},
        {"[group]\nname = a/b\n", {"bad.ini:2:", "name", "A-Za-z0-9"}},
        {"[group]\nthis line has no equals sign\n", {"bad.ini:2:", "syntax error", ""}},
        {"name = x\n", {"bad.ini:1:", "name", "outside any section"}},
        {"[prefetcher.x]\ncpus = 1\n", {"bad.ini:1:", "prefetcher.x", "NUMA node number"}},
        {"[prefetcher.01]\ncpus = 1\n", {"bad.ini:1:", "prefetcher.01", "NUMA node number"}},
        {"[prefetcher.0]\n[prefetcher.1]\n[prefetcher.2]\n[prefetcher.3]\n[prefetcher.4]\n[prefetcher.5]\n[prefetcher.6]\n[prefetcher.7]\n[prefetcher.8]\n",
         {"bad.ini:9:", "prefetcher.8", "more than 8"}},
        {"[launcher]\nrestart_backoff_ms = 500\nrestart_backoff_max_ms = 100\n", {"bad.ini:", "restart_backoff_max_ms", "less than"}},
        {"[group]\nrun_dir = /tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
         {"bad.ini:", "[router]" /* never: replaced below */, ""}},
        {"[scheduler]\nendpoint = ipc:///tmp/a.sock\n[executor]\nendpoint = ipc:///tmp/a.sock\n", {"bad.ini:", "[executor] endpoint", "also"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        strata_config_t c;
        strata_errbuf_t eb = {{0}};
        int rc = config_parse(&c, cases[i].text, "bad.ini", &eb);
        T_CHECK(rc == STRATA_EINVAL_INPUT, "case %zu: rc %d", i, rc);
        const char *const *want = cases[i].want;
        const char *w1 = want[1];
        if (!strcmp(w1, "[router]")) w1 = "ipc path"; /* the long run_dir case: the first ipc endpoint */
        T_CHECK(strstr(eb.msg, want[0]) && strstr(eb.msg, w1) && strstr(eb.msg, want[2]), "case %zu: message '%s'", i, eb.msg);
    }
    /* an over-long line is refused with its number (inih would split it) */
    char big[600];
    int n = snprintf(big, sizeof big, "[group]\nmodel = ");
    memset(big + n, 'm', 300);
    big[n + 300] = '\n';
    big[n + 301] = 0;
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    T_CHECK(config_parse(&c, big, "long.ini", &eb) == STRATA_EINVAL_INPUT && strstr(eb.msg, "long.ini:2:"), "long line: %s", eb.msg);
    /* missing file */
    int rc = config_load(&c, "/nonexistent/strata.ini", &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "/nonexistent/strata.ini"), "missing file: %d %s", rc, eb.msg);
}

/* Endpoints the parser takes, and the ipc directories config_check_paths checks. */
static void test_endpoints(void)
{
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    const char *ok = "[router]\nendpoint = tcp://[::1]:7757\n[scheduler]\nendpoint = tcp://*:7758\n"
                     "[executor]\nendpoint = tcp://localhost:65535\n";
    T_CHECK(config_parse(&c, ok, "ok.ini", &eb) == 0, "valid endpoints: %s", eb.msg);
    T_CHECK(config_check_paths(&c, "ok.ini", &eb) == 0, "run dir ipc: %s", eb.msg);
    /* an ipc endpoint in a missing directory: the scheduler was restarted 8 times before up gave up */
    T_CHECK(config_parse(&c, "[scheduler]\nendpoint = ipc:///nonexistent-strata-dir/s.sock\n", "ipc.ini", &eb) == 0, "%s", eb.msg);
    T_CHECK(config_check_paths(&c, "ipc.ini", &eb) == STRATA_EINVAL_INPUT && strstr(eb.msg, "[scheduler] endpoint") &&
                strstr(eb.msg, "/nonexistent-strata-dir"),
            "missing ipc dir: %s", eb.msg);
    T_CHECK(config_parse(&c, "[scheduler]\nendpoint = ipc:///tmp/s.sock\n", "tmp.ini", &eb) == 0, "%s", eb.msg);
    /* /tmp is root's: only root passes */
    int rc = config_check_paths(&c, "tmp.ini", &eb);
    T_CHECK(geteuid() == 0 ? rc == 0 : rc == STRATA_EINVAL_INPUT && strstr(eb.msg, "owned by uid"), "/tmp: %d %s", rc, eb.msg);
}

static void test_load_file(void)
{
    char path[] = "/tmp/test_config_XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    const char *t = "[group]\nname = filetest\n[scheduler]\nmax_seqs = 7\n[launcher]\nready_timeout_s = x\n";
    T_CHECK(write(fd, t, strlen(t)) == (ssize_t)strlen(t), "write");
    close(fd);
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    int rc = config_load(&c, path, &eb);
    char want[128];
    snprintf(want, sizeof want, "%s:6: [launcher] ready_timeout_s", path);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, want), "file error: '%s' want '%s'", eb.msg, want);
    unlink(path);
}

static void test_cpulist(uint64_t *rng)
{
    cpu_set_t s;
    strata_errbuf_t eb = {{0}};
    T_CHECK(cpulist_parse("", &s, &eb) == 0, "empty");
    T_CHECK(cpulist_parse("0-3,8", &s, &eb) == 5 && CPU_ISSET(3, &s) && CPU_ISSET(8, &s) && !CPU_ISSET(4, &s), "0-3,8");
    T_CHECK(cpulist_parse(" 1 , 2 ", &s, &eb) == 2, "spaces");
    T_CHECK(cpulist_parse("1,", &s, &eb) < 0, "trailing comma");
    T_CHECK(cpulist_parse("-1", &s, &eb) < 0, "negative");
    T_CHECK(cpulist_parse("1-", &s, &eb) < 0, "open range");
    T_CHECK(cpulist_parse("1024", &s, &eb) < 0, "too big");
    char buf[4096];
    T_CHECK(cpulist_parse("7,1-2,3,0", &s, &eb) == 5 && cpulist_format(&s, buf, sizeof buf) > 0 && !strcmp(buf, "0-3,7"), "format %s", buf);
    /* random sets round-trip through format and parse */
    for (int it = 0; it < 200; it++) {
        cpu_set_t a, b;
        CPU_ZERO(&a);
        int k = (int)(t_rng_next(rng) % 64);
        for (int i = 0; i < k; i++) CPU_SET((int)(t_rng_next(rng) % 300), &a);
        int len = cpulist_format(&a, buf, sizeof buf);
        T_CHECK(len >= 0, "format len");
        int cnt = cpulist_parse(buf, &b, &eb);
        T_CHECK(cnt == CPU_COUNT(&a) && CPU_EQUAL(&a, &b), "round trip '%s': %d vs %d (%s)", buf, cnt, CPU_COUNT(&a), eb.msg);
    }
    char tiny[4];
    CPU_ZERO(&s);
    CPU_SET(100, &s);
    CPU_SET(200, &s);
    T_CHECK(cpulist_format(&s, tiny, sizeof tiny) < 0, "ENOSPC");
}

static void test_notify_parse(void)
{
    notify_msg_t m = {0};
    const char t[] = "READY=1\nSTATUS=serving 3 clients\nMAINPID=12\nWATCHDOG=1";
    notify_parse(t, sizeof t - 1, &m);
    T_CHECK(m.ready && m.watchdog && !m.stopping && !strcmp(m.status, "serving 3 clients"), "notify parse");
    notify_msg_t m2 = {0};
    notify_parse("READY=0\nSTOPPING=1\n", 20, &m2);
    T_CHECK(!m2.ready && m2.stopping, "notify parse 2");
}

static void test_parse_bytes(void)
{
    static const struct {
        const char *s;
        int rc;
        int64_t want;
    } cases[] = {
        {"0", 0, 0}, {"1048576", 0, 1048576}, {"512M", 0, 512ll << 20}, {"16GiB", 0, 16ll << 30}, {"2kB", 0, 2048},
        {"1.5G", 0, 3ll << 29}, {"8t", 0, 8ll << 40}, {"0.5", -EINVAL, 0}, {"-1", -EINVAL, 0}, {"12Q", -EINVAL, 0},
        {"", -EINVAL, 0}, {" 5", -EINVAL, 0}, {"5 ", -EINVAL, 0}, {"GiB", -EINVAL, 0}, {"16Gi", -EINVAL, 0},
        {"nan", -EINVAL, 0}, {"1e30", -ERANGE, 0}, {"9000000T", -ERANGE, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = -7;
        int rc = strata_parse_bytes(cases[i].s, &v);
        T_CHECK(rc == cases[i].rc && (rc < 0 ? v == -7 : v == cases[i].want), "strata_parse_bytes('%s'): %d %lld",
                cases[i].s, rc, (long long)v);
    }
}

/* strata_grow: doubling from `first`, contents kept, nothing reallocated while there is room,
 * and a capacity that would not double is refused with the array unchanged. */
static void test_grow(void)
{
    int32_t *v = NULL;
    size_t cap = 0, grows = 0;
    for (size_t n = 0; n < 1000; n++) {
        size_t before = cap;
        T_CHECK(strata_grow(&v, &cap, n, sizeof *v, 4) == 0 && cap > n, "grow to %zu: cap %zu", n, cap);
        grows += cap != before;
        v[n] = (int32_t)n * 3;
    }
    T_CHECK(cap == 1024 && grows == 9, "cap %zu after %zu grows (want 1024, 9)", cap, grows);
    bool same = true;
    for (size_t n = 0; n < 1000; n++) same &= v[n] == (int32_t)n * 3;
    T_CHECK(same, "contents lost across growth");
    int32_t *keep = v;
    size_t huge = SIZE_MAX / 2 + 1;
    T_CHECK(strata_grow(&v, &huge, huge, sizeof *v, 4) == STRATA_ENOMEM && v == keep && huge == SIZE_MAX / 2 + 1,
            "overflowing capacity not refused");
    free(v);
}

int main(void)
{
    uint64_t rng = t_seed();
    test_grow();
    test_parse_bytes();
    test_defaults();
    test_full();
    test_errors();
    test_endpoints();
    test_load_file();
    test_cpulist(&rng);
    test_notify_parse();
    return t_done("test_config");
}
