/* test_roofline.c - the decode bound arithmetic (bench/roofline.h) against hand-computed cases.
 *
 * Every expected number below is worked out in the comments from the model's shapes and the
 * formulas of DESIGN.md "Physical limits", independently of the code under test: bytes of one
 * expert and of the resident weights from the config, the slots a budget leaves, distinct
 * experts per step under uniform routing, and the split of missed bytes between PCIe and CPU.
 * Three bounds (bench/roofline.h): PCIe only, PCIe + CPU with the bandwidths added, and PCIe +
 * CPU with host memory shared (the copy's and the CPU's reads capped together). gpt-oss adds
 * MXFP4 experts (4.25 bits a weight), expert biases held resident and read per touched expert,
 * and sliding-window layers that read only their window of the KV cache.
 */
#include <math.h>
#include <string.h>

#include "bench/roofline.h"
#include "bench/shapes.h"
#include "tests/unit/check.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static bool s_close(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b) + 1e-12; }

/* Mixtral-8x7B, int4 group 32 experts, bf16 attention and lm_head, at a 24 GiB budget. */
static void s_mixtral_int4_24g(void)
{
    const shape_t *s = shape_find("mixtral-8x7b");
    T_CHECK(s != NULL, "shape");
    model_config_t c;
    strata_errbuf_t eb = {{0}};
    T_CHECK(shape_config(s, &c, &eb) == 0, "%s", eb.msg);
    roofline_model_t m;
    T_CHECK(roofline_model_from_config(&m, &c, WF_INT4, 32, WF_BF16, &eb) == 0, "%s", eb.msg);

    /* One expert: gate, up [14336][4096] and down [4096][14336]; int4 data = 4096*14336/2 =
     * 29,360,128 bytes per matrix, fp16 scales = 4096*14336/32*2 = 3,670,016; x3 = 99,090,432. */
    T_CHECK(m.expert_bytes == 99090432.0, "expert bytes %.0f", m.expert_bytes);
    /* Resident (no embedding): per layer q,o [4096][4096] + k,v [1024][4096] bf16 =
     * (2*16,777,216 + 2*4,194,304) * 2 = 83,886,080; two f32 norms 32,768; router [8][4096] f32
     * 131,072: 84,049,920 x 32 layers = 2,689,597,440; final norm 16,384; lm_head [32000][4096]
     * bf16 262,144,000. Total 2,951,757,824. */
    T_CHECK(m.resident_bytes == 2951757824.0, "resident bytes %.0f", m.resident_bytes);
    T_CHECK(m.embed_bytes == 262144000.0, "embed bytes %.0f", m.embed_bytes);
    /* K and V fp32: 2 * 32 layers * 8 kv heads * 128 * 4 = 262,144 bytes per token */
    T_CHECK(m.kv_bytes_per_token == 262144.0, "kv/token %.0f", m.kv_bytes_per_token);
    T_CHECK(m.n_experts_total == 256 && m.top_k == 2, "experts %lld top_k %d", (long long)m.n_experts_total, m.top_k);

    /* Budget 24 GiB = 25,769,803,776; reserved: KV for 4096 tokens (1 GiB) + 0.25 GiB workspace =
     * 1,342,177,280. Slots = floor((25,769,803,776 - 2,951,757,824 - 1,342,177,280) / 99,090,432)
     * = floor(21,475,868,672 / 99,090,432) = floor(216.73) = 216; hit rate 216/256 = 0.84375.
     * Batch 1: 2 distinct experts per layer; touched = 32 * 2 * 99,090,432 = 6,341,787,648;
     * hits 5,350,883,328; misses 990,904,320. Context 1024: KV read 268,435,456. */
    roofline_run_t r;
    roofline_run_default(&r);
    r.batch = 1;
    r.context = 1024;
    r.gpu_mem = 24.0 * GIB;
    r.reserved_bytes = 1.25 * GIB;
    roofline_t o;

    /* RTX 4090: a = (2,951,757,824 + 268,435,456 + 5,350,883,328) / 1008e9 = 8.5030e-3 s; the
     * split x = max((a+b)/(b+d), c/(c+d)) with b = M/1008e9, c = M/25e9, d = M/80e9 gives
     * x = 80/105 = 0.7619 (transfer-bound), step = M / (25e9 + 80e9) = 9.43718e-3 s:
     * 105.96 tok/s. The GPU term there is a + b(1-x) = 8.74e-3 s < step. */
    T_CHECK(roofline_decode(&m, &roofline_rtx4090, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 216, "slots %.0f", o.slots);
    T_CHECK(s_close(o.hit_rate, 0.84375, 1e-12), "hit %.6f", o.hit_rate);
    T_CHECK(s_close(o.distinct_experts, 2.0, 1e-12), "distinct %.6f", o.distinct_experts);
    T_CHECK(o.miss_bytes == 990904320.0, "miss %.0f", o.miss_bytes);
    T_CHECK(o.kv_bytes == 268435456.0, "kv %.0f", o.kv_bytes);
    T_CHECK(s_close(o.cpu_share, 80.0 / 105.0, 1e-9), "cpu share %.6f", o.cpu_share);
    T_CHECK(s_close(o.bw_added_step_s, 990904320.0 / 105e9, 1e-9), "step %.9f", o.bw_added_step_s);
    T_CHECK(s_close(o.bw_added_tok_s, 105.9629, 1e-5), "tok/s %.4f", o.bw_added_tok_s);
    T_CHECK(!strcmp(o.bw_added_limit, "pcie+cpu"), "limit %s", o.bw_added_limit);
    /* without the CPU path every miss crosses PCIe at 25 GB/s, which binds (the GPU's reads take 9.5 ms) */
    T_CHECK(s_close(o.pcie_only_tok_s, 25e9 / 990904320.0, 1e-9), "pcie-only tok/s %.4f", o.pcie_only_tok_s);
    /* bytes per token: 2,951,757,824 + 268,435,456 + 6,341,787,648 = 9,561,980,928 */
    T_CHECK(o.bytes_per_token == 9561980928.0, "bytes/token %.0f", o.bytes_per_token);
    /* Host memory shared, not measured on the RTX 4090 host: assumed max(25, 80, 0.85 * 105 =
     * 89.25) = 89.25 GB/s for the copy and the CPU together, below their 105: the step is
     * M / 89.25e9 = 11.1026e-3 s, 90.07 tok/s, bound by host memory. */
    T_CHECK(o.host_bw_assumed && s_close(o.host_bw, 89.25e9, 1e-12), "host %.4g assumed %d", o.host_bw, o.host_bw_assumed);
    T_CHECK(s_close(o.host_shared_step_s, 990904320.0 / 89.25e9, 1e-9), "shared step %.9f", o.host_shared_step_s);
    T_CHECK(s_close(o.host_shared_tok_s, 90.0688, 1e-5), "shared tok/s %.4f", o.host_shared_tok_s);
    T_CHECK(!strcmp(o.host_shared_limit, "host memory") && !strcmp(o.pcie_only_limit, "pcie"), "limits %s %s",
            o.host_shared_limit, o.pcie_only_limit);

    /* RTX 3090 (936 GB/s, PCIe 12 GB/s, CPU 120 GB/s): a = 8,571,076,608 / 936e9 = 9.15713e-3 s
     * exceeds M / (12e9 + 120e9) = 7.5068e-3 s, and x1 = (a+b)/(b+d) = 1.097 > 1: everything
     * missed goes to the CPU (x = 1, d = 8.2575e-3 s < a), the GPU binds: 109.20 tok/s. */
    T_CHECK(roofline_decode(&m, &roofline_rtx3090, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.bw_added_step_s, 8571076608.0 / 936e9, 1e-9), "step %.9f", o.bw_added_step_s);
    T_CHECK(s_close(o.bw_added_tok_s, 109.2043, 1e-5), "tok/s %.4f", o.bw_added_tok_s);
    T_CHECK(o.cpu_share == 1.0 && !strcmp(o.bw_added_limit, "hbm"), "share %.3f limit %s", o.cpu_share, o.bw_added_limit);
    /* host memory shared: assumed max(12, 120, 0.85 * 132 = 112.2) = 120 GB/s; M / 120e9 =
     * 8.2575e-3 s is below the GPU's 9.157e-3: still GPU-bound at 109.20 tok/s */
    T_CHECK(s_close(o.host_bw, 120e9, 1e-12), "host %.4g", o.host_bw);
    T_CHECK(s_close(o.host_shared_tok_s, 109.2043, 1e-5) && !strcmp(o.host_shared_limit, "hbm"), "shared %.4f %s",
            o.host_shared_tok_s, o.host_shared_limit);

    /* Batch 16: distinct experts per layer = 8 * (1 - (6/8)^16) = 8 * (1 - 0.0100226) = 7.91982;
     * touched = 32 * 7.91982 * 99,090,432 = 25,113,... ; on the RTX 4090 with the same cache the
     * misses are (1 - 0.84375) of it and the step is M / 105e9. */
    r.batch = 16;
    T_CHECK(roofline_decode(&m, &roofline_rtx4090, &r, &o) == 0, "decode");
    double distinct = 8.0 * (1.0 - pow(0.75, 16));
    T_CHECK(s_close(o.distinct_experts, distinct, 1e-12), "distinct %.6f", o.distinct_experts);
    double miss16 = 32.0 * distinct * 99090432.0 * (1.0 - 0.84375);
    T_CHECK(s_close(o.miss_bytes, miss16, 1e-12), "miss %.0f vs %.0f", o.miss_bytes, miss16);
    /* GPU term: (2,951,757,824 + 16 * 268,435,456 + 0.84375 * touched) / 1008e9 = 0.0317 s versus
     * M / 105e9 = 0.0378 s: still the transfer. 16 / 0.03781 = 423.2 tok/s. */
    T_CHECK(s_close(o.bw_added_step_s, miss16 / 105e9, 1e-9), "step %.6f", o.bw_added_step_s);
    T_CHECK(s_close(o.bw_added_tok_s, 16.0 / (miss16 / 105e9), 1e-9), "tok/s %.2f", o.bw_added_tok_s);

    /* A budget that holds every expert: 256 slots, hit 1, no misses; batch 1 step =
     * (2,951,757,824 + 268,435,456 + 6,341,787,648) / 1008e9 = 9.48609e-3 s -> 105.42 tok/s. */
    r.batch = 1;
    r.gpu_mem = 64.0 * GIB;
    T_CHECK(roofline_decode(&m, &roofline_rtx4090, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 256 && o.hit_rate == 1.0 && o.miss_bytes == 0, "all resident");
    T_CHECK(s_close(o.bw_added_step_s, 9561980928.0 / 1008e9, 1e-12), "step %.9f", o.bw_added_step_s);

    /* The CPU backend reads everything from host memory: 9,561,980,928 / 120e9 = 79.68 ms. */
    r.cpu_backend = true;
    T_CHECK(roofline_decode(&m, &roofline_rtx3090, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.bw_added_step_s, 9561980928.0 / 120e9, 1e-12), "cpu step %.6f", o.bw_added_step_s);
    T_CHECK(!strcmp(o.bw_added_limit, "cpu memory"), "limit %s", o.bw_added_limit);
    /* one reader: the shared bound is the same, and there is no PCIe-only bound */
    T_CHECK(o.host_shared_step_s == o.bw_added_step_s && o.pcie_only_tok_s == 0, "cpu shared %.6f pcie-only %.3f",
            o.host_shared_step_s, o.pcie_only_tok_s);

    /* no host budget: three tiers are host_shared */
    T_CHECK(o.three_tier_step_s == o.host_shared_step_s && o.host_fraction == 1 && o.disk_bytes == 0 &&
                !strcmp(o.three_tier_limit, "cpu memory"), "three tiers without a budget %.6f %s", o.three_tier_step_s,
            o.three_tier_limit);
    /* host memory holds 64 of the 256 experts: 3/4 of the 6,341,787,648 expert bytes a step
     * touches come from disk first, 4,756,340,736 / 1.5e9 = 3.17089 s, which binds */
    r.host_experts = 64;
    machine_t slow = roofline_rtx3090;
    T_CHECK(roofline_decode(&m, &slow, &r, &o) == 0 && o.three_tier_tok_s == 0 &&
                !strcmp(o.three_tier_limit, "disk (rate unknown)"), "no disk rate: %s", o.three_tier_limit);
    slow.disk_bw = 1.5e9;
    T_CHECK(roofline_decode(&m, &slow, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.disk_bytes, 0.75 * 6341787648.0, 1e-12) && s_close(o.three_tier_step_s, 0.75 * 6341787648.0 / 1.5e9, 1e-12) &&
                !strcmp(o.three_tier_limit, "disk") && s_close(o.three_tier_tok_s, 1.5e9 / (0.75 * 6341787648.0), 1e-12),
            "three tiers %.6f s %s", o.three_tier_step_s, o.three_tier_limit);
    /* on the GPU only the misses go to host memory: the RTX 4090 at batch 16 as above, 3/4 of
     * them from disk */
    r.cpu_backend = false;
    r.gpu_mem = 0;
    r.batch = 16;
    slow = roofline_rtx4090;
    slow.disk_bw = 1e12; /* a disk faster than everything: host_shared binds */
    T_CHECK(roofline_decode(&m, &slow, &r, &o) == 0 && s_close(o.disk_bytes, 0.75 * miss16, 1e-12) &&
                o.three_tier_step_s == o.host_shared_step_s, "fast disk %.6f", o.three_tier_step_s);
    slow.disk_bw = 1.5e9;
    T_CHECK(roofline_decode(&m, &slow, &r, &o) == 0 && s_close(o.three_tier_step_s, 0.75 * miss16 / 1.5e9, 1e-12) &&
                !strcmp(o.three_tier_limit, "disk"), "slow disk %.6f", o.three_tier_step_s);
    r.host_experts = -1;
    r.batch = 1;
    r.gpu_mem = 64.0 * GIB;

    /* A budget below the resident weights is refused. */
    r.cpu_backend = false;
    r.gpu_mem = 2.0 * GIB;
    T_CHECK(roofline_decode(&m, &roofline_rtx4090, &r, &o) == STRATA_EINVAL_INPUT, "too small");
}

/* A small made-up model, every number round: resident 1e9 B, expert 1e8 B, 10 MoE layers of 4
 * experts, top 1, no KV. Machine: hbm 1e12, pcie 1e10, cpu 3e10, budget fits 20 of 40 experts. */
static void s_round_numbers(void)
{
    roofline_model_t m = {.resident_bytes = 1e9, .expert_bytes = 1e8, .n_moe_layers = 10, .n_experts = 4,
                          .top_k = 1, .n_experts_total = 40};
    machine_t mc = {"round", 4e9, 1e12, 1e10, 3e10};
    roofline_run_t r;
    roofline_run_default(&r);
    roofline_t o;
    /* slots = floor((4e9 - 1e9 - 1e9 reserved) / 1e8) = 20, hit 0.5; batch 1: touched 10 * 1 *
     * 1e8 = 1e9, miss 5e8. a = (1e9 + 5e8)/1e12 = 1.5e-3; transfer+cpu: 5e8/4e10 = 1.25e-2 s. */
    r.reserved_bytes = 1e9;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 20 && o.hit_rate == 0.5, "slots %.0f hit %.3f", o.slots, o.hit_rate);
    T_CHECK(s_close(o.bw_added_step_s, 1.25e-2, 1e-12), "step %.6f", o.bw_added_step_s);
    T_CHECK(s_close(o.cpu_share, 0.75, 1e-12), "share %.4f", o.cpu_share);
    /* PCIe only: 5e8 / 1e10 = 5e-2 s. Host memory shared at 2.5e10 (below 1e10 + 3e10): the copy
     * and the CPU read 5e8 of host memory together at any split, 5e8 / 2.5e10 = 2e-2 s; at 5e10
     * (above the sum) the cap does not bind and the shared bound is the added one. */
    T_CHECK(s_close(o.pcie_only_step_s, 5e-2, 1e-12), "pcie-only step %.6f", o.pcie_only_step_s);
    mc.host_bw = 2.5e10;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(!o.host_bw_assumed && s_close(o.host_shared_step_s, 2e-2, 1e-12) && s_close(o.host_shared_tok_s, 50, 1e-12),
            "shared step %.6f", o.host_shared_step_s);
    T_CHECK(!strcmp(o.host_shared_limit, "host memory") && s_close(o.bw_added_step_s, 1.25e-2, 1e-12), "%s",
            o.host_shared_limit);
    mc.host_bw = 5e10;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(o.host_shared_step_s == o.bw_added_step_s && !strcmp(o.host_shared_limit, "pcie+cpu"), "shared %.6f %s",
            o.host_shared_step_s, o.host_shared_limit);
    /* not measured: 0.85 * 4e10 = 3.4e10, M / 3.4e10 = 1.4706e-2 s */
    mc.host_bw = 0;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(o.host_bw_assumed && s_close(o.host_shared_step_s, 5e8 / 3.4e10, 1e-12), "assumed %.6f", o.host_shared_step_s);
    /* a given hit rate overrides the cache size: hit 0.9 -> miss 1e8, step 1e8/4e10 = 2.5e-3 */
    r.hit_rate = 0.9;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0 && s_close(o.bw_added_step_s, 2.5e-3, 1e-12), "step %.6f", o.bw_added_step_s);
    /* batch 4: distinct = 4 * (1 - 0.75^4) = 2.734375 per layer, touched 2.734375e9, hit 0.9:
     * miss 2.734375e8 -> 6.8359375e-3; GPU (1e9 + 0.9*2.734375e9 + 0.1*(1-x)...) stays below */
    r.batch = 4;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.distinct_experts, 2.734375, 1e-12), "distinct %.6f", o.distinct_experts);
    T_CHECK(s_close(o.bw_added_step_s, 2.734375e8 / 4e10, 1e-12), "step %.9f", o.bw_added_step_s);
    T_CHECK(s_close(o.bw_added_tok_s, 4 / (2.734375e8 / 4e10), 1e-12), "tok/s %.3f", o.bw_added_tok_s);
    /* GPU-bound: a slow GPU (hbm 1e11) with everything resident except one expert:
     * hit 39/40 at batch 1 -> touched 1e9, miss 2.5e7: a = (1e9 + 9.75e8)/1e11 = 1.975e-2,
     * b = 2.5e-4, c = 2.5e-3, d = 8.33e-4: x1 = (a+b)/(b+d) > 1, so x = 1 and the step is a. */
    mc.hbm_bw = 1e11;
    r.batch = 1;
    r.hit_rate = 39.0 / 40.0;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.bw_added_step_s, 1.975e-2, 1e-12) && !strcmp(o.bw_added_limit, "hbm"), "step %.6f %s", o.bw_added_step_s, o.bw_added_limit);
    /* No CPU path (cpu 0): transfer only, 2.5e7/1e10 = 2.5e-3 < a: still a. Faster GPU:
     * hbm 1e13 -> a = 1.975e-4 + b: the transfer binds: (1 - 0) * 2.5e7 / 1e10 = 2.5e-3. */
    mc.cpu_bw = 0;
    mc.hbm_bw = 1e13;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(s_close(o.bw_added_step_s, 2.5e-3, 1e-12) && o.cpu_share == 0, "step %.6f share %.3f", o.bw_added_step_s, o.cpu_share);
    /* fractional slots (split experts: every head plus some tails, gpu_stats_t.experts_on_gpu):
     * 30.5 of 40 resident, batch 1, no CPU path: miss (1 - 30.5/40) * 1e9 = 2.375e8 -> 2.375e-2
     * s over PCIe, the PCIe-only bound 1 / 2.375e-2 (not 30's 1 / 2.5e-2) */
    r.hit_rate = -1;
    r.slots = 30.5;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 30.5 && s_close(o.miss_bytes, 2.375e8, 1e-12), "slots %.2f miss %.4g", o.slots, o.miss_bytes);
    T_CHECK(s_close(o.pcie_only_tok_s, 1 / 2.375e-2, 1e-12), "pcie-only %.4f", o.pcie_only_tok_s);
    r.slots = -1;
    /* batch 0 is refused */
    r.batch = 0;
    T_CHECK(roofline_decode(&m, &mc, &r, &o) == STRATA_EINVAL_INPUT, "batch 0");
}

/* The GPU host's ceilings (1 x H200): pinned H2D alone 55.5 GB/s, 16 CPU threads alone 81 GB/s,
 * both at once 115 GB/s together. GPU memory 4.0e12 B/s (an assumed streaming read: it does not
 * bind in these cases, the GPU terms stay below 6 % of the step). */
static const machine_t s_h200 = {"h200", 141e9, 4.0e12, 55.5e9, 81e9, 115e9};

/* Bytes of a shape with int4 g32 everywhere (`strata synth --format int4 --attn-format same`). */
static void s_model_same(const char *name, roofline_model_t *m)
{
    model_config_t c;
    strata_errbuf_t eb = {{0}};
    const shape_t *s = shape_find(name);
    T_CHECK(s && shape_config(s, &c, &eb) == 0, "%s: %s", name, eb.msg);
    T_CHECK(roofline_model_from_config(m, &c, WF_INT4, 32, WF_INT4, &eb) == 0, "%s", eb.msg);
}

/* The three bounds with host memory shared on the H200 host, Mixtral-8x22B int4 everywhere at a
 * 24 GiB budget, context 1024, 1.25 GiB of KV and workspace charged, as the 8x7B case above. */
static void s_host_shared_8x22b(void)
{
    roofline_model_t m;
    s_model_same("mixtral-8x22b", &m);
    /* One expert: gate, up [16384][6144] and down [6144][16384] at 4 bits + an fp16 scale per 32:
     * 100,663,296 x 0.5625 = 56,623,104 bytes a matrix, x3 = 169,869,312. Resident per layer: q, o
     * [6144][6144] and k, v [1024][6144] = 88,080,384 weights x 0.5625 = 49,545,216; norms 2 x
     * 6144 x 4 = 49,152; router [8][6144] f32 196,608: 49,790,976 x 56 layers = 2,788,294,656;
     * final norm 24,576; lm_head [32000][6144] int4 110,592,000. Total 2,898,911,232. */
    T_CHECK(m.expert_bytes == 169869312.0, "expert %.0f", m.expert_bytes);
    T_CHECK(m.resident_bytes == 2898911232.0, "resident %.0f", m.resident_bytes);
    T_CHECK(m.n_experts_total == 448 && m.kv_bytes_per_token == 458752.0, "experts %lld kv %.0f",
            (long long)m.n_experts_total, m.kv_bytes_per_token);
    roofline_run_t r;
    roofline_run_default(&r);
    r.context = 1024;
    r.gpu_mem = 24.0 * GIB;
    r.reserved_bytes = 1.25 * GIB;
    roofline_t o;
    /* slots = floor((25,769,803,776 - 2,898,911,232 - 1,342,177,280) / 169,869,312) =
     * floor(21,528,715,264 / 169,869,312) = floor(126.74) = 126; hit 126 / 448 = 0.28125.
     * Batch 1: touched 56 x 2 x 169,869,312 = 19,025,362,944, missed 0.71875 of it =
     * 13,674,479,616 bytes. GPU term at most (2,898,911,232 + 1024 x 458,752 + 19,025,362,944) /
     * 4e12 = 5.6 ms: never binds. PCIe only: M / 55.5e9 = 0.246387 s, 4.0587 tok/s. Bandwidths
     * added: M / 136.5e9 = 0.100179 s, 9.9822 tok/s (58.3 % of the misses on the CPU: 81 / 136.5).
     * Host memory shared: M / 115e9 = 0.118909 s, 8.4098 tok/s. */
    r.batch = 1;
    T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 126 && o.miss_bytes == 13674479616.0, "slots %.0f miss %.0f", o.slots, o.miss_bytes);
    T_CHECK(s_close(o.pcie_only_tok_s, 55.5e9 / 13674479616.0, 1e-9), "pcie-only %.4f", o.pcie_only_tok_s);
    T_CHECK(s_close(o.bw_added_tok_s, 136.5e9 / 13674479616.0, 1e-9), "bw-added %.4f", o.bw_added_tok_s);
    T_CHECK(s_close(o.host_shared_tok_s, 115e9 / 13674479616.0, 1e-9), "host-shared %.4f", o.host_shared_tok_s);
    T_CHECK(s_close(o.pcie_only_tok_s, 4.0587, 1e-4) && s_close(o.bw_added_tok_s, 9.9822, 1e-4) &&
                s_close(o.host_shared_tok_s, 8.4098, 1e-4),
            "%.4f %.4f %.4f", o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s);
    T_CHECK(s_close(o.cpu_share, 81.0 / 136.5, 1e-9), "share %.4f", o.cpu_share);
    T_CHECK(!strcmp(o.pcie_only_limit, "pcie") && !strcmp(o.bw_added_limit, "pcie+cpu") &&
                !strcmp(o.host_shared_limit, "host memory") && !o.host_bw_assumed,
            "%s %s %s", o.pcie_only_limit, o.bw_added_limit, o.host_shared_limit);
    /* Batch 16: 8 (1 - 0.75^16) = 7.91982 experts a layer, M = 0.71875 x 56 x 7.91982 x
     * 169,869,312 = 54,149,703,338 bytes; every bound is M over its rate again, 16x the tokens:
     * 16.40, 40.33, 33.98 tok/s (the GPU term, at most 21.4 ms with 16 sequences' KV, stays below). */
    r.batch = 16;
    T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0, "decode");
    double M16 = 0.71875 * 56 * 8.0 * (1.0 - pow(0.75, 16)) * 169869312.0;
    T_CHECK(s_close(o.miss_bytes, M16, 1e-12), "miss %.0f vs %.0f", o.miss_bytes, M16);
    T_CHECK(s_close(o.pcie_only_tok_s, 16 * 55.5e9 / M16, 1e-9) && s_close(o.bw_added_tok_s, 16 * 136.5e9 / M16, 1e-9) &&
                s_close(o.host_shared_tok_s, 16 * 115e9 / M16, 1e-9),
            "%.4f %.4f %.4f", o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s);
    T_CHECK(fabs(o.pcie_only_tok_s - 16.40) < 0.01 && fabs(o.bw_added_tok_s - 40.33) < 0.01 &&
                fabs(o.host_shared_tok_s - 33.98) < 0.01,
            "%.3f %.3f %.3f", o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s);
}

/* Mixtral-8x7B at 12 GiB and Qwen3-30B-A3B at 6 GiB, int4 everywhere, on the H200 host, same
 * operating point. Slots by hand:
 *   Mixtral-8x7B: resident 833,961,984 (32 x (q, o [4096]^2 + k, v [1024][4096]) x 0.5625 =
 *     754,974,720, norms 1,048,576, routers 4,194,304, final norm 16,384, lm_head [32000][4096]
 *     x 0.5625 = 73,728,000); (12,884,901,888 - 833,961,984 - 1,342,177,280) / 99,090,432 =
 *     108.06: 108 of 256, hit 0.421875; batch 1 M = 0.578125 x 64 x 99,090,432 = 3,666,345,984.
 *   Qwen3-30B-A3B: expert 3 x 768 x 2048 x 0.5625 = 2,654,208; resident 735,813,632 (48 x (q, o
 *     [4096][2048] + k, v [512][2048]) x 0.5625 = 509,607,936, q/k norms 48 x 2 x 128 x 4 =
 *     49,152, norms 786,432, routers [128][2048] f32 50,331,648, final norm 8,192, lm_head
 *     [151936][2048] x 0.5625 = 175,030,272); (6,442,450,944 - 735,813,632 - 1,342,177,280) /
 *     2,654,208 = 1644.4: 1644 of 6144; batch 1: 8 of 128, M = (1 - 1644/6144) x 48 x 8 x
 *     2,654,208.
 * Every case is transfer-bound, so the bounds are M over 55.5, 136.5 and 115 GB/s. */
static void s_host_shared_small(void)
{
    struct {
        const char *shape;
        double gib, expert, resident, slots, k, E, layers;
        double tok[2][3]; /* batch 1, 16: pcie-only, bw-added, host-shared (rounded, 0.01) */
    } cs[] = {
        {"mixtral-8x7b", 12, 99090432.0, 833961984.0, 108, 2, 8, 32, {{15.14, 37.23, 31.37}, {61.16, 150.43, 126.74}}},
        {"qwen3-30b-a3b", 6, 2654208.0, 735813632.0, 1644, 8, 128, 48, {{74.35, 182.85, 154.05}, {115.46, 283.97, 239.24}}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        roofline_model_t m;
        s_model_same(cs[i].shape, &m);
        T_CHECK(m.expert_bytes == cs[i].expert && m.resident_bytes == cs[i].resident, "%s: expert %.0f resident %.0f",
                cs[i].shape, m.expert_bytes, m.resident_bytes);
        roofline_run_t r;
        roofline_run_default(&r);
        r.context = 1024;
        r.gpu_mem = cs[i].gib * GIB;
        r.reserved_bytes = 1.25 * GIB;
        for (int b = 0; b < 2; b++) {
            r.batch = b ? 16 : 1;
            roofline_t o;
            T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0, "%s decode", cs[i].shape);
            double total = cs[i].layers * cs[i].E;
            double D = cs[i].E * (1.0 - pow(1.0 - cs[i].k / cs[i].E, r.batch));
            double M = (1.0 - cs[i].slots / total) * cs[i].layers * D * cs[i].expert;
            T_CHECK(o.slots == cs[i].slots && s_close(o.miss_bytes, M, 1e-12), "%s: slots %.0f miss %.0f vs %.0f",
                    cs[i].shape, o.slots, o.miss_bytes, M);
            double want[3] = {r.batch * 55.5e9 / M, r.batch * 136.5e9 / M, r.batch * 115e9 / M};
            double got[3] = {o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s};
            for (int j = 0; j < 3; j++)
                T_CHECK(s_close(got[j], want[j], 1e-9) && fabs(got[j] - cs[i].tok[b][j]) < 0.006,
                        "%s batch %d bound %d: %.4f, by hand %.4f (%.2f)", cs[i].shape, r.batch, j, got[j], want[j],
                        cs[i].tok[b][j]);
        }
    }
}

/* gpt-oss with MXFP4 experts and bf16 attention and lm_head, as the checkpoints ship it
 * (`strata synth --format mxfp4`), on the H200 host's ceilings at the operating point above. */
static void s_gpt_oss_mxfp4(void)
{
    model_config_t c;
    strata_errbuf_t eb = {{0}};
    roofline_model_t m;
    T_CHECK(shape_config(shape_find("gpt-oss-120b"), &c, &eb) == 0, "%s", eb.msg);
    T_CHECK(roofline_model_from_config(&m, &c, WF_MXFP4, 32, WF_BF16, &eb) == 0, "%s", eb.msg);
    /* One expert: gate, up [2880][2880] and down [2880][2880] at 4 bits + one e8m0 byte per 32
     * (4.25 bits): data 8,294,400 / 2 = 4,147,200 + scales 8,294,400 / 32 = 259,200 = 4,406,400 a
     * matrix, x3 = 13,219,200. Its biases (gate, up [2880], down [2880] f32) are resident, not in
     * the expert: 3 x 2880 x 4 = 34,560 bytes. */
    T_CHECK(m.expert_bytes == 13219200.0, "expert %.0f", m.expert_bytes);
    T_CHECK(m.expert_vec_bytes == 34560.0, "expert vectors %.0f", m.expert_vec_bytes);
    /* Resident per layer: wq, wo [4096][2880] and wk, wv [512][2880] bf16 = 53,084,160; router
     * [128][2880] f32 1,474,560; f32 vectors: attn and ffn norms 2 x 11,520, bq 16,384, bk, bv 2 x
     * 2,048, bo 11,520, sinks 256, router bias 512 = 55,808: 54,614,528 x 36 layers =
     * 1,966,123,008; final norm 11,520; lm_head [201088][2880] bf16 1,158,266,880. Total
     * 3,124,401,408 (the experts' biases, 36 x 128 x 34,560 = 159,252,480, apart). */
    T_CHECK(m.resident_bytes == 3124401408.0, "resident %.0f", m.resident_bytes);
    T_CHECK(m.embed_bytes == 1158266880.0, "embed %.0f", m.embed_bytes);
    /* K and V fp32: 2 x 36 x 8 x 64 x 4 = 147,456 a token, half of it in the 18 sliding layers */
    T_CHECK(m.kv_bytes_per_token == 147456.0 && m.kv_window_bytes_per_token == 73728.0 && m.sliding_window == 128,
            "kv %.0f window %.0f over %d", m.kv_bytes_per_token, m.kv_window_bytes_per_token, m.sliding_window);
    T_CHECK(m.n_experts_total == 4608 && m.top_k == 4 && m.n_moe_layers == 36, "experts %lld", (long long)m.n_experts_total);

    roofline_run_t r;
    roofline_run_default(&r);
    r.context = 1024;
    r.gpu_mem = 24.0 * GIB;
    r.reserved_bytes = 1.25 * GIB;
    roofline_t o;
    /* Slots: (25,769,803,776 - 3,124,401,408 - 159,252,480 - 1,342,177,280) / 13,219,200 =
     * 21,143,972,608 / 13,219,200 = 1599.49: 1599 of 4608, hit 1599 / 4608 = 0.347005. Batch 1:
     * 4 experts a layer, touched 36 x 4 x 13,219,200 = 1,903,564,800, missed 3009 / 4608 of it =
     * 1,243,017,900 bytes a token. KV read: full layers 1024 x 73,728 + sliding layers 128 x
     * 73,728 = 84,934,656. GPU term (3,124,401,408 + 84,934,656 + 660,546,900 + 0.347 x 4,976,640
     * of hit experts' biases) / 4e12 = 0.97 ms, far below: the bounds are M over 55.5, 136.5 and
     * 115 GB/s: 44.649, 109.813 and 92.517 tok/s. */
    r.batch = 1;
    T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 1599 && s_close(o.hit_rate, 1599.0 / 4608.0, 1e-12), "slots %.0f hit %.6f", o.slots, o.hit_rate);
    T_CHECK(o.miss_bytes == 1243017900.0, "miss %.0f", o.miss_bytes);
    T_CHECK(o.kv_bytes == 84934656.0, "kv %.0f", o.kv_bytes);
    /* every byte touched: 3,124,401,408 + 84,934,656 + 1,903,564,800 + 36 x 4 x 34,560 */
    T_CHECK(o.bytes_per_token == 5117877504.0, "bytes/token %.0f", o.bytes_per_token);
    T_CHECK(s_close(o.pcie_only_tok_s, 55.5e9 / 1243017900.0, 1e-9) && s_close(o.bw_added_tok_s, 136.5e9 / 1243017900.0, 1e-9) &&
                s_close(o.host_shared_tok_s, 115e9 / 1243017900.0, 1e-9),
            "%.4f %.4f %.4f", o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s);
    T_CHECK(fabs(o.pcie_only_tok_s - 44.649) < 0.001 && fabs(o.bw_added_tok_s - 109.813) < 0.001 &&
                fabs(o.host_shared_tok_s - 92.517) < 0.001,
            "%.4f %.4f %.4f", o.pcie_only_tok_s, o.bw_added_tok_s, o.host_shared_tok_s);
    T_CHECK(!strcmp(o.pcie_only_limit, "pcie") && !strcmp(o.bw_added_limit, "pcie+cpu") &&
                !strcmp(o.host_shared_limit, "host memory"),
            "%s %s %s", o.pcie_only_limit, o.bw_added_limit, o.host_shared_limit);
    /* context 64, inside the window: every layer reads 64 positions */
    r.context = 64;
    T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0 && o.kv_bytes == 64 * 147456.0, "kv %.0f", o.kv_bytes);

    /* gpt-oss-20b: 24 layers of 32 experts all fit in 24 GiB (768 x 13,219,200 = 10,152,345,600
     * besides 2,442,475,776 resident and 768 x 34,560 = 26,542,080 of expert biases), so the GPU
     * binds: batch 1 at context 1024 reads 2,442,475,776 + KV (1024 + 128) x 49,152 = 56,623,104
     * + 24 x 4 x (13,219,200 + 34,560) = 1,272,360,960: 3,771,459,840 bytes, 1060.60 tok/s at
     * 4 TB/s. (Resident per layer: 54,614,528 less 96 router rows of 2880 f32 and their 96 biases,
     * 1,106,304: 53,508,224 x 24 + 11,520 + 1,158,266,880.) */
    T_CHECK(shape_config(shape_find("gpt-oss-20b"), &c, &eb) == 0, "%s", eb.msg);
    T_CHECK(roofline_model_from_config(&m, &c, WF_MXFP4, 32, WF_BF16, &eb) == 0, "%s", eb.msg);
    T_CHECK(m.expert_bytes == 13219200.0 && m.resident_bytes == 2442475776.0 && m.n_experts_total == 768,
            "20b: expert %.0f resident %.0f", m.expert_bytes, m.resident_bytes);
    r.context = 1024;
    T_CHECK(roofline_decode(&m, &s_h200, &r, &o) == 0, "decode");
    T_CHECK(o.slots == 768 && o.miss_bytes == 0 && !strcmp(o.bw_added_limit, "hbm"), "20b: slots %.0f miss %.0f %s",
            o.slots, o.miss_bytes, o.bw_added_limit);
    T_CHECK(s_close(o.bw_added_step_s, 3771459840.0 / 4.0e12, 1e-12) && s_close(o.host_shared_tok_s, 4.0e12 / 3771459840.0, 1e-12),
            "20b: step %.9f", o.bw_added_step_s);
}

/* Every real shape's config parses and plans, and the counts match the published totals. */
static void s_shapes(void)
{
    struct {
        const char *name;
        double params_b; /* total parameters in billions, from the model cards */
    } known[] = {{"mixtral-8x7b", 46.7}, {"mixtral-8x22b", 140.6}, {"qwen3-30b-a3b", 30.5},
                 {"qwen3-235b-a22b", 235.1}, {"qwen2-57b-a14b", 57.4}, {"olmoe-1b-7b", 6.9},
                 {"gpt-oss-120b", 116.8}, {"gpt-oss-20b", 20.9}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const shape_t *s = shape_find(known[i].name);
        T_CHECK(s != NULL, "%s", known[i].name);
        if (!s) continue;
        model_config_t c;
        strata_errbuf_t eb = {{0}};
        T_CHECK(shape_config(s, &c, &eb) == 0, "%s: %s", s->name, eb.msg);
        double p = (double)c.vocab * c.hidden * 2; /* embed + lm_head */
        for (int l = 0; l < c.n_layers; l++) {
            p += (double)c.hidden * c.head_dim * (2.0 * c.n_heads + 2.0 * c.n_kv_heads);
            p += c.layer_sparse[l] ? 3.0 * c.hidden * c.moe_inter * c.n_experts + (double)c.n_experts * c.hidden
                                   : 3.0 * c.hidden * c.dense_inter;
            if (c.layer_sparse[l] && c.shared_inter) p += 3.0 * c.hidden * c.shared_inter + c.hidden;
        }
        T_CHECK(fabs(p / 1e9 - known[i].params_b) < 0.15, "%s: %.2f B params, published %.1f", s->name, p / 1e9,
                known[i].params_b);
        T_CHECK(c.n_experts == s->n_experts && c.top_k == s->top_k && c.n_layers == s->n_layers, "%s", s->name);
    }
}

int main(void)
{
    s_mixtral_int4_24g();
    s_round_numbers();
    s_host_shared_8x22b();
    s_host_shared_small();
    s_gpt_oss_mxfp4();
    s_shapes();
    return t_done("roofline");
}
