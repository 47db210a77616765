/*
 * Preloaded into Debian's HTTP/3 client (ngtcp2-client's gtlsclient, over
 * libnghttp3) by h3.py.  That client sends only :method, :scheme,
 * :authority, :path and user-agent, and prints what it receives as a debug
 * trace; this shim lets it send more request fields and writes what came
 * back as a test can read it.  QUIC, TLS, QPACK and the framing stay the
 * client's and the libraries' own.
 *
 * ESI_H3_HEADERS  request fields to add, "name: value" one a line; a name
 *                 given twice is sent as two fields (cookies, RFC 9114
 *                 4.2.1, as browsers send them); a name the client sends
 *                 itself (user-agent) replaces its field
 * ESI_H3_OUTPUT   file to write the response to: "HTTP/3 STATUS", the
 *                 fields as "name: value", a blank line (all CRLF), then
 *                 the body byte for byte; and, when the stream closes,
 *                 ESI_H3_OUTPUT.end with the stream's HTTP/3 error code in
 *                 decimal (256, H3_NO_ERROR, for a complete response)
 *
 * One request per client process, as h3.py runs it.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <nghttp3/nghttp3.h>


#define H3SHIM_MAX_FIELDS  64


typedef int (*h3shim_client_new_pt)(nghttp3_conn **pconn,
    int callbacks_version, const nghttp3_callbacks *callbacks,
    int settings_version, const nghttp3_settings *settings,
    const nghttp3_mem *mem, void *user_data);

typedef int (*h3shim_submit_request_pt)(nghttp3_conn *conn,
    int64_t stream_id, const nghttp3_nv *nva, size_t nvlen,
    const nghttp3_data_reader *dr, void *stream_user_data);


static nghttp3_callbacks  h3shim_callbacks;
static int                h3shim_fd = -1;


static void
h3shim_write(const void *data, size_t len)
{
    const char  *p = data;
    ssize_t      n;

    while (len > 0) {
        n = write(h3shim_fd, p, len);
        if (n <= 0) {
            return;
        }
        p += n;
        len -= (size_t) n;
    }
}


static int
h3shim_recv_header(nghttp3_conn *conn, int64_t stream_id, int32_t token,
    nghttp3_rcbuf *name, nghttp3_rcbuf *value, uint8_t flags,
    void *conn_user_data, void *stream_user_data)
{
    nghttp3_vec  n, v;

    if (h3shim_fd != -1) {
        n = nghttp3_rcbuf_get_buf(name);
        v = nghttp3_rcbuf_get_buf(value);

        if (n.len == 7 && memcmp(n.base, ":status", 7) == 0) {
            h3shim_write("HTTP/3 ", 7);
            h3shim_write(v.base, v.len);

        } else {
            h3shim_write(n.base, n.len);
            h3shim_write(": ", 2);
            h3shim_write(v.base, v.len);
        }

        h3shim_write("\r\n", 2);
    }

    if (h3shim_callbacks.recv_header == NULL) {
        return 0;
    }

    return h3shim_callbacks.recv_header(conn, stream_id, token, name, value,
                                        flags, conn_user_data,
                                        stream_user_data);
}


static int
h3shim_end_headers(nghttp3_conn *conn, int64_t stream_id, int fin,
    void *conn_user_data, void *stream_user_data)
{
    if (h3shim_fd != -1) {
        h3shim_write("\r\n", 2);
    }

    if (h3shim_callbacks.end_headers == NULL) {
        return 0;
    }

    return h3shim_callbacks.end_headers(conn, stream_id, fin, conn_user_data,
                                        stream_user_data);
}


static int
h3shim_recv_data(nghttp3_conn *conn, int64_t stream_id, const uint8_t *data,
    size_t datalen, void *conn_user_data, void *stream_user_data)
{
    if (h3shim_fd != -1) {
        h3shim_write(data, datalen);
    }

    if (h3shim_callbacks.recv_data == NULL) {
        return 0;
    }

    return h3shim_callbacks.recv_data(conn, stream_id, data, datalen,
                                      conn_user_data, stream_user_data);
}


static int
h3shim_stream_close(nghttp3_conn *conn, int64_t stream_id,
    uint64_t app_error_code, void *conn_user_data, void *stream_user_data)
{
    char        path[4096], code[32];
    int         fd, len;
    const char  *output;

    output = getenv("ESI_H3_OUTPUT");

    /* client streams are bidirectional and even; control streams are not */

    if (output != NULL && stream_id % 4 == 0) {
        snprintf(path, sizeof(path), "%s.end", output);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd != -1) {
            len = snprintf(code, sizeof(code), "%" PRIu64 "\n",
                           app_error_code);
            if (write(fd, code, (size_t) len) != len) {
                /* the missing code reads as an incomplete response */
            }
            close(fd);
        }
    }

    if (h3shim_callbacks.stream_close == NULL) {
        return 0;
    }

    return h3shim_callbacks.stream_close(conn, stream_id, app_error_code,
                                         conn_user_data, stream_user_data);
}


/* whether a line of fields is "name: ..." */

static int
h3shim_named(const char *fields, const uint8_t *name, size_t len)
{
    const char  *line;

    for (line = fields; line != NULL; line = strchr(line, '\n')) {
        if (*line == '\n') {
            line++;
        }

        if (strncasecmp(line, (const char *) name, len) == 0
            && line[len] == ':')
        {
            return 1;
        }
    }

    return 0;
}


int
nghttp3_conn_client_new_versioned(nghttp3_conn **pconn, int callbacks_version,
    const nghttp3_callbacks *callbacks, int settings_version,
    const nghttp3_settings *settings, const nghttp3_mem *mem, void *user_data)
{
    const char            *output;
    nghttp3_callbacks      ours;
    h3shim_client_new_pt   next;

    next = (h3shim_client_new_pt) dlsym(RTLD_NEXT,
                                        "nghttp3_conn_client_new_versioned");
    if (next == NULL || callbacks_version != NGHTTP3_CALLBACKS_VERSION) {
        return NGHTTP3_ERR_INVALID_ARGUMENT;
    }

    output = getenv("ESI_H3_OUTPUT");
    if (output != NULL && h3shim_fd == -1) {
        h3shim_fd = open(output, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }

    h3shim_callbacks = *callbacks;
    ours = *callbacks;

    ours.recv_header = h3shim_recv_header;
    ours.end_headers = h3shim_end_headers;
    ours.recv_data = h3shim_recv_data;
    ours.stream_close = h3shim_stream_close;

    return next(pconn, callbacks_version, &ours, settings_version, settings,
                mem, user_data);
}


int
nghttp3_conn_submit_request(nghttp3_conn *conn, int64_t stream_id,
    const nghttp3_nv *nva, size_t nvlen, const nghttp3_data_reader *dr,
    void *stream_user_data)
{
    int                        rc;
    char                      *lines, *line, *save, *colon, *value;
    size_t                     i, n;
    nghttp3_nv                 all[H3SHIM_MAX_FIELDS];
    const char                *extra;
    h3shim_submit_request_pt   next;

    next = (h3shim_submit_request_pt) dlsym(RTLD_NEXT,
                                            "nghttp3_conn_submit_request");
    if (next == NULL || nvlen > H3SHIM_MAX_FIELDS) {
        return NGHTTP3_ERR_INVALID_ARGUMENT;
    }

    extra = getenv("ESI_H3_HEADERS");
    if (extra == NULL) {
        extra = "";
    }

    n = 0;

    for (i = 0; i < nvlen; i++) {
        if (nva[i].name[0] == ':'
            || !h3shim_named(extra, nva[i].name, nva[i].namelen))
        {
            all[n++] = nva[i];
        }
    }

    lines = strdup(extra);
    if (lines == NULL) {
        return NGHTTP3_ERR_NOMEM;
    }

    for (line = strtok_r(lines, "\n", &save);
         line != NULL;
         line = strtok_r(NULL, "\n", &save))
    {
        colon = strchr(line, ':');
        if (colon == NULL || colon == line || n == H3SHIM_MAX_FIELDS) {
            free(lines);
            return NGHTTP3_ERR_INVALID_ARGUMENT;
        }

        value = colon + 1;
        while (*value == ' ') {
            value++;
        }

        all[n].name = (uint8_t *) line;
        all[n].namelen = (size_t) (colon - line);
        all[n].value = (uint8_t *) value;
        all[n].valuelen = strlen(value);
        all[n].flags = NGHTTP3_NV_FLAG_NONE;
        n++;
    }

    /* nghttp3 copies the fields; the lines are not needed after the call */

    rc = next(conn, stream_id, all, n, dr, stream_user_data);

    free(lines);

    return rc;
}
