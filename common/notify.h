/* notify.h - the service readiness protocol (sd_notify), both sides.
 *
 * Service side: a thin wrapper over libsystemd's sd_notify, so the same binaries run under
 * systemd (Type=notify, WatchdogSec=) and under `strata up`. Every call is a no-op returning 0
 * when NOTIFY_SOCKET is not set (the service was started by hand).
 *
 *   notify_ready()       once the service serves            -> "READY=1"
 *   notify_stopping()    when it begins to stop             -> "STOPPING=1"
 *   notify_watchdog()    call often from the main loop; sends "WATCHDOG=1" at most every
 *                        half WATCHDOG_USEC (cheap: one clock read when not due)
 *   notify_status(...)   free text shown by systemctl status -> "STATUS=..."
 *
 * Launcher side: notify_server_* open a unix datagram socket with SO_PASSCRED, so every
 * datagram carries the sender's pid from the kernel (the sender cannot lie), exactly as
 * systemd's own notify socket does. The address is put into each child's NOTIFY_SOCKET.
 */
#ifndef STRATA_NOTIFY_H
#define STRATA_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Tell the supervisor the service is ready. 0, or <0 if the socket is set but unusable. */
int notify_ready(void);
/* Tell the supervisor the service is stopping. */
int notify_stopping(void);
/* Send WATCHDOG=1 if the watchdog is enabled and half its interval passed since the last one. */
int notify_watchdog(void);
/* The watchdog interval in microseconds from WATCHDOG_USEC, or 0 if disabled. */
uint64_t notify_watchdog_usec(void);
/* Send "STATUS=<text>". */
int notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Launcher side. Messages a service sent, parsed from one datagram. */
typedef struct {
    pid_t pid;          /* sender pid from SCM_CREDENTIALS, 0 if the kernel gave none */
    bool ready;         /* READY=1 */
    bool stopping;      /* STOPPING=1 */
    bool watchdog;      /* WATCHDOG=1 */
    char status[256];   /* STATUS=..., "" if absent */
} notify_msg_t;

/* Open a datagram socket bound to the abstract address "@<name>" (no file in the file system,
 * so nothing is left behind on a crash). Returns the fd (non-blocking, close-on-exec) or <0.
 * The value for NOTIFY_SOCKET is "@<name>". */
int notify_server_open(const char *name);
/* Receive one datagram. 1 if a message was read, 0 if none is pending, <0 on error. */
int notify_server_recv(int fd, notify_msg_t *m);
/* Parse the text of one datagram ("KEY=VALUE\n..."); used by notify_server_recv and tests. */
void notify_parse(const char *text, size_t len, notify_msg_t *m);

#endif
