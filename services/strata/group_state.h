/* group_state.h - the launcher's state file (run_dir/state.json) and group lock, shared by
 * `strata up` (writer), `strata status` and `strata down` (readers).
 *
 * state.json is rewritten atomically (temporary file + rename) on every change:
 *   {"group": NAME, "config": PATH, "launcher_pid": PID, "state": "starting|running|stopping|
 *    stopped|failed", "started_unix": SECONDS, "updated_unix": SECONDS,
 *    "services": [{"name", "pid", "state", "started_unix", "ready_unix", "restarts",
 *                  "last_exit", "exe"}, ...]}
 * Times are CLOCK_REALTIME seconds, so a reader in another process can compute uptimes.
 *
 * run_dir/launcher.lock is held (flock, exclusive) by the running launcher: the kernel drops it
 * when the launcher dies, so "is the group running" never trusts a stale pid.
 */
#ifndef STRATA_GROUP_STATE_H
#define STRATA_GROUP_STATE_H

#include <stdbool.h>
#include <sys/types.h>

#include "common/config.h"
#include "proto/msg.h"

#define GS_MAX_SVC (4 + CONFIG_MAX_PREFETCHERS) /* prefetchers, executor, scheduler, router, http */

typedef struct {
    char name[32];          /* "prefetcher.0", "executor", "scheduler", "router", "http" */
    pid_t pid;              /* 0 when not running */
    char state[16];         /* idle starting ready backoff stopping exited failed */
    double started_unix;    /* current process's spawn time, 0 if none */
    double ready_unix;      /* when it reported READY=1, 0 if not (yet) */
    int restarts;           /* spawns after the first */
    char last_exit[48];     /* "exit 1", "signal 9", "" if it never exited */
    char exe[256];
} gs_service_t;

typedef struct {
    char group[64];
    char config[512];
    pid_t launcher_pid;
    char state[16];         /* starting running stopping stopped failed */
    double started_unix;
    double updated_unix;
    int n;
    gs_service_t svc[GS_MAX_SVC];
} gs_state_t;

/* Write st to run_dir/state.json atomically. */
int gs_write(const char *run_dir, const gs_state_t *st);
/* Read run_dir/state.json. -ENOENT if absent; STRATA_EFORMAT if unreadable. */
int gs_read(const char *run_dir, gs_state_t *st, strata_errbuf_t *eb);
/* Take the group lock (non-blocking). Returns the lock fd (keep it open), or STRATA_EBUSY if
 * another launcher holds it, or <0. */
int gs_lock(const char *run_dir);
/* True if some process holds the group lock (the launcher is alive). */
bool gs_locked(const char *run_dir);
/* CLOCK_REALTIME in seconds. */
double gs_now_unix(void);

/* The group a reader command (`strata status`, `strata down`) names: --config FILE, or --demo
 * [--run-dir DIR]. */
typedef struct {
    const char *config;     /* --config FILE, or NULL */
    const char *run_dir;    /* --run-dir DIR, or NULL */
    bool demo;              /* --demo */
} gs_target_t;

/* If argv[*i] is --demo, or --config / --run-dir followed by a value, record it in t, move *i past
 * the value and return true; else false (an option without its value included). */
bool gs_target_opt(gs_target_t *t, int argc, char **argv, int *i);
/* Check t names exactly one group and write its run dir to rd: DIR or /tmp/strata-demo for --demo,
 * else the config's run_dir. Returns 0, 2 (bad usage or config, "strata CMD: ..." printed) or 1
 * (out of memory). */
int gs_target_run_dir(const gs_target_t *t, const char *cmd, char *rd, size_t cap);

/* The running groups of this user, so that `strata status`, `strata down` and `strata client`
 * find one without --config: `strata up` records each group it starts in the registry, a folder
 * of this user's ($STRATA_REGISTRY, else $XDG_RUNTIME_DIR/strata, or /run/strata for root; none
 * when neither applies),
 * one file per group named after it, holding its run dir and its config's path, and removes it
 * at the stop. A record whose run dir's lock nobody holds is stale (a launcher killed): readers
 * skip and remove it. */
typedef struct {
    char name[64];
    char run_dir[512];
    char config[512];
} gs_entry_t;
/* The registry folder into buf (made, 0700); -ENOENT where there is none. */
int gs_registry_dir(char *buf, size_t cap);
/* Record the group name (run dir, config) as running; 0 or <0. */
int gs_register(const char *name, const char *run_dir, const char *config);
/* Remove its record (no error if absent). */
void gs_unregister(const char *name);
/* Up to max running groups into out; returns how many are running (may exceed max), or <0. */
int gs_running(gs_entry_t *out, int max);
/* With no --config / --demo: the one running group's entry into e, 0. Several: lists them on
 * stderr, "strata CMD: ..." and returns 2; none: returns -ENOENT (nothing printed). */
int gs_find_one(const char *cmd, gs_entry_t *e);
/* Without an endpoint given: the router endpoint of the one group this user runs into ep, and
 * its model folder into model (may be NULL). 0 (ep untouched when none runs), 2 when several
 * run (listed) or its config no longer parses (printed), 1 out of memory. */
int gs_find_router(const char *cmd, char *ep, size_t cap, char *model, size_t mcap);

/* One request of `type` (no body) to a service's endpoint on a DEALER of ctx, and its reply in
 * family fam, waited for timeout_ms: 0 with *out (msg_free it), or <0 (not answering). */
int gs_ask(void *ctx, const char *endpoint, msg_type_t type, msg_family_t fam, int timeout_ms, msg_t *out);
/* Where the experts are, tier by tier, and how often each tier had what was asked: the
 * executor's GPU expert cache (its stats), each prefetcher's arena and disk tier (its status),
 * each asked with a 500 ms timeout. One line of text at a time to line(). */
void gs_tiers(const char *config_path, void (*line)(void *ctx, const char *text), void *lctx);

#endif
