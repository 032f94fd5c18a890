/* ceilings - the machine's bandwidth ceilings for the roofline (bench/roofline.h): host memory
 * read bandwidth, and with a GPU the pinned host->GPU copy bandwidth, GPU memory read bandwidth
 * (kernels/cuda/probe.h) and host memory read by the copy and the CPU at once
 * (bench/shared_probe.h); with --disk FILE, the disk's read rate as the disk tier reads expert
 * blocks (services/prefetcher/dtier.c: O_DIRECT, io_uring, 2 MiB reads, 64 in flight). One JSON object on stdout (or --json FILE), with the machine in words
 * and the build's commit for results rows (bench/results.h); `strata bench` runs it so that the
 * strata tool itself needs no CUDA. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build_commit.h"
#include "bench/results.h"
#include "bench/roofline.h"
#ifdef STRATA_HAVE_CUDA
#include "bench/shared_probe.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/probe.h"
#endif

#define DISK_READ (2u << 20) /* bytes a read: an expert block's alignment */
#define DISK_QD 64

/* Read up to max bytes of path with O_DIRECT through io_uring, DISK_QD reads of DISK_READ in
 * flight: bytes per second, or <0 (-errno; *what says what failed). A file the page cache holds
 * is read from the disk all the same (O_DIRECT); one shorter than a read is refused. */
static double s_disk_probe(const char *path, uint64_t max, const char **what)
{
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        *what = errno == EINVAL ? "O_DIRECT is not supported on its file system" : "open";
        return -errno;
    }
    struct stat st;
    uint64_t size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size / DISK_READ * DISK_READ : 0;
    if (size > max) size = max / DISK_READ * DISK_READ;
    struct io_uring ring;
    void *buf = NULL;
    double rate = -EINVAL;
    *what = "the file is shorter than one 2 MiB read";
    if (size == 0) goto out_fd;
    int e = io_uring_queue_init(DISK_QD, &ring, 0);
    if (e < 0) {
        *what = "io_uring";
        rate = e;
        goto out_fd;
    }
    if (posix_memalign(&buf, 4096, (size_t)DISK_READ * DISK_QD)) {
        *what = "memory";
        rate = -ENOMEM;
        goto out_ring;
    }
    uint64_t next = 0, done = 0;
    int inflight = 0;
    double t0 = strata_now();
    *what = "read";
    while (done < size) {
        while (inflight < DISK_QD && next < size) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe) break;
            int slot = (int)((next / DISK_READ) % DISK_QD);
            io_uring_prep_read(sqe, fd, (char *)buf + (size_t)slot * DISK_READ, DISK_READ, next);
            next += DISK_READ;
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if ((e = io_uring_wait_cqe(&ring, &cqe)) < 0) {
            rate = e;
            goto out_buf;
        }
        if (cqe->res <= 0) {
            rate = cqe->res < 0 ? cqe->res : -EIO;
            io_uring_cqe_seen(&ring, cqe);
            goto out_buf;
        }
        done += (uint64_t)cqe->res;
        inflight--;
        io_uring_cqe_seen(&ring, cqe);
    }
    rate = (double)done / (strata_now() - t0);
out_buf:
    free(buf);
out_ring:
    io_uring_queue_exit(&ring);
out_fd:
    close(fd);
    return rate;
}

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: ceilings [--mib N] [--device D] [--no-gpu] [--threads T] [--disk FILE [--disk-mib N]]\n"
            "                [--json FILE]\n\n"
            "Measure host memory read bandwidth and, when a CUDA GPU is present, pinned host->GPU copy\n"
            "bandwidth, GPU memory read bandwidth, and host memory read by a pinned host->GPU copy loop\n"
            "and the CPU threads at once (both timed over the same window, best of 3 windows of 0.5 s).\n"
            "Prints one JSON object:\n"
            "  {\"machine\", \"machine_desc\", \"commit\", \"gpu\", \"gpu_mem\", \"cpu_gb_s\", \"pcie_gb_s\", \"hbm_gb_s\",\n"
            "   \"h2d_shared_gb_s\", \"cpu_shared_gb_s\", \"host_shared_gb_s\", \"disk_gb_s\", \"disk_file\"}\n"
            "GPU fields are null without a GPU; the roofline then assumes the shared rate\n"
            "(bench/roofline.h, ROOFLINE_HOST_SHARED_FRACTION).\n\n"
            "  --mib N      probe buffer size in MiB (default 1024)\n"
            "  --device D   CUDA device (default 0)\n"
            "  --no-gpu     skip the GPU probes\n"
            "  --threads T  threads for the host probe (default: all CPUs)\n"
            "  --disk FILE  also read FILE (e.g. a packed model's experts-000.bin) with O_DIRECT and\n"
            "               io_uring, 2 MiB reads with 64 in flight, as the disk tier reads expert\n"
            "               blocks: disk_gb_s (null without --disk)\n"
            "  --disk-mib N read at most N MiB of it (default 1024)\n"
            "  --json FILE  write there instead of stdout\n"
            "  -h, --help   this help\n\n"
            "Exit codes: 0 ok, 1 a probe failed, 2 bad usage.\n");
}

int main(int argc, char **argv)
{
    long mib = 1024, device = 0, threads = 0, disk_mib = 1024;
    bool no_gpu = false;
    const char *json = NULL, *disk = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *e = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        } else if (!strcmp(a, "--no-gpu")) {
            no_gpu = true;
        } else if (v && !strcmp(a, "--json")) {
            json = v;
            i++;
        } else if (v && !strcmp(a, "--disk")) {
            disk = v;
            i++;
        } else if (v && (!strcmp(a, "--mib") || !strcmp(a, "--device") || !strcmp(a, "--threads") || !strcmp(a, "--disk-mib"))) {
            long x = strtol(v, &e, 10);
            if (*e || e == v || x < 0 || x > (1 << 20) || (!strcmp(a, "--mib") && x < 16)) {
                fprintf(stderr, "ceilings: %s '%s': not a valid number\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--mib")) mib = x;
            else if (!strcmp(a, "--disk-mib")) disk_mib = x;
            else if (!strcmp(a, "--device")) device = x;
            else threads = x;
            i++;
        } else {
            fprintf(stderr, "ceilings: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!getenv("STRATA_LOG")) log_set_level(LOG_WARN);
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    tpool_t *pool = tpool_create((int)threads);
    double cpu = roofline_cpu_membw(pool, (size_t)mib << 20, 5);
    tpool_destroy(pool);
    json_t *o = json_pack("{s:s,s:f}", "machine", host, "cpu_gb_s", cpu / 1e9);
    json_object_set_new(o, "gpu", json_null());
    json_object_set_new(o, "gpu_mem", json_null());
    json_object_set_new(o, "pcie_gb_s", json_null());
    json_object_set_new(o, "hbm_gb_s", json_null());
    json_object_set_new(o, "h2d_shared_gb_s", json_null());
    json_object_set_new(o, "cpu_shared_gb_s", json_null());
    json_object_set_new(o, "host_shared_gb_s", json_null());
    json_object_set_new(o, "disk_gb_s", json_null());
    json_object_set_new(o, "disk_file", disk ? json_string(disk) : json_null());
    int rc = cpu > 0 ? 0 : 1;
    if (disk) {
        const char *what = "";
        double d = s_disk_probe(disk, (uint64_t)disk_mib << 20, &what);
        if (d > 0) {
            json_object_set_new(o, "disk_gb_s", json_real(d / 1e9));
        } else {
            fprintf(stderr, "ceilings: --disk %s: %s: %s\n", disk, what, strerror((int)-d));
            rc = 1;
        }
    }
    char gpu_name[128] = "";
    double gpu_total = 0, h2d = 0;
#ifdef STRATA_HAVE_CUDA
    if (!no_gpu && cuda_device_count() > device) {
        size_t total = 0;
        double hbm = 0;
        size_t pb = (size_t)mib << 20;
        shared_probe_t sh;
        /* the best of 20 copies: on the H200 host the best of 5 read from about 52 to 55 GB/s from one
         * run to the next (a bound read low flatters every ratio against it) */
        if (cuda_probe_device((int)device, gpu_name, sizeof gpu_name, &total) < 0 ||
            cuda_probe_h2d((int)device, pb / 4, 20, &h2d) < 0 || cuda_probe_membw((int)device, pb, 5, &hbm) < 0) {
            rc = 1;
        } else {
            gpu_total = (double)total;
            json_object_set_new(o, "gpu", json_string(gpu_name));
            json_object_set_new(o, "gpu_mem", json_integer((json_int_t)total));
            json_object_set_new(o, "pcie_gb_s", json_real(h2d / 1e9));
            json_object_set_new(o, "hbm_gb_s", json_real(hbm / 1e9));
            /* both at once: 64 MiB copies, 4 in flight,
             * against the host probe's buffer size read by every thread */
            tpool_t *sp = tpool_create((int)threads);
            int e = shared_probe_run(sp, (int)device, (size_t)64 << 20, pb, 3, 0.5, &sh);
            tpool_destroy(sp);
            if (e < 0) {
                rc = 1;
            } else {
                json_object_set_new(o, "h2d_shared_gb_s", json_real(sh.h2d_bw / 1e9));
                json_object_set_new(o, "cpu_shared_gb_s", json_real(sh.cpu_bw / 1e9));
                json_object_set_new(o, "host_shared_gb_s", json_real(sh.host_bw / 1e9));
            }
        }
    }
#else
    (void)device;
    (void)no_gpu;
#endif
    char desc[512], commit[128];
    results_machine(desc, sizeof desc, gpu_name[0] ? gpu_name : NULL, gpu_total, h2d);
    results_commit(commit, sizeof commit, STRATA_BUILD_COMMIT, NULL);
    json_object_set_new(o, "machine_desc", json_string(desc));
    json_object_set_new(o, "commit", commit[0] ? json_string(commit) : json_null());
    int w = json ? json_dump_file(o, json, JSON_INDENT(2)) : json_dumpf(o, stdout, JSON_INDENT(2));
    if (!json) printf("\n");
    json_decref(o);
    if (w < 0) {
        fprintf(stderr, "ceilings: cannot write the result\n");
        return 1;
    }
    return rc;
}
