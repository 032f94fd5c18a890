/* zmsg.h - sending and receiving msg_t over ZeroMQ sockets (one frame per message, with an
 * optional routing-id frame in front for ROUTER sockets). Shared by every service. */
#ifndef STRATA_PROTO_ZMSG_H
#define STRATA_PROTO_ZMSG_H

#include <stddef.h>
#include <zmq.h>

#include "proto/msg.h"

/* Encode m into b and send it. If route != NULL, a routing-id frame (route, route_len) goes
 * first (ROUTER sockets). flags: ZMQ_DONTWAIT or 0. Returns 0, STRATA_EINVAL_INPUT (bad
 * message), -EAGAIN (would block), -EHOSTUNREACH (ROUTER_MANDATORY, peer gone) or another
 * -errno from zmq_send. */
int zmsg_send(void *sock, const void *route, size_t route_len, const msg_t *m, msg_buf_t *b, int flags);

/* Send an error message of type `type` (MSG_ERROR, MSG_SCHED_ERROR, MSG_EXEC_ERROR) with the
 * given code and text; has_id/id name the request it answers. Same returns as zmsg_send. */
int zmsg_send_error(void *sock, const void *route, size_t route_len, msg_type_t type, bool has_id, uint64_t id,
                    msg_errcode_t code, const char *text, msg_buf_t *b, int flags);

/* Receive one message on a DEALER/PAIR-style socket (no routing frame) and decode it in
 * family fam. Extra frames are drained and refused. flags: ZMQ_DONTWAIT or 0.
 * Returns 0 (m filled; msg_free it), -EAGAIN, another -errno, or a msg_decode error (err
 * filled, m holds what could be read; msg_free it). */
int zmsg_recv(void *sock, msg_family_t fam, msg_t *m, msg_err_t *err, int flags);

/* Receive one message on a ROUTER socket without blocking: its routing-id frame into idf and
 * the first frame after it into body; any further frames are drained. *frames gets the number
 * of frames after the id (1 for a well-formed message). Returns 1 (idf and body initialised:
 * the caller closes both), 0 (nothing to read, or interrupted; nothing to close) or -errno. */
int zmsg_recv_routed(void *sock, zmq_msg_t *idf, zmq_msg_t *body, int *frames);

#endif
