/* notify.c - sd_notify wrapper (service side) and the launcher's notify socket. */
#include "common/notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "common/strata.h"

static uint64_t s_last_watchdog_ns;

static int s_send(const char *state)
{
    if (!getenv("NOTIFY_SOCKET")) return 0;
    int r = sd_notify(0, state);
    if (r < 0) {
        log_warn("sd_notify(%s) failed: %s", state, strata_strerror(r));
        return r;
    }
    return 0;
}

int notify_ready(void)
{
    s_last_watchdog_ns = strata_now_ns();
    return s_send("READY=1");
}

int notify_stopping(void) { return s_send("STOPPING=1"); }

uint64_t notify_watchdog_usec(void)
{
    uint64_t usec = 0;
    /* sd_watchdog_enabled also checks WATCHDOG_PID when set (systemd sets it to the main pid). */
    if (sd_watchdog_enabled(0, &usec) <= 0) return 0;
    return usec;
}

int notify_watchdog(void)
{
    /* read every time (a getenv and a parse): cheap, and never stale */
    uint64_t interval_ns = notify_watchdog_usec() * 1000;
    if (interval_ns == 0) return 0;
    uint64_t now = strata_now_ns();
    if (s_last_watchdog_ns && now - s_last_watchdog_ns < interval_ns / 2) return 0;
    s_last_watchdog_ns = now;
    return s_send("WATCHDOG=1");
}

int notify_status(const char *fmt, ...)
{
    char buf[300];
    int n = snprintf(buf, sizeof buf, "STATUS=");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    return s_send(buf);
}

int notify_server_open(const char *name)
{
    int rc, fd = -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    if (n == 0 || n + 1 > sizeof sa.sun_path) return -ENAMETOOLONG;
    /* abstract namespace: sun_path[0] = 0, the name follows, the length ends it */
    memcpy(sa.sun_path + 1, name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    SYS_CHECK(fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    SYS_CHECK(setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one));
    SYS_CHECK(bind(fd, (struct sockaddr *)&sa, len));
    return fd;
fail:
    if (fd >= 0) close(fd);
    return rc;
}

void notify_parse(const char *text, size_t len, notify_msg_t *m)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        size_t ll = (size_t)(le - p);
        if (ll == 7 && !memcmp(p, "READY=1", 7)) m->ready = true;
        else if (ll == 10 && !memcmp(p, "STOPPING=1", 10)) m->stopping = true;
        else if (ll == 10 && !memcmp(p, "WATCHDOG=1", 10)) m->watchdog = true;
        else if (ll >= 7 && !memcmp(p, "STATUS=", 7)) {
            size_t sl = ll - 7;
            if (sl >= sizeof m->status) sl = sizeof m->status - 1;
            memcpy(m->status, p + 7, sl);
            m->status[sl] = 0;
        }
        p = le + 1;
    }
}

int notify_server_recv(int fd, notify_msg_t *m)
{
    char buf[4096];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(struct ucred))];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
    memset(m, 0, sizeof *m);
    ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return -errno;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
            c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
            struct ucred u;
            memcpy(&u, CMSG_DATA(c), sizeof u);
            m->pid = u.pid;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            /* a service may pass fds (FDSTORE); we keep none: close them */
            int nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < nfd; i++) {
                int x;
                memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof x);
                close(x);
            }
        }
    }
    notify_parse(buf, (size_t)n, m);
    return 1;
}
