/* zmsg.c - msg_t over ZeroMQ frames (see zmsg.h). */
#include "proto/zmsg.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

int zmsg_send(void *sock, const void *route, size_t route_len, const msg_t *m, msg_buf_t *b, int flags)
{
    int rc = msg_encode(m, b);
    if (rc < 0) return rc;
    if (route && zmq_send(sock, route, route_len, flags | ZMQ_SNDMORE) < 0) return -zmq_errno();
    /* A ROUTER socket has queued the routing frame only together with the last frame, so a
     * failure of the body send below drops the whole message; nothing is left half-sent. */
    if (zmq_send(sock, b->data, b->size, flags) < 0) return -zmq_errno();
    return 0;
}

int zmsg_send_error(void *sock, const void *route, size_t route_len, msg_type_t type, bool has_id, uint64_t id,
                    msg_errcode_t code, const char *text, msg_buf_t *b, int flags)
{
    msg_t m;
    msg_init(&m, type);
    m.has_id = has_id;
    m.id = id;
    m.u.error.code = code;
    size_t n = strlen(text);
    m.u.error.message.s = text;
    m.u.error.message.len = n > 4096 ? 4096 : n;
    return zmsg_send(sock, route, route_len, &m, b, flags);
}

int zmsg_recv(void *sock, msg_family_t fam, msg_t *m, msg_err_t *err, int flags)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    msg_init(m, MSG_INVALID);
    if (zmq_msg_recv(&f, sock, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&f);
        return -e;
    }
    bool extra = zmq_msg_more(&f);
    while (zmq_msg_more(&f)) {
        /* drain the rest of a multi-frame message; it is refused below */
        zmq_msg_t g;
        zmq_msg_init(&g);
        if (zmq_msg_recv(&g, sock, 0) < 0) { zmq_msg_close(&g); break; }
        int more = zmq_msg_more(&g);
        zmq_msg_close(&g);
        if (!more) break;
    }
    int rc;
    if (extra) {
        if (err) {
            err->code = MSG_E_MALFORMED;
            snprintf(err->text, sizeof err->text, "a message must be one frame");
        }
        rc = STRATA_EFORMAT;
    } else {
        rc = msg_decode(fam, zmq_msg_data(&f), zmq_msg_size(&f), m, err);
    }
    zmq_msg_close(&f);
    return rc;
}

int zmsg_recv_routed(void *sock, zmq_msg_t *idf, zmq_msg_t *body, int *frames)
{
    zmq_msg_init(idf);
    if (zmq_msg_recv(idf, sock, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(idf);
        return e == EAGAIN || e == EINTR ? 0 : -e;
    }
    zmq_msg_init(body);
    *frames = 0;
    bool more = zmq_msg_more(idf);
    while (more) { /* keep the first payload frame; count and drop any others */
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            zmq_msg_close(&f);
            break;
        }
        more = zmq_msg_more(&f);
        if ((*frames)++ == 0) zmq_msg_move(body, &f);
        zmq_msg_close(&f);
    }
    return 1;
}
