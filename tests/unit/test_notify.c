/* test_notify.c - the readiness protocol both ways: a child process reports READY=1,
 * WATCHDOG=1, STATUS and STOPPING=1 through notify.h (libsystemd's sd_notify) to a
 * notify_server socket, which must name the child's pid from the kernel credentials. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/notify.h"
#include "tests/unit/check.h"

/* Next message within 2 s, or 0. */
static int s_recv(int fd, notify_msg_t *m)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 2000) <= 0) return 0;
    return notify_server_recv(fd, m);
}

int main(void)
{
    char name[64];
    snprintf(name, sizeof name, "strata-test-notify-%d", (int)getpid());
    int fd = notify_server_open(name);
    T_CHECK(fd >= 0, "notify_server_open: %d", fd);
    if (fd < 0) return t_done("test_notify");
    T_CHECK(notify_server_open(name) < 0, "the same name twice is refused");
    notify_msg_t m;
    T_CHECK(notify_server_recv(fd, &m) == 0, "nothing pending");

    /* without NOTIFY_SOCKET every call is a no-op */
    unsetenv("NOTIFY_SOCKET");
    T_CHECK(notify_ready() == 0 && notify_stopping() == 0 && notify_watchdog() == 0, "no-ops without NOTIFY_SOCKET");

    char addr[80];
    snprintf(addr, sizeof addr, "@%s", name);
    setenv("NOTIFY_SOCKET", addr, 1);
    setenv("WATCHDOG_USEC", "200000", 1);
    pid_t child = fork();
    if (child == 0) {
        int rc = 0;
        rc |= notify_status("warming up %d", 42);
        rc |= notify_ready();
        T_CHECK(notify_watchdog_usec() == 200000, "watchdog usec");
        usleep(120000); /* past half the interval: the next call sends */
        rc |= notify_watchdog();
        rc |= notify_watchdog(); /* rate-limited: not sent */
        rc |= notify_stopping();
        _exit(rc || t_failed ? 1 : 0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child ok");

    int got_status = 0, got_ready = 0, got_wd = 0, got_stop = 0, other = 0;
    while (s_recv(fd, &m) > 0) {
        T_CHECK(m.pid == child, "sender pid %d, want %d", (int)m.pid, (int)child);
        if (m.status[0]) got_status += !strcmp(m.status, "warming up 42");
        else if (m.ready) got_ready++;
        else if (m.watchdog) got_wd++;
        else if (m.stopping) got_stop++;
        else other++;
        if (got_stop) break;
    }
    T_CHECK(got_status == 1 && got_ready == 1 && got_wd == 1 && got_stop == 1 && other == 0,
            "messages: status %d ready %d watchdog %d stopping %d other %d", got_status, got_ready, got_wd, got_stop, other);
    close(fd);
    return t_done("test_notify");
}
