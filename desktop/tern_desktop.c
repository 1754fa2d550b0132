/* tern-desktop: a native window around `tern serve`. It starts one server
 * over a models folder (`tern serve --models DIR`, the model pool) on a free
 * loopback port (--port 0; the port is read from the server's "serving ...
 * on http://" line), shows the server's own chat page in a WebKitGTK view,
 * and restarts the server if it dies. The model picker lists what
 * GET /v1/models reports; choosing a model loads it (POST /v1/models/load),
 * unloads the one it replaces (POST /v1/models/unload) and points the chat
 * page at it (/?model=ID). A status line shows each model's state, the
 * server's live tokens/s (GET /stats) and its memory (its resident set, from
 * /proc). Closing the window stops the server; the server is also tied to
 * this process with PR_SET_PDEATHSIG, so it cannot outlive a crash. Nothing
 * here needs a GPU or the network: tern picks the CPU when no GPU is usable
 * and the page comes from the local server.
 *
 * --self-test PNG drives the app as a person would (types a message,
 * presses Send, waits for the streamed answer, takes a screenshot of the
 * window; then kills the server under the app, switches the picker, and
 * closes the window the normal way); desktop/check.sh runs it under Xvfb. */
#include <errno.h>
#include <gtk/gtk.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <webkit2/webkit2.h>

/* Restarts in a row before the app gives up on a server that keeps dying. */
#define MAX_RESTARTS 3
/* How long a stopping server gets after SIGTERM before SIGKILL. */
#define STOP_GRACE_MS 5000
/* A self-test that has no answer by then fails (a cold CPU start included). */
#define SELF_TEST_TIMEOUT_S 240

typedef struct app {
    GtkWidget *win, *combo, *status, *states, *stats;
    WebKitWebView *view;
    char *models_dir, *tern_bin;
    char *want;   /* the model the picker asks for */
    char *active; /* the model the page is on (loaded), NULL while none */
    GPid pid;
    int port, stopping, restarts, page_loaded, filling, activating;
    unsigned generation; /* bumped per server start: late answers of an old one are dropped */
    GIOChannel *err_ch;
    guint err_watch, child_watch, poll_timer;
    GString *line;
    json_object *models; /* the last GET /v1/models */
    long long last_tokens;
    double last_t;
    const char *self_test_png; /* NULL unless --self-test */
    int test_sent, test_done, test_rc; /* test_sent: 0 not yet, 1 asked, 2 sent */
    int test_phase;                    /* 0 chat, 1 restart, 2 model switch */
    GPid test_pid;
    char *test_from;                   /* phase 2: the model switched away from */
    char *test_page_model;             /* phase 2: the model the page says it talks to */
    double test_t0;
} app;

static double now_s(void)
{
    return g_get_monotonic_time() / 1e6;
}

/* ---- tiny requests to the supervised server (loopback, short timeouts) ---- */

/* method path [body]; returns the response body (g_free) and *status, or
 * NULL when nothing answered. timeout_s bounds each read (a model load
 * answers only once loaded). */
static char *http_request(int port, const char *method, const char *path, const char *body, int timeout_s,
                          int *status)
{
    *status = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct timeval tv = {timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    GString *resp = NULL;
    if (connect(fd, (struct sockaddr *)&a, sizeof a))
        goto out;
    char *rq = g_strdup_printf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                               "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                               method, path, body ? strlen(body) : 0, body ? body : "");
    ssize_t n = (ssize_t)strlen(rq), sent = send(fd, rq, (size_t)n, MSG_NOSIGNAL);
    g_free(rq);
    if (sent != n)
        goto out;
    resp = g_string_new(NULL);
    char buf[4096];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0)
        g_string_append_len(resp, buf, k);
out:
    close(fd);
    if (!resp)
        return NULL;
    char *ret = NULL, *sep = strstr(resp->str, "\r\n\r\n");
    if (sscanf(resp->str, "HTTP/1.1 %d", status) == 1 && sep)
        ret = g_strdup(sep + 4);
    g_string_free(resp, TRUE);
    return ret;
}

static char *http_get(int port, const char *path)
{
    int st;
    char *b = http_request(port, "GET", path, NULL, 2, &st);
    if (st != 200) {
        g_free(b);
        return NULL;
    }
    return b;
}

/* Resident memory of a process, MiB (0 if unknown). */
static double proc_rss_mb(GPid pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double mb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            mb = atof(line + 6) / 1024.0;
    fclose(f);
    return mb;
}

/* ---- the server ---- */

static void server_start(app *a);
static void model_activate(app *a, const char *id);

static void set_status(app *a, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static void set_status(app *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    gtk_label_set_text(GTK_LABEL(a->status), s);
    g_free(s);
}

static void child_setup(gpointer user)
{
    (void)user;
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the window */
}

static gboolean restart_later(gpointer user)
{
    server_start(user);
    return G_SOURCE_REMOVE;
}

static void on_child_exit(GPid pid, gint status, gpointer user)
{
    app *a = user;
    g_spawn_close_pid(pid);
    a->child_watch = 0;
    a->pid = 0;
    a->port = 0;
    g_clear_pointer(&a->active, g_free);
    if (a->stopping)
        return;
    fprintf(stderr, "tern-desktop: server %d exited (status %d)\n", (int)pid, status);
    if (++a->restarts > MAX_RESTARTS) {
        set_status(a, "the server keeps stopping (status %d); restart the app to try again", status);
        return;
    }
    set_status(a, "server exited (status %d) - restarting", status);
    g_timeout_add(1000, restart_later, a);
}

/* The picker's entries: every model of GET /v1/models, the wanted one active. */
static void picker_fill(app *a)
{
    json_object *data;
    if (!a->models || !json_object_object_get_ex(a->models, "data", &data))
        return;
    a->filling = 1;
    gtk_combo_box_text_remove_all(GTK_COMBO_BOX_TEXT(a->combo));
    int pick = -1;
    for (size_t i = 0; i < json_object_array_length(data); i++) {
        json_object *id;
        if (!json_object_object_get_ex(json_object_array_get_idx(data, i), "id", &id))
            continue;
        const char *s = json_object_get_string(id);
        gtk_combo_box_text_append(GTK_COMBO_BOX_TEXT(a->combo), s, s);
        if (pick < 0 || (a->want && !strcmp(s, a->want)))
            pick = (int)i;
    }
    if (pick >= 0)
        gtk_combo_box_set_active(GTK_COMBO_BOX(a->combo), pick);
    a->filling = 0;
    const char *id = gtk_combo_box_get_active_id(GTK_COMBO_BOX(a->combo));
    if (id && (!a->want || strcmp(a->want, id))) {
        g_free(a->want);
        a->want = g_strdup(id);
    }
}

/* A model's state in the last /v1/models ("" if unknown). */
static const char *model_state(app *a, const char *id)
{
    json_object *data, *v;
    if (!id || !a->models || !json_object_object_get_ex(a->models, "data", &data))
        return "";
    for (size_t i = 0; i < json_object_array_length(data); i++) {
        json_object *m = json_object_array_get_idx(data, i);
        if (json_object_object_get_ex(m, "id", &v) && !strcmp(json_object_get_string(v), id))
            return json_object_object_get_ex(m, "state", &v) ? json_object_get_string(v) : "";
    }
    return "";
}

static void models_refresh(app *a)
{
    char *body = http_get(a->port, "/v1/models");
    json_object *o = body ? json_tokener_parse(body) : NULL, *data;
    g_free(body);
    if (!o)
        return;
    json_object_put(a->models);
    a->models = o;
    GString *g = g_string_new(NULL);
    if (json_object_object_get_ex(o, "data", &data))
        for (size_t i = 0; i < json_object_array_length(data); i++) {
            json_object *m = json_object_array_get_idx(data, i), *id, *st;
            if (json_object_object_get_ex(m, "id", &id) && json_object_object_get_ex(m, "state", &st))
                g_string_append_printf(g, "%s%s: %s", g->len ? "  ·  " : "", json_object_get_string(id),
                                       json_object_get_string(st));
        }
    gtk_label_set_text(GTK_LABEL(a->states), g->str);
    g_string_free(g, TRUE);
}

/* One line of the server's stderr: echoed, shown while loading, and the
 * "serving ... on http://HOST:PORT" line gives the port. */
static void server_line(app *a, const char *line)
{
    fprintf(stderr, "[tern serve] %s\n", line);
    const char *p = strstr(line, " on http://");
    if (p && !a->port) {
        const char *colon = strrchr(p + 11, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (port > 0) {
            a->port = port;
            a->restarts = 0;
            a->last_tokens = -1;
            fprintf(stderr, "tern-desktop: server %d ready at http://127.0.0.1:%d/\n", (int)a->pid, port);
            models_refresh(a);
            picker_fill(a);
            if (a->want)
                model_activate(a, a->want);
            else
                set_status(a, "no model in %s", a->models_dir);
            return;
        }
    }
    if (!a->port && line[0]) { /* loading progress; strip the bar */
        const char *s = strchr(line, ']');
        set_status(a, "starting: %s", s ? s + 2 : line);
    }
}

static gboolean on_server_stderr(GIOChannel *ch, GIOCondition cond, gpointer user)
{
    app *a = user;
    char buf[1024];
    gsize n = 0;
    GIOStatus st = g_io_channel_read_chars(ch, buf, sizeof buf, &n, NULL);
    for (gsize i = 0; i < n; i++) {
        if (buf[i] == '\n' || buf[i] == '\r') {
            if (a->line->len)
                server_line(a, a->line->str);
            g_string_truncate(a->line, 0);
        } else {
            g_string_append_c(a->line, buf[i]);
        }
    }
    if (st == G_IO_STATUS_EOF || st == G_IO_STATUS_ERROR || (cond & (G_IO_HUP | G_IO_ERR) && n == 0)) {
        a->err_watch = 0;
        return G_SOURCE_REMOVE;
    }
    return G_SOURCE_CONTINUE;
}

static void server_start(app *a)
{
    char *argv[] = {a->tern_bin, "serve", "--models", a->models_dir, "--host", "127.0.0.1", "--port", "0", NULL};
    GError *ge = NULL;
    gint err_fd = -1;
    a->stopping = 0;
    a->port = 0;
    a->generation++;
    if (!g_spawn_async_with_pipes(NULL, argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD, child_setup, NULL, &a->pid, NULL,
                                  NULL, &err_fd, &ge)) {
        set_status(a, "cannot start %s: %s", a->tern_bin, ge->message);
        fprintf(stderr, "tern-desktop: cannot start %s: %s\n", a->tern_bin, ge->message);
        g_error_free(ge);
        return;
    }
    fprintf(stderr, "tern-desktop: server pid %d: %s serve --models %s\n", (int)a->pid, a->tern_bin, a->models_dir);
    set_status(a, "starting the server");
    webkit_web_view_load_html(a->view, "<p style='font-family:sans-serif;color:#666'>Starting the server…</p>",
                              NULL);
    a->child_watch = g_child_watch_add(a->pid, on_child_exit, a);
    a->err_ch = g_io_channel_unix_new(err_fd);
    g_io_channel_set_encoding(a->err_ch, NULL, NULL);
    g_io_channel_set_close_on_unref(a->err_ch, TRUE);
    g_io_channel_set_flags(a->err_ch, G_IO_FLAG_NONBLOCK, NULL);
    a->err_watch = g_io_add_watch(a->err_ch, G_IO_IN | G_IO_HUP | G_IO_ERR, on_server_stderr, a);
}

/* SIGTERM, a grace period, then SIGKILL; reaps the server here. */
static void server_stop(app *a)
{
    a->stopping = 1;
    if (a->child_watch) {
        g_source_remove(a->child_watch);
        a->child_watch = 0;
    }
    if (a->pid > 0) {
        kill(a->pid, SIGTERM);
        int status = 0, gone = 0;
        for (int ms = 0; ms < STOP_GRACE_MS && !gone; ms += 20) {
            if (waitpid(a->pid, &status, WNOHANG) == a->pid)
                gone = 1;
            else
                g_usleep(20000);
        }
        if (!gone) {
            kill(a->pid, SIGKILL);
            waitpid(a->pid, &status, 0);
        }
        fprintf(stderr, "tern-desktop: server %d stopped%s\n", (int)a->pid, gone ? "" : " (killed)");
        g_spawn_close_pid(a->pid);
        a->pid = 0;
    }
    if (a->err_watch) {
        g_source_remove(a->err_watch);
        a->err_watch = 0;
    }
    if (a->err_ch) {
        g_io_channel_unref(a->err_ch);
        a->err_ch = NULL;
    }
    g_string_truncate(a->line, 0);
    a->port = 0;
}

/* ---- switching models: load the new one, unload the old, move the page ---- */

typedef struct activation {
    app *a;
    unsigned generation;
    int port, status;
    char *id, *prev, *error;
} activation;

static gboolean activation_done(gpointer user)
{
    activation *x = user;
    app *a = x->a;
    if (x->generation == a->generation && a->port == x->port) { /* still the same server */
        a->activating = 0;
        if (x->status == 200) {
            g_free(a->active);
            a->active = g_strdup(x->id);
            fprintf(stderr, "tern-desktop: model %s loaded%s%s\n", x->id, x->prev ? ", unloaded " : "",
                    x->prev ? x->prev : "");
            set_status(a, "serving %s", x->id);
            char *uri = g_strdup_printf("http://127.0.0.1:%d/?model=%s", a->port, x->id);
            a->page_loaded = 0;
            webkit_web_view_load_uri(a->view, uri);
            g_free(uri);
        } else {
            set_status(a, "cannot load %s: %s", x->id, x->error ? x->error : "no answer");
        }
        models_refresh(a);
        if (a->want && strcmp(a->want, x->id)) /* picked again meanwhile */
            model_activate(a, a->want);
    }
    g_free(x->id);
    g_free(x->prev);
    g_free(x->error);
    g_free(x);
    return G_SOURCE_REMOVE;
}

static gpointer activation_main(gpointer user)
{
    activation *x = user;
    char *body = g_strdup_printf("{\"model\":\"%s\"}", x->id);
    char *r = http_request(x->port, "POST", "/v1/models/load", body, 300, &x->status);
    g_free(body);
    if (x->status != 200) {
        json_object *o = r ? json_tokener_parse(r) : NULL, *e, *m;
        x->error = g_strdup(o && json_object_object_get_ex(o, "error", &e) && json_object_object_get_ex(e, "message", &m)
                                ? json_object_get_string(m)
                                : "the server did not answer");
        json_object_put(o);
    } else if (x->prev && strcmp(x->prev, x->id)) { /* free the one it replaces (409 if busy: left to the pool) */
        int st;
        body = g_strdup_printf("{\"model\":\"%s\"}", x->prev);
        g_free(http_request(x->port, "POST", "/v1/models/unload", body, 30, &st));
        g_free(body);
    }
    g_free(r);
    g_idle_add(activation_done, x);
    return NULL;
}

/* Loads id on the running server in a worker thread (a load answers once
 * the weights are in), then moves the page to it. */
static void model_activate(app *a, const char *id)
{
    if (!a->port || a->activating)
        return;
    activation *x = g_new0(activation, 1);
    x->a = a;
    x->generation = a->generation;
    x->port = a->port;
    x->id = g_strdup(id);
    x->prev = a->active ? g_strdup(a->active) : NULL;
    a->activating = 1;
    set_status(a, "loading %s", id);
    g_thread_unref(g_thread_new("model-load", activation_main, x));
}

static void on_model_changed(GtkComboBox *cb, gpointer user)
{
    app *a = user;
    const char *id = gtk_combo_box_get_active_id(cb);
    if (a->filling || !id)
        return;
    g_free(a->want);
    a->want = g_strdup(id);
    if (!a->active || strcmp(a->active, id))
        model_activate(a, id);
}

/* ---- live numbers ---- */

static gboolean on_poll(gpointer user)
{
    app *a = user;
    if (!a->port || !a->pid) {
        gtk_label_set_text(GTK_LABEL(a->stats), "");
        return G_SOURCE_CONTINUE;
    }
    models_refresh(a);
    char *body = http_get(a->port, "/stats");
    json_object *o = body ? json_tokener_parse(body) : NULL, *eng, *v;
    long long tokens = -1, running = 0;
    if (o && json_object_object_get_ex(o, "engine", &eng)) {
        if (json_object_object_get_ex(eng, "tokens_decoded", &v))
            tokens = json_object_get_int64(v);
        if (json_object_object_get_ex(eng, "running", &v))
            running = json_object_get_int64(v);
    }
    double t = now_s(), tps = 0;
    if (tokens >= 0 && a->last_tokens >= 0 && t > a->last_t)
        tps = (tokens - a->last_tokens) / (t - a->last_t);
    if (tokens >= 0) {
        a->last_tokens = tokens;
        a->last_t = t;
    }
    char *s = g_strdup_printf("%.1f tok/s  ·  %lld running  ·  %.0f MB  ·  port %d", tps, running,
                              proc_rss_mb(a->pid), a->port);
    gtk_label_set_text(GTK_LABEL(a->stats), s);
    g_free(s);
    json_object_put(o);
    g_free(body);
    return G_SOURCE_CONTINUE;
}

/* ---- the self-test ---- */

static void self_test_finish(app *a, int rc)
{
    a->test_rc = rc;
    gtk_window_close(GTK_WINDOW(a->win)); /* the same path as a person closing it */
}

static gboolean self_test_shot(gpointer user)
{
    app *a = user;
    GdkWindow *w = gtk_widget_get_window(a->win);
    int wd = gdk_window_get_width(w), ht = gdk_window_get_height(w);
    GdkPixbuf *pb = gdk_pixbuf_get_from_window(w, 0, 0, wd, ht);
    GError *ge = NULL;
    int ok = pb && gdk_pixbuf_save(pb, a->self_test_png, "png", &ge, NULL);
    fprintf(stderr, "tern-desktop: screenshot %dx%d -> %s%s%s\n", wd, ht, a->self_test_png, ok ? "" : ": ",
            ok ? "" : ge ? ge->message : "failed");
    if (ge)
        g_error_free(ge);
    if (pb)
        g_object_unref(pb);
    if (!ok) {
        self_test_finish(a, 1);
        return G_SOURCE_REMOVE;
    }
    /* supervision: the server dies under the window, which starts another */
    a->test_phase = 1;
    a->test_pid = a->pid;
    fprintf(stderr, "tern-desktop: self-test: killing server %d\n", (int)a->pid);
    kill(a->pid, SIGKILL);
    return G_SOURCE_REMOVE;
}

static void on_page_model(GObject *src, GAsyncResult *res, gpointer user)
{
    app *a = user;
    JSCValue *v = webkit_web_view_evaluate_javascript_finish(WEBKIT_WEB_VIEW(src), res, NULL);
    g_free(a->test_page_model);
    a->test_page_model = v ? jsc_value_to_string(v) : NULL;
    if (v)
        g_object_unref(v);
}

/* After the answer: wait for the restarted server to serve the same model,
 * then pick the next model (when there is one) and wait until it is loaded,
 * the old one unloaded and the page on it. Returns 1 when done. */
static int self_test_later_phases(app *a)
{
    if (!a->port || !a->active || a->activating || !a->page_loaded)
        return 0;
    if (a->test_phase == 1) {
        if (a->pid == a->test_pid || strcmp(a->active, a->want))
            return 0;
        printf("restarted: pid %d serving %s\n", (int)a->pid, a->active);
        GtkTreeModel *m = gtk_combo_box_get_model(GTK_COMBO_BOX(a->combo));
        int n = gtk_tree_model_iter_n_children(m, NULL);
        if (n < 2)
            return 1;
        int cur = gtk_combo_box_get_active(GTK_COMBO_BOX(a->combo));
        a->test_phase = 2;
        a->test_from = g_strdup(a->active);
        gtk_combo_box_set_active(GTK_COMBO_BOX(a->combo), (cur + 1) % n); /* as a click would */
        return 0;
    }
    if (!strcmp(a->active, a->test_from) || strcmp(model_state(a, a->active), "loaded") ||
        strcmp(model_state(a, a->test_from), "unloaded"))
        return 0;
    if (!a->test_page_model || strcmp(a->test_page_model, a->active)) { /* ask the page (answer comes later) */
        webkit_web_view_evaluate_javascript(a->view, "typeof modelId === 'string' ? modelId : ''", -1, NULL, NULL,
                                            NULL, on_page_model, a);
        return 0;
    }
    printf("switched: pid %d serving %s (%s %s), page on %s\n", (int)a->pid, a->active, a->test_from,
           model_state(a, a->test_from), a->test_page_model);
    return 1;
}

static void on_answer(GObject *src, GAsyncResult *res, gpointer user)
{
    app *a = user;
    GError *ge = NULL;
    JSCValue *v = webkit_web_view_evaluate_javascript_finish(WEBKIT_WEB_VIEW(src), res, &ge);
    char *s = v ? jsc_value_to_string(v) : NULL;
    if (s && s[0] && strcmp(s, "undefined") && strcmp(s, "null") && !a->test_done) {
        a->test_done = 1;
        printf("answer: %s\n", s);
        fflush(stdout);
        g_timeout_add(700, self_test_shot, a); /* let the last frame paint, then go on */
    }
    g_free(s);
    if (v)
        g_object_unref(v);
    if (ge)
        g_error_free(ge);
}

static void on_sent(GObject *src, GAsyncResult *res, gpointer user)
{
    app *a = user;
    JSCValue *v = webkit_web_view_evaluate_javascript_finish(WEBKIT_WEB_VIEW(src), res, NULL);
    char *s = v ? jsc_value_to_string(v) : NULL;
    a->test_sent = s && !strcmp(s, "sent") ? 2 : 0; /* else the page is not ready: ask again */
    if (a->test_sent == 2)
        fprintf(stderr, "tern-desktop: self-test: message sent\n");
    g_free(s);
    if (v)
        g_object_unref(v);
}

static gboolean self_test_step(gpointer user)
{
    app *a = user;
    if (now_s() - a->test_t0 > SELF_TEST_TIMEOUT_S) {
        fprintf(stderr, "tern-desktop: self-test: stuck in phase %d after %d s\n", a->test_phase,
                SELF_TEST_TIMEOUT_S);
        self_test_finish(a, 1);
        return G_SOURCE_REMOVE;
    }
    if (a->test_phase > 0) {
        if (self_test_later_phases(a)) {
            fflush(stdout);
            self_test_finish(a, 0);
            return G_SOURCE_REMOVE;
        }
        return G_SOURCE_CONTINUE;
    }
    if (!a->port || !a->active || !a->page_loaded || a->test_done || a->test_sent == 1)
        return G_SOURCE_CONTINUE;
    if (!a->test_sent) { /* type and press Send, as a person would */
        static const char js[] = "(() => { const i = document.getElementById('input');"
                                 " if (!i || document.getElementById('model-name').textContent === '\\u2026')"
                                 " return 'wait'; i.value = 'Hello! Who are you?';"
                                 " document.getElementById('send').click(); return 'sent'; })()";
        webkit_web_view_evaluate_javascript(a->view, js, -1, NULL, NULL, NULL, on_sent, a);
        a->test_sent = 1;
        return G_SOURCE_CONTINUE;
    }
    static const char poll[] = "(() => { const m = document.querySelector('.msg.assistant');"
                               " if (!m || !m.dataset.done) return '';"
                               " const t = m.querySelector('.answer').textContent;"
                               " return t || (m.querySelector('.thought-text') || {}).textContent || ''; })()";
    webkit_web_view_evaluate_javascript(a->view, poll, -1, NULL, NULL, NULL, on_answer, a);
    return G_SOURCE_CONTINUE;
}

static void on_load_changed(WebKitWebView *v, WebKitLoadEvent ev, gpointer user)
{
    app *a = user;
    if (ev == WEBKIT_LOAD_FINISHED && a->port && a->active)
        a->page_loaded = 1;
}

/* ---- the window ---- */

static void on_destroy(GtkWidget *w, gpointer user)
{
    app *a = user;
    if (a->poll_timer) {
        g_source_remove(a->poll_timer);
        a->poll_timer = 0;
    }
    server_stop(a);
    gtk_main_quit();
}

static char *find_tern(const char *argv0)
{
    const char *env = g_getenv("TERN_BIN");
    if (env && g_file_test(env, G_FILE_TEST_IS_EXECUTABLE))
        return g_strdup(env);
    char *self = g_file_read_link("/proc/self/exe", NULL);
    char *dir = self ? g_path_get_dirname(self) : g_path_get_dirname(argv0);
    const char *rel[] = {"tern", "../tern", "../build/tern", "../../build/tern"};
    char *found = NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(rel) && !found; i++) {
        char *p = g_build_filename(dir, rel[i], NULL);
        if (g_file_test(p, G_FILE_TEST_IS_EXECUTABLE) && !g_file_test(p, G_FILE_TEST_IS_DIR))
            found = p;
        else
            g_free(p);
    }
    g_free(self);
    g_free(dir);
    return found ? found : g_find_program_in_path("tern");
}

int main(int argc, char **argv)
{
    app a = {0};
    const char *models = "models", *prefer = "tern-demo", *tern = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc)
            models = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            prefer = argv[++i];
        else if (!strcmp(argv[i], "--tern") && i + 1 < argc)
            tern = argv[++i];
        else if (!strcmp(argv[i], "--self-test") && i + 1 < argc)
            a.self_test_png = argv[++i];
        else {
            fprintf(stderr, "usage: tern-desktop [--models DIR] [--model NAME] [--tern PATH] [--self-test PNG]\n");
            return 2;
        }
    }
    /* software rendering: no GPU needed (and none under Xvfb) */
    g_setenv("WEBKIT_DISABLE_COMPOSITING_MODE", "1", FALSE);
    gtk_init(&argc, &argv);
    a.models_dir = g_canonicalize_filename(models, NULL);
    a.tern_bin = tern ? g_strdup(tern) : find_tern(argv[0]);
    a.want = g_strdup(prefer);
    a.line = g_string_new(NULL);
    if (!a.tern_bin) {
        fprintf(stderr, "tern-desktop: no tern binary found (--tern PATH or TERN_BIN)\n");
        return 1;
    }
    if (!g_file_test(a.models_dir, G_FILE_TEST_IS_DIR)) {
        fprintf(stderr, "tern-desktop: %s is not a folder (--models DIR)\n", a.models_dir);
        return 1;
    }

    a.win = gtk_window_new(GTK_WINDOW_TOPLEVEL);
    gtk_window_set_title(GTK_WINDOW(a.win), "tern");
    gtk_window_set_default_size(GTK_WINDOW(a.win), 1000, 720);
    GtkWidget *box = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0);
    GtkWidget *bar = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 8);
    GtkWidget *bar2 = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 8);
    gtk_container_set_border_width(GTK_CONTAINER(bar), 6);
    gtk_container_set_border_width(GTK_CONTAINER(bar2), 2);
    a.combo = gtk_combo_box_text_new();
    a.status = gtk_label_new("");
    a.states = gtk_label_new("");
    a.stats = gtk_label_new("");
    gtk_label_set_ellipsize(GTK_LABEL(a.status), PANGO_ELLIPSIZE_END);
    gtk_label_set_ellipsize(GTK_LABEL(a.states), PANGO_ELLIPSIZE_END);
    gtk_widget_set_opacity(a.states, 0.7);
    gtk_box_pack_start(GTK_BOX(bar), gtk_label_new("Model"), FALSE, FALSE, 0);
    gtk_box_pack_start(GTK_BOX(bar), a.combo, FALSE, FALSE, 0);
    gtk_box_pack_start(GTK_BOX(bar), a.status, TRUE, TRUE, 0);
    gtk_box_pack_end(GTK_BOX(bar), a.stats, FALSE, FALSE, 0);
    gtk_box_pack_start(GTK_BOX(bar2), a.states, TRUE, TRUE, 6);
    a.view = WEBKIT_WEB_VIEW(webkit_web_view_new());
    g_signal_connect(a.view, "load-changed", G_CALLBACK(on_load_changed), &a);
    gtk_box_pack_start(GTK_BOX(box), bar, FALSE, FALSE, 0);
    gtk_box_pack_start(GTK_BOX(box), bar2, FALSE, FALSE, 0);
    gtk_box_pack_start(GTK_BOX(box), GTK_WIDGET(a.view), TRUE, TRUE, 0);
    gtk_container_add(GTK_CONTAINER(a.win), box);
    g_signal_connect(a.win, "destroy", G_CALLBACK(on_destroy), &a);
    g_signal_connect(a.combo, "changed", G_CALLBACK(on_model_changed), &a);
    gtk_widget_show_all(a.win);

    server_start(&a);
    a.poll_timer = g_timeout_add(1000, on_poll, &a);
    if (a.self_test_png) {
        a.test_t0 = now_s();
        g_timeout_add(500, self_test_step, &a);
    }
    gtk_main();
    json_object_put(a.models);
    g_free(a.want);
    g_free(a.active);
    g_free(a.test_from);
    g_free(a.test_page_model);
    g_free(a.models_dir);
    g_free(a.tern_bin);
    g_string_free(a.line, TRUE);
    return a.test_rc;
}
