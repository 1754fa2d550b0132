/* The connection guard: keeps slow or idle connections from holding every
 * connection thread (slowloris). MHD runs one thread per connection up to
 * --max-connections; the guard tracks each connection's state (reading a
 * request's headers, reading its body, being served) and
 *   - closes a connection whose headers are not complete within the header
 *     deadline, or whose body is not complete within the body deadline
 *     (MHD's own timeout is an idle timeout: one byte per interval resets it);
 *   - caps the connections of one client address: a client at its cap that
 *     opens another loses its own oldest waiting connection (or is refused
 *     when all its connections are being served);
 *   - keeps a reserve: connections still reading a request may hold at most
 *     max_connections - reserve slots; a newcomer beyond that closes the
 *     oldest waiting connection of the client holding the most waiting ones.
 * So a quick request (/health, an authenticated call) always finds a slot:
 * it is never the oldest waiting connection, and the reserve keeps room for
 * the requests being served. Connections are closed with shutdown(): the
 * connection's own thread sees the end of its stream and MHD cleans up. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/log.h"
#include "server/server_int.h"

/* How often the deadline sweep runs: deadlines are whole seconds, so a
 * quarter second late at most is fine. */
#define GUARD_SWEEP_MS 250

typedef enum guard_state { G_HEADERS, G_BODY, G_SERVING, G_CLOSING } guard_state;

/* A client address without its port: the IPv6 form (IPv4 mapped). */
typedef struct guard_ip {
    uint8_t b[16];
} guard_ip;

typedef struct guard_conn {
    struct guard_conn *prev, *next;
    int fd;
    guard_ip ip;
    guard_state state;
    double since; /* when the current state began (monotonic seconds) */
} guard_conn;

struct srv_guard {
    tern_server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t sweeper;
    int sweeper_started, stop;
    guard_conn *head, *tail; /* every connection MHD holds, oldest first */
    int n_conns;
};

static int ip_of(const struct sockaddr *a, guard_ip *ip)
{
    memset(ip, 0, sizeof *ip);
    if (!a)
        return -1;
    if (a->sa_family == AF_INET) {
        ip->b[10] = ip->b[11] = 0xff;
        memcpy(ip->b + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
        return 0;
    }
    if (a->sa_family == AF_INET6) {
        memcpy(ip->b, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
        return 0;
    }
    return -1;
}

static int waiting(const guard_conn *g) { return g->state == G_HEADERS || g->state == G_BODY; }

/* Closes g's socket for both directions (mu held). Its thread ends the
 * connection; MHD's CLOSED notification unlinks it. */
static void close_locked(srv_guard *gd, guard_conn *g, atomic_llong *counter)
{
    if (g->state == G_CLOSING)
        return;
    g->state = G_CLOSING;
    if (g->fd >= 0)
        shutdown(g->fd, SHUT_RDWR);
    atomic_fetch_add(counter, 1);
    (void)gd;
}

/* The oldest waiting connection (of ip when ip is not NULL), mu held. */
static guard_conn *oldest_waiting(srv_guard *gd, const guard_ip *ip)
{
    guard_conn *best = NULL;
    for (guard_conn *g = gd->head; g; g = g->next)
        if (waiting(g) && (!ip || !memcmp(&g->ip, ip, sizeof *ip)) && (!best || g->since < best->since))
            best = g;
    return best;
}

/* The client with the most waiting connections (mu held): the one whose
 * oldest waiting connection goes when the waiting slots are full. */
static int busiest_waiting(srv_guard *gd, guard_ip *out)
{
    int best = 0;
    for (guard_conn *g = gd->head; g; g = g->next) {
        if (!waiting(g))
            continue;
        int n = 0;
        for (guard_conn *h = gd->head; h; h = h->next)
            n += waiting(h) && !memcmp(&h->ip, &g->ip, sizeof g->ip);
        if (n > best) {
            best = n;
            *out = g->ip;
        }
        if (best * 2 > gd->n_conns)
            break; /* a majority: no other client can have more */
    }
    return best;
}

enum MHD_Result srv_guard_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    srv_guard *gd = ((tern_server *)cls)->guard;
    tern_server *s = gd->s;
    (void)len;
    guard_ip ip;
    if (ip_of(addr, &ip))
        return MHD_YES; /* not an IP socket: nothing to count by */
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&gd->mu);
    int n_ip = 0, n_waiting = 0;
    for (guard_conn *g = gd->head; g; g = g->next) {
        if (g->state == G_CLOSING)
            continue;
        n_ip += !memcmp(&g->ip, &ip, sizeof ip);
        n_waiting += waiting(g);
    }
    if (s->o.max_client_connections > 0 && n_ip >= s->o.max_client_connections) {
        guard_conn *g = oldest_waiting(gd, &ip);
        if (g)
            close_locked(gd, g, &s->met.conn_evicted);
        else {
            atomic_fetch_add(&s->met.conn_refused, 1);
            ok = MHD_NO; /* every connection of this client is being served */
        }
    } else if (n_waiting >= s->o.max_connections - s->o.reserve_connections) {
        guard_ip busy;
        if (busiest_waiting(gd, &busy) > 0) {
            guard_conn *g = oldest_waiting(gd, &busy);
            if (g)
                close_locked(gd, g, &s->met.conn_evicted);
        }
    }
    pthread_mutex_unlock(&gd->mu);
    return ok;
}

void srv_guard_notify(void *cls, struct MHD_Connection *mc, void **socket_ctx, enum MHD_ConnectionNotificationCode toe)
{
    srv_guard *gd = ((tern_server *)cls)->guard;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        guard_conn *g = calloc(1, sizeof *g);
        *socket_ctx = g;
        if (!g)
            return; /* untracked: it still has MHD's idle timeout */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        g->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        ip_of(ci ? ci->client_addr : NULL, &g->ip);
        g->state = G_HEADERS;
        g->since = tern_time_s();
        pthread_mutex_lock(&gd->mu);
        g->prev = gd->tail;
        if (gd->tail)
            gd->tail->next = g;
        else
            gd->head = g;
        gd->tail = g;
        gd->n_conns++;
        pthread_mutex_unlock(&gd->mu);
        return;
    }
    guard_conn *g = *socket_ctx;
    if (!g)
        return;
    pthread_mutex_lock(&gd->mu);
    if (g->prev)
        g->prev->next = g->next;
    else
        gd->head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        gd->tail = g->prev;
    gd->n_conns--;
    pthread_mutex_unlock(&gd->mu);
    free(g);
    *socket_ctx = NULL;
}

static void mark(tern_server *s, struct MHD_Connection *mc, guard_state st)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    guard_conn *g = ci ? ci->socket_context : NULL;
    if (!g || !s->guard)
        return;
    pthread_mutex_lock(&s->guard->mu);
    if (g->state != G_CLOSING) {
        g->state = st;
        g->since = tern_time_s();
    }
    pthread_mutex_unlock(&s->guard->mu);
}

void srv_guard_headers_done(tern_server *s, struct MHD_Connection *mc) { mark(s, mc, G_BODY); }
void srv_guard_request_done(tern_server *s, struct MHD_Connection *mc) { mark(s, mc, G_SERVING); }
void srv_guard_reply_done(tern_server *s, struct MHD_Connection *mc) { mark(s, mc, G_HEADERS); }

/* Closes connections past their read deadline, every GUARD_SWEEP_MS. */
static void *sweep(void *arg)
{
    srv_guard *gd = arg;
    tern_server *s = gd->s;
    pthread_mutex_lock(&gd->mu);
    while (!gd->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += GUARD_SWEEP_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&gd->cv, &gd->mu, &ts);
        double now = tern_time_s();
        for (guard_conn *g = gd->head; g && !gd->stop; g = g->next) {
            if (g->state == G_HEADERS && s->o.header_deadline_s > 0 && now - g->since > s->o.header_deadline_s)
                close_locked(gd, g, &s->met.conn_deadline);
            else if (g->state == G_BODY && s->o.body_deadline_s > 0 && now - g->since > s->o.body_deadline_s)
                close_locked(gd, g, &s->met.conn_deadline);
        }
    }
    pthread_mutex_unlock(&gd->mu);
    return NULL;
}

int srv_guard_start(tern_server *s, tern_err *err)
{
    srv_guard *gd = calloc(1, sizeof *gd);
    if (!gd)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    gd->s = s;
    pthread_mutex_init(&gd->mu, NULL);
    pthread_cond_init(&gd->cv, NULL);
    s->guard = gd;
    if (pthread_create(&gd->sweeper, NULL, sweep, gd) != 0)
        return tern_err_set(err, TERN_EIO, "cannot start the connection guard thread");
    gd->sweeper_started = 1;
    return 0;
}

void srv_guard_stop(tern_server *s)
{
    srv_guard *gd = s->guard;
    if (!gd || !gd->sweeper_started)
        return;
    pthread_mutex_lock(&gd->mu);
    gd->stop = 1;
    pthread_cond_broadcast(&gd->cv);
    pthread_mutex_unlock(&gd->mu);
    pthread_join(gd->sweeper, NULL);
    gd->sweeper_started = 0;
}

void srv_guard_free(tern_server *s)
{
    srv_guard *gd = s->guard;
    if (!gd)
        return;
    srv_guard_stop(s);
    /* MHD is stopped: every connection was CLOSED and unlinked */
    pthread_mutex_destroy(&gd->mu);
    pthread_cond_destroy(&gd->cv);
    free(gd);
    s->guard = NULL;
}
