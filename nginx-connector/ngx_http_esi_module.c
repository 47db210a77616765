
/*
 * Copyright (C) The ESI project authors
 *
 * ESI for NGINX: the response body is streamed to esid through a shared
 * ring; esid answers with splice instructions that this filter executes:
 * verbatim runs are emitted as buffers pointing into the held input, and
 * includes become subrequests.  The wire protocol is proto/README.md.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/mman.h>

#include <esi/ring.h>
#include "esi_wire.h"

#if (NGX_ZLIB)
#include "esi_inflate.h"
#include "ngx_http_esi_stitch.h"
#endif

/* memfd seals of Linux 5.1 that older headers lack */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE            0x0010
#endif


/* r->buffered has four bits, all taken; this one is the image filter's */
#define NGX_HTTP_ESI_BUFFERED          0x08

#define NGX_HTTP_ESI_PASSTHROUGH       0
#define NGX_HTTP_ESI_ABORT             1

#define NGX_HTTP_ESI_STATUS_NONE       0
#define NGX_HTTP_ESI_STATUS_PROCESSED  1
#define NGX_HTTP_ESI_STATUS_PASSTHROUGH  2
#define NGX_HTTP_ESI_STATUS_ABORTED    3

#define NGX_HTTP_ESI_IDLE              0
#define NGX_HTTP_ESI_CONNECTING        1
#define NGX_HTTP_ESI_READY             2

#define NGX_HTTP_ESI_IDENTITY          0
#define NGX_HTTP_ESI_GZIP              1
#define NGX_HTTP_ESI_ENCODED           2

#if (NGX_ZLIB)
#define NGX_HTTP_ESI_DECODES           "only gzip is decoded"
#else
#define NGX_HTTP_ESI_DECODES           "nothing is decoded (no zlib)"
#endif

/* the buffers a gzipped body is inflated into */
#define NGX_HTTP_ESI_INFLATED          (ngx_buf_tag_t) &ngx_http_esi_module_ctx

/* how many of them may be ahead of the client after a fallback */
#define NGX_HTTP_ESI_INFLATE_AHEAD     8

#define NGX_HTTP_ESI_VERBATIM          0
#define NGX_HTTP_ESI_INCLUDE           1
#define NGX_HTTP_ESI_SPLICE            2
#define NGX_HTTP_ESI_CHECK             3    /* plan steps only */
#define NGX_HTTP_ESI_LITERAL           4
#define NGX_HTTP_ESI_TRY_START         5
#define NGX_HTTP_ESI_TRY_EXCEPT        6
#define NGX_HTTP_ESI_TRY_END           7
#define NGX_HTTP_ESI_SEGMENT           8    /* a run's gzip, from a plan */

/* a request variable longer than this is not sent: esid ignores it anyway */
#define NGX_HTTP_ESI_VAR_MAX           8192

/* tries open at once in one stream; esid's instructions are refused deeper */
#define NGX_HTTP_ESI_TRY_MAX           64

/* esi_stitch's default: on wherever plans are kept and gzip is on */
#define NGX_HTTP_ESI_STITCH_GZIP       2

#define NGX_HTTP_ESI_OBJECT_LEN        48   /* key, size, header size, inode,
                                               modification time */
#define NGX_HTTP_ESI_PLAIN_OBJECTS     1024 /* a power of two */
#define NGX_HTTP_ESI_REPLAYS           256  /* a power of two */
#define NGX_HTTP_ESI_REPLAY_SWEEP      1000 /* expired copies go, ms */
#define NGX_HTTP_ESI_CHECK_MAX         4096
#define NGX_HTTP_ESI_PLAN_BYTES        2048 /* room for checks and literals */
#define NGX_HTTP_ESI_BATCH             16   /* links, bufs, insns allocated */
#define NGX_HTTP_ESI_PACK_MAX          64   /* output copied, not linked */
#define NGX_HTTP_ESI_PACK_SIZE         256  /* ... into buffers this large */

/* esi_max_tag_size: esid's own range (ParserLimits) */
#define NGX_HTTP_ESI_TAG_SIZE_MIN      256
#define NGX_HTTP_ESI_TAG_SIZE_MAX      (1024 * 1024)

#define NGX_HTTP_ESI_BACKOFF_MIN       100
#define NGX_HTTP_ESI_BACKOFF_MAX       1000
#define NGX_HTTP_ESI_WELCOME_WORDS     32
#define NGX_HTTP_ESI_DRAIN_BATCH       1024

/* messages waiting for room in the ring to esid, in bytes */
#define NGX_HTTP_ESI_POSTED_MAX        (4 * 1024 * 1024)

#define NGX_HTTP_ESI_PURGE_OFF         0
#define NGX_HTTP_ESI_PURGE_METHOD      1    /* in the cached location */
#define NGX_HTTP_ESI_PURGE_LOCATION    2    /* a location of its own */

#define NGX_HTTP_ESI_PURGE_KEY         0
#define NGX_HTTP_ESI_PURGE_PREFIX      1
#define NGX_HTTP_ESI_PURGE_TAG         2


typedef struct {
    ngx_str_t                  daemon;
    ngx_url_t                  url;
    ngx_msec_t                 timeout;
    ngx_flag_t                 used;

    size_t                     purge_index;
    ngx_msec_t                 purge_timeout;
    ngx_array_t                purge_zones;  /* of ngx_shm_zone_t * */

    ngx_array_t                plan_zones;   /* of ngx_http_esi_plan_zone_t * */
} ngx_http_esi_main_conf_t;


/* an esi_plan_zone: the store lives in esid, which gets name and size */

typedef struct {
    ngx_str_t                  name;
    size_t                     size;
} ngx_http_esi_plan_zone_t;


typedef struct {
    ngx_flag_t                 enable;
    ngx_flag_t                 silent_errors;
    ngx_uint_t                 fallback;
    size_t                     buffer_size;
    ngx_int_t                  max_depth;
    ngx_uint_t                 max_includes;
    off_t                      max_page_size;
    size_t                     max_tag_size;
    off_t                      max_fragment_size;

    ngx_hash_t                 types;
    ngx_array_t               *types_keys;

    ngx_uint_t                 purge;
    ngx_str_t                  purge_method;
    ngx_array_t               *purge_from;  /* of ngx_cidr_t; NULL: all */
    ngx_shm_zone_t            *purge_zone;
    ngx_http_complex_value_t  *purge_key;

    ngx_http_esi_plan_zone_t  *plan;        /* NULL: esi_plan off */
    ngx_msec_t                 plan_reuse;  /* 0: esid is always asked */
    ngx_flag_t                 stitch;
    ngx_uint_t                 stitch_level;

    ngx_array_t               *cookies;     /* of ngx_str_t; NULL: none */

    ngx_str_t                  surrogate;   /* esi_surrogate NAME */
    ngx_str_t                  capability;  /* NAME="ESI/1.0" */
    ngx_flag_t                 surrogate_control;
} ngx_http_esi_loc_conf_t;


/* what Surrogate-Control says to us: untargeted or ";NAME" directives */

typedef struct {
    time_t                     max_age;     /* -1: none */
    time_t                     max_age_targeted;
    unsigned                   esi:1;       /* content="ESI/1.0" */
    unsigned                   no_store:1;
} ngx_http_esi_surrogate_t;


/*
 * A mapping that requests may outlive the connection with: esid's segment
 * arena (read-only), and the connection's pin table, mapped apart from the
 * rings.  A request that pinned segments keeps both until it is over, also
 * after the connection closed and the worker attached again (esid keeps
 * counting the old table meanwhile).
 */

typedef struct {
    u_char                    *start;
    size_t                     size;
    ngx_uint_t                 refs;        /* requests, and esi_daemon's */
} ngx_http_esi_mapping_t;


typedef struct ngx_http_esi_held_s  ngx_http_esi_held_t;

struct ngx_http_esi_held_s {
    ngx_buf_t                 *buf;         /* an input buffer, not a copy */
    u_char                    *start;       /* its pos when it arrived */
    off_t                      offset;      /* stream offset of start */
    off_t                      end;
    ngx_uint_t                 refs;        /* output bufs pointing into it */
    ngx_http_esi_held_t       *next;
};


typedef struct ngx_http_esi_insn_s  ngx_http_esi_insn_t;

struct ngx_http_esi_insn_s {
    ngx_uint_t                 type;
    off_t                      offset;      /* verbatim start, or released */
    size_t                     length;
    ngx_str_t                  path;
    ngx_str_t                  args;
    ngx_str_t                  alt_path;
    ngx_str_t                  alt_args;
    ngx_str_t                  text;        /* LITERAL, SEGMENT */
    uint32_t                   crc;         /* SEGMENT */
    unsigned                   continue_on_error:1;
    unsigned                   last:1;
    ngx_http_esi_insn_t       *next;
};


/*
 * An open <esi:try>.  Its attempt's output is held in ctx->out, a chain of
 * its own, while what came before waits here; the outcome decides whether
 * the held chain follows it.
 */

typedef struct {
    ngx_chain_t               *out;         /* the enclosing output */
    ngx_chain_t              **last_out;
    unsigned                   attempt:1;   /* before its tryExcept */
    unsigned                   failed:1;    /* an include of it failed */
} ngx_http_esi_try_t;


/* a step of a parse plan, as esid sent it */

typedef struct {
    ngx_uint_t                 type;        /* an instruction's, or CHECK */
    off_t                      offset;
    off_t                      length;
    u_char                    *bytes;       /* CHECK, LITERAL */
    ngx_http_esi_insn_t       *include;     /* INCLUDE: a template */
    ngx_str_t                  segment;     /* VERBATIM: in the arena */
    uint32_t                   crc;
    u_char                    *head;        /* ... the run's first bytes */
    size_t                     head_len;
} ngx_http_esi_step_t;


typedef struct ngx_http_esi_ctx_s {
    ngx_rbtree_node_t          node;        /* key: the stream id */
    ngx_queue_t                tx_link;     /* waiting to write the ring */
    ngx_queue_t                wake_link;   /* waiting to run its output */

    ngx_http_request_t        *request;
    ngx_uint_t                 depth;
    ngx_uint_t                 status;

    ngx_http_esi_held_t       *held;
    ngx_http_esi_held_t      **last_held;
    ngx_http_esi_held_t       *free_held;
    ngx_http_esi_held_t       *send_held;   /* holds the byte at "sent" */

    off_t                      received;    /* bytes held so far */
    off_t                      sent;        /* bytes copied into the ring */
    off_t                      released;    /* as of executed splices */
    off_t                      verbatim_end;
    off_t                      rx_released; /* as of received splices */
    off_t                      rx_verbatim_end;
    ngx_uint_t                 awaiting;    /* messages not answered yet */

    ngx_http_esi_insn_t       *insns;
    ngx_http_esi_insn_t      **last_insn;
    ngx_http_esi_insn_t       *free_insns;

    ngx_http_request_t        *wait;        /* sequential include */
    ngx_http_esi_insn_t       *wait_insn;

    ngx_http_esi_try_t        *tries;       /* NGX_HTTP_ESI_TRY_MAX of them */
    ngx_uint_t                 ntries;      /* open, as executed */
    ngx_uint_t                 attempts;    /* ... and before tryExcept */
    ngx_uint_t                 skip;        /* tries open in a skipped part */
    off_t                      captured;    /* bytes copied from includes */
    off_t                      made;        /* literal bytes from esid */
    struct ngx_http_esi_ctx_s *capture;     /* who holds our output */

    ngx_uint_t                 rx_tries;    /* open, as received */
    uint64_t                   rx_excepts;  /* bit n: try n had tryExcept */

    ngx_chain_t               *out;
    ngx_chain_t              **last_out;
    ngx_chain_t               *busy;
    ngx_chain_t               *free;
    ngx_buf_t                 *pack;        /* small output copied here */
    ngx_chain_t              **pack_next;   /* ... while it ends ctx->out */

    ngx_event_t                timer;
    ngx_event_t                resume;

    ngx_http_esi_plan_zone_t  *plan_zone;
    u_char                     object[NGX_HTTP_ESI_OBJECT_LEN];
    ngx_http_esi_step_t       *steps;       /* the plan being replayed */
    ngx_uint_t                 nsteps;
    ngx_uint_t                 step;        /* the next one to run */
    ngx_uint_t                 plan_ahead;  /* steps before it checked */
    off_t                      plan_pos;    /* run or skipped up to here */
    off_t                      plan_length;
    off_t                      base;        /* first byte esid parses */
    ngx_uint_t                 includes;    /* issued, alt= not counted */
    ngx_http_esi_mapping_t    *arena;       /* the plan's segments are here */
    ngx_http_esi_mapping_t    *pins;        /* ... pinned in this table */
    uint32_t                   pin;         /* ... at this slot + 1 */
    off_t                      passed;      /* fallen: input a segment sent */
    off_t                      fragment_room; /* esi_max_fragment_size left */

#if (NGX_ZLIB)
    esi_inflate_t              gunzip;      /* a gzipped body's inflate */
#endif
    ngx_chain_t               *zin;         /* gzip not inflated yet */
    ngx_buf_t                 *zbuf;        /* being inflated into */
    ngx_chain_t               *zfree;       /* inflated buffers to reuse */
    ngx_uint_t                 zbufs;       /* ... all of them */

    unsigned                   stream:1;    /* this body goes to esid */
    unsigned                   inflate:1;   /* ... after we inflate it */
    unsigned                   zstarted:1;
    unsigned                   zlast:1;     /* the gzip's end is in zin */
    unsigned                   zerror:1;    /* the gzip body is broken */
    unsigned                   fragment:1;  /* a sequential include */
    unsigned                   discard:1;   /* ... that failed */
    unsigned                   limited:1;   /* esi_max_fragment_size applies */
    unsigned                   oversized:1; /* ... its Content-Length is over */
    unsigned                   cut:1;       /* ... it grew past it */
    unsigned                   in_table:1;
    unsigned                   tx_queued:1;
    unsigned                   wake_queued:1;
    unsigned                   flushed:1;   /* no output since a flush */
    unsigned                   open_sent:1;
    unsigned                   input_done:1;
    unsigned                   end_sent:1;
    unsigned                   last:1;      /* esid has said everything */
    unsigned                   done:1;      /* the final buf went out */
    unsigned                   failed:1;    /* esi_fallback is due */
    unsigned                   fallen:1;    /* esi_fallback was applied */
    unsigned                   wait_alt:1;
    unsigned                   wait_failed:1;
    unsigned                   identified:1; /* object[] is a cache hit's */
    unsigned                   plan_wait:1;  /* esid answers plan or not */
    unsigned                   planned:1;    /* replaying a plan */
    unsigned                   plan_more:1;  /* ... stopped after a batch */
    unsigned                   plan_starved:1; /* ... for more body */
    unsigned                   plan_failed:1;
    unsigned                   segments:1;   /* the response is stitched */
} ngx_http_esi_ctx_t;


/*
 * a purge waiting for esid's answer: an HTTP purge's (request set) or an
 * order esid relayed from esictl (request NULL, in a pool of its own)
 */

typedef struct {
    ngx_rbtree_node_t          node;        /* key: the purge's id */

    ngx_http_request_t        *request;
    ngx_pool_t                *pool;
    ngx_log_t                 *log;
    uint32_t                   order;       /* esid's id of the order */
    ngx_shm_zone_t            *zone;
    ngx_http_file_cache_t     *cache;
    ngx_uint_t                 kind;
    ngx_str_t                  key;         /* the key, prefix or tags */
    ngx_array_t               *tags;        /* of ngx_str_t */
    ngx_uint_t                 next_tag;
    u_char                    *name;        /* a cache file's path */
    size_t                     name_len;

    ngx_uint_t                 count;       /* files removed */
    ngx_uint_t                 status;
    ngx_str_t                  error;

    ngx_event_t                timer;
    ngx_event_t                finish;

    unsigned                   in_table:1;
    unsigned                   scanned:1;
} ngx_http_esi_purge_t;


/*
 * A cached object whose plan was one run over all of it: it has no ESI, and
 * later hits go out as they would with esi off, without esid.
 */

typedef struct {
    ngx_http_esi_plan_zone_t  *zone;
    u_char                     object[NGX_HTTP_ESI_OBJECT_LEN];
} ngx_http_esi_plain_t;


/*
 * A plan that reads nothing of the request (Plan.reusable), kept to replay
 * later hits of its object without asking esid, for esi_plan_reuse: the
 * message as esid sent it, and a pin count of its own on the segments it
 * names.  Entries belong to the connection to esid: they go with it.
 */

typedef struct {
    ngx_http_esi_plan_zone_t  *zone;
    u_char                     object[NGX_HTTP_ESI_OBJECT_LEN];
    uint64_t                  *message;     /* NULL: the slot is free */
    size_t                     len;
    ngx_msec_t                 expires;
    uint32_t                   pin;
    unsigned                   segments:1;
} ngx_http_esi_replay_t;


/* a file NGINX stores: reported when its request is over */

typedef struct {
    ngx_http_request_t        *request;
    ngx_pool_t                *pool;
} ngx_http_esi_stored_t;


/* a message for esid waiting for room in the ring */

typedef struct {
    ngx_queue_t                link;
    size_t                     len;
    uint64_t                   data[1];
} ngx_http_esi_msg_t;


typedef struct {
    ngx_http_esi_main_conf_t  *conf;
    ngx_log_t                 *log;
    ngx_uint_t                 state;

    ngx_connection_t          *conn;        /* the Unix socket */
    ngx_connection_t          *notify;      /* our eventfd */
    ngx_fd_t                   daemon_fd;   /* esid's eventfd */
    u_char                    *shm;
    size_t                     shm_size;
    esi_ring_t                 tx;
    esi_ring_t                 rx;
    uint32_t                   need;        /* bytes the tx ring lacks */
    unsigned                   kick:1;

    ngx_pool_t                *pool;
    ngx_array_t               *cancels;     /* of uint32_t */

    uint32_t                   next_id;
    ngx_rbtree_t               streams;
    ngx_rbtree_node_t          sentinel;
    ngx_queue_t                tx_wait;
    ngx_queue_t                wake;

    ngx_queue_t                posted;      /* of ngx_http_esi_msg_t */
    size_t                     posted_size;
    ngx_rbtree_t               purges;
    ngx_rbtree_node_t          purge_sentinel;

    ngx_event_t                reconnect;
    ngx_event_t                wake_event;
    ngx_msec_t                 backoff;
    ngx_err_t                  last_err;    /* of the last failed connect */

    uint64_t                   hello[4];
    size_t                     hello_sent;
    uint64_t                   welcome[NGX_HTTP_ESI_WELCOME_WORDS];
    size_t                     welcome_len;
    int                        fds[4];
    ngx_uint_t                 nfds;
    ngx_http_esi_mapping_t    *arena;
    ngx_http_esi_mapping_t    *pins;

    ngx_http_esi_plain_t      *plain;       /* by hash of the object */
    ngx_http_esi_replay_t     *replays;     /* ... likewise */
    ngx_uint_t                 nreplays;    /* slots in use */
    ngx_event_t                replay_timer;

    unsigned                   lost_reports:1;  /* since the last announce */
} ngx_http_esi_daemon_t;


static ngx_int_t ngx_http_esi_init_process(ngx_cycle_t *cycle);
static void ngx_http_esi_exit_process(ngx_cycle_t *cycle);
static void ngx_http_esi_connect(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_connect_denied(ngx_http_esi_daemon_t *d,
    ngx_err_t err);
static ngx_str_t ngx_http_esi_id_name(u_char *buf, size_t size,
    ngx_uint_t id, ngx_uint_t group);
static void ngx_http_esi_reconnect_handler(ngx_event_t *ev);
static void ngx_http_esi_hello_handler(ngx_event_t *wev);
static void ngx_http_esi_socket_handler(ngx_event_t *rev);
static ngx_int_t ngx_http_esi_read_welcome(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_attach(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_map_arena(ngx_http_esi_daemon_t *d,
    ngx_fd_t fd, uint64_t size);
static ngx_http_esi_mapping_t *ngx_http_esi_map(ngx_http_esi_daemon_t *d,
    ngx_fd_t fd, size_t size, off_t offset, int prot, const char *what);
static void ngx_http_esi_unmap(ngx_http_esi_mapping_t *m);
static ngx_int_t ngx_http_esi_map_pins(ngx_http_esi_daemon_t *d,
    ngx_fd_t fd, uint32_t ring_size);
static void ngx_http_esi_unpin(ngx_http_esi_mapping_t *pins, uint32_t pin);
static void ngx_http_esi_drop(ngx_http_esi_daemon_t *d, ngx_uint_t level,
    const char *reason);
static void ngx_http_esi_close(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_notify_handler(ngx_event_t *rev);
static ngx_int_t ngx_http_esi_response(ngx_http_esi_daemon_t *d,
    const uint8_t *p, uint32_t len);
static ngx_int_t ngx_http_esi_splice(ngx_http_esi_ctx_t *ctx,
    esi_wire_struct_t *root);
static ngx_int_t ngx_http_esi_wire_str(ngx_http_request_t *r,
    esi_wire_struct_t *s, unsigned ptr, ngx_str_t *str, ngx_uint_t is_path);
static ngx_int_t ngx_http_esi_purged(ngx_http_esi_purge_t *p,
    esi_wire_struct_t *root);
static void ngx_http_esi_flush(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_announce(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_post(ngx_http_esi_daemon_t *d, void *buf,
    size_t len);
static ngx_int_t ngx_http_esi_enqueue(ngx_http_esi_daemon_t *d, void *buf,
    size_t len, ngx_queue_t *before);
static ngx_int_t ngx_http_esi_flush_posted(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_free_posted(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_send(ngx_http_esi_daemon_t *d,
    ngx_http_esi_ctx_t *ctx);
static void *ngx_http_esi_reserve(ngx_http_esi_daemon_t *d, size_t need);
static void ngx_http_esi_commit(ngx_http_esi_daemon_t *d, size_t len);
static ngx_int_t ngx_http_esi_send_short(ngx_http_esi_daemon_t *d,
    uint32_t id, uint16_t which);
static void ngx_http_esi_cancel(ngx_http_esi_daemon_t *d, uint32_t id);
static ngx_http_esi_ctx_t *ngx_http_esi_lookup(ngx_http_esi_daemon_t *d,
    uint32_t id);
static ngx_rbtree_node_t *ngx_http_esi_find(ngx_rbtree_t *tree, uint32_t id);
static void ngx_http_esi_unlink(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_fail(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_forget(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_schedule(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_timer(ngx_http_esi_ctx_t *ctx, ngx_uint_t reset);
static void ngx_http_esi_timeout_handler(ngx_event_t *ev);
static void ngx_http_esi_wake_handler(ngx_event_t *ev);
static void ngx_http_esi_resume_handler(ngx_event_t *ev);
static void ngx_http_esi_wake(ngx_http_esi_ctx_t *ctx);

static ngx_int_t ngx_http_esi_header_filter(ngx_http_request_t *r);
static void ngx_http_esi_report(ngx_http_request_t *r,
    ngx_http_esi_main_conf_t *emcf);
static void ngx_http_esi_report_stored(void *data);
static void ngx_http_esi_report_object(ngx_http_request_t *r,
    ngx_pool_t *pool, ngx_uint_t store);
static ngx_int_t ngx_http_esi_report_file(ngx_http_request_t *r,
    ngx_pool_t *pool, ngx_str_t *zone, ngx_str_t *key, u_char *file,
    ngx_str_t *tags);
static ngx_uint_t ngx_http_esi_encoding(ngx_http_request_t *r);
static ngx_table_elt_t *ngx_http_esi_find_header(ngx_list_t *headers,
    const char *name);
static void ngx_http_esi_request_vars(ngx_http_request_t *r, ngx_str_t *vars);
static size_t ngx_http_esi_cookies(ngx_http_request_t *r, ngx_array_t *names,
    u_char *dst);
static void ngx_http_esi_hide_surrogate_control(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_open(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_cleanup(void *data);
static ngx_int_t ngx_http_esi_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_esi_feed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
#if (NGX_ZLIB)
static ngx_int_t ngx_http_esi_inflate(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in, ngx_chain_t **out);
static ngx_uint_t ngx_http_esi_inflate_room(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_inflate_buf(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_inflate_out(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t ***last);
static void ngx_http_esi_inflate_failed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, const char *what, int rc);
static void *ngx_http_esi_inflate_alloc(void *opaque, u_int items,
    u_int size);
static void ngx_http_esi_inflate_free(void *opaque, void *address);
#endif
static void ngx_http_esi_recycle(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_buf_t *b, ngx_chain_t *cl);
static ngx_int_t ngx_http_esi_hold(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_process(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_execute(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_verbatim(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, off_t offset, off_t end);
static ngx_int_t ngx_http_esi_include(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn, ngx_uint_t alt);
static ngx_int_t ngx_http_esi_include_failed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn, ngx_uint_t alt);
static ngx_int_t ngx_http_esi_fragment_header(ngx_http_request_t *r,
    ngx_http_esi_ctx_t **ctxp);
static ngx_int_t ngx_http_esi_fragment_limit(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t **in);
static ngx_int_t ngx_http_esi_fragment_marker(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_literal(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_str_t *text);
#if (NGX_ZLIB)
static ngx_int_t ngx_http_esi_segment(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn);
#endif
static ngx_int_t ngx_http_esi_try_start(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_try_except(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_try_close(ngx_http_esi_ctx_t *ctx,
    ngx_uint_t keep);
static void ngx_http_esi_try_failed(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_skip(ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn);
static ngx_int_t ngx_http_esi_next(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_capture(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *to, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_include_done(ngx_http_request_t *r,
    void *data, ngx_int_t rc);
static ngx_int_t ngx_http_esi_fallback(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_final(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_chain_t *ngx_http_esi_link(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_pack(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, u_char *data, size_t len);
static ngx_int_t ngx_http_esi_output(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_release(ngx_http_esi_ctx_t *ctx);
static ngx_uint_t ngx_http_esi_starved(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_flush_held(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_own_held(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);

static uint32_t ngx_http_esi_object_hash(const u_char *key);
static ngx_http_esi_plain_t *ngx_http_esi_plain(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_forget_objects(ngx_http_esi_daemon_t *d,
    esi_wire_struct_t *root);
static ngx_http_esi_replay_t *ngx_http_esi_replay_slot(
    ngx_http_esi_ctx_t *ctx);
static ngx_uint_t ngx_http_esi_replay_matches(ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_replay_t *e);
static ngx_int_t ngx_http_esi_replay(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_replay_keep(ngx_http_esi_ctx_t *ctx,
    const uint8_t *message, size_t len, uint32_t pin);
static void ngx_http_esi_replay_forget(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_replay_release(ngx_http_esi_daemon_t *d,
    ngx_http_esi_replay_t *e);
static void ngx_http_esi_replay_flush(ngx_http_esi_daemon_t *d,
    ngx_uint_t all);
static void ngx_http_esi_replay_timer_handler(ngx_event_t *ev);
static void ngx_http_esi_replay_report(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_identify(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_loc_conf_t *elcf);
static ngx_int_t ngx_http_esi_plan(ngx_http_esi_ctx_t *ctx,
    esi_wire_struct_t *root, const uint8_t *message, size_t len);
static ngx_int_t ngx_http_esi_plan_unused(ngx_http_esi_daemon_t *d,
    esi_wire_struct_t *root);
static ngx_int_t ngx_http_esi_plan_segment(ngx_http_esi_ctx_t *ctx,
    esi_wire_struct_t *step, ngx_str_t *room, ngx_http_esi_step_t *out);
static u_char *ngx_http_esi_plan_copy(ngx_http_request_t *r, ngx_str_t *room,
    const uint8_t *bytes, size_t len);
static ngx_int_t ngx_http_esi_plan_run(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_plan_ahead(ngx_http_esi_ctx_t *ctx,
    const char **why);
static ngx_int_t ngx_http_esi_plan_drop(ngx_http_esi_ctx_t *ctx, off_t at,
    const char *why);
static ngx_uint_t ngx_http_esi_held_equal(ngx_http_esi_ctx_t *ctx,
    off_t offset, u_char *bytes, size_t len);
static ngx_http_esi_insn_t *ngx_http_esi_insn(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_try_insn(ngx_http_esi_ctx_t *ctx,
    ngx_uint_t type);
static ngx_int_t ngx_http_esi_include_insn(ngx_http_request_t *r,
    esi_wire_struct_t *inc, ngx_http_esi_insn_t *insn);
static ngx_uint_t ngx_http_esi_splits_line(ngx_str_t *s, ngx_uint_t args);

static ngx_int_t ngx_http_esi_purge_access(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_purge_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_purge_init(ngx_http_esi_purge_t *p,
    ngx_shm_zone_t *zone);
static ngx_int_t ngx_http_esi_purge_order(ngx_http_esi_daemon_t *d,
    uint32_t order, esi_wire_struct_t *root);
static void ngx_http_esi_purge_report(ngx_http_esi_purge_t *p);
static void ngx_http_esi_purge_log(ngx_http_esi_purge_t *p);
static ngx_int_t ngx_http_esi_purge_tags(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p);
static ngx_int_t ngx_http_esi_purge_send(ngx_http_esi_purge_t *p);
static ngx_uint_t ngx_http_esi_purge_file(ngx_http_esi_purge_t *p,
    const u_char *key);
static ngx_http_file_cache_node_t *ngx_http_esi_cache_lookup(
    ngx_http_file_cache_t *cache, const u_char *key);
static void ngx_http_esi_purge_done(ngx_http_esi_purge_t *p,
    ngx_uint_t status, const char *error);
static void ngx_http_esi_purge_timeout_handler(ngx_event_t *ev);
static void ngx_http_esi_purge_finish_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_esi_purge_respond(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p);
static void ngx_http_esi_purge_cleanup(void *data);

static ngx_int_t ngx_http_esi_capability(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_surrogate_control(ngx_http_request_t *r,
    ngx_http_esi_loc_conf_t *elcf);
static void ngx_http_esi_surrogate_parse(ngx_str_t *value, ngx_str_t *name,
    ngx_http_esi_surrogate_t *sc);
static ngx_int_t ngx_http_esi_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_esi_add_variables(ngx_conf_t *cf);
static void *ngx_http_esi_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_esi_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_esi_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_esi_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_esi_cache_purge(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_purge_index(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_plan_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_plan_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_cookies_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_uint_t ngx_http_esi_stitches(ngx_http_request_t *r,
    ngx_http_esi_loc_conf_t *elcf);
static ngx_uint_t ngx_http_esi_stitch_available(ngx_conf_t *cf);
static ngx_int_t ngx_http_esi_stitch_check(ngx_conf_t *cf,
    ngx_http_esi_loc_conf_t *elcf);
static ngx_int_t ngx_http_esi_add_zone(ngx_conf_t *cf, ngx_shm_zone_t *zone);
static char *ngx_http_esi_tag_size_bounds(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_esi_filter_init(ngx_conf_t *cf);


/* Cache-Purge-Result's first word, by NGX_HTTP_ESI_PURGE_KEY ... _TAG */

static ngx_str_t  ngx_http_esi_purge_kinds[] = {
    ngx_string("exact"),
    ngx_string("wildcard"),
    ngx_string("tag")
};


static ngx_conf_enum_t  ngx_http_esi_fallback_modes[] = {
    { ngx_string("passthrough"), NGX_HTTP_ESI_PASSTHROUGH },
    { ngx_string("abort"), NGX_HTTP_ESI_ABORT },
    { ngx_null_string, 0 }
};


static ngx_conf_num_bounds_t  ngx_http_esi_stitch_level_bounds = {
    ngx_conf_check_num_bounds, 1, 9
};


/* where a location without esi_plan keeps its plans; esid sizes it */
static ngx_http_esi_plan_zone_t  ngx_http_esi_default_plan =
    { ngx_string("default"), 0 };


static ngx_conf_post_t  ngx_http_esi_tag_size_post =
    { ngx_http_esi_tag_size_bounds };


static ngx_command_t  ngx_http_esi_filter_commands[] = {

    { ngx_string("esi"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_HTTP_LIF_CONF
                        |NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, enable),
      NULL },

    { ngx_string("esi_types"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_types_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, types_keys),
      &ngx_http_html_default_types[0] },

    { ngx_string("esi_silent_errors"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, silent_errors),
      NULL },

    { ngx_string("esi_buffer_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, buffer_size),
      NULL },

    { ngx_string("esi_max_depth"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_depth),
      NULL },

    { ngx_string("esi_max_includes"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_includes),
      NULL },

    { ngx_string("esi_max_page_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_off_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_page_size),
      NULL },

    { ngx_string("esi_max_tag_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_tag_size),
      &ngx_http_esi_tag_size_post },

    { ngx_string("esi_max_fragment_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_off_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_fragment_size),
      NULL },

    { ngx_string("esi_fallback"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, fallback),
      &ngx_http_esi_fallback_modes },

    { ngx_string("esi_daemon"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_main_conf_t, daemon),
      NULL },

    { ngx_string("esi_daemon_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_main_conf_t, timeout),
      NULL },

    { ngx_string("esi_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_cache_purge,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_cache_purge_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, purge_key),
      NULL },

    { ngx_string("esi_purge_index"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_purge_index,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_purge_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_main_conf_t, purge_timeout),
      NULL },

    { ngx_string("esi_plan_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_plan_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_plan"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_plan_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_plan_reuse"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, plan_reuse),
      NULL },

    { ngx_string("esi_stitch"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, stitch),
      NULL },

    { ngx_string("esi_stitch_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, stitch_level),
      &ngx_http_esi_stitch_level_bounds },

    { ngx_string("esi_cookies"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_cookies_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_surrogate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, surrogate),
      NULL },

    { ngx_string("esi_surrogate_control"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, surrogate_control),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_esi_module_ctx = {
    ngx_http_esi_add_variables,            /* preconfiguration */
    ngx_http_esi_filter_init,              /* postconfiguration */

    ngx_http_esi_create_main_conf,         /* create main configuration */
    ngx_http_esi_init_main_conf,           /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_esi_create_loc_conf,          /* create location configuration */
    ngx_http_esi_merge_loc_conf            /* merge location configuration */
};


ngx_module_t  ngx_http_esi_module = {
    NGX_MODULE_V1,
    &ngx_http_esi_module_ctx,              /* module context */
    ngx_http_esi_filter_commands,          /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_esi_init_process,             /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_esi_exit_process,             /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* the proxy module's loc conf starts with its ngx_http_upstream_conf_t */
extern ngx_module_t  ngx_http_proxy_module;

static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

static ngx_http_esi_daemon_t  ngx_http_esi_daemon;

static u_char  ngx_http_esi_error_marker[] = "<!-- ESI include error -->";

static ngx_str_t  ngx_http_esi_status_names[] = {
    ngx_null_string,
    ngx_string("processed"),
    ngx_string("passthrough"),
    ngx_string("aborted")
};


static ngx_http_variable_t  ngx_http_esi_vars[] = {

    { ngx_string("esi_status"), NULL, ngx_http_esi_status_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


/* the per-worker connection to esid */

static ngx_int_t
ngx_http_esi_init_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_daemon_t     *d;
    ngx_http_conf_ctx_t       *hctx;
    ngx_http_esi_main_conf_t  *emcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    hctx = (ngx_http_conf_ctx_t *) ngx_get_conf(cycle->conf_ctx,
                                                ngx_http_module);
    if (hctx == NULL) {
        return NGX_OK;
    }

    emcf = hctx->main_conf[ngx_http_esi_module.ctx_index];

    if (!emcf->used) {
        return NGX_OK;
    }

    d = &ngx_http_esi_daemon;

    d->plain = ngx_pcalloc(cycle->pool, NGX_HTTP_ESI_PLAIN_OBJECTS
                                        * sizeof(ngx_http_esi_plain_t));
    if (d->plain == NULL) {
        return NGX_ERROR;
    }

    d->replays = ngx_pcalloc(cycle->pool, NGX_HTTP_ESI_REPLAYS
                                          * sizeof(ngx_http_esi_replay_t));
    if (d->replays == NULL) {
        return NGX_ERROR;
    }

    d->conf = emcf;
    d->log = cycle->log;
    d->daemon_fd = -1;
    d->backoff = NGX_HTTP_ESI_BACKOFF_MIN;

    ngx_rbtree_init(&d->streams, &d->sentinel, ngx_rbtree_insert_value);
    ngx_queue_init(&d->tx_wait);
    ngx_queue_init(&d->wake);
    ngx_queue_init(&d->posted);
    ngx_rbtree_init(&d->purges, &d->purge_sentinel, ngx_rbtree_insert_value);

    d->reconnect.handler = ngx_http_esi_reconnect_handler;
    d->reconnect.log = cycle->log;
    d->reconnect.data = d;
    d->reconnect.cancelable = 1;

    d->wake_event.handler = ngx_http_esi_wake_handler;
    d->wake_event.log = cycle->log;
    d->wake_event.data = d;

    d->replay_timer.handler = ngx_http_esi_replay_timer_handler;
    d->replay_timer.log = cycle->log;
    d->replay_timer.data = d;
    d->replay_timer.cancelable = 1;

    ngx_http_esi_connect(d);

    return NGX_OK;
}


static void
ngx_http_esi_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (d->conf == NULL) {
        return;
    }

    ngx_http_esi_close(d);

    if (d->reconnect.timer_set) {
        ngx_del_timer(&d->reconnect);
    }

    if (d->replay_timer.timer_set) {
        ngx_del_timer(&d->replay_timer);
    }
}


static void
ngx_http_esi_connect(ngx_http_esi_daemon_t *d)
{
    ngx_err_t          err;
    ngx_uint_t         level;
    ngx_socket_t       s;
    ngx_connection_t  *c;
    esi_wire_out_t     hello;
    esi_wire_builder_t  b;

    d->pool = ngx_create_pool(1024, d->log);
    if (d->pool == NULL) {
        goto failed;
    }

    d->cancels = ngx_array_create(d->pool, 16, sizeof(uint32_t));
    if (d->cancels == NULL) {
        goto failed;
    }

    s = ngx_socket(AF_UNIX, SOCK_STREAM, 0);

    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_socket_errno,
                      ngx_socket_n " failed");
        goto failed;
    }

    c = ngx_get_connection(s, d->log);

    if (c == NULL) {
        ngx_close_socket(s);
        goto failed;
    }

    d->conn = c;

    if (ngx_nonblocking(s) == -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_socket_errno,
                      ngx_nonblocking_n " failed");
        goto failed;
    }

    if (connect(s, d->conf->url.addrs[0].sockaddr,
                d->conf->url.addrs[0].socklen)
        == -1)
    {
        /* AF_UNIX connects at once: EAGAIN means a full backlog */

        err = ngx_socket_errno;
        level = (err == d->last_err) ? NGX_LOG_DEBUG : NGX_LOG_WARN;
        d->last_err = err;

        if ((err == NGX_EACCES || err == NGX_EPERM)
            && level != NGX_LOG_DEBUG)
        {
            ngx_http_esi_connect_denied(d, err);

        } else {
            ngx_log_error(level, d->log, err,
                          "esi: connect() to %V failed", &d->conf->daemon);
        }

        goto failed;
    }

    esi_wire_builder_init(&b, d->hello, sizeof(d->hello));

    if (esi_wire_root(&b, ESI_WIRE_HELLO_DATA_WORDS, ESI_WIRE_HELLO_POINTERS,
                      &hello)
        != 0)
    {
        goto failed;
    }

    esi_wire_set_u32(&hello, ESI_WIRE_HELLO_VERSION_OFFSET,
                     ESI_WIRE_PROTOCOL_VERSION);
    esi_wire_set_u16(&hello, ESI_WIRE_HELLO_WHICH_OFFSET,
                     ESI_WIRE_HELLO_ATTACH_WHICH);

    d->hello_sent = 0;
    d->welcome_len = 0;
    d->nfds = 0;
    d->next_id = 1;
    d->state = NGX_HTTP_ESI_CONNECTING;

    c->read->handler = ngx_http_esi_socket_handler;
    c->write->handler = ngx_http_esi_hello_handler;
    c->read->log = d->log;
    c->write->log = d->log;
    c->read->cancelable = 1;
    c->recv = ngx_recv;
    c->send = ngx_send;

    if (esi_wire_finish(&b) != sizeof(d->hello)
        || ngx_handle_read_event(c->read, 0) != NGX_OK)
    {
        goto failed;
    }

    ngx_add_timer(c->read, d->conf->timeout);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, d->log, 0,
                   "esi: connected to %V", &d->conf->daemon);

    ngx_http_esi_hello_handler(c->write);

    return;

failed:

    ngx_http_esi_drop(d, NGX_LOG_DEBUG, NULL);
}


/*
 * The worker may not connect to esid's socket: every page passes through
 * unprocessed until an operator acts, so say what to do, once for each
 * time the connection is lost (d->last_err).  The names are looked up
 * here only, when the error is new.
 */

static void
ngx_http_esi_connect_denied(ngx_http_esi_daemon_t *d, ngx_err_t err)
{
    u_char               mode[4];
    u_char               user[64], group[64], owner[64], owner_group[64];
    uid_t                euid;
    gid_t                egid;
    ngx_str_t            worker_user, worker_group, sock_user, sock_group;
    struct stat          sb;
    struct sockaddr_un  *saun;

    saun = (struct sockaddr_un *) d->conf->url.addrs[0].sockaddr;

    euid = geteuid();
    egid = getegid();
    worker_user = ngx_http_esi_id_name(user, sizeof(user), euid, 0);
    worker_group = ngx_http_esi_id_name(group, sizeof(group), egid, 1);

    if (stat(saun->sun_path, &sb) == -1) {

        if (ngx_errno != NGX_EACCES) {
            ngx_log_error(NGX_LOG_ERR, d->log, err,
                          "esi: connect() to %V failed", &d->conf->daemon);
            return;
        }

        ngx_log_error(NGX_LOG_ERR, d->log, err,
                      "esi: connect() to %V failed: this worker, user %V "
                      "(uid %ui) group %V (gid %ui), cannot reach the "
                      "socket: a directory above it is not searchable "
                      "by the worker's user or group",
                      &d->conf->daemon, &worker_user, (ngx_uint_t) euid,
                      &worker_group, (ngx_uint_t) egid);
        return;
    }

    sock_user = ngx_http_esi_id_name(owner, sizeof(owner), sb.st_uid, 0);
    sock_group = ngx_http_esi_id_name(owner_group, sizeof(owner_group),
                                      sb.st_gid, 1);

    mode[0] = (u_char) ('0' + ((sb.st_mode >> 9) & 7));
    mode[1] = (u_char) ('0' + ((sb.st_mode >> 6) & 7));
    mode[2] = (u_char) ('0' + ((sb.st_mode >> 3) & 7));
    mode[3] = (u_char) ('0' + (sb.st_mode & 7));

    ngx_log_error(NGX_LOG_ERR, d->log, err,
                  "esi: connect() to %V failed: the socket is owned by "
                  "%V:%V with mode %*s, and this worker runs as user %V "
                  "(uid %ui) group %V (gid %ui); run esid with "
                  "--socket-group %V (under systemd: SocketGroup=%V in "
                  "esid.socket), or set nginx's \"user\" directive to a "
                  "user in group %V",
                  &d->conf->daemon, &sock_user, &sock_group,
                  (size_t) 4, mode, &worker_user, (ngx_uint_t) euid,
                  &worker_group, (ngx_uint_t) egid, &worker_group,
                  &worker_group, &sock_group);
}


/* a user's (or with group set, a group's) name, else its number */

static ngx_str_t
ngx_http_esi_id_name(u_char *buf, size_t size, ngx_uint_t id,
    ngx_uint_t group)
{
    char           *name, lookup[4096];
    ngx_str_t       s;
    struct group    gr, *grp;
    struct passwd   pw, *pwp;

    name = NULL;

    if (group) {
        if (getgrgid_r((gid_t) id, &gr, lookup, sizeof(lookup), &grp) == 0
            && grp != NULL)
        {
            name = gr.gr_name;
        }

    } else if (getpwuid_r((uid_t) id, &pw, lookup, sizeof(lookup), &pwp)
               == 0
               && pwp != NULL)
    {
        name = pw.pw_name;
    }

    s.data = buf;

    if (name) {
        s.len = ngx_slprintf(buf, buf + size, "%s", name) - buf;

    } else {
        s.len = ngx_slprintf(buf, buf + size, "%ui", id) - buf;
    }

    return s;
}


static void
ngx_http_esi_reconnect_handler(ngx_event_t *ev)
{
    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    ngx_http_esi_connect(ev->data);
}


static void
ngx_http_esi_hello_handler(ngx_event_t *wev)
{
    ssize_t                 n;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = wev->data;
    d = &ngx_http_esi_daemon;

    if (d->state != NGX_HTTP_ESI_CONNECTING
        || d->hello_sent == sizeof(d->hello))
    {
        return;
    }

    n = c->send(c, (u_char *) d->hello + d->hello_sent,
                sizeof(d->hello) - d->hello_sent);

    if (n == NGX_ERROR) {
        ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: cannot send hello to esid");
        return;
    }

    if (n > 0) {
        d->hello_sent += n;
    }

    if (d->hello_sent < sizeof(d->hello)
        && ngx_handle_write_event(wev, 0) != NGX_OK)
    {
        ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: cannot wait to write");
    }
}


static void
ngx_http_esi_socket_handler(ngx_event_t *rev)
{
    u_char                  byte;
    ssize_t                 n;
    ngx_err_t               err;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = rev->data;
    d = &ngx_http_esi_daemon;

    if (rev->timedout) {
        ngx_http_esi_drop(d, NGX_LOG_ERR,
                          "esi: esid did not answer hello in time");
        return;
    }

    if (d->state == NGX_HTTP_ESI_CONNECTING) {

        switch (ngx_http_esi_read_welcome(d)) {

        case NGX_AGAIN:
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: cannot wait to read");
            }
            return;

        case NGX_OK:
            if (ngx_http_esi_attach(d) == NGX_OK) {
                return;
            }

            /* fall through */

        default:
            ngx_http_esi_drop(d, NGX_LOG_ERR, NULL);
            return;
        }
    }

    /* nothing but EOF travels on the socket once attached */

    n = recv(c->fd, &byte, 1, 0);

    if (n == -1) {
        err = ngx_socket_errno;

        if (err == NGX_EAGAIN || err == NGX_EINTR) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: cannot wait to read");
            }
            return;
        }

        ngx_log_error(NGX_LOG_ERR, d->log, err, "esi: recv() failed");
        ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: connection to esid failed");
        return;
    }

    ngx_http_esi_drop(d, NGX_LOG_ERR,
                      n == 0 ? "esi: esid closed the connection"
                             : "esi: esid sent data on the socket");
}


static ngx_int_t
ngx_http_esi_read_welcome(ngx_http_esi_daemon_t *d)
{
    int             *fd;
    size_t           total;
    ssize_t          n;
    uint32_t         table[2];
    ngx_err_t        err;
    ngx_uint_t       i, nfd;
    struct iovec     iov;
    struct msghdr    msg;
    struct cmsghdr  *cmsg;
    union {
        struct cmsghdr  cm;
        u_char          space[CMSG_SPACE(5 * sizeof(int))];
    } cmsgbuf;

    for ( ;; ) {
        iov.iov_base = (u_char *) d->welcome + d->welcome_len;
        iov.iov_len = sizeof(d->welcome) - d->welcome_len;

        ngx_memzero(&msg, sizeof(struct msghdr));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = &cmsgbuf;
        msg.msg_controllen = sizeof(cmsgbuf);

        n = recvmsg(d->conn->fd, &msg, MSG_CMSG_CLOEXEC);

        if (n == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EAGAIN) {
                return NGX_AGAIN;
            }

            if (err == NGX_EINTR) {
                continue;
            }

            ngx_log_error(NGX_LOG_ERR, d->log, err, "esi: recvmsg() failed");
            return NGX_ERROR;
        }

        for (cmsg = CMSG_FIRSTHDR(&msg);
             cmsg != NULL;
             cmsg = CMSG_NXTHDR(&msg, cmsg))
        {
            if (cmsg->cmsg_level != SOL_SOCKET
                || cmsg->cmsg_type != SCM_RIGHTS)
            {
                continue;
            }

            fd = (int *) CMSG_DATA(cmsg);
            nfd = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);

            for (i = 0; i < nfd; i++) {
                if (d->nfds < 4) {
                    d->fds[d->nfds++] = fd[i];

                } else {
                    close(fd[i]);
                    d->nfds++;
                }
            }
        }

        if (msg.msg_flags & MSG_CTRUNC) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: welcome carried too many descriptors");
            return NGX_ERROR;
        }

        if (n == 0) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: esid closed the connection before welcome");
            return NGX_ERROR;
        }

        d->welcome_len += n;

        if (d->welcome_len < 8) {
            continue;
        }

        ngx_memcpy(table, d->welcome, 8);

        if (table[0] != 0 || table[1] >= NGX_HTTP_ESI_WELCOME_WORDS) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: malformed welcome from esid");
            return NGX_ERROR;
        }

        total = 8 + (size_t) table[1] * 8;

        if (d->welcome_len > total) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: esid sent more than a welcome");
            return NGX_ERROR;
        }

        if (d->welcome_len == total) {
            return NGX_OK;
        }
    }
}


static ngx_int_t
ngx_http_esi_attach(ngx_http_esi_daemon_t *d)
{
    int                 seals;
    u_char             *shm;
    uint32_t            version, ring_size, pid;
    uint64_t            arena_size;
    ngx_connection_t   *c;
    esi_shm_header_t   *hdr;
    esi_wire_msg_t      msg;
    esi_wire_struct_t   root;
    struct stat         st;

    if (esi_wire_open(&msg, d->welcome, d->welcome_len, &root) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed welcome from esid");
        return NGX_ERROR;
    }

    version = esi_wire_u32(&root, ESI_WIRE_WELCOME_VERSION_OFFSET);
    ring_size = esi_wire_u32(&root, ESI_WIRE_WELCOME_RING_SIZE_OFFSET);
    pid = esi_wire_u32(&root, ESI_WIRE_WELCOME_DAEMON_PID_OFFSET);
    arena_size = esi_wire_u64(&root, ESI_WIRE_WELCOME_ARENA_SIZE_OFFSET);

    if (version != ESI_WIRE_PROTOCOL_VERSION) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: esid speaks protocol %uD, we speak %uD",
                      version, (uint32_t) ESI_WIRE_PROTOCOL_VERSION);
        return NGX_ERROR;
    }

    if (d->nfds != 4 || !esi_ring_size_valid(ring_size)) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: invalid welcome from esid: %ui descriptors, "
                      "ring size %uD", d->nfds, ring_size);
        return NGX_ERROR;
    }

    seals = fcntl(d->fds[0], F_GET_SEALS);

    if (seals == -1
        || (seals & (F_SEAL_SHRINK|F_SEAL_GROW))
           != (F_SEAL_SHRINK|F_SEAL_GROW))
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the shared memory from esid is not sealed");
        return NGX_ERROR;
    }

    if (fstat(d->fds[0], &st) == -1
        || (size_t) st.st_size != esi_shm_size(ring_size))
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the shared memory from esid has the wrong size");
        return NGX_ERROR;
    }

    d->shm_size = esi_shm_size(ring_size);

    shm = mmap(NULL, d->shm_size, PROT_READ|PROT_WRITE, MAP_SHARED,
               d->fds[0], 0);

    if (shm == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: mmap() of the shared memory failed");
        return NGX_ERROR;
    }

    d->shm = shm;
    hdr = (esi_shm_header_t *) shm;

    if (hdr->magic != ESI_SHM_MAGIC
        || hdr->version != ESI_WIRE_PROTOCOL_VERSION
        || hdr->ring_size != ring_size)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: corrupt shared memory header from esid");
        return NGX_ERROR;
    }

    esi_ring_attach(&d->tx, &hdr->to_daemon, shm + ESI_SHM_HEADER_SIZE,
                    ring_size);
    esi_ring_attach(&d->rx, &hdr->to_worker,
                    shm + ESI_SHM_HEADER_SIZE + ring_size, ring_size);

    if (ngx_http_esi_map_pins(d, d->fds[0], ring_size) != NGX_OK) {
        return NGX_ERROR;
    }

    close(d->fds[0]);
    d->fds[0] = -1;

    if (ngx_http_esi_map_arena(d, d->fds[3], arena_size) != NGX_OK) {
        return NGX_ERROR;
    }

    close(d->fds[3]);
    d->fds[3] = -1;

    c = ngx_get_connection(d->fds[1], d->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    d->notify = c;
    d->fds[1] = -1;
    d->daemon_fd = d->fds[2];
    d->fds[2] = -1;
    d->nfds = 0;

    if (ngx_nonblocking(c->fd) == -1 || ngx_nonblocking(d->daemon_fd) == -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_errno,
                      ngx_nonblocking_n " failed");
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_esi_notify_handler;
    c->read->log = d->log;
    c->write->log = d->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        return NGX_ERROR;
    }

    if (d->conn->read->timer_set) {
        ngx_del_timer(d->conn->read);
    }

    d->state = NGX_HTTP_ESI_READY;
    d->backoff = NGX_HTTP_ESI_BACKOFF_MIN;
    d->last_err = 0;

    ngx_log_error(NGX_LOG_INFO, d->log, 0,
                  "esi: attached to esid pid %uD, ring %uD bytes",
                  pid, ring_size);

    if (ngx_http_esi_announce(d) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_esi_flush(d);

    /* esid may have written before we watched the eventfd */
    ngx_post_event(c->read, &ngx_posted_events);

    return NGX_OK;
}


/*
 * The segment arena: sealed so that it can neither be written through a
 * new mapping nor change size (a send from it would fault), mapped
 * read-only.  An empty one means esid stitches nothing.
 */

static ngx_int_t
ngx_http_esi_map_arena(ngx_http_esi_daemon_t *d, ngx_fd_t fd, uint64_t size)
{
    int           seals, need;
    struct stat   st;

    if (size == 0) {
        return NGX_OK;
    }

    need = F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_FUTURE_WRITE;
    seals = fcntl(fd, F_GET_SEALS);

    if (seals == -1 || (seals & need) != need) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the segment arena from esid is not sealed");
        return NGX_ERROR;
    }

    if (fstat(fd, &st) == -1
        || size > (uint64_t) NGX_MAX_SIZE_T_VALUE
        || (uint64_t) st.st_size != size)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the segment arena from esid has the wrong size");
        return NGX_ERROR;
    }

    d->arena = ngx_http_esi_map(d, fd, (size_t) size, 0, PROT_READ,
                                "the segment arena");

    return d->arena ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_esi_map_pins(ngx_http_esi_daemon_t *d, ngx_fd_t fd,
    uint32_t ring_size)
{
    d->pins = ngx_http_esi_map(d, fd, ESI_PIN_SLOTS * sizeof(uint32_t),
                               (off_t) esi_shm_pins_offset(ring_size),
                               PROT_READ|PROT_WRITE, "the pin table");

    return d->pins ? NGX_OK : NGX_ERROR;
}


static ngx_http_esi_mapping_t *
ngx_http_esi_map(ngx_http_esi_daemon_t *d, ngx_fd_t fd, size_t size,
    off_t offset, int prot, const char *what)
{
    u_char                  *start;
    ngx_http_esi_mapping_t  *m;

    m = ngx_alloc(sizeof(ngx_http_esi_mapping_t), d->log);
    if (m == NULL) {
        return NULL;
    }

    start = mmap(NULL, size, prot, MAP_SHARED, fd, offset);

    if (start == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: mmap() of %s failed", what);
        ngx_free(m);
        return NULL;
    }

    m->start = start;
    m->size = size;
    m->refs = 1;

    return m;
}


static void
ngx_http_esi_unmap(ngx_http_esi_mapping_t *m)
{
    if (--m->refs) {
        return;
    }

    munmap(m->start, m->size);
    ngx_free(m);
}


/* the request is over, or never used the plan: its pin goes */

static void
ngx_http_esi_unpin(ngx_http_esi_mapping_t *pins, uint32_t pin)
{
    uint32_t  *counts;

    counts = (uint32_t *) pins->start;

    (void) __atomic_fetch_sub(&counts[pin - 1], 1, __ATOMIC_RELEASE);
}


static void
ngx_http_esi_drop(ngx_http_esi_daemon_t *d, ngx_uint_t level,
    const char *reason)
{
    ngx_rbtree_node_t   *node;
    ngx_http_esi_ctx_t  *ctx;

    if (reason) {
        ngx_log_error(level, d->log, 0, "%s, esi streams fall back", reason);
    }

    ngx_http_esi_close(d);

    while (d->streams.root != d->streams.sentinel) {
        node = ngx_rbtree_min(d->streams.root, d->streams.sentinel);
        ctx = (ngx_http_esi_ctx_t *) node;

        ngx_http_esi_unlink(ctx);
        ngx_http_esi_fail(ctx);
    }

    while (d->purges.root != d->purges.sentinel) {
        node = ngx_rbtree_min(d->purges.root, d->purges.sentinel);

        ngx_http_esi_purge_done((ngx_http_esi_purge_t *) node,
                                NGX_HTTP_SERVICE_UNAVAILABLE,
                                "the connection to esid was lost");
    }

    if (!ngx_exiting && !ngx_terminate && !ngx_quit) {
        ngx_add_timer(&d->reconnect, d->backoff);
        d->backoff = ngx_min(d->backoff * 2, NGX_HTTP_ESI_BACKOFF_MAX);
    }
}


static void
ngx_http_esi_close(ngx_http_esi_daemon_t *d)
{
    ngx_uint_t  i;

    d->state = NGX_HTTP_ESI_IDLE;

    if (d->conn) {
        ngx_close_connection(d->conn);
        d->conn = NULL;
    }

    if (d->notify) {
        ngx_close_connection(d->notify);
        d->notify = NULL;
    }

    if (d->daemon_fd != -1) {
        close(d->daemon_fd);
        d->daemon_fd = -1;
    }

    for (i = 0; i < ngx_min(d->nfds, 4); i++) {
        if (d->fds[i] != -1) {
            close(d->fds[i]);
        }
    }

    d->nfds = 0;

    if (d->shm) {
        munmap(d->shm, d->shm_size);
        d->shm = NULL;
    }

    ngx_http_esi_replay_flush(d, 1);

    if (d->pins) {
        ngx_http_esi_unmap(d->pins);
        d->pins = NULL;
    }

    if (d->arena) {
        ngx_http_esi_unmap(d->arena);
        d->arena = NULL;
    }

    if (d->pool) {
        ngx_destroy_pool(d->pool);
        d->pool = NULL;
        d->cancels = NULL;
    }

    ngx_http_esi_free_posted(d);
}


static void
ngx_http_esi_notify_handler(ngx_event_t *rev)
{
    uint64_t                value;
    uint32_t                len;
    ngx_uint_t              n;
    const uint8_t          *p;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = rev->data;
    d = &ngx_http_esi_daemon;

    while (read(c->fd, &value, sizeof(uint64_t)) == sizeof(uint64_t)) {
        /* void */
    }

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    for (n = 0; n < NGX_HTTP_ESI_DRAIN_BATCH; n++) {

        switch (esi_ring_peek(&d->rx, &p, &len)) {

        case ESI_RING_EMPTY:
            if (esi_ring_wait_data(&d->rx)) {
                goto drained;
            }
            continue;

        case ESI_RING_OK:
            break;

        default:
            ngx_http_esi_drop(d, NGX_LOG_ERR,
                              "esi: the ring from esid is corrupt");
            return;
        }

        if (ngx_http_esi_response(d, p, len) != NGX_OK) {
            ngx_http_esi_drop(d, NGX_LOG_ERR, NULL);
            return;
        }

        if (d->state != NGX_HTTP_ESI_READY) {

            /* an answer led to dropping the connection: the ring is gone */
            return;
        }

        if (esi_ring_release(&d->rx)) {
            d->kick = 1;
        }
    }

    /* esid keeps writing: let other events run, then carry on */
    ngx_post_event(rev, &ngx_posted_events);

drained:

    ngx_http_esi_flush(d);

    if (ngx_handle_read_event(rev, 0) != NGX_OK) {
        ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: cannot watch the eventfd");
    }
}


static ngx_int_t
ngx_http_esi_response(ngx_http_esi_daemon_t *d, const uint8_t *p,
    uint32_t len)
{
    size_t               n;
    uint16_t             which;
    uint32_t             id;
    const char          *reason;
    esi_wire_msg_t       msg;
    esi_wire_struct_t    root;
    ngx_rbtree_node_t   *node;
    ngx_http_esi_ctx_t  *ctx;

    if (esi_wire_open(&msg, p, len, &root) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed response from esid");
        return NGX_ERROR;
    }

    id = esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET);
    which = esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET);

    if (which == ESI_WIRE_RESPONSE_PURGE_ORDER_WHICH) {
        return ngx_http_esi_purge_order(d, id, &root);
    }

    if (which == ESI_WIRE_RESPONSE_FORGET_WHICH) {
        return ngx_http_esi_forget_objects(d, &root);
    }

    ctx = ngx_http_esi_lookup(d, id);

    if (ctx == NULL) {
        node = ngx_http_esi_find(&d->purges, id);

        if (node) {
            if (which != ESI_WIRE_RESPONSE_PURGED_WHICH) {
                ngx_log_error(NGX_LOG_ERR, d->log, 0,
                              "esi: response %ud from esid to purge %uD",
                              which, id);
                return NGX_ERROR;
            }

            return ngx_http_esi_purged((ngx_http_esi_purge_t *) node, &root);
        }

        if (id == 0 || id >= d->next_id) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: response for stream %uD never opened", id);
            return NGX_ERROR;
        }

        /* a stream we cancelled or failed, a purge that is over */

        if (which == ESI_WIRE_RESPONSE_PLAN_WHICH) {
            return ngx_http_esi_plan_unused(d, &root);
        }

        return NGX_OK;
    }

    switch (which) {

    case ESI_WIRE_RESPONSE_SPLICE_WHICH:
        return ngx_http_esi_splice(ctx, &root);

    case ESI_WIRE_RESPONSE_PLAN_WHICH:
        return ngx_http_esi_plan(ctx, &root, p, len);

    case ESI_WIRE_RESPONSE_FAIL_WHICH:
        if (esi_wire_get_text(&root, ESI_WIRE_RESPONSE_FAIL_PTR, &reason, &n)
            != 0)
        {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: malformed failure from esid");
            return NGX_ERROR;
        }

        ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                      "esi: esid failed the stream: \"%*s\"",
                      ngx_min(n, 256), (u_char *) reason);

        ngx_http_esi_unlink(ctx);
        ngx_http_esi_fail(ctx);
        return NGX_OK;

    default:
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: unknown response %ud from esid", which);
        return NGX_ERROR;
    }
}


static ngx_int_t
ngx_http_esi_splice(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *root)
{
    off_t                 offset, end, released, verbatim_end;
    size_t                n;
    uint16_t              which;
    uint32_t              i, length;
    uint64_t              value;
    ngx_int_t             rc;
    ngx_log_t            *log;
    const uint8_t        *bytes;
    ngx_http_request_t   *r;
    ngx_http_esi_insn_t  *insn, *head, **last;
    esi_wire_list_t       list;
    esi_wire_struct_t     splice, in, inc;

    r = ctx->request;
    log = ngx_http_esi_daemon.log;

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice) != 0
        || esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list)
           != 0)
    {
        ngx_log_error(NGX_LOG_ERR, log, 0, "esi: malformed splice from esid");
        return NGX_ERROR;
    }

    value = esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET);

    if (value < (uint64_t) ctx->rx_released || value > (uint64_t) ctx->sent) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid released %uL of stream %uD, "
                      "outside [%O, %O]",
                      value, (uint32_t) ctx->node.key, ctx->rx_released,
                      ctx->sent);
        return NGX_ERROR;
    }

    released = (off_t) value;

    if (ctx->plan_wait) {

        /* no plan for this object yet: the body goes to esid after all */

        ctx->plan_wait = 0;

        if (!ctx->tx_queued) {
            ngx_queue_insert_tail(&ngx_http_esi_daemon.tx_wait,
                                  &ctx->tx_link);
            ctx->tx_queued = 1;
        }
    }

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT) && !ctx->end_sent) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid ended stream %uD before its body",
                      (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    head = NULL;
    last = &head;
    verbatim_end = ctx->rx_verbatim_end;

    for (i = 0; i < list.count; i++) {

        esi_wire_list_at(&list, i, &in);
        which = esi_wire_u16(&in, ESI_WIRE_INSTRUCTION_WHICH_OFFSET);

        insn = ngx_http_esi_insn(ctx);
        if (insn == NULL) {
            goto local_failure;
        }

        switch (which) {

        case ESI_WIRE_INSTRUCTION_VERBATIM_WHICH:
            value = esi_wire_u64(&in,
                                 ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
            length = esi_wire_u32(&in,
                                  ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET);

            if (value < (uint64_t) ctx->rx_released
                || value < (uint64_t) verbatim_end
                || value > (uint64_t) ctx->sent
                || length > (uint64_t) ctx->sent - value)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: verbatim %uL+%uD of stream %uD is "
                              "outside [%O, %O) or before %O",
                              value, length, (uint32_t) ctx->node.key,
                              ctx->rx_released, ctx->sent, verbatim_end);
                return NGX_ERROR;
            }

            offset = (off_t) value;
            end = offset + length;
            verbatim_end = end;

            insn->type = NGX_HTTP_ESI_VERBATIM;
            insn->offset = offset;
            insn->length = length;
            break;

        case ESI_WIRE_INSTRUCTION_INCLUDE_WHICH:
            if (esi_wire_get_struct(&in, ESI_WIRE_INSTRUCTION_INCLUDE_PTR,
                                    &inc)
                != 0)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed include from esid");
                return NGX_ERROR;
            }

            rc = ngx_http_esi_include_insn(r, &inc, insn);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed include path from esid");
                return NGX_ERROR;
            }

            break;

        case ESI_WIRE_INSTRUCTION_LITERAL_WHICH:
            if (esi_wire_get_data(&in, ESI_WIRE_INSTRUCTION_LITERAL_PTR,
                                  &bytes, &n)
                != 0)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed literal from esid");
                return NGX_ERROR;
            }

            /* the ring's bytes are reused once this splice is read */

            insn->type = NGX_HTTP_ESI_LITERAL;
            insn->text.len = n;

            if (n) {
                insn->text.data = ngx_pnalloc(r->pool, n);
                if (insn->text.data == NULL) {
                    goto local_failure;
                }

                ngx_memcpy(insn->text.data, bytes, n);
            }

            break;

        case ESI_WIRE_INSTRUCTION_TRY_START_WHICH:
        case ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH:
        case ESI_WIRE_INSTRUCTION_TRY_END_WHICH:
            insn->type = NGX_HTTP_ESI_TRY_START
                         + (which - ESI_WIRE_INSTRUCTION_TRY_START_WHICH);

            if (ngx_http_esi_try_insn(ctx, insn->type) != NGX_OK) {
                return NGX_ERROR;
            }

            break;

        default:
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "esi: unknown instruction %ud from esid", which);
            return NGX_ERROR;
        }

        *last = insn;
        last = &insn->next;
    }

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT) && ctx->rx_tries) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid ended stream %uD inside a try",
                      (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    insn = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_insn_t));
    if (insn == NULL) {
        goto local_failure;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = released;
    insn->last = esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT);

    *last = insn;

    *ctx->last_insn = head;
    ctx->last_insn = &insn->next;

    ctx->rx_released = released;
    ctx->rx_verbatim_end = verbatim_end;

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_ANSWERED_BIT)
        && ctx->awaiting)
    {
        ctx->awaiting--;
    }

    if (insn->last) {
        ngx_http_esi_unlink(ctx);
    }

    ngx_http_esi_timer(ctx, 1);
    ngx_http_esi_schedule(ctx);

    return NGX_OK;

local_failure:

    ngx_http_esi_fail(ctx);
    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_wire_str(ngx_http_request_t *r, esi_wire_struct_t *s,
    unsigned ptr, ngx_str_t *str, ngx_uint_t is_path)
{
    size_t       len;
    const char  *p;

    if (esi_wire_get_text(s, ptr, &p, &len) != 0) {
        return NGX_DECLINED;
    }

    if (is_path && len && p[0] != '/') {
        return NGX_DECLINED;
    }

    str->len = len;

    if (len == 0) {
        return NGX_OK;
    }

    str->data = ngx_pnalloc(r->pool, len);
    if (str->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(str->data, p, len);

    return NGX_OK;
}


/* an include instruction from esid; NGX_DECLINED: malformed */

static ngx_int_t
ngx_http_esi_include_insn(ngx_http_request_t *r, esi_wire_struct_t *inc,
    ngx_http_esi_insn_t *insn)
{
    ngx_int_t  rc;

    insn->type = NGX_HTTP_ESI_INCLUDE;
    insn->continue_on_error =
        esi_wire_bool(inc, ESI_WIRE_INCLUDE_CONTINUE_ON_ERROR_BIT);

    rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_PATH_PTR,
                               &insn->path, 1);
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ARGS_PTR,
                                   &insn->args, 0);
    }
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ALT_PATH_PTR,
                                   &insn->alt_path, 1);
    }
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ALT_ARGS_PTR,
                                   &insn->alt_args, 0);
    }

    if (rc == NGX_OK
        && (ngx_http_esi_splits_line(&insn->path, 0)
            || ngx_http_esi_splits_line(&insn->args, 1)
            || ngx_http_esi_splits_line(&insn->alt_path, 0)
            || ngx_http_esi_splits_line(&insn->alt_args, 1)))
    {
        rc = NGX_DECLINED;
    }

    return rc;
}


/*
 * The proxy module escapes a subrequest's path but copies its args as they
 * are into the request line upstream: a byte that ends the line there
 * could add a header.  esid refuses such a src; a worker checks anyway.
 */

static ngx_uint_t
ngx_http_esi_splits_line(ngx_str_t *s, ngx_uint_t args)
{
    u_char  c;
    size_t  i;

    for (i = 0; i < s->len; i++) {
        c = s->data[i];

        if (c < 0x20 || c == 0x7f || (args && c == ' ')) {
            return 1;
        }
    }

    return 0;
}


/*
 * Keeps esid's try markers balanced as they arrive, so that execution never
 * meets a tryExcept or tryEnd without its tryStart.  NGX_ERROR: a violation.
 */

static ngx_int_t
ngx_http_esi_try_insn(ngx_http_esi_ctx_t *ctx, ngx_uint_t type)
{
    uint64_t     bit;
    const char  *error;

    bit = ctx->rx_tries ? (uint64_t) 1 << (ctx->rx_tries - 1) : 0;

    switch (type) {

    case NGX_HTTP_ESI_TRY_START:
        if (ctx->rx_tries == NGX_HTTP_ESI_TRY_MAX) {
            error = "tries nested too deep";
            goto violation;
        }

        ctx->rx_tries++;
        ctx->rx_excepts &= ~((uint64_t) 1 << (ctx->rx_tries - 1));
        return NGX_OK;

    case NGX_HTTP_ESI_TRY_EXCEPT:
        if (ctx->rx_tries == 0 || (ctx->rx_excepts & bit)) {
            error = "tryExcept outside an attempt";
            goto violation;
        }

        ctx->rx_excepts |= bit;
        return NGX_OK;

    default: /* NGX_HTTP_ESI_TRY_END */
        if (ctx->rx_tries == 0 || !(ctx->rx_excepts & bit)) {
            error = "tryEnd without its tryExcept";
            goto violation;
        }

        ctx->rx_tries--;
        return NGX_OK;
    }

violation:

    ngx_log_error(NGX_LOG_ERR, ngx_http_esi_daemon.log, 0,
                  "esi: %s in stream %uD from esid", error,
                  (uint32_t) ctx->node.key);

    return NGX_ERROR;
}


static ngx_http_esi_insn_t *
ngx_http_esi_insn(ngx_http_esi_ctx_t *ctx)
{
    ngx_uint_t            i;
    ngx_http_esi_insn_t  *insn, *batch;

    if (ctx->free_insns == NULL) {
        batch = ngx_palloc(ctx->request->pool,
                           NGX_HTTP_ESI_BATCH * sizeof(ngx_http_esi_insn_t));
        if (batch == NULL) {
            return NULL;
        }

        for (i = 0; i < NGX_HTTP_ESI_BATCH; i++) {
            batch[i].next = ctx->free_insns;
            ctx->free_insns = &batch[i];
        }
    }

    insn = ctx->free_insns;
    ctx->free_insns = insn->next;
    ngx_memzero(insn, sizeof(ngx_http_esi_insn_t));

    return insn;
}


/*
 * esid's plan for a cached object whose body it has not seen: validated
 * whole before anything runs (a lying esid could otherwise make us skip
 * bytes nobody checked), then replayed here as the body arrives.
 */

/*
 * A plan for a stream: message is esid's (kept for later hits when it is
 * reusable), NULL when the worker replays its own copy of one.
 */

static ngx_int_t
ngx_http_esi_plan(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *root,
    const uint8_t *message, size_t message_len)
{
    off_t                   pos, checked;
    size_t                  len;
    uint16_t                which;
    uint32_t                i, pin;
    uint64_t                offset, length, plan_length;
    ngx_int_t               rc;
    ngx_log_t              *log;
    ngx_str_t               room;
    const uint8_t          *bytes;
    ngx_http_request_t     *r;
    ngx_http_esi_step_t    *step;
    ngx_http_esi_insn_t    *insn;
    ngx_http_esi_daemon_t  *d;
    esi_wire_list_t         list;
    esi_wire_struct_t       plan, in, inc;

    r = ctx->request;
    d = &ngx_http_esi_daemon;
    log = d->log;
    ngx_str_null(&room);

    if (!ctx->plan_wait) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid sent a plan for stream %uD, which asked "
                      "for none", (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan) != 0
        || esi_wire_get_list(&plan, ESI_WIRE_PLAN_STEPS_PTR, &list) != 0)
    {
        goto malformed;
    }

    plan_length = esi_wire_u64(&plan, ESI_WIRE_PLAN_LENGTH_OFFSET);

    if (plan_length > (uint64_t) NGX_MAX_OFF_T_VALUE) {
        goto malformed;
    }

    pin = esi_wire_u32(&plan, ESI_WIRE_PLAN_PIN_OFFSET);

    if (pin) {

        /* held from here on, whatever becomes of the plan */

        if (!ctx->segments || pin > ESI_PIN_SLOTS || d->arena == NULL) {
            goto malformed;
        }

        if (message == NULL) {

            /* the copy's own count keeps the slot esid's until this one */

            (void) __atomic_fetch_add(&((uint32_t *) d->pins->start)[pin - 1],
                                      1, __ATOMIC_ACQUIRE);
        }

        ctx->pin = pin;
        ctx->pins = d->pins;
        ctx->pins->refs++;
        ctx->arena = d->arena;
        ctx->arena->refs++;
    }

    ctx->steps = ngx_palloc(r->pool, list.count * sizeof(ngx_http_esi_step_t));
    if (ctx->steps == NULL && list.count) {
        goto local_failure;
    }

    /* every byte the plan skips must follow a check at its start */

    pos = 0;
    checked = -1;

    for (i = 0; i < list.count; i++) {

        esi_wire_list_at(&list, i, &in);
        which = esi_wire_u16(&in, ESI_WIRE_PLAN_STEP_WHICH_OFFSET);
        step = &ctx->steps[i];
        ngx_memzero(step, sizeof(ngx_http_esi_step_t));

        switch (which) {

        case ESI_WIRE_PLAN_STEP_VERBATIM_WHICH:
            offset = esi_wire_u64(&in,
                                  ESI_WIRE_PLAN_STEP_VERBATIM_OFFSET_OFFSET);
            length = esi_wire_u64(&in,
                                  ESI_WIRE_PLAN_STEP_VERBATIM_LENGTH_OFFSET);

            if (offset < (uint64_t) pos
                || (offset > (uint64_t) pos && checked != pos)
                || offset > plan_length
                || length > plan_length - offset)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_VERBATIM;
            step->offset = (off_t) offset;
            step->length = (off_t) length;
            pos = step->offset + step->length;

            rc = ngx_http_esi_plan_segment(ctx, &in, &room, step);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                goto malformed;
            }

            break;

        case ESI_WIRE_PLAN_STEP_CHECK_WHICH:
            offset = esi_wire_u64(&in, ESI_WIRE_PLAN_STEP_CHECK_OFFSET_OFFSET);

            if (offset != (uint64_t) pos
                || esi_wire_get_data(&in, ESI_WIRE_PLAN_STEP_CHECK_BYTES_PTR,
                                     &bytes, &len)
                   != 0
                || len == 0
                || len > NGX_HTTP_ESI_CHECK_MAX
                || len > plan_length - offset)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_CHECK;
            step->offset = pos;
            step->length = len;

            step->bytes = ngx_http_esi_plan_copy(r, &room, bytes, len);
            if (step->bytes == NULL) {
                goto local_failure;
            }

            checked = pos;
            break;

        case ESI_WIRE_PLAN_STEP_INCLUDE_WHICH:
            if (checked != pos
                || esi_wire_get_struct(&in, ESI_WIRE_PLAN_STEP_INCLUDE_PTR,
                                       &inc)
                   != 0)
            {
                goto malformed;
            }

            insn = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_insn_t));
            if (insn == NULL) {
                goto local_failure;
            }

            rc = ngx_http_esi_include_insn(r, &inc, insn);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_INCLUDE;
            step->offset = pos;
            step->include = insn;
            break;

        case ESI_WIRE_PLAN_STEP_LITERAL_WHICH:
            if (esi_wire_get_data(&in, ESI_WIRE_PLAN_STEP_LITERAL_PTR,
                                  &bytes, &len)
                != 0)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_LITERAL;
            step->offset = pos;
            step->length = len;

            if (len) {
                step->bytes = ngx_http_esi_plan_copy(r, &room, bytes, len);
                if (step->bytes == NULL) {
                    goto local_failure;
                }
            }

            break;

        case ESI_WIRE_PLAN_STEP_TRY_START_WHICH:
        case ESI_WIRE_PLAN_STEP_TRY_EXCEPT_WHICH:
        case ESI_WIRE_PLAN_STEP_TRY_END_WHICH:
            step->type = NGX_HTTP_ESI_TRY_START
                         + (which - ESI_WIRE_PLAN_STEP_TRY_START_WHICH);
            step->offset = pos;

            /* an outermost try is checked ahead from the check before it */

            if ((step->type == NGX_HTTP_ESI_TRY_START && ctx->rx_tries == 0
                 && checked != pos)
                || ngx_http_esi_try_insn(ctx, step->type) != NGX_OK)
            {
                goto malformed;
            }

            break;

        default:
            goto malformed;
        }
    }

    if (((off_t) plan_length > pos && checked != pos) || ctx->rx_tries) {
        goto malformed;
    }

    if (message && esi_wire_bool(&plan, ESI_WIRE_PLAN_REUSABLE_BIT)) {
        ngx_http_esi_replay_keep(ctx, message, message_len, pin);
    }

    ctx->nsteps = list.count;
    ctx->step = 0;
    ctx->plan_ahead = 0;
    ctx->plan_pos = 0;
    ctx->plan_length = (off_t) plan_length;
    ctx->plan_wait = 0;
    ctx->planned = 1;

    if (ctx->awaiting) {
        ctx->awaiting--;
    }

    /* esid is done with this stream: it never saw the body, nor will */

    ngx_http_esi_unlink(ctx);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi plan of %ui steps over %O bytes",
                   ctx->nsteps, ctx->plan_length);

    if (ngx_http_esi_plan_run(ctx) != NGX_OK) {
        ngx_http_esi_fail(ctx);
        return NGX_OK;
    }

    ngx_http_esi_schedule(ctx);

    return NGX_OK;

malformed:

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "esi: malformed plan from esid for stream %uD",
                  (uint32_t) ctx->node.key);
    return NGX_ERROR;

local_failure:

    ngx_http_esi_fail(ctx);
    return NGX_OK;
}


/*
 * A verbatim step's segment, if esid named one: inside the arena, pinned,
 * with a head no longer than its run.  NGX_DECLINED: malformed.
 */

static ngx_int_t
ngx_http_esi_plan_segment(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *step,
    ngx_str_t *room, ngx_http_esi_step_t *out)
{
    size_t                   len;
    uint32_t                 zlen;
    uint64_t                 zoff;
    const uint8_t           *head;
    esi_wire_struct_t        seg;
    ngx_http_esi_mapping_t  *arena;

    if (esi_wire_get_struct(step, ESI_WIRE_PLAN_STEP_VERBATIM_SEGMENT_PTR,
                            &seg)
        != 0)
    {
        return NGX_DECLINED;
    }

    zoff = esi_wire_u64(&seg, ESI_WIRE_SEGMENT_OFFSET_OFFSET);
    zlen = esi_wire_u32(&seg, ESI_WIRE_SEGMENT_LENGTH_OFFSET);

    if (zlen == 0) {
        return NGX_OK;
    }

    arena = ctx->arena;

    if (ctx->pin == 0
        || zoff > arena->size
        || zlen > arena->size - zoff
        || esi_wire_get_data(&seg, ESI_WIRE_SEGMENT_HEAD_PTR, &head, &len)
           != 0
        || len == 0
        || len > NGX_HTTP_ESI_CHECK_MAX
        || (off_t) len > out->length)
    {
        return NGX_DECLINED;
    }

    out->segment.data = arena->start + zoff;
    out->segment.len = zlen;
    out->crc = esi_wire_u32(&seg, ESI_WIRE_SEGMENT_CRC_OFFSET);
    out->head_len = len;

    out->head = ngx_http_esi_plan_copy(ctx->request, room, head, len);
    if (out->head == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* a plan for a stream that is gone: its pin goes at once */

static ngx_int_t
ngx_http_esi_plan_unused(ngx_http_esi_daemon_t *d, esi_wire_struct_t *root)
{
    uint32_t           pin;
    esi_wire_struct_t  plan;

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed plan from esid");
        return NGX_ERROR;
    }

    pin = esi_wire_u32(&plan, ESI_WIRE_PLAN_PIN_OFFSET);

    if (pin > ESI_PIN_SLOTS || (pin && d->arena == NULL)) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: plan from esid with pin %uD", pin);
        return NGX_ERROR;
    }

    if (pin) {
        ngx_http_esi_unpin(d->pins, pin);
    }

    return NGX_OK;
}


/*
 * The bytes of a plan's checks and literals, copied out of the ring into
 * a few blocks of the request's pool rather than one allocation each.
 */

static u_char *
ngx_http_esi_plan_copy(ngx_http_request_t *r, ngx_str_t *room,
    const uint8_t *bytes, size_t len)
{
    u_char  *p;

    if (room->len < len) {
        room->len = ngx_max(len, NGX_HTTP_ESI_PLAN_BYTES);

        room->data = ngx_pnalloc(r->pool, room->len);
        if (room->data == NULL) {
            return NULL;
        }
    }

    p = room->data;
    ngx_memcpy(p, bytes, len);

    room->data += len;
    room->len -= len;

    return p;
}


/*
 * Runs the plan's steps as far as the bytes that arrived allow: verbatim
 * runs as they come, a construct only after its recorded first bytes are
 * found where they should be, the includes it holds; then tells execute()
 * what may be released, and whether the page is complete.  At most a
 * batch of steps at a time: execute() asks for the next (plan_more).
 */

static ngx_int_t
ngx_http_esi_plan_run(ngx_http_esi_ctx_t *ctx)
{
    off_t                  end, to;
    ngx_int_t              rc;
    ngx_uint_t             n;
    const char            *why;
    ngx_http_esi_step_t   *step;
    ngx_http_esi_insn_t   *insn;
    ngx_http_esi_plain_t  *plain;

    ctx->plan_more = 0;
    ctx->plan_starved = 0;

    for (n = 0; ctx->step < ctx->nsteps; n++) {

        if (n == NGX_HTTP_ESI_BATCH) {

            /*
             * the rest once execute() ran these, so that their insns and
             * those of the batches after are the same few
             */

            ctx->plan_more = 1;
            return NGX_OK;
        }

        step = &ctx->steps[ctx->step];

        switch (step->type) {

        case NGX_HTTP_ESI_VERBATIM:

            /* the construct before it was checked: skip it */

            if (ctx->plan_pos < step->offset) {
                ctx->plan_pos = step->offset;
            }

            end = step->offset + step->length;

            if (step->segment.len && ctx->plan_pos == step->offset) {

                /* its gzip instead, once its first bytes are the run's */

                if (ctx->received < step->offset + (off_t) step->head_len) {
                    if (ctx->input_done) {
                        return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                            "the body is shorter than planned");
                    }

                    goto released;
                }

                if (!ngx_http_esi_held_equal(ctx, step->offset, step->head,
                                             step->head_len))
                {
                    return ngx_http_esi_plan_drop(ctx, step->offset,
                                                "a run differs from the plan");
                }

                insn = ngx_http_esi_insn(ctx);
                if (insn == NULL) {
                    return NGX_ERROR;
                }

                insn->type = NGX_HTTP_ESI_SEGMENT;
                insn->offset = step->offset;
                insn->length = (size_t) step->length;
                insn->text = step->segment;
                insn->crc = step->crc;

                *ctx->last_insn = insn;
                ctx->last_insn = &insn->next;

                ctx->plan_pos = end;
                break;
            }

            to = ngx_min(end, ctx->received);

            if (to > ctx->plan_pos) {
                insn = ngx_http_esi_insn(ctx);
                if (insn == NULL) {
                    return NGX_ERROR;
                }

                insn->type = NGX_HTTP_ESI_VERBATIM;
                insn->offset = ctx->plan_pos;
                insn->length = (size_t) (to - ctx->plan_pos);

                *ctx->last_insn = insn;
                ctx->last_insn = &insn->next;

                ctx->plan_pos = to;
            }

            if (ctx->plan_pos < end) {
                if (ctx->input_done) {
                    return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                            "the body is shorter than planned");
                }

                goto released;
            }

            break;

        case NGX_HTTP_ESI_CHECK:
            if (ctx->step < ctx->plan_ahead) {
                break;
            }

            rc = ngx_http_esi_plan_ahead(ctx, &why);

            if (rc == NGX_AGAIN) {
                goto released;
            }

            if (rc != NGX_OK) {
                return ngx_http_esi_plan_drop(ctx, step->offset, why);
            }

            break;

        case NGX_HTTP_ESI_INCLUDE:
            insn = ngx_palloc(ctx->request->pool,
                              sizeof(ngx_http_esi_insn_t));
            if (insn == NULL) {
                return NGX_ERROR;
            }

            *insn = *step->include;
            insn->next = NULL;

            *ctx->last_insn = insn;
            ctx->last_insn = &insn->next;
            break;

        default: /* LITERAL, TRY_START, TRY_EXCEPT, TRY_END */
            insn = ngx_http_esi_insn(ctx);
            if (insn == NULL) {
                return NGX_ERROR;
            }

            insn->type = step->type;
            insn->text.len = (size_t) step->length;
            insn->text.data = step->bytes;

            if (step->type == NGX_HTTP_ESI_TRY_START) {
                ctx->rx_tries++;

            } else if (step->type == NGX_HTTP_ESI_TRY_END) {
                ctx->rx_tries--;
            }

            *ctx->last_insn = insn;
            ctx->last_insn = &insn->next;
            break;
        }

        ctx->step++;
    }

    if (ctx->received > ctx->plan_length) {
        return ngx_http_esi_plan_drop(ctx, ctx->plan_length,
                                      "the body is longer than planned");
    }

    if (!ctx->input_done) {
        goto released;
    }

    if (ctx->received < ctx->plan_length) {
        return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                      "the body is shorter than planned");
    }

    /* the whole body, as planned */

    if (ctx->nsteps == 1
        && ctx->steps[0].type == NGX_HTTP_ESI_VERBATIM
        && ctx->steps[0].length == ctx->plan_length
        && ctx->steps[0].segment.len == 0)
    {
        plain = ngx_http_esi_plain(ctx);
        plain->zone = ctx->plan_zone;
        ngx_memcpy(plain->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    }

    insn = ngx_http_esi_insn(ctx);
    if (insn == NULL) {
        return NGX_ERROR;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = ctx->plan_length;
    insn->last = 1;

    *ctx->last_insn = insn;
    ctx->last_insn = &insn->next;

    ctx->planned = 0;

    return NGX_OK;

released:

    ctx->plan_starved = 1;

    insn = ngx_http_esi_insn(ctx);
    if (insn == NULL) {
        return NGX_ERROR;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = ctx->plan_pos;

    *ctx->last_insn = insn;
    ctx->last_insn = &insn->next;

    return NGX_OK;
}


/*
 * A construct's check, and, when tries follow it before the next run, the
 * checks, runs and segment heads up to their end: all of them before any
 * of it runs, so that the plan never stops matching inside a try (its
 * attempt held here, it could not be handed to esid).  NGX_AGAIN: those
 * bytes have not all arrived (held meanwhile, as copies once the stream
 * starves: see own_held); NGX_DECLINED: the plan is dropped at the check,
 * for "why".
 */

static ngx_int_t
ngx_http_esi_plan_ahead(ngx_http_esi_ctx_t *ctx, const char **why)
{
    off_t                 need;
    ngx_uint_t            i, end, depth;
    ngx_http_esi_step_t  *check, *step;

    check = &ctx->steps[ctx->step];
    need = check->offset + check->length;
    depth = 0;

    for (end = ctx->step + 1; end < ctx->nsteps; end++) {
        step = &ctx->steps[end];

        if (step->type == NGX_HTTP_ESI_TRY_START) {
            depth++;

        } else if (step->type == NGX_HTTP_ESI_TRY_END) {
            depth--;

        } else if (step->type == NGX_HTTP_ESI_CHECK
                   || step->type == NGX_HTTP_ESI_VERBATIM)
        {
            if (depth == 0) {
                break;
            }

            need = ngx_max(need, step->offset + step->length);
        }
    }

    if (ctx->received < need) {
        if (ctx->input_done) {
            *why = "the body is shorter than planned";
            return NGX_DECLINED;
        }

        return NGX_AGAIN;
    }

    for (i = ctx->step; i < end; i++) {
        step = &ctx->steps[i];

        if (step->type == NGX_HTTP_ESI_CHECK
            && !ngx_http_esi_held_equal(ctx, step->offset, step->bytes,
                                        (size_t) step->length))
        {
            *why = "a construct differs from the plan";
            return NGX_DECLINED;
        }

        if (step->type == NGX_HTTP_ESI_VERBATIM && step->segment.len
            && !ngx_http_esi_held_equal(ctx, step->offset, step->head,
                                        step->head_len))
        {
            *why = "a run differs from the plan";
            return NGX_DECLINED;
        }
    }

    ctx->plan_ahead = end;

    return NGX_OK;
}


/*
 * The plan does not fit the body from "at" on: everything before went out
 * as planned, the rest goes to esid as a new stream that starts there (a
 * construct's start or the end of a run: outside any markup, and never
 * inside a try, see plan_ahead), telling esid to forget the plan.
 */

static ngx_int_t
ngx_http_esi_plan_drop(ngx_http_esi_ctx_t *ctx, off_t at, const char *why)
{
    ngx_http_esi_held_t    *h;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                  "esi: plan dropped at byte %O: %s, the rest is parsed",
                  at, why);

    ngx_http_esi_replay_forget(ctx);

    ctx->planned = 0;
    ctx->plan_failed = 1;
    ctx->base = at;
    ctx->sent = at;
    ctx->rx_released = at;
    ctx->rx_verbatim_end = at;
    ctx->open_sent = 0;
    ctx->end_sent = 0;

    ctx->send_held = NULL;

    for (h = ctx->held; h; h = h->next) {
        if (h->end > at) {
            ctx->send_held = h;
            break;
        }
    }

    if (d->state == NGX_HTTP_ESI_IDLE) {
        ngx_http_esi_fail(ctx);
        return NGX_OK;
    }

    ctx->node.key = d->next_id++;
    ngx_rbtree_insert(&d->streams, &ctx->node);
    ctx->in_table = 1;

    ngx_queue_insert_tail(&d->tx_wait, &ctx->tx_link);
    ctx->tx_queued = 1;

    ngx_http_esi_flush(d);
    ngx_http_esi_timer(ctx, 0);

    return NGX_OK;
}


/* whether the held bytes at offset are these */

static ngx_uint_t
ngx_http_esi_held_equal(ngx_http_esi_ctx_t *ctx, off_t offset, u_char *bytes,
    size_t len)
{
    size_t                n;
    ngx_http_esi_held_t  *h;

    for (h = ctx->held; h && len; h = h->next) {

        if (h->end <= offset) {
            continue;
        }

        if (h->offset > offset) {
            return 0;
        }

        n = ngx_min(len, (size_t) (h->end - offset));

        if (ngx_memcmp(h->start + (offset - h->offset), bytes, n) != 0) {
            return 0;
        }

        bytes += n;
        offset += n;
        len -= n;
    }

    return len == 0;
}


/* an answer to a purge: mark and unlink the files it names */

static ngx_int_t
ngx_http_esi_purged(ngx_http_esi_purge_t *p, esi_wire_struct_t *root)
{
    size_t                  n, len;
    const char             *error;
    const uint8_t          *files;
    esi_wire_struct_t       purged;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PURGED_PTR, &purged) != 0
        || esi_wire_get_data(&purged, ESI_WIRE_PURGED_FILES_PTR, &files, &len)
           != 0
        || len % NGX_HTTP_CACHE_KEY_LEN != 0
        || esi_wire_get_text(&purged, ESI_WIRE_PURGED_ERROR_PTR, &error, &n)
           != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge answer from esid");
        return NGX_ERROR;
    }

    if (esi_wire_bool(&purged, ESI_WIRE_PURGED_SCANNED_BIT)) {
        p->scanned = 1;
    }

    for (/* void */; len; len -= NGX_HTTP_CACHE_KEY_LEN) {
        p->count += ngx_http_esi_purge_file(p, files);
        files += NGX_HTTP_CACHE_KEY_LEN;
    }

    if (n) {
        p->error.len = ngx_min(n, 256);
        p->error.data = ngx_pnalloc(p->pool, p->error.len);

        if (p->error.data) {
            ngx_memcpy(p->error.data, error, p->error.len);

        } else {
            p->error.len = 0;
        }

        ngx_http_esi_purge_done(p, NGX_HTTP_SERVICE_UNAVAILABLE, NULL);
        return NGX_OK;
    }

    if (esi_wire_bool(&purged, ESI_WIRE_PURGED_MORE_BIT)) {
        ngx_add_timer(&p->timer, d->conf->purge_timeout);
        return NGX_OK;
    }

    if (p->tags && p->next_tag < p->tags->nelts) {
        ngx_rbtree_delete(&d->purges, &p->node);
        p->in_table = 0;

        if (ngx_http_esi_purge_send(p) != NGX_OK) {
            ngx_http_esi_purge_done(p, NGX_HTTP_SERVICE_UNAVAILABLE,
                                    "cannot ask esid");
        }

        return NGX_OK;
    }

    ngx_http_esi_purge_done(p, p->count ? NGX_HTTP_OK : NGX_HTTP_NOT_FOUND,
                            NULL);

    return NGX_OK;
}


static void
ngx_http_esi_flush(ngx_http_esi_daemon_t *d)
{
    uint64_t             one;
    uint32_t            *id;
    ngx_int_t            rc;
    ngx_uint_t           i;
    ngx_queue_t         *q;
    ngx_http_esi_ctx_t  *ctx;

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    for ( ;; ) {

        rc = ngx_http_esi_flush_posted(d);

        if (rc == NGX_AGAIN) {
            goto wait;
        }

        id = d->cancels->elts;

        for (i = 0; i < d->cancels->nelts; i++) {
            if (ngx_http_esi_send_short(d, id[i], ESI_WIRE_REQUEST_CANCEL_WHICH)
                != NGX_OK)
            {
                break;
            }
        }

        if (i < d->cancels->nelts) {
            ngx_memmove(id, &id[i], (d->cancels->nelts - i) * sizeof(uint32_t));
            d->cancels->nelts -= i;
            rc = NGX_AGAIN;
            goto wait;
        }

        d->cancels->nelts = 0;
        rc = NGX_OK;

        while (!ngx_queue_empty(&d->tx_wait)) {
            q = ngx_queue_head(&d->tx_wait);
            ctx = ngx_queue_data(q, ngx_http_esi_ctx_t, tx_link);

            rc = ngx_http_esi_send(d, ctx);

            if (rc == NGX_AGAIN) {
                break;
            }

            ngx_queue_remove(q);
            ctx->tx_queued = 0;

            if (rc == NGX_OK) {
                ngx_http_esi_timer(ctx, 1);

            } else {
                ngx_http_esi_fail(ctx);
            }
        }

    wait:

        if (rc != NGX_AGAIN || esi_ring_wait_space(&d->tx, d->need)) {
            break;
        }
    }

    if (d->kick) {
        d->kick = 0;
        one = 1;

        if (write(d->daemon_fd, &one, sizeof(uint64_t)) == -1
            && ngx_errno != NGX_EAGAIN)
        {
            ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                          "esi: write() to esid's eventfd failed");
        }
    }
}


/*
 * Tells esid which proxy_cache zones this worker serves, first thing on a
 * new connection: the announcements go ahead of anything queued while
 * connecting.
 */

static ngx_int_t
ngx_http_esi_announce(ngx_http_esi_daemon_t *d)
{
    size_t                   need;
    u_char                  *buf;
    ngx_str_t               *name, *path;
    ngx_uint_t               i;
    ngx_queue_t             *first;
    ngx_shm_zone_t         **zone;
    esi_wire_out_t           req, z;
    esi_wire_builder_t       b;
    ngx_http_file_cache_t   *cache;

    zone = d->conf->purge_zones.elts;
    first = ngx_queue_head(&d->posted);   /* the sentinel when empty */

    for (i = 0; i < d->conf->purge_zones.nelts; i++) {
        cache = zone[i]->data;
        name = &zone[i]->shm.name;
        path = &cache->path->name;

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS
                             + ESI_WIRE_ZONE_DATA_WORDS
                             + ESI_WIRE_ZONE_POINTERS,
                             esi_wire_blob(name->len + 1)
                             + esi_wire_blob(path->len + 1));

        buf = ngx_palloc(d->pool, need);
        if (buf == NULL) {
            return NGX_ERROR;
        }

        esi_wire_builder_init(&b, buf, need);

        (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                             ESI_WIRE_REQUEST_POINTERS, &req);
        esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                         ESI_WIRE_REQUEST_ZONE_WHICH);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_ZONE_PTR,
                                   ESI_WIRE_ZONE_DATA_WORDS,
                                   ESI_WIRE_ZONE_POINTERS, &z);
        (void) esi_wire_set_text(&z, ESI_WIRE_ZONE_NAME_PTR,
                                 (const char *) name->data, name->len);
        (void) esi_wire_set_text(&z, ESI_WIRE_ZONE_PATH_PTR,
                                 (const char *) path->data, path->len);
        esi_wire_set_u64(&z, ESI_WIRE_ZONE_INDEX_BYTES_OFFSET,
                         (uint64_t) d->conf->purge_index);
        esi_wire_set_bool(&z, ESI_WIRE_ZONE_LOST_REPORTS_BIT,
                          d->lost_reports);

        if (esi_wire_finish(&b) != need) {
            return NGX_ERROR;
        }

        /*
         * ahead of what was queued while connecting (reports, purges):
         * attach() flushes the queue next
         */

        if (ngx_http_esi_enqueue(d, buf, need, first) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* should the announcement itself be lost, free_posted() says so again */

    d->lost_reports = 0;

    return NGX_OK;
}


/*
 * Writes a message that waits for no answer (zone, stored) or whose answer
 * finds its purge by id: into the ring when nothing waits before it, into
 * the queue otherwise, in order.  NGX_DECLINED: esid is not connected, or
 * the message cannot be queued (the connection is then dropped).
 */

static ngx_int_t
ngx_http_esi_post(ngx_http_esi_daemon_t *d, void *buf, size_t len)
{
    void  *p;

    if (d->state == NGX_HTTP_ESI_IDLE) {
        return NGX_DECLINED;
    }

    if (d->state == NGX_HTTP_ESI_READY && ngx_queue_empty(&d->posted)) {

        if (len > esi_ring_max_payload(&d->tx)) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: a %uz byte message does not fit the ring",
                          len);
            return NGX_DECLINED;
        }

        p = ngx_http_esi_reserve(d, len);

        if (p) {
            ngx_memcpy(p, buf, len);
            ngx_http_esi_commit(d, len);
            ngx_http_esi_flush(d);
            return NGX_OK;
        }
    }

    if (d->posted_size + len > NGX_HTTP_ESI_POSTED_MAX) {
        ngx_http_esi_drop(d, NGX_LOG_ERR,
                          "esi: too many messages wait for room in the ring");
        return NGX_DECLINED;
    }

    if (ngx_http_esi_enqueue(d, buf, len, ngx_queue_sentinel(&d->posted))
        != NGX_OK)
    {
        ngx_http_esi_drop(d, NGX_LOG_ERR, "esi: out of memory");
        return NGX_DECLINED;
    }

    /* asks esid to wake us when it frees room */
    ngx_http_esi_flush(d);

    return NGX_OK;
}


/* queues a copy of the message before "before" (the sentinel: at the end) */

static ngx_int_t
ngx_http_esi_enqueue(ngx_http_esi_daemon_t *d, void *buf, size_t len,
    ngx_queue_t *before)
{
    ngx_http_esi_msg_t  *m;

    /*
     * Freed one by one as the ring takes them, in any order of size, so
     * they cannot live in a pool.
     */

    m = ngx_alloc(offsetof(ngx_http_esi_msg_t, data) + len, d->log);
    if (m == NULL) {
        return NGX_ERROR;
    }

    m->len = len;
    ngx_memcpy(m->data, buf, len);

    ngx_queue_insert_tail(before, &m->link);
    d->posted_size += len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_flush_posted(ngx_http_esi_daemon_t *d)
{
    void                *p;
    ngx_queue_t         *q;
    ngx_http_esi_msg_t  *m;

    while (!ngx_queue_empty(&d->posted)) {
        q = ngx_queue_head(&d->posted);
        m = ngx_queue_data(q, ngx_http_esi_msg_t, link);

        if (m->len > esi_ring_max_payload(&d->tx)) {

            /* queued while connecting, before the ring size was known */

            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: a %uz byte message does not fit the ring, "
                          "dropped", m->len);

            d->lost_reports = 1;

        } else {
            p = ngx_http_esi_reserve(d, m->len);
            if (p == NULL) {
                return NGX_AGAIN;
            }

            ngx_memcpy(p, m->data, m->len);
            ngx_http_esi_commit(d, m->len);
        }

        ngx_queue_remove(q);
        d->posted_size -= m->len;
        ngx_free(m);
    }

    return NGX_OK;
}


static void
ngx_http_esi_free_posted(ngx_http_esi_daemon_t *d)
{
    ngx_queue_t  *q;

    /* reports may be among them */

    if (!ngx_queue_empty(&d->posted)) {
        d->lost_reports = 1;
    }

    while (!ngx_queue_empty(&d->posted)) {
        q = ngx_queue_head(&d->posted);
        ngx_queue_remove(q);
        ngx_free(ngx_queue_data(q, ngx_http_esi_msg_t, link));
    }

    d->posted_size = 0;
}


/*
 * Writes what the stream has for esid: open, body, end.  NGX_AGAIN: the
 * ring is full; NGX_DECLINED: a message can never fit.
 */

static ngx_int_t
ngx_http_esi_send(ngx_http_esi_daemon_t *d, ngx_http_esi_ctx_t *ctx)
{
    off_t                     from;
    size_t                    need, len, n, k, max, room, uri_len,
                              host_len, vars_len, cookies_len;
    u_char                   *dst, *host_data;
    void                     *p;
    ngx_str_t                *host, *zone;
    ngx_str_t                 vars[ESI_WIRE_REQUEST_VARS_POINTERS];
    ngx_uint_t                i;
    ngx_http_request_t       *r;
    ngx_http_esi_held_t      *h;
    esi_wire_out_t            req, open, rv;
    esi_wire_builder_t        b;
    ngx_http_esi_loc_conf_t  *elcf;
    ngx_http_core_srv_conf_t *cscf;

    r = ctx->request;
    max = esi_ring_max_payload(&d->tx);
    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (!ctx->open_sent) {
        if (r->headers_in.host) {
            host = &r->headers_in.host->value;

        } else {
            cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);
            host = &cscf->server_name;
        }

        uri_len = r->uri.len;
        host_len = host->len;
        host_data = host->data;
        zone = ctx->identified ? &ctx->plan_zone->name : NULL;

        ngx_http_esi_request_vars(r, vars);

        cookies_len = ngx_http_esi_cookies(r, elcf->cookies, NULL);
        if (cookies_len > NGX_HTTP_ESI_VAR_MAX) {
            cookies_len = 0;
        }

        vars_len = cookies_len ? esi_wire_blob(cookies_len + 1) : 0;

        for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
            if (vars[i].len) {
                vars_len += esi_wire_blob(vars[i].len + 1);
            }
        }

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS
                             + ESI_WIRE_OPEN_DATA_WORDS
                             + ESI_WIRE_OPEN_POINTERS
                             + ESI_WIRE_REQUEST_VARS_DATA_WORDS
                             + ESI_WIRE_REQUEST_VARS_POINTERS,
                             esi_wire_blob(uri_len + 1)
                             + esi_wire_blob(host_len + 1)
                             + vars_len
                             + (zone ? esi_wire_blob(NGX_HTTP_ESI_OBJECT_LEN)
                                       + esi_wire_blob(zone->len + 1)
                                     : 0));

        if (need > max) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: uri and host too long for the ring");
            return NGX_DECLINED;
        }

        p = ngx_http_esi_reserve(d, need);
        if (p == NULL) {
            return NGX_AGAIN;
        }

        esi_wire_builder_init(&b, p, need);

        (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                             ESI_WIRE_REQUEST_POINTERS, &req);
        esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET,
                         (uint32_t) ctx->node.key);
        esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                         ESI_WIRE_REQUEST_OPEN_WHICH);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_OPEN_PTR,
                                   ESI_WIRE_OPEN_DATA_WORDS,
                                   ESI_WIRE_OPEN_POINTERS, &open);
        (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR,
                                 (const char *) r->uri.data, uri_len);
        (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR,
                                 (const char *) host_data, host_len);
        esi_wire_set_u32(&open, ESI_WIRE_OPEN_MAX_TAG_BYTES_OFFSET,
                         (uint32_t) elcf->max_tag_size);
        (void) esi_wire_set_struct(&open, ESI_WIRE_OPEN_VARS_PTR,
                                   ESI_WIRE_REQUEST_VARS_DATA_WORDS,
                                   ESI_WIRE_REQUEST_VARS_POINTERS, &rv);

        for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
            if (vars[i].len) {
                (void) esi_wire_set_text(&rv, i, (const char *) vars[i].data,
                                         vars[i].len);
            }
        }

        if (cookies_len) {
            dst = esi_wire_alloc_data(&rv, ESI_WIRE_REQUEST_VARS_COOKIES_PTR,
                                      cookies_len + 1);
            if (dst) {
                (void) ngx_http_esi_cookies(r, elcf->cookies, dst);
                dst[cookies_len] = '\0';
            }
        }

        if (zone) {
            dst = esi_wire_alloc_data(&open, ESI_WIRE_OPEN_OBJECT_PTR,
                                      NGX_HTTP_ESI_OBJECT_LEN);
            if (dst) {
                ngx_memcpy(dst, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
            }

            (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_PLAN_ZONE_PTR,
                                     (const char *) zone->data, zone->len);
            esi_wire_set_u64(&open, ESI_WIRE_OPEN_PLAN_ZONE_BYTES_OFFSET,
                             (uint64_t) ctx->plan_zone->size);
            esi_wire_set_u64(&open, ESI_WIRE_OPEN_BASE_OFFSET,
                             (uint64_t) ctx->base);
            esi_wire_set_bool(&open, ESI_WIRE_OPEN_PLAN_FAILED_BIT,
                              ctx->plan_failed);
            esi_wire_set_u8(&open, ESI_WIRE_OPEN_STITCH_LEVEL_OFFSET,
                            (uint8_t) (ngx_http_esi_stitches(r, elcf)
                                       ? elcf->stitch_level : 0));
            esi_wire_set_bool(&open, ESI_WIRE_OPEN_SEGMENTS_BIT,
                              ctx->segments);

            if (!ctx->plan_failed) {

                /* esid answers with the plan, or says "send the body" */

                ctx->plan_wait = 1;
                ctx->awaiting++;
            }
        }

        ngx_http_esi_commit(d, esi_wire_finish(&b));
        ctx->open_sent = 1;
    }

    if (ctx->plan_wait) {
        return NGX_OK;
    }

    room = (max - esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                                + ESI_WIRE_REQUEST_POINTERS, 0))
           & ~(size_t) 7;
    room = ngx_min(room, elcf->buffer_size);

    while (ctx->sent < ctx->received) {
        len = ngx_min((size_t) (ctx->received - ctx->sent), room);

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS,
                             esi_wire_blob(len));

        p = ngx_http_esi_reserve(d, need);
        if (p == NULL) {
            return NGX_AGAIN;
        }

        esi_wire_builder_init(&b, p, need);

        (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                             ESI_WIRE_REQUEST_POINTERS, &req);
        esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET,
                         (uint32_t) ctx->node.key);
        esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                         ESI_WIRE_REQUEST_BODY_WHICH);
        dst = esi_wire_alloc_data(&req, ESI_WIRE_REQUEST_BODY_PTR, len);

        /* the one copy of the page: into the ring */

        h = ctx->send_held;

        for (n = 0; n < len; n += k) {
            from = ctx->sent + n;
            k = ngx_min(len - n, (size_t) (h->end - from));

            ngx_memcpy(dst + n, h->start + (from - h->offset), k);

            if (from + (off_t) k == h->end) {
                h = h->next;
            }
        }

        ctx->send_held = h;
        ctx->sent += len;
        ctx->awaiting++;

        ngx_http_esi_commit(d, esi_wire_finish(&b));
    }

    if (ctx->input_done && !ctx->end_sent) {
        if (ngx_http_esi_send_short(d, (uint32_t) ctx->node.key,
                                    ESI_WIRE_REQUEST_END_WHICH)
            != NGX_OK)
        {
            return NGX_AGAIN;
        }

        ctx->end_sent = 1;
        ctx->awaiting++;
    }

    return NGX_OK;
}


static void *
ngx_http_esi_reserve(ngx_http_esi_daemon_t *d, size_t need)
{
    void  *p;

    p = esi_ring_reserve(&d->tx, need);

    if (p == NULL) {
        d->need = need;
    }

    return p;
}


static void
ngx_http_esi_commit(ngx_http_esi_daemon_t *d, size_t len)
{
    if (esi_ring_commit(&d->tx, len)) {
        d->kick = 1;
    }
}


static ngx_int_t
ngx_http_esi_send_short(ngx_http_esi_daemon_t *d, uint32_t id,
    uint16_t which)
{
    size_t               need;
    void                *p;
    esi_wire_out_t       req;
    esi_wire_builder_t   b;

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS, 0);

    p = ngx_http_esi_reserve(d, need);
    if (p == NULL) {
        return NGX_AGAIN;
    }

    esi_wire_builder_init(&b, p, need);

    (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                         ESI_WIRE_REQUEST_POINTERS, &req);
    esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, id);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, which);

    ngx_http_esi_commit(d, esi_wire_finish(&b));

    return NGX_OK;
}


static void
ngx_http_esi_cancel(ngx_http_esi_daemon_t *d, uint32_t id)
{
    uint32_t  *p;

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    p = ngx_array_push(d->cancels);

    if (p == NULL) {
        ngx_http_esi_drop(d, NGX_LOG_ALERT, "esi: out of memory");
        return;
    }

    *p = id;

    ngx_http_esi_flush(d);
}


static ngx_http_esi_ctx_t *
ngx_http_esi_lookup(ngx_http_esi_daemon_t *d, uint32_t id)
{
    return (ngx_http_esi_ctx_t *) ngx_http_esi_find(&d->streams, id);
}


/* streams and purges share one id space, in two tables */

static ngx_rbtree_node_t *
ngx_http_esi_find(ngx_rbtree_t *tree, uint32_t id)
{
    ngx_rbtree_node_t  *node, *sentinel;

    node = tree->root;
    sentinel = tree->sentinel;

    while (node != sentinel) {

        if (id < node->key) {
            node = node->left;
            continue;
        }

        if (id > node->key) {
            node = node->right;
            continue;
        }

        return node;
    }

    return NULL;
}


/* the stream leaves the table: esid will say nothing more about it */

static void
ngx_http_esi_unlink(ngx_http_esi_ctx_t *ctx)
{
    if (ctx->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.streams, &ctx->node);
        ctx->in_table = 0;
    }

    if (ctx->tx_queued) {
        ngx_queue_remove(&ctx->tx_link);
        ctx->tx_queued = 0;
    }

    ngx_http_esi_timer(ctx, 0);
}


static void
ngx_http_esi_fail(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_forget(ctx);

    ctx->failed = 1;
    ctx->planned = 0;

    ngx_http_esi_schedule(ctx);
}


/* as unlink, telling esid to drop the stream when it knows about it */

static void
ngx_http_esi_forget(ngx_http_esi_ctx_t *ctx)
{
    uint32_t  id;

    id = (uint32_t) ctx->node.key;

    if (ctx->in_table && ctx->open_sent) {
        ngx_http_esi_unlink(ctx);
        ngx_http_esi_cancel(&ngx_http_esi_daemon, id);
        return;
    }

    ngx_http_esi_unlink(ctx);
}


static void
ngx_http_esi_schedule(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (!ctx->wake_queued) {
        ngx_queue_insert_tail(&d->wake, &ctx->wake_link);
        ctx->wake_queued = 1;
    }

    if (!d->wake_event.posted) {
        ngx_post_event(&d->wake_event, &ngx_posted_events);
    }
}


/*
 * Armed from the open until esid's last splice, re-armed by each answer
 * and by each message written to esid.  "awaiting" counts the messages
 * esid has not finished answering (a splice marked "answered" ends one),
 * so when the timer expires it tells whether the silence is esid's.
 */

static void
ngx_http_esi_timer(ngx_http_esi_ctx_t *ctx, ngx_uint_t reset)
{
    if (ctx->in_table) {
        if (reset || !ctx->timer.timer_set) {
            ngx_add_timer(&ctx->timer, ngx_http_esi_daemon.conf->timeout);
        }

        return;
    }

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}


static void
ngx_http_esi_timeout_handler(ngx_event_t *ev)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ev->data;

    if (!ctx->tx_queued && !ctx->end_sent && ctx->awaiting == 0) {

        /* esid is even with us: the page's upstream is the slow one */

        ngx_add_timer(ev, ngx_http_esi_daemon.conf->timeout);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                  "esi: esid did not answer stream %uD in time",
                  (uint32_t) ctx->node.key);

    ngx_http_esi_drop(&ngx_http_esi_daemon, NGX_LOG_ERR,
                      "esi: dropping the connection to esid");
}


static void
ngx_http_esi_wake_handler(ngx_event_t *ev)
{
    ngx_queue_t            *q;
    ngx_http_esi_ctx_t     *ctx;
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    while (!ngx_queue_empty(&d->wake)) {
        q = ngx_queue_head(&d->wake);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_esi_ctx_t, wake_link);
        ctx->wake_queued = 0;

        ngx_http_esi_wake(ctx);
    }
}


static void
ngx_http_esi_resume_handler(ngx_event_t *ev)
{
    ngx_http_esi_wake(ev->data);
}


/* runs a request's output after async work, then its own write path */

static void
ngx_http_esi_wake(ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t            rc;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "esi wake \"%V?%V\"", &r->uri, &r->args);

    rc = ngx_http_esi_process(r, ctx, NULL);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);

    } else if (ngx_http_post_request(r, NULL) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_run_posted_requests(c);
}


/* filters */

static ngx_int_t
ngx_http_esi_header_filter(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_uint_t                 depth, encoding;
    ngx_http_request_t        *pr;
    ngx_http_esi_ctx_t        *ctx, *pctx;
    ngx_http_esi_plain_t      *plain;
    ngx_http_esi_loc_conf_t   *elcf;
    ngx_http_esi_main_conf_t  *emcf;

    emcf = ngx_http_get_module_main_conf(r, ngx_http_esi_module);

    if (r->cache && emcf->purge_zones.nelts) {
        ngx_http_esi_report(r, emcf);
    }

    if (r->content_handler == ngx_http_esi_purge_handler) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx && ctx->fragment
        && r->headers_out.status >= NGX_HTTP_BAD_REQUEST)
    {
        ctx->discard = 1;
        return ngx_http_next_header_filter(r);
    }

    if (r != r->main) {
        rc = ngx_http_esi_fragment_header(r, &ctx);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_OK) {
            return ngx_http_next_header_filter(r);
        }
    }

    encoding = ngx_http_esi_encoding(r);

    /*
     * An include of ours that gunzip left encoded: its bytes would be
     * spliced into a plaintext page by postpone, unseen by anyone.
     */

    if (encoding != NGX_HTTP_ESI_IDENTITY && r != r->main) {
        pctx = ngx_http_get_module_ctx(r->parent, ngx_http_esi_module);

        if (pctx && pctx->stream) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" answered with "
                          "Content-Encoding \"%V\", request refused rather "
                          "than splice encoded bytes into the page; set "
                          "\"gunzip on\" in the fragment's location, or "
                          "\"proxy_set_header Accept-Encoding \"\"\" "
                          "towards its upstream",
                          &r->uri, &r->headers_out.content_encoding->value);

            pctx->status = NGX_HTTP_ESI_STATUS_ABORTED;

            return NGX_ERROR;
        }
    }

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->surrogate_control
        && ngx_http_esi_surrogate_control(r, elcf) != NGX_OK)
    {
        return ngx_http_next_header_filter(r);
    }

    if (!elcf->enable
        || r->header_only
        || (r->method & NGX_HTTP_HEAD)
        || r->headers_out.status == NGX_HTTP_NO_CONTENT
        || r->headers_out.status == NGX_HTTP_NOT_MODIFIED
        || r->headers_out.content_length_n == 0
        || ngx_http_test_content_type(r, &elcf->types) == NULL)
    {
        return ngx_http_next_header_filter(r);
    }

    if (encoding == NGX_HTTP_ESI_ENCODED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: \"%V\" encoded response left unprocessed: "
                      NGX_HTTP_ESI_DECODES,
                      &r->headers_out.content_encoding->value);
        return ngx_http_next_header_filter(r);
    }

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_esi_module);
    }

    depth = 0;

    for (pr = r->parent; pr; pr = pr->parent) {
        pctx = ngx_http_get_module_ctx(pr, ngx_http_esi_module);

        if (pctx && pctx->stream) {
            depth++;
        }
    }

    ctx->depth = depth;
    ctx->request = r;

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        /*
         * esid may be back before the backoff says so: a Unix socket
         * connect() answers at once, so try now rather than fall back
         */

        if (ngx_http_esi_daemon.reconnect.timer_set) {
            ngx_del_timer(&ngx_http_esi_daemon.reconnect);
        }

        ngx_http_esi_connect(&ngx_http_esi_daemon);
    }

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        if (elcf->fallback == NGX_HTTP_ESI_ABORT) {
            ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: esid is not connected, request aborted");
            return NGX_ERROR;
        }

        ctx->status = NGX_HTTP_ESI_STATUS_PASSTHROUGH;
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "esi: esid is not connected, response passed through");

        return ngx_http_next_header_filter(r);
    }

    ngx_http_esi_identify(r, ctx, elcf);

    if (encoding == NGX_HTTP_ESI_GZIP) {

        /* gunzip did not decode it: we do, and gzip may encode the result */

        ctx->inflate = 1;

        r->headers_out.content_encoding->hash = 0;
        r->headers_out.content_encoding = NULL;
    }

#if (NGX_ZLIB)

    /* before the open: it tells esid whether the plan may name segments */

    if (r == r->main && ngx_http_esi_stitches(r, elcf)) {
        rc = ngx_http_esi_stitch_start(r, elcf->stitch_level);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        ctx->segments = (rc == NGX_OK);
    }

#endif

    if (ctx->identified && !ctx->segments && !ctx->inflate) {
        plain = ngx_http_esi_plain(ctx);

        if (ngx_memcmp(plain->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN)
            == 0
            && plain->zone == ctx->plan_zone)
        {
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "esi: no ESI in this object, as its plan said");

            /* the response is the object, Content-Length, ETag and all */

            ctx->status = NGX_HTTP_ESI_STATUS_PROCESSED;
            ngx_http_esi_hide_surrogate_control(r);

            return ngx_http_next_header_filter(r);
        }
    }

    if (ngx_http_esi_open(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);
    ngx_http_clear_last_modified(r);
    ngx_http_clear_etag(r);

    return ngx_http_next_header_filter(r);
}


/*
 * Tells esid about a file of an announced zone that this response was
 * served from or is being stored into, so that its variant index stays
 * complete.  The header filter runs before the upstream module computes
 * the final file name from the response's Vary: a response being stored
 * goes under r->cache->key or, if its Vary changed, back under
 * r->cache->main, so both are reported.  A name that never gets written
 * costs esid nothing but an entry a purge finds absent.
 */

static void
ngx_http_esi_report(ngx_http_request_t *r, ngx_http_esi_main_conf_t *emcf)
{
    ngx_uint_t              i, store;
    ngx_shm_zone_t        **zone;
    ngx_pool_cleanup_t     *cln;
    ngx_http_esi_stored_t  *stored;

    store = (r->upstream && r->upstream->cacheable && !r->cached);

    if (!r->cached && !store) {
        return;
    }

    zone = emcf->purge_zones.elts;

    for (i = 0; i < emcf->purge_zones.nelts; i++) {
        if (zone[i] == r->cache->file_cache->shm_zone) {
            break;
        }
    }

    if (i == emcf->purge_zones.nelts) {
        return;
    }

    if (!store) {
        ngx_http_esi_report_object(r, r->pool, 0);
        return;
    }

    /*
     * NGINX renames a stored file into place once the body is in.  Reported
     * now, a purge in between would find no file, and esid would forget one
     * that then appears: reported when the request is over instead.
     */

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_esi_stored_t));
    if (cln == NULL) {
        return;
    }

    stored = cln->data;
    stored->request = r;
    stored->pool = r->pool;

    cln->handler = ngx_http_esi_report_stored;
}


/*
 * r->pool is being destroyed, and r->pool is NULL by now
 * (ngx_http_free_request): the pool itself, which its cleanups may still
 * allocate from, is what the report is built in.
 */

static void
ngx_http_esi_report_stored(void *data)
{
    ngx_http_esi_stored_t *stored = data;

    ngx_http_esi_report_object(stored->request, stored->pool, 1);
}


/* a file of a zone esid indexes: its key, its file name and its tags */

static void
ngx_http_esi_report_object(ngx_http_request_t *r, ngx_pool_t *pool,
    ngx_uint_t store)
{
    u_char            *p;
    size_t             len;
    ngx_str_t          key, tags, *name, *k;
    ngx_uint_t         i, n;
    ngx_list_part_t   *part;
    ngx_table_elt_t   *h;
    ngx_http_cache_t  *c;

    c = r->cache;
    name = &c->file_cache->shm_zone->shm.name;

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        /*
         * lost: esid puts the zone in doubt when this worker attaches
         * again and announces it
         */

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "esi: esid is not connected, cache report dropped");
        return;
    }

    /* the key as NGINX writes its KEY line: the parts, concatenated */

    len = 0;
    k = c->keys.elts;

    for (n = 0; n < c->keys.nelts; n++) {
        len += k[n].len;
    }

    key.data = ngx_pnalloc(pool, len);
    if (key.data == NULL) {
        return;
    }

    p = key.data;

    for (n = 0; n < c->keys.nelts; n++) {
        p = ngx_cpymem(p, k[n].data, k[n].len);
    }

    key.len = len;

    /*
     * tags as the upstream sent them (as esid reads them from the file),
     * even when proxy_hide_header keeps them from the client
     */

    part = r->upstream ? &r->upstream->headers_in.headers.part
                       : &r->headers_out.headers.part;

    for (n = 0; n < 2; n++) {
        len = 0;
        h = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (h[i].hash == 0
                || !((h[i].key.len == sizeof("Surrogate-Key") - 1
                      && ngx_strncasecmp(h[i].key.data,
                                         (u_char *) "Surrogate-Key",
                                         h[i].key.len)
                         == 0)
                     || (h[i].key.len == sizeof("xkey") - 1
                         && ngx_strncasecmp(h[i].key.data, (u_char *) "xkey",
                                            h[i].key.len)
                            == 0)))
            {
                continue;
            }

            if (n == 0) {
                len += h[i].value.len + 1;
                continue;
            }

            /* space separated, whatever separated them before */

            for (p = h[i].value.data;
                 p < h[i].value.data + h[i].value.len;
                 p++)
            {
                if (*p == ' ' || *p == '\t' || *p == ',') {
                    if (tags.len && tags.data[tags.len - 1] != ' ') {
                        tags.data[tags.len++] = ' ';
                    }

                } else {
                    tags.data[tags.len++] = *p;
                }
            }

            if (tags.len && tags.data[tags.len - 1] != ' ') {
                tags.data[tags.len++] = ' ';
            }
        }

        if (n == 0) {
            tags.len = 0;
            tags.data = NULL;

            if (len == 0) {
                break;
            }

            tags.data = ngx_pnalloc(pool, len);
            if (tags.data == NULL) {
                return;
            }

            part = r->upstream ? &r->upstream->headers_in.headers.part
                               : &r->headers_out.headers.part;

        } else if (tags.len) {
            tags.len--;
        }
    }

    if (ngx_http_esi_report_file(r, pool, name, &key, c->key, &tags)
        != NGX_OK)
    {
        return;
    }

    if (store && ngx_memcmp(c->key, c->main, NGX_HTTP_CACHE_KEY_LEN) != 0) {
        (void) ngx_http_esi_report_file(r, pool, name, &key, c->main, &tags);
    }
}


static ngx_int_t
ngx_http_esi_report_file(ngx_http_request_t *r, ngx_pool_t *pool,
    ngx_str_t *zone, ngx_str_t *key, u_char *file, ngx_str_t *tags)
{
    size_t                  need;
    u_char                 *buf, *dst;
    esi_wire_out_t          req, stored;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_STORED_DATA_WORDS
                         + ESI_WIRE_STORED_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(key->len + 1)
                         + esi_wire_blob(NGX_HTTP_CACHE_KEY_LEN)
                         + esi_wire_blob(tags->len + 1));

    buf = ngx_palloc(pool, need);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    esi_wire_builder_init(&b, buf, need);

    (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                         ESI_WIRE_REQUEST_POINTERS, &req);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                     ESI_WIRE_REQUEST_STORED_WHICH);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_STORED_PTR,
                               ESI_WIRE_STORED_DATA_WORDS,
                               ESI_WIRE_STORED_POINTERS, &stored);
    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_ZONE_PTR,
                             (const char *) zone->data, zone->len);
    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_KEY_PTR,
                             (const char *) key->data, key->len);
    dst = esi_wire_alloc_data(&stored, ESI_WIRE_STORED_FILE_PTR,
                              NGX_HTTP_CACHE_KEY_LEN);
    if (dst) {
        ngx_memcpy(dst, file, NGX_HTTP_CACHE_KEY_LEN);
    }

    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_TAGS_PTR,
                             (const char *) tags->data, tags->len);

    if (esi_wire_finish(&b) != need) {
        return NGX_ERROR;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi: cache report for \"%V\"", key);

    if (ngx_http_esi_post(d, buf, need) == NGX_OK) {
        return NGX_OK;
    }

    /*
     * A report esid never gets leaves its index incomplete: the next
     * announcement says so, and esid doubts the zone.  A connection that
     * cannot take a report is dropped, so that the announcement comes soon.
     */

    d->lost_reports = 1;

    if (d->state != NGX_HTTP_ESI_IDLE) {
        ngx_http_esi_drop(d, NGX_LOG_ERR,
                          "esi: a cache report cannot reach esid");
    }

    return NGX_ERROR;
}


static ngx_uint_t
ngx_http_esi_encoding(ngx_http_request_t *r)
{
    ngx_str_t  *ce;

#if !(NGX_HTTP_GZIP)

    /*
     * Without the gzip and gunzip modules an upstream's Content-Encoding
     * is copied as any other header, and r->headers_out.content_encoding
     * is not set: find it, as those modules would have it found
     */

    if (r->headers_out.content_encoding == NULL) {
        r->headers_out.content_encoding = ngx_http_esi_find_header(
                                              &r->headers_out.headers,
                                              "Content-Encoding");
    }
#endif

    if (r->headers_out.content_encoding == NULL
        || r->headers_out.content_encoding->hash == 0)
    {
        return NGX_HTTP_ESI_IDENTITY;
    }

    ce = &r->headers_out.content_encoding->value;

    if (ce->len == 0
        || (ce->len == sizeof("identity") - 1
            && ngx_strncasecmp(ce->data, (u_char *) "identity", ce->len) == 0))
    {
        return NGX_HTTP_ESI_IDENTITY;
    }

#if (NGX_ZLIB)
    if (ce->len == sizeof("gzip") - 1
        && ngx_strncasecmp(ce->data, (u_char *) "gzip", ce->len) == 0)
    {
        return NGX_HTTP_ESI_GZIP;
    }
#endif

    return NGX_HTTP_ESI_ENCODED;
}


/* the first header of that name in a list, deleted ones (hash 0) aside */

static ngx_table_elt_t *
ngx_http_esi_find_header(ngx_list_t *headers, const char *name)
{
    size_t            len;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);
    part = &headers->part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash
            && h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
        {
            return &h[i];
        }
    }
}


/*
 * A body read from the cache, in a location with esi_plan: its identity
 * lets esid answer with the plan instead of reading the body.  It is the
 * open cache file's: its key, size and header size, and its inode and
 * modification time, since NGINX writes each store to a new file and
 * renames it into place.  The response's own Date, length and validators
 * can be those of the object it replaced, within the same second.  A miss
 * is never planned: what NGINX will store is not known yet.
 */

static void
ngx_http_esi_identify(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_loc_conf_t *elcf)
{
    u_char              *p;
    uint64_t             v[4];
    ngx_uint_t           i, k;
    ngx_file_info_t      fi;
    ngx_http_cache_t    *c;
    ngx_http_upstream_t *u;

    c = r->cache;
    u = r->upstream;

    if (elcf->plan == NULL || c == NULL || u == NULL
        || (u->cache_status != NGX_HTTP_CACHE_HIT
            && u->cache_status != NGX_HTTP_CACHE_STALE
            && u->cache_status != NGX_HTTP_CACHE_UPDATING
            && u->cache_status != NGX_HTTP_CACHE_REVALIDATED))
    {
        return;
    }

    if (ngx_fd_info(c->file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                      ngx_fd_info_n " \"%s\" failed", c->file.name.data);
        return;
    }

    p = ngx_cpymem(ctx->object, c->key, NGX_HTTP_CACHE_KEY_LEN);

    v[0] = (uint64_t) c->length;
    v[1] = (uint64_t) c->body_start;
    v[2] = (uint64_t) ngx_file_uniq(&fi);
    v[3] = (uint64_t) fi.st_mtim.tv_sec * 1000000000
           + (uint64_t) fi.st_mtim.tv_nsec;

    for (i = 0; i < 4; i++) {
        for (k = 0; k < 8; k++) {
            *p++ = (u_char) (v[i] >> (8 * k));
        }
    }

    ctx->plan_zone = elcf->plan;
    ctx->identified = 1;
}


/*
 * An object's slot in the worker's tables of plain objects and plans: by
 * its cache file's key alone, so that a purge of the file finds it.
 */

static uint32_t
ngx_http_esi_object_hash(const u_char *key)
{
    /* not ngx_murmur_hash2(): it shifts a byte into the sign bit (UBSan) */

    return ngx_crc32_short((u_char *) key, NGX_HTTP_CACHE_KEY_LEN);
}


/* where the object would be among those known to have no ESI */

static ngx_http_esi_plain_t *
ngx_http_esi_plain(ngx_http_esi_ctx_t *ctx)
{
    return &ngx_http_esi_daemon.plain[ngx_http_esi_object_hash(ctx->object)
                                      & (NGX_HTTP_ESI_PLAIN_OBJECTS - 1)];
}


/* where the worker's copy of the object's reusable plan would be */

static ngx_http_esi_replay_t *
ngx_http_esi_replay_slot(ngx_http_esi_ctx_t *ctx)
{
    return &ngx_http_esi_daemon.replays[ngx_http_esi_object_hash(ctx->object)
                                        & (NGX_HTTP_ESI_REPLAYS - 1)];
}


/*
 * A purge removes these cache files (Response.forget; none listed: too
 * many to list): the worker's copies of their plans and its notes that
 * they have no ESI go, so that no pin or slot is held for objects nobody
 * will be sent again.  Their identities would never match a later store.
 */

static ngx_int_t
ngx_http_esi_forget_objects(ngx_http_esi_daemon_t *d, esi_wire_struct_t *root)
{
    size_t                  len;
    uint32_t                hash;
    const uint8_t          *key;
    ngx_http_esi_plain_t   *plain;
    ngx_http_esi_replay_t  *e;

    if (esi_wire_get_data(root, ESI_WIRE_RESPONSE_FORGET_PTR, &key, &len)
        != 0
        || len % NGX_HTTP_CACHE_KEY_LEN != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed forget from esid");
        return NGX_ERROR;
    }

    if (d->plain == NULL) {
        return NGX_OK;
    }

    if (len == 0) {
        ngx_memzero(d->plain, NGX_HTTP_ESI_PLAIN_OBJECTS
                              * sizeof(ngx_http_esi_plain_t));
        ngx_http_esi_replay_flush(d, 1);
        return NGX_OK;
    }

    for ( /* void */ ; len; len -= NGX_HTTP_CACHE_KEY_LEN) {
        hash = ngx_http_esi_object_hash(key);

        plain = &d->plain[hash & (NGX_HTTP_ESI_PLAIN_OBJECTS - 1)];

        if (ngx_memcmp(plain->object, key, NGX_HTTP_CACHE_KEY_LEN) == 0) {
            ngx_memzero(plain, sizeof(ngx_http_esi_plain_t));
        }

        e = &d->replays[hash & (NGX_HTTP_ESI_REPLAYS - 1)];

        if (e->message
            && ngx_memcmp(e->object, key, NGX_HTTP_CACHE_KEY_LEN) == 0)
        {
            ngx_http_esi_replay_release(d, e);
        }

        key += NGX_HTTP_CACHE_KEY_LEN;
    }

    return NGX_OK;
}


static ngx_uint_t
ngx_http_esi_replay_matches(ngx_http_esi_ctx_t *ctx, ngx_http_esi_replay_t *e)
{
    return e->message != NULL
           && e->zone == ctx->plan_zone
           && e->segments == ctx->segments
           && ngx_memcmp(e->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN) == 0;
}


/*
 * Replays the worker's copy of the object's plan, if it holds one that has
 * not expired: the stream never reaches esid, which only hears of the hit.
 * NGX_DECLINED: esid is to be asked.
 */

static ngx_int_t
ngx_http_esi_replay(ngx_http_esi_ctx_t *ctx)
{
    esi_wire_msg_t            msg;
    esi_wire_struct_t         root;
    ngx_http_esi_replay_t    *e;
    ngx_http_esi_daemon_t    *d;
    ngx_http_esi_loc_conf_t  *elcf;

    d = &ngx_http_esi_daemon;
    e = ngx_http_esi_replay_slot(ctx);
    elcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_esi_module);

    if (elcf->plan_reuse == 0 || !ngx_http_esi_replay_matches(ctx, e)) {
        return NGX_DECLINED;
    }

    if ((ngx_msec_int_t) (e->expires - ngx_current_msec) <= 0) {
        ngx_http_esi_replay_release(d, e);
        return NGX_DECLINED;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "esi: the plan is replayed from the worker's copy");

    ctx->plan_wait = 1;

    /* the copy passed these checks when esid sent it */

    if (esi_wire_open(&msg, (const uint8_t *) e->message, e->len, &root) != 0
        || ngx_http_esi_plan(ctx, &root, NULL, 0) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, ctx->request->connection->log, 0,
                      "esi: the worker's copy of a plan is malformed");
        ngx_http_esi_replay_release(d, e);
        ngx_http_esi_fail(ctx);
        return NGX_OK;
    }

    if (!ctx->failed) {
        ngx_http_esi_replay_report(ctx);
    }

    return NGX_OK;
}


/* keeps a copy of esid's reusable plan for the stream's object */

static void
ngx_http_esi_replay_keep(ngx_http_esi_ctx_t *ctx, const uint8_t *message,
    size_t len, uint32_t pin)
{
    ngx_http_esi_replay_t    *e;
    ngx_http_esi_daemon_t    *d;
    ngx_http_esi_loc_conf_t  *elcf;

    d = &ngx_http_esi_daemon;
    e = ngx_http_esi_replay_slot(ctx);
    elcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_esi_module);

    if (elcf->plan_reuse == 0) {
        return;
    }

    if (e->message) {
        ngx_http_esi_replay_release(d, e);
    }

    /* without a copy later hits ask esid, as they would anyway */

    e->message = ngx_alloc(len, d->log);
    if (e->message == NULL) {
        return;
    }

    ngx_memcpy(e->message, message, len);
    e->len = len;
    e->zone = ctx->plan_zone;
    ngx_memcpy(e->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    e->segments = ctx->segments;
    e->expires = ngx_current_msec + elcf->plan_reuse;
    e->pin = pin;

    if (pin) {

        /* the stream's count keeps the slot esid's until this one */

        (void) __atomic_fetch_add(&((uint32_t *) d->pins->start)[pin - 1], 1,
                                  __ATOMIC_RELAXED);
    }

    d->nreplays++;

    if (!d->replay_timer.timer_set) {
        ngx_add_timer(&d->replay_timer, NGX_HTTP_ESI_REPLAY_SWEEP);
    }
}


/* the object's plan did not match its body: no more replays of the copy */

static void
ngx_http_esi_replay_forget(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_replay_t  *e;

    e = ngx_http_esi_replay_slot(ctx);

    if (ngx_http_esi_replay_matches(ctx, e)) {
        ngx_http_esi_replay_release(&ngx_http_esi_daemon, e);
    }
}


static void
ngx_http_esi_replay_release(ngx_http_esi_daemon_t *d,
    ngx_http_esi_replay_t *e)
{
    if (e->pin) {
        ngx_http_esi_unpin(d->pins, e->pin);
        e->pin = 0;
    }

    ngx_free(e->message);
    e->message = NULL;
    d->nreplays--;
}


/* releases the expired copies, or all of them when the connection goes */

static void
ngx_http_esi_replay_flush(ngx_http_esi_daemon_t *d, ngx_uint_t all)
{
    ngx_uint_t              i;
    ngx_http_esi_replay_t  *e;

    for (i = 0; d->nreplays && i < NGX_HTTP_ESI_REPLAYS; i++) {
        e = &d->replays[i];

        if (e->message
            && (all || (ngx_msec_int_t) (e->expires - ngx_current_msec) <= 0))
        {
            ngx_http_esi_replay_release(d, e);
        }
    }
}


/* so that a copy nobody asks for again does not pin its segments for long */

static void
ngx_http_esi_replay_timer_handler(ngx_event_t *ev)
{
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    ngx_http_esi_replay_flush(d, 0);

    if (d->nreplays) {
        ngx_add_timer(ev, NGX_HTTP_ESI_REPLAY_SWEEP);
    }
}


/* tells esid of a hit replayed from the worker's copy, for its counts */

static void
ngx_http_esi_replay_report(ngx_http_esi_ctx_t *ctx)
{
    size_t               need;
    u_char              *buf, *dst;
    ngx_str_t           *zone;
    esi_wire_out_t       req, replayed;
    esi_wire_builder_t   b;

    zone = &ctx->plan_zone->name;

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_REPLAYED_DATA_WORDS
                         + ESI_WIRE_REPLAYED_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(NGX_HTTP_ESI_OBJECT_LEN));

    buf = ngx_palloc(ctx->request->pool, need);
    if (buf == NULL) {
        return;
    }

    esi_wire_builder_init(&b, buf, need);

    (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                         ESI_WIRE_REQUEST_POINTERS, &req);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                     ESI_WIRE_REQUEST_REPLAYED_WHICH);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_REPLAYED_PTR,
                               ESI_WIRE_REPLAYED_DATA_WORDS,
                               ESI_WIRE_REPLAYED_POINTERS, &replayed);
    (void) esi_wire_set_text(&replayed, ESI_WIRE_REPLAYED_ZONE_PTR,
                             (const char *) zone->data, zone->len);

    dst = esi_wire_alloc_data(&replayed, ESI_WIRE_REPLAYED_OBJECT_PTR,
                              NGX_HTTP_ESI_OBJECT_LEN);
    if (dst) {
        ngx_memcpy(dst, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    }

    esi_wire_set_bool(&replayed, ESI_WIRE_REPLAYED_STITCHED_BIT,
                      ctx->pin != 0);

    /* only counts are lost if it cannot go */

    (void) ngx_http_esi_post(&ngx_http_esi_daemon, buf, esi_wire_finish(&b));
}


/*
 * What ESI variables may read of the client's request (r->main's, also for
 * a fragment page), indexed by RequestVars pointer; cookies are apart.  The
 * values point into the request: nothing is allocated.
 */

static void
ngx_http_esi_request_vars(ngx_http_request_t *r, ngx_str_t *vars)
{
    ngx_uint_t            i;
    ngx_table_elt_t      *h[ESI_WIRE_REQUEST_VARS_POINTERS];
    ngx_http_request_t   *mr;

    mr = r->main;

    ngx_memzero(h, sizeof(h));

    h[ESI_WIRE_REQUEST_VARS_HOST_PTR] = mr->headers_in.host;
    h[ESI_WIRE_REQUEST_VARS_USER_AGENT_PTR] = mr->headers_in.user_agent;
    h[ESI_WIRE_REQUEST_VARS_REFERER_PTR] = mr->headers_in.referer;
    h[ESI_WIRE_REQUEST_VARS_ACCEPT_LANGUAGE_PTR] =
        ngx_http_esi_find_header(&mr->headers_in.headers, "Accept-Language");

    for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
        if (h[i] && h[i]->value.len <= NGX_HTTP_ESI_VAR_MAX) {
            vars[i] = h[i]->value;

        } else {
            ngx_str_null(&vars[i]);
        }
    }

    if (mr->args.len <= NGX_HTTP_ESI_VAR_MAX) {
        vars[ESI_WIRE_REQUEST_VARS_QUERY_STRING_PTR] = mr->args;
    }
}


/*
 * The client's cookies that esi_cookies names ("*": all), as "a=1; b=2";
 * returns the length and, when dst is set, writes them there.
 */

static size_t
ngx_http_esi_cookies(ngx_http_request_t *r, ngx_array_t *names, u_char *dst)
{
    u_char            *p, *end, *start, *name_end;
    size_t             len;
    ngx_str_t         *name;
    ngx_uint_t         i, k, all;
    ngx_table_elt_t  **h;

    if (names == NULL) {
        return 0;
    }

    name = names->elts;
    all = (name[0].len == 1 && name[0].data[0] == '*');

    h = r->main->headers_in.cookies.elts;
    len = 0;

    for (i = 0; i < r->main->headers_in.cookies.nelts; i++) {

        p = h[i]->value.data;
        end = p + h[i]->value.len;

        while (p < end) {

            while (p < end && (*p == ' ' || *p == '\t' || *p == ';')) {
                p++;
            }

            start = p;

            while (p < end && *p != ';') {
                p++;
            }

            while (p > start && (p[-1] == ' ' || p[-1] == '\t')) {
                p--;
            }

            if (p == start) {
                break;
            }

            name_end = ngx_strlchr(start, p, '=');
            if (name_end == NULL) {
                name_end = p;
            }

            for (k = 0; !all && k < names->nelts; k++) {
                if (name[k].len == (size_t) (name_end - start)
                    && ngx_strncmp(name[k].data, start, name[k].len) == 0)
                {
                    break;
                }
            }

            if (all || k < names->nelts) {
                if (len) {
                    if (dst) {
                        ngx_memcpy(dst + len, "; ", 2);
                    }

                    len += 2;
                }

                if (dst) {
                    ngx_memcpy(dst + len, start, p - start);
                }

                len += p - start;
            }

            while (p < end && *p != ';') {
                p++;
            }
        }
    }

    return len;
}


/* Surrogate-Control is for us: the client never sees it */

static void
ngx_http_esi_hide_surrogate_control(ngx_http_request_t *r)
{
    ngx_table_elt_t  *h;

    for ( ;; ) {
        h = ngx_http_esi_find_header(&r->headers_out.headers,
                                     "Surrogate-Control");
        if (h == NULL) {
            return;
        }

        h->hash = 0;
    }
}


static ngx_int_t
ngx_http_esi_open(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_pool_cleanup_t     *cln;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_esi_cleanup;
    cln->data = ctx;

    ngx_http_esi_hide_surrogate_control(r);

    r->filter_need_in_memory = 1;

    if (r == r->main) {
        r->preserve_body = 1;
    }

    ctx->stream = 1;
    ctx->status = NGX_HTTP_ESI_STATUS_PROCESSED;
    ctx->last_held = &ctx->held;
    ctx->last_insn = &ctx->insns;
    ctx->last_out = &ctx->out;

    ctx->timer.handler = ngx_http_esi_timeout_handler;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;

    ctx->resume.handler = ngx_http_esi_resume_handler;
    ctx->resume.data = ctx;
    ctx->resume.log = r->connection->log;

    if (ctx->identified && ngx_http_esi_replay(ctx) == NGX_OK) {
        return NGX_OK;
    }

    ctx->node.key = d->next_id++;
    ngx_rbtree_insert(&d->streams, &ctx->node);
    ctx->in_table = 1;

    ngx_queue_insert_tail(&d->tx_wait, &ctx->tx_link);
    ctx->tx_queued = 1;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi stream %ui depth %ui", ctx->node.key, ctx->depth);

    ngx_http_esi_flush(d);
    ngx_http_esi_timer(ctx, 0);

    return NGX_OK;
}


static void
ngx_http_esi_cleanup(void *data)
{
    ngx_http_esi_ctx_t  *ctx = data;

    ngx_http_esi_forget(ctx);

    /* nothing of the request is on its way to the client any more */

    if (ctx->pins) {
        ngx_http_esi_unpin(ctx->pins, ctx->pin);
        ngx_http_esi_unmap(ctx->pins);
        ctx->pins = NULL;
    }

    if (ctx->arena) {
        ngx_http_esi_unmap(ctx->arena);
        ctx->arena = NULL;
    }

    if (ctx->wake_queued) {
        ngx_queue_remove(&ctx->wake_link);
        ctx->wake_queued = 0;
    }

    if (ctx->resume.posted) {
        ngx_delete_posted_event(&ctx->resume);
    }
}


static ngx_int_t
ngx_http_esi_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t            rc;
    ngx_chain_t         *cl;
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx && ctx->discard) {
        for (cl = in; cl; cl = cl->next) {
            cl->buf->pos = cl->buf->last;
            cl->buf->file_pos = cl->buf->file_last;

            /* a parallel include has no alt= nor onerror: it fails here */

            if (cl->buf->last_in_chain && ctx->oversized && !ctx->fragment) {
                return ngx_http_esi_fragment_marker(r);
            }
        }

        return NGX_OK;
    }

    if (ctx && ctx->limited
        && ngx_http_esi_fragment_limit(r, ctx, &in) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ctx == NULL || !ctx->stream
        || (ctx->fallen && !ctx->inflate && ctx->out == NULL
            && ctx->busy == NULL && ctx->held == NULL))
    {
        return ngx_http_esi_next(r, ctx, in);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi body filter \"%V?%V\"", &r->uri, &r->args);

    if (ctx->zerror) {
        return NGX_ERROR;
    }

    for ( ;; ) {
        rc = ngx_http_esi_feed(r, ctx, in);

#if (NGX_ZLIB)
        /*
         * what went out may have made room for more of a gzipped body: as
         * gunzip does, inflate until the client stops taking it
         */

        if (rc != NGX_ERROR && ctx->zin
            && ngx_http_esi_inflate_room(r, ctx))
        {
            in = NULL;
            continue;
        }
#endif

        return rc;
    }
}


static ngx_int_t
ngx_http_esi_feed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_int_t                 rc;
    ngx_chain_t              *cl, *zin;
    ngx_http_esi_loc_conf_t  *elcf;

    zin = NULL;

#if (NGX_ZLIB)
    if (ctx->inflate) {

        /* from here on "in" is plaintext, in buffers of our own */

        if (ngx_http_esi_inflate(r, ctx, in, &zin) != NGX_OK) {
            return NGX_ERROR;
        }

        in = zin;
    }
#endif

    if (!ctx->failed && !ctx->fallen) {
        for (cl = in; cl; cl = cl->next) {
            if (ngx_buf_size(cl->buf) && !ngx_buf_in_memory(cl->buf)) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "esi: body not in memory");
                ngx_http_esi_fail(ctx);
                break;
            }
        }
    }

    if (!ctx->failed && !ctx->fallen) {
        if (ngx_http_esi_hold(r, ctx, in) != NGX_OK) {
            return NGX_ERROR;
        }

        elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

        if (elcf->max_page_size && ctx->received > elcf->max_page_size) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: \"%V\" is larger than esi_max_page_size "
                          "%O, esi_fallback applies", &r->uri,
                          elcf->max_page_size);
            ngx_http_esi_fail(ctx);
        }

        if (ctx->planned && ngx_http_esi_plan_run(ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        if (in && !ctx->tx_queued && ctx->in_table) {
            ngx_queue_insert_tail(&ngx_http_esi_daemon.tx_wait,
                                  &ctx->tx_link);
            ctx->tx_queued = 1;

            ngx_http_esi_flush(&ngx_http_esi_daemon);
            ngx_http_esi_timer(ctx, 0);
        }

        in = NULL;
    }

    rc = ngx_http_esi_process(r, ctx, in);

    /* the links, not the buffers: those are held or went out */

    while (zin) {
        cl = zin;
        zin = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    return rc;
}


#if (NGX_ZLIB)

/*
 * Inflates a gzipped body as ngx_http_gunzip_filter_module does, into
 * buffers of esi_buffer_size that are held and emitted like any input.
 * Compressed input waits in ctx->zin while there is no room to inflate it:
 * past esi_max_page_size (the page then falls back), and, after a
 * fallback, while NGX_HTTP_ESI_INFLATE_AHEAD buffers are still on their
 * way to the client.  A ratio bomb so costs a few buffers, not its size.
 */

static ngx_int_t
ngx_http_esi_inflate(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in, ngx_chain_t **out)
{
    int            rc;
    ngx_buf_t     *b;
    ngx_chain_t   *cl, **ll;

    *out = NULL;
    ll = out;

    if (in && ngx_chain_add_copy(r->pool, &ctx->zin, in) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!ctx->zstarted) {
        rc = esi_inflate_init(&ctx->gunzip, ngx_http_esi_inflate_alloc,
                              ngx_http_esi_inflate_free, r);
        if (rc != Z_OK) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "inflateInit2() failed: %d", rc);
            return NGX_ERROR;
        }

        ctx->zstarted = 1;
    }

    while (ctx->zin) {
        cl = ctx->zin;
        b = cl->buf;

        if (ngx_buf_size(b) && !ngx_buf_in_memory(b)) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: gzipped body not in memory");
            ngx_http_esi_inflate_failed(r, ctx, NULL, 0);
            return NGX_ERROR;
        }

        while (b->pos < b->last) {

            if (ctx->zbuf == NULL) {
                if (!ngx_http_esi_inflate_room(r, ctx)) {
                    return NGX_OK;
                }

                if (ngx_http_esi_inflate_buf(r, ctx) != NGX_OK) {
                    return NGX_ERROR;
                }
            }

            rc = esi_inflate(&ctx->gunzip, &b->pos, b->last,
                             &ctx->zbuf->last, ctx->zbuf->end);

            if (rc == ESI_INFLATE_CORRUPT) {
                ngx_http_esi_inflate_failed(r, ctx, "corrupt",
                                            ctx->gunzip.rc);
                return NGX_ERROR;
            }

            /* full: zlib may have more for the next buffer */

            if (rc == ESI_INFLATE_FULL
                && ngx_http_esi_inflate_out(r, ctx, &ll) != NGX_OK)
            {
                return NGX_ERROR;
            }
        }

        if (b->last_buf || b->last_in_chain) {
            ctx->zlast = 1;
        }

        ctx->zin = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    if (ctx->zlast && !esi_inflate_complete(&ctx->gunzip)) {
        ngx_http_esi_inflate_failed(r, ctx, "truncated", Z_BUF_ERROR);
        return NGX_ERROR;
    }

    /* what is inflated goes on now, as gunzip does at the end of input */

    if (ctx->zbuf && ngx_buf_size(ctx->zbuf)) {
        if (ngx_http_esi_inflate_out(r, ctx, &ll) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (ctx->zlast) {

        /*
         * the end in a buffer without memory, as gunzip ends: an empty one
         * of ours would be a "zero size buf" to the writer once it goes
         * out as it is, after a fallback
         */

        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->sync = 1;

        if (r == r->main) {
            b->last_buf = 1;

        } else {
            b->last_in_chain = 1;
        }

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = b;
        cl->next = NULL;
        *ll = cl;

        esi_inflate_end(&ctx->gunzip);
        ctx->zstarted = 0;
        ctx->inflate = 0;
    }

    return NGX_OK;
}


/* whether another buffer may be inflated into now */

static ngx_uint_t
ngx_http_esi_inflate_room(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_loc_conf_t  *elcf;

    if (ctx->zfree) {
        return 1;
    }

    if (ctx->fallen) {
        return ctx->zbufs < NGX_HTTP_ESI_INFLATE_AHEAD;
    }

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    return elcf->max_page_size == 0
           || (off_t) ctx->gunzip.total <= elcf->max_page_size;
}


static ngx_int_t
ngx_http_esi_inflate_buf(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    if (ctx->zfree) {
        cl = ctx->zfree;
        ctx->zfree = cl->next;

        b = cl->buf;
        ngx_free_chain(r->pool, cl);

        b->pos = b->start;
        b->last = b->start;
        b->last_buf = 0;
        b->last_in_chain = 0;

    } else {
        elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

        b = ngx_create_temp_buf(r->pool, elcf->buffer_size);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->tag = NGX_HTTP_ESI_INFLATED;
        ctx->zbufs++;
    }

    ctx->zbuf = b;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_inflate_out(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t ***last)
{
    ngx_chain_t  *cl;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = ctx->zbuf;
    cl->next = NULL;

    **last = cl;
    *last = &cl->next;

    ctx->zbuf = NULL;

    return NGX_OK;
}


/* nothing more of this response goes out, not even a fallback */

static void
ngx_http_esi_inflate_failed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    const char *what, int rc)
{
    const char  *msg;

    if (what) {
        msg = esi_inflate_message(&ctx->gunzip);

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: %s gzip body from upstream (inflate() %d%s%s) "
                      "after %uL decoded bytes, response cut off",
                      what, rc, *msg ? ": " : "", msg,
                      ctx->gunzip.total);
    }

    ctx->zerror = 1;
    ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;

    ngx_http_esi_forget(ctx);
}


static void *
ngx_http_esi_inflate_alloc(void *opaque, u_int items, u_int size)
{
    ngx_http_request_t *r = opaque;

    return ngx_palloc(r->pool, items * size);
}


static void
ngx_http_esi_inflate_free(void *opaque, void *address)
{
    /* the request pool frees it */
}

#endif


/* an inflated buffer nothing refers to any more */

static void
ngx_http_esi_recycle(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_buf_t *b, ngx_chain_t *cl)
{
    if (cl == NULL) {
        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return;
        }
    }

    cl->buf = b;
    cl->next = ctx->zfree;
    ctx->zfree = cl;
}


static ngx_int_t
ngx_http_esi_hold(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    off_t                 size;
    ngx_buf_t            *b, *nb;
    ngx_http_esi_held_t  *h;

    for ( /* void */ ; in; in = in->next) {
        b = in->buf;

        if (b->last_buf || b->last_in_chain) {
            ctx->input_done = 1;
        }

        size = ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        /*
         * An unbuffered upstream reuses its one buffer, and signals the end
         * of the body only once that buffer is consumed; esid may keep the
         * last bytes until the end: hold a copy, so neither waits for the
         * other.
         */

        if (r->upstream && !r->upstream->buffering && b->tag != ctx
            && b->tag != NGX_HTTP_ESI_INFLATED)
        {
            nb = ngx_create_temp_buf(r->pool, (size_t) size);
            if (nb == NULL) {
                return NGX_ERROR;
            }

            nb->last = ngx_cpymem(nb->pos, b->pos, (size_t) size);
            nb->tag = ctx;
            b->pos = b->last;
            b = nb;
        }

        if (ctx->free_held) {
            h = ctx->free_held;
            ctx->free_held = h->next;

        } else {
            h = ngx_palloc(r->pool, sizeof(ngx_http_esi_held_t));
            if (h == NULL) {
                return NGX_ERROR;
            }
        }

        h->buf = b;
        h->start = b->pos;
        h->offset = ctx->received;
        h->end = ctx->received + size;
        h->refs = 0;
        h->next = NULL;

        *ctx->last_held = h;
        ctx->last_held = &h->next;

        if (ctx->send_held == NULL && !ctx->planned) {
            ctx->send_held = h;
        }

        ctx->received = h->end;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_process(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    off_t         size;
    ngx_int_t     rc;
    ngx_uint_t    starved;
    ngx_chain_t  *cl;

    if (ctx->zerror) {
        return NGX_ERROR;
    }

    if (!ctx->fallen && !ctx->failed) {
        if (ngx_http_esi_execute(r, ctx) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (ctx->failed && !ctx->fallen) {
        if (ngx_http_esi_fallback(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* after a fallback, later input goes out as it came */

    for ( /* void */ ; in; in = in->next) {

        if (ctx->passed) {
            size = ngx_min(ctx->passed, ngx_buf_size(in->buf));
            in->buf->pos += size;
            ctx->passed -= size;

            if (ngx_buf_size(in->buf) == 0 && !in->buf->last_buf
                && !in->buf->last_in_chain && !in->buf->flush)
            {
                continue;
            }
        }

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = in->buf;
        cl->next = NULL;
        *ctx->last_out = cl;
        ctx->last_out = &cl->next;
    }

    /*
     * postpone may still hold our output behind an include, last_buf too;
     * and the filters below may hold what we gave them (gzip's copy, the
     * writer's): only the writer's call through us lets them go on
     */

    starved = ngx_http_esi_starved(ctx);

    if (starved && ngx_http_esi_flush_held(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->out == NULL && ctx->busy == NULL && r->postponed == NULL
        && !r->connection->buffered)
    {
        ngx_http_esi_release(ctx);
        rc = NGX_OK;

    } else {
        rc = ngx_http_esi_output(r, ctx);
    }

    if (starved && rc != NGX_ERROR && ngx_http_esi_own_held(r, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return rc;
}


static ngx_int_t
ngx_http_esi_execute(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t             rc;
    ngx_http_esi_insn_t  *insn;

    while (ctx->insns || ctx->wait || ctx->plan_more) {

        if (ctx->insns == NULL && ctx->wait == NULL) {
            if (ngx_http_esi_plan_run(ctx) != NGX_OK) {
                return NGX_ERROR;
            }

            continue;
        }

        if (ctx->wait) {
            if (!ctx->wait->done) {
                return NGX_OK;
            }

            ctx->wait = NULL;

            if (ctx->wait_failed) {
                ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                               "esi include failed: \"%V\"",
                               ctx->wait_alt ? &ctx->wait_insn->alt_path
                                             : &ctx->wait_insn->path);

                rc = ngx_http_esi_include_failed(r, ctx, ctx->wait_insn,
                                                 ctx->wait_alt);
                if (rc != NGX_OK) {
                    return rc;
                }
            }

            continue;
        }

        insn = ctx->insns;
        ctx->insns = insn->next;

        if (ctx->insns == NULL) {
            ctx->last_insn = &ctx->insns;
        }

        if (ctx->skip && insn->type != NGX_HTTP_ESI_SPLICE) {
            ngx_http_esi_skip(ctx, insn);
            rc = NGX_OK;

        } else {

            switch (insn->type) {

            case NGX_HTTP_ESI_VERBATIM:
                rc = ngx_http_esi_verbatim(r, ctx, insn->offset,
                                           insn->offset + insn->length);
                break;

            case NGX_HTTP_ESI_INCLUDE:
                rc = ngx_http_esi_include(r, ctx, insn, 0);
                break;

            case NGX_HTTP_ESI_LITERAL:
                rc = ngx_http_esi_literal(r, ctx, &insn->text);
                break;

#if (NGX_ZLIB)
            case NGX_HTTP_ESI_SEGMENT:
                rc = ngx_http_esi_segment(r, ctx, insn);
                break;
#endif

            case NGX_HTTP_ESI_TRY_START:
                rc = ngx_http_esi_try_start(r, ctx);
                break;

            case NGX_HTTP_ESI_TRY_EXCEPT:
                ngx_http_esi_try_except(ctx);
                rc = NGX_OK;
                break;

            case NGX_HTTP_ESI_TRY_END:
                ctx->ntries--;
                rc = NGX_OK;
                break;

            default: /* NGX_HTTP_ESI_SPLICE */
                ctx->released = insn->offset;
                rc = insn->last ? ngx_http_esi_final(r, ctx) : NGX_OK;
                break;
            }
        }

        if (insn->type != NGX_HTTP_ESI_INCLUDE) {
            insn->next = ctx->free_insns;
            ctx->free_insns = insn;
        }

        if (rc == NGX_DECLINED) {
            ngx_http_esi_fail(ctx);
            return NGX_OK;
        }

        if (rc != NGX_OK) {
            return rc;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_verbatim(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    off_t offset, off_t end)
{
    off_t                 to;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    for (h = ctx->held; h && offset < end; h = h->next) {

        if (h->end <= offset) {
            continue;
        }

        if (h->offset > offset) {
            break;
        }

        to = ngx_min(end, h->end);

        /*
         * an attempt's output waits for its outcome: a copy, so that the
         * body's buffers go on (held, a long attempt would stall its read)
         */

        if (to - offset <= NGX_HTTP_ESI_PACK_MAX || ctx->attempts) {
            if (ngx_http_esi_pack(r, ctx, h->start + (offset - h->offset),
                                  (size_t) (to - offset))
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            offset = to;
            continue;
        }

        cl = ngx_http_esi_link(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;
        b->memory = 1;
        b->pos = h->start + (offset - h->offset);
        b->last = h->start + (to - h->offset);
        b->shadow = h->buf;
        h->refs++;

        offset = to;
    }

    if (offset < end) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "esi: verbatim at %O is no longer held", offset);
        return NGX_DECLINED;
    }

    ctx->verbatim_end = end;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_include(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn, ngx_uint_t alt)
{
    ngx_str_t                   *path, *args;
    ngx_http_request_t          *sr, *pr;
    ngx_http_esi_ctx_t          *sctx, *capture;
    ngx_http_esi_loc_conf_t     *elcf;
    ngx_http_post_subrequest_t  *psr;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    /* inside an attempt, output is held and includes come one at a time */

    capture = ctx->attempts ? ctx : ctx->capture;

    path = alt ? &insn->alt_path : &insn->path;
    args = alt ? &insn->alt_args : &insn->args;

    if (path->len == 0) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "esi: include refused by esid");
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    if (ctx->depth >= (ngx_uint_t) elcf->max_depth) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: include \"%V\" exceeds esi_max_depth %i",
                      path, elcf->max_depth);
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    if (!alt && ++ctx->includes > elcf->max_includes) {
        if (ctx->includes == elcf->max_includes + 1) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: \"%V\" has more than %ui includes "
                          "(esi_max_includes), the rest fail",
                          &r->uri, elcf->max_includes);
        }

        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    for (pr = r; pr; pr = pr->parent) {
        if (pr->uri.len == path->len
            && ngx_strncmp(pr->uri.data, path->data, path->len) == 0
            && pr->args.len == args->len
            && (args->len == 0
                || ngx_strncmp(pr->args.data, args->data, args->len) == 0))
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" would include itself "
                          "(a loop), refused", path);
            return ngx_http_esi_include_failed(r, ctx, insn, alt);
        }
    }

    /* what came before the include goes first, ordered by postpone */

    if (ctx->out && ngx_http_esi_output(r, ctx) == NGX_ERROR) {
        return NGX_ERROR;
    }

    /* when it is done, what postpone holds behind it goes on */

    psr = ngx_palloc(r->pool, sizeof(ngx_http_post_subrequest_t));
    if (psr == NULL) {
        return NGX_ERROR;
    }

    psr->handler = ngx_http_esi_include_done;
    psr->data = ctx;

    if (insn->alt_path.len == 0 && !insn->continue_on_error
        && capture == NULL)
    {
        if (ngx_http_subrequest(r, path, args, &sr, psr, 0) != NGX_OK) {
            return ngx_http_esi_include_failed(r, ctx, insn, alt);
        }

        return NGX_OK;
    }

    /* the outcome decides what follows: wait for it */

    sctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
    if (sctx == NULL) {
        return NGX_ERROR;
    }

    sctx->fragment = 1;
    sctx->capture = capture;

    if (ngx_http_subrequest(r, path, args, &sr, psr,
                            NGX_HTTP_SUBREQUEST_WAITED)
        != NGX_OK)
    {
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    ngx_http_set_ctx(sr, sctx, ngx_http_esi_module);

    if (capture) {
        sr->filter_need_in_memory = 1;
    }

    ctx->wait = sr;
    ctx->wait_insn = insn;
    ctx->wait_alt = alt;
    ctx->wait_failed = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_include_failed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn, ngx_uint_t alt)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    if (!alt && insn->alt_path.len) {
        return ngx_http_esi_include(r, ctx, insn, 1);
    }

    if (insn->continue_on_error) {
        return NGX_OK;
    }

    ngx_http_esi_try_failed(ctx);

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->silent_errors) {
        return NGX_OK;
    }

    cl = ngx_http_esi_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->memory = 1;
    b->pos = ngx_http_esi_error_marker;
    b->last = ngx_http_esi_error_marker + sizeof(ngx_http_esi_error_marker) - 1;

    return NGX_OK;
}


/*
 * An include of the page counts against its esi_max_fragment_size.  One
 * whose Content-Length says it is larger fails as an error status does:
 * NGX_OK, its body is discarded.  NGX_DECLINED: it goes on, counted.
 */

static ngx_int_t
ngx_http_esi_fragment_header(ngx_http_request_t *r, ngx_http_esi_ctx_t **ctxp)
{
    ngx_http_esi_ctx_t       *ctx, *pctx;
    ngx_http_esi_loc_conf_t  *plcf;

    pctx = ngx_http_get_module_ctx(r->parent, ngx_http_esi_module);
    plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);

    if (pctx == NULL || !pctx->stream || plcf->max_fragment_size == 0) {
        return NGX_DECLINED;
    }

    ctx = *ctxp;

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_esi_module);
        *ctxp = ctx;
    }

    ctx->limited = 1;
    ctx->fragment_room = plcf->max_fragment_size;

    if (r->headers_out.content_length_n <= plcf->max_fragment_size) {
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "esi: include \"%V\" is larger than "
                  "esi_max_fragment_size %O (Content-Length %O), "
                  "include failed", &r->uri, plcf->max_fragment_size,
                  r->headers_out.content_length_n);

    ctx->oversized = 1;
    ctx->discard = 1;

    return NGX_OK;
}


/*
 * What an include sends past esi_max_fragment_size is consumed unseen; the
 * end of its response still goes on, so that the include, and an ESI
 * stream of its own, finish.
 */

static ngx_int_t
ngx_http_esi_fragment_limit(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t **in)
{
    off_t                     size;
    ngx_buf_t                *b;
    ngx_uint_t                end;
    ngx_chain_t              *cl, *out, **ll;
    ngx_http_esi_loc_conf_t  *plcf;

    size = 0;

    for (cl = *in; cl; cl = cl->next) {
        size += ngx_buf_size(cl->buf);
    }

    if (size <= ctx->fragment_room) {
        ctx->fragment_room -= size;
        return NGX_OK;
    }

    if (!ctx->cut) {
        ctx->cut = 1;
        plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: include \"%V\" is larger than "
                      "esi_max_fragment_size %O, the rest of it is "
                      "discarded", &r->uri, plcf->max_fragment_size);
    }

    out = NULL;
    ll = &out;
    end = 0;

    for (cl = *in; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size > ctx->fragment_room) {
            if (ctx->fragment_room == 0) {
                end |= b->last_in_chain;
                b->pos = b->last;
                b->file_pos = b->file_last;
                continue;
            }

            /* cut in place, as the range filter does */

            if (b->in_file) {
                b->file_last = b->file_pos + ctx->fragment_room;
            }

            if (ngx_buf_in_memory(b)) {
                b->last = b->pos + (size_t) ctx->fragment_room;
            }

            size = ctx->fragment_room;
        }

        ctx->fragment_room -= size;

        *ll = ngx_alloc_chain_link(r->pool);
        if (*ll == NULL) {
            return NGX_ERROR;
        }

        (*ll)->buf = b;
        ll = &(*ll)->next;
    }

    if (end) {
        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->last_in_chain = 1;
        b->sync = 1;

        *ll = ngx_alloc_chain_link(r->pool);
        if (*ll == NULL) {
            return NGX_ERROR;
        }

        (*ll)->buf = b;
        ll = &(*ll)->next;
    }

    *ll = NULL;
    *in = out;

    return NGX_OK;
}


/* in place of a parallel include refused by its Content-Length */

static ngx_int_t
ngx_http_esi_fragment_marker(ngx_http_request_t *r)
{
    ngx_buf_t                *b;
    ngx_chain_t               out;
    ngx_http_esi_loc_conf_t  *plcf;

    plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);

    if (plcf->silent_errors) {
        return NGX_OK;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->memory = 1;
    b->pos = ngx_http_esi_error_marker;
    b->last = ngx_http_esi_error_marker + sizeof(ngx_http_esi_error_marker) - 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_next_body_filter(r, &out);
}


static ngx_int_t
ngx_http_esi_include_done(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_esi_ctx_t  *ctx = data;
    ngx_http_esi_ctx_t  *sctx;

    sctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx->wait == r
        && (rc == NGX_ERROR
            || rc >= NGX_HTTP_BAD_REQUEST
            || r->headers_out.status >= NGX_HTTP_BAD_REQUEST
            || (sctx && sctx->oversized)))
    {
        ctx->wait_failed = 1;
    }

    /* r->done is set after this handler returns */

    if (!ctx->resume.posted) {
        ngx_post_event(&ctx->resume, &ngx_posted_events);
    }

    return rc;
}


/* bytes esid made, such as a substituted variable */

static ngx_int_t
ngx_http_esi_literal(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_str_t *text)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    ctx->made += text->len;

    if (elcf->max_page_size && ctx->made > elcf->max_page_size) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: esid made more than esi_max_page_size %O "
                      "of \"%V\"", elcf->max_page_size, &r->uri);
        return NGX_DECLINED;
    }

    if (text->len == 0) {
        return NGX_OK;
    }

    if (text->len <= NGX_HTTP_ESI_PACK_MAX) {
        return ngx_http_esi_pack(r, ctx, text->data, text->len);
    }

    cl = ngx_http_esi_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->memory = 1;
    b->pos = text->data;
    b->last = text->data + text->len;

    return NGX_OK;
}


#if (NGX_ZLIB)

/*
 * A run sent as its segment: the arena's bytes as they are, for the stitch
 * filter to forward; the run's own bytes are released unread.
 */

static ngx_int_t
ngx_http_esi_segment(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn)
{
    ngx_chain_t             *cl;
    ngx_http_esi_segment_t  *seg;

    seg = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_segment_t));
    if (seg == NULL) {
        return NGX_ERROR;
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    seg->buf.memory = 1;
    seg->buf.pos = insn->text.data;
    seg->buf.last = insn->text.data + insn->text.len;
    seg->buf.tag = (ngx_buf_tag_t) &ngx_http_esi_stitch_filter_module;
    seg->crc = insn->crc;
    seg->size = (off_t) insn->length;

    cl->buf = &seg->buf;
    cl->next = NULL;

    *ctx->last_out = cl;
    ctx->last_out = &cl->next;

    ctx->verbatim_end = insn->offset + (off_t) insn->length;

    return NGX_OK;
}

#endif


/*
 * <esi:attempt>: what came before is set aside (the outermost try sends it
 * first, flushed: see flush_held), and ctx->out starts afresh to hold the
 * attempt's output.
 */

static ngx_int_t
ngx_http_esi_try_start(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_try_t  *t;

    if (ctx->tries == NULL) {
        ctx->tries = ngx_palloc(r->pool, NGX_HTTP_ESI_TRY_MAX
                                         * sizeof(ngx_http_esi_try_t));
        if (ctx->tries == NULL) {
            return NGX_ERROR;
        }
    }

    if (ctx->attempts == 0) {
        if (ngx_http_esi_flush_held(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        if (ctx->out && ngx_http_esi_output(r, ctx) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    t = &ctx->tries[ctx->ntries++];

    t->out = ctx->out;
    t->last_out = ctx->last_out;
    t->attempt = 1;
    t->failed = 0;

    ctx->out = NULL;
    ctx->last_out = &ctx->out;
    ctx->pack = NULL;
    ctx->attempts++;

    return NGX_OK;
}


/* the attempt is over: its output goes on, or the except part runs */

static void
ngx_http_esi_try_except(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_try_t  *t;

    t = &ctx->tries[ctx->ntries - 1];

    if (t->failed) {
        ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                      "esi: an include of an attempt failed, "
                      "its except part is used");

        ngx_http_esi_try_close(ctx, 0);
        return;
    }

    ngx_http_esi_try_close(ctx, 1);

    ctx->skip = 1;
}


/* ends the innermost attempt, keeping or dropping its held output */

static void
ngx_http_esi_try_close(ngx_http_esi_ctx_t *ctx, ngx_uint_t keep)
{
    ngx_chain_t           *held, **last_held, *cl;
    ngx_http_esi_held_t   *h;
    ngx_http_esi_try_t    *t;

    t = &ctx->tries[ctx->ntries - 1];

    held = ctx->out;
    last_held = ctx->last_out;

    ctx->out = t->out;
    ctx->last_out = t->out ? t->last_out : &ctx->out;
    ctx->pack = NULL;

    t->attempt = 0;
    ctx->attempts--;

    if (keep) {
        if (held) {
            *ctx->last_out = held;
            ctx->last_out = last_held;
        }

        return;
    }

    while (held) {
        cl = held;
        held = cl->next;

        if (cl->buf->shadow) {
            for (h = ctx->held; h; h = h->next) {
                if (h->buf == cl->buf->shadow && h->refs) {
                    h->refs--;
                    break;
                }
            }
        }

        cl->next = ctx->free;
        ctx->free = cl;
    }
}


/* an include failed for good: so did the innermost attempt around it */

static void
ngx_http_esi_try_failed(ngx_http_esi_ctx_t *ctx)
{
    ngx_uint_t  i;

    for (i = ctx->ntries; i; i--) {
        if (ctx->tries[i - 1].attempt) {
            ctx->tries[i - 1].failed = 1;
            return;
        }
    }
}


/* the except part of a try whose attempt succeeded: nothing of it runs */

static void
ngx_http_esi_skip(ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn)
{
    switch (insn->type) {

    case NGX_HTTP_ESI_TRY_START:
        ctx->skip++;
        break;

    case NGX_HTTP_ESI_TRY_END:
        if (--ctx->skip == 0) {
            ctx->ntries--;
        }

        break;

    case NGX_HTTP_ESI_VERBATIM:
    case NGX_HTTP_ESI_SEGMENT:
        ctx->verbatim_end = insn->offset + insn->length;
        break;

    default: /* an include never fetched, a literal, a tryExcept */
        break;
    }
}


/*
 * Where the output of a request goes when it leaves this filter: down to
 * postpone, or, for an include inside an attempt, into the attempt's held
 * chain.  Postpone is called even then, with no data, so that it wakes
 * the request's own includes in order.
 */

static ngx_int_t
ngx_http_esi_next(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    if (ctx && ctx->capture) {
        if (ngx_http_esi_capture(r, ctx->capture, in) != NGX_OK) {
            return NGX_ERROR;
        }

        in = NULL;
    }

    return ngx_http_next_body_filter(r, in);
}


/*
 * Copies an include's output into the attempt that holds it: upstream
 * buffers are reused as soon as they are consumed.  The copies live in the
 * request's pool until it ends, so all the page's attempts together may
 * copy esi_max_page_size; past it the attempt fails.  After a fallback the
 * bytes have no place to go.
 */

static ngx_int_t
ngx_http_esi_capture(ngx_http_request_t *r, ngx_http_esi_ctx_t *to,
    ngx_chain_t *in)
{
    off_t                     size;
    u_char                   *p;
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(to->request, ngx_http_esi_module);

    for ( /* void */ ; in; in = in->next) {
        size = ngx_buf_size(in->buf);

        if (size == 0) {
            continue;
        }

        if (to->attempts == 0 || to->fallen) {
            /* void */

        } else if (!ngx_buf_in_memory(in->buf)) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" in an attempt is not in "
                          "memory", &r->uri);
            ngx_http_esi_try_failed(to);

        } else if (elcf->max_page_size
                   && to->captured + size > elcf->max_page_size)
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: includes held by an attempt exceed "
                          "esi_max_page_size %O, the attempt fails",
                          elcf->max_page_size);
            ngx_http_esi_try_failed(to);

        } else {
            p = ngx_pnalloc(r->pool, (size_t) size);
            if (p == NULL) {
                return NGX_ERROR;
            }

            cl = ngx_http_esi_link(to->request, to);
            if (cl == NULL) {
                return NGX_ERROR;
            }

            b = cl->buf;
            b->memory = 1;
            b->pos = p;
            b->last = ngx_cpymem(p, in->buf->pos, (size_t) size);

            to->captured += size;
        }

        in->buf->pos = in->buf->last;
        in->buf->file_pos = in->buf->file_last;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_fallback(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    off_t                     cut;
    ngx_int_t                 rc;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    ctx->fallen = 1;
    ctx->insns = NULL;
    ctx->last_insn = &ctx->insns;
    ctx->wait = NULL;

    /* what open attempts hold goes out as it is, before the rest */

    while (ctx->attempts) {
        while (!ctx->tries[ctx->ntries - 1].attempt) {
            ctx->ntries--;
        }

        ngx_http_esi_try_close(ctx, 1);
        ctx->ntries--;
    }

    ctx->ntries = 0;
    ctx->skip = 0;

    if (ctx->done) {
        return NGX_OK;
    }

    if (elcf->fallback == NGX_HTTP_ESI_ABORT) {
        ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: processing failed, request aborted");
        return NGX_ERROR;
    }

    ctx->status = NGX_HTTP_ESI_STATUS_PASSTHROUGH;
    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "esi: processing failed, rest of the body passed through "
                  "from offset %O", ngx_max(ctx->released, ctx->verbatim_end));

    /* what esid had not covered yet goes out unprocessed */

    cut = ngx_max(ctx->released, ctx->verbatim_end);

    if (cut < ctx->received) {
        rc = ngx_http_esi_verbatim(r, ctx, cut, ctx->received);
        if (rc != NGX_OK) {
            return NGX_ERROR;
        }

    } else {

        /* a segment went out for bytes still to come: they must not */

        ctx->passed = cut - ctx->received;
    }

    ctx->released = NGX_MAX_OFF_T_VALUE;
    ctx->send_held = NULL;

    if (ctx->input_done) {
        return ngx_http_esi_final(r, ctx);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_final(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = ngx_http_esi_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->sync = 1;

    if (r == r->main) {
        b->last_buf = 1;

    } else {
        b->last_in_chain = 1;
    }

    ctx->done = 1;

    return NGX_OK;
}


static ngx_chain_t *
ngx_http_esi_link(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_uint_t    i;
    ngx_chain_t  *cl;

    if (ctx->free == NULL) {
        b = ngx_palloc(r->pool, NGX_HTTP_ESI_BATCH * sizeof(ngx_buf_t));
        cl = ngx_palloc(r->pool, NGX_HTTP_ESI_BATCH * sizeof(ngx_chain_t));

        if (b == NULL || cl == NULL) {
            return NULL;
        }

        for (i = 0; i < NGX_HTTP_ESI_BATCH; i++) {
            cl[i].buf = &b[i];
            cl[i].next = ctx->free;
            ctx->free = &cl[i];
        }
    }

    cl = ctx->free;
    ctx->free = cl->next;
    b = cl->buf;
    ngx_memzero(b, sizeof(ngx_buf_t));

    b->tag = (ngx_buf_tag_t) &ngx_http_esi_module;
    cl->next = NULL;

    *ctx->last_out = cl;
    ctx->last_out = &cl->next;

    ctx->flushed = 0;

    return cl;
}


/*
 * Small pieces of output (a value, the tags between a construct's values)
 * are copied one after another into a buffer of their own: linked apart,
 * each would cost a buf in every filter and an iovec in writev, more than
 * copying its few bytes.  A larger piece (an attempt's) gets a buffer of
 * its size.
 */

static ngx_int_t
ngx_http_esi_pack(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    u_char *data, size_t len)
{
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ctx->pack;

    if (b == NULL || ctx->last_out != ctx->pack_next
        || (size_t) (b->end - b->last) < len)
    {
        cl = ngx_http_esi_link(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;

        size = ngx_max(len, NGX_HTTP_ESI_PACK_SIZE);

        b->start = ngx_pnalloc(r->pool, size);
        if (b->start == NULL) {
            return NGX_ERROR;
        }

        b->pos = b->start;
        b->last = b->start;
        b->end = b->start + size;
        b->temporary = 1;

        ctx->pack = b;
        ctx->pack_next = &cl->next;
    }

    b->last = ngx_cpymem(b->last, data, len);

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_output(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    if (ctx->attempts) {

        /* held until the attempt's outcome is known */

        rc = ngx_http_esi_next(r, ctx, NULL);

    } else {
        rc = ngx_http_esi_next(r, ctx, ctx->out);

        if (ctx->busy == NULL) {
            ctx->busy = ctx->out;

        } else {
            for (cl = ctx->busy; cl->next; cl = cl->next) { /* void */ }
            cl->next = ctx->out;
        }

        ctx->out = NULL;
        ctx->last_out = &ctx->out;
        ctx->pack = NULL;
    }

    while (ctx->busy) {

        cl = ctx->busy;
        b = cl->buf;

        if (ngx_buf_size(b) != 0) {
            break;
        }

        ctx->busy = cl->next;

        if (b->tag == NGX_HTTP_ESI_INFLATED) {

            /* one that went out as it is, after a fallback */

            ngx_http_esi_recycle(r, ctx, b, cl);
            continue;
        }

        if (b->tag != (ngx_buf_tag_t) &ngx_http_esi_module) {
            ngx_free_chain(r->pool, cl);
            continue;
        }

        if (b->shadow) {
            for (h = ctx->held; h; h = h->next) {
                if (h->buf == b->shadow && h->refs) {
                    h->refs--;
                    break;
                }
            }
        }

        if (ngx_buf_in_memory(b)) {
            cl->next = ctx->free;
            ctx->free = cl;
        }
    }

    ngx_http_esi_release(ctx);

    return rc;
}


/* input is consumed once esid released it and its output went out */

static void
ngx_http_esi_release(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_request_t   *r;
    ngx_http_esi_held_t  *h;

    while (ctx->held) {
        h = ctx->held;

        if (h->refs || h->end > ctx->released) {
            break;
        }

        h->buf->pos = h->buf->last;

        if (h->buf->tag == NGX_HTTP_ESI_INFLATED) {
            ngx_http_esi_recycle(ctx->request, ctx, h->buf, NULL);
        }

        ctx->held = h->next;
        h->next = ctx->free_held;
        ctx->free_held = h;
    }

    if (ctx->held == NULL) {
        ctx->last_held = &ctx->held;
    }

    r = ctx->request;

    /* output waiting further down is not ours to report */

    if (ctx->out || ctx->zin || (!ctx->done && !ctx->fallen)) {
        r->buffered |= NGX_HTTP_ESI_BUFFERED;

    } else {
        r->buffered &= ~NGX_HTTP_ESI_BUFFERED;
    }
}


/*
 * Whether the stream can go on only with more of the body: esid answered
 * all of it that it has, or the plan runs past what arrived, and every
 * instruction has run.  The body's buffers it holds must then go back to
 * whoever reads the body, who may have no other (output_buffers 1, or a
 * construct longer than a buffer) and would read no more.
 */

static ngx_uint_t
ngx_http_esi_starved(ngx_http_esi_ctx_t *ctx)
{
    if (ctx->input_done || ctx->failed || ctx->fallen || ctx->insns
        || ctx->wait)
    {
        return 0;
    }

    if (ctx->planned) {
        return ctx->plan_starved;
    }

    return !ctx->plan_wait && ctx->awaiting == 0
           && ctx->sent == ctx->received;
}


/*
 * Output that points into the body's buffers goes out now, however small:
 * the write filter would hold it back (postpone_output) until more output
 * came, that is, until more body was read.  Not while an attempt holds
 * the output: the attempt's start flushed what came before it.
 */

static ngx_int_t
ngx_http_esi_flush_held(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    if (ctx->flushed || ctx->attempts) {
        return NGX_OK;
    }

    for (h = ctx->held; h; h = h->next) {
        if (h->refs && h->buf->tag != ctx
            && h->buf->tag != NGX_HTTP_ESI_INFLATED)
        {
            break;
        }
    }

    if (h == NULL) {
        return NGX_OK;
    }

    cl = ngx_http_esi_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->flush = 1;
    ctx->flushed = 1;

    return NGX_OK;
}


/*
 * A starved stream holds copies of the bytes it has not released yet
 * rather than the body's buffers they are in (those output still points
 * into go back once it went out).
 */

static ngx_int_t
ngx_http_esi_own_held(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    off_t                 from;
    size_t                size;
    ngx_buf_t            *b, *nb;
    ngx_http_esi_held_t  *h;

    for (h = ctx->held; h; h = h->next) {
        b = h->buf;
        from = ngx_max(h->offset, ctx->released);

        if (h->refs || from >= h->end || b->tag == ctx
            || b->tag == NGX_HTTP_ESI_INFLATED)
        {
            continue;
        }

        size = (size_t) (h->end - from);

        nb = ngx_create_temp_buf(r->pool, size);
        if (nb == NULL) {
            return NGX_ERROR;
        }

        nb->last = ngx_cpymem(nb->pos, h->start + (from - h->offset), size);
        nb->tag = ctx;

        /* no later instruction reads below "released" */

        b->pos = b->last;

        h->buf = nb;
        h->start = nb->pos;
        h->offset = from;
    }

    return NGX_OK;
}


/* purge */

/*
 * The same-location form: a request with the configured method, in a
 * location whose proxy_cache zone esid indexes, is a purge when it comes
 * from an allowed address.
 */

static ngx_int_t
ngx_http_esi_purge_access(ngx_http_request_t *r)
{
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->purge != NGX_HTTP_ESI_PURGE_METHOD
        || r != r->main
        || r->method_name.len != elcf->purge_method.len
        || ngx_strncmp(r->method_name.data, elcf->purge_method.data,
                       r->method_name.len)
           != 0)
    {
        return NGX_DECLINED;
    }

    if (elcf->purge_from
        && ngx_cidr_match(r->connection->sockaddr, elcf->purge_from)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: purge by %V forbidden", &r->connection->addr_text);
        return NGX_HTTP_FORBIDDEN;
    }

    r->content_handler = ngx_http_esi_purge_handler;

    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_esi_purge_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_str_t                 key;
    ngx_pool_cleanup_t       *cln;
    ngx_http_esi_purge_t     *p;
    ngx_http_esi_daemon_t    *d;
    ngx_http_esi_loc_conf_t  *elcf;

    if (r != r->main) {
        return NGX_HTTP_FORBIDDEN;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);
    d = &ngx_http_esi_daemon;

    p = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_purge_t));
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_esi_purge_cleanup;
    cln->data = p;

    p->request = r;
    p->pool = r->pool;
    p->log = r->connection->log;

    if (ngx_http_esi_purge_init(p, elcf->purge_zone) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_esi_purge_tags(r, p) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (p->tags == NULL) {
        if (ngx_http_complex_value(r, elcf->purge_key, &key) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p->kind = NGX_HTTP_ESI_PURGE_KEY;

        if (key.len && key.data[key.len - 1] == '*') {
            p->kind = NGX_HTTP_ESI_PURGE_PREFIX;
            key.len--;
        }

        p->key = key;
    }

    if (d->state == NGX_HTTP_ESI_IDLE && d->conf) {

        /* esid may be back before the backoff says so */

        if (d->reconnect.timer_set) {
            ngx_del_timer(&d->reconnect);
        }

        ngx_http_esi_connect(d);
    }

    if (d->state == NGX_HTTP_ESI_IDLE) {
        p->status = NGX_HTTP_SERVICE_UNAVAILABLE;
        ngx_str_set(&p->error, "esid is not connected");

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: purge of \"%V\" failed: esid is not connected",
                      &p->key);

        return ngx_http_esi_purge_respond(r, p);
    }

    if (ngx_http_esi_purge_send(p) != NGX_OK) {
        p->status = NGX_HTTP_SERVICE_UNAVAILABLE;
        ngx_str_set(&p->error, "cannot ask esid");
        return ngx_http_esi_purge_respond(r, p);
    }

    r->main->count++;

    return NGX_DONE;
}


static ngx_int_t
ngx_http_esi_purge_init(ngx_http_esi_purge_t *p, ngx_shm_zone_t *zone)
{
    p->zone = zone;
    p->cache = zone->data;

    p->timer.handler = ngx_http_esi_purge_timeout_handler;
    p->timer.data = p;
    p->timer.log = p->log;

    p->finish.handler = ngx_http_esi_purge_finish_handler;
    p->finish.data = p;
    p->finish.log = p->log;

    /* "path/" + "l/ll/" + 32 hex digits, as ngx_http_file_cache_name() */

    p->name_len = p->cache->path->name.len + 1 + p->cache->path->len
                  + 2 * NGX_HTTP_CACHE_KEY_LEN;

    p->name = ngx_pnalloc(p->pool, p->name_len + 1);
    if (p->name == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p->name, p->cache->path->name.data, p->cache->path->name.len);

    return NGX_OK;
}


/*
 * esictl's purge, relayed by esid: carried out as an HTTP purge would be,
 * with no request; its outcome goes back as Request.purgeDone.  A malformed
 * order is a lying esid; an order this worker cannot carry out is answered
 * with an error.
 */

static ngx_int_t
ngx_http_esi_purge_order(ngx_http_esi_daemon_t *d, uint32_t order,
    esi_wire_struct_t *root)
{
    size_t                 n;
    uint16_t               which;
    ngx_str_t              zone, *tag;
    unsigned               ptr;
    ngx_uint_t             i;
    ngx_pool_t            *pool;
    const char            *text;
    ngx_shm_zone_t       **zones;
    esi_wire_struct_t      purge;
    ngx_http_esi_purge_t  *p;

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PURGE_ORDER_PTR, &purge)
        != 0
        || esi_wire_get_text(&purge, ESI_WIRE_PURGE_ZONE_PTR, &text, &n) != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge order from esid");
        return NGX_ERROR;
    }

    zone.data = (u_char *) text;
    zone.len = n;

    pool = ngx_create_pool(NGX_DEFAULT_POOL_SIZE, d->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    p = ngx_pcalloc(pool, sizeof(ngx_http_esi_purge_t));
    if (p == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    p->pool = pool;
    p->log = d->log;
    p->order = order;

    which = esi_wire_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET);

    switch (which) {

    case ESI_WIRE_PURGE_KEY_PREFIX_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_PREFIX;
        ptr = ESI_WIRE_PURGE_KEY_PREFIX_PTR;
        break;

    case ESI_WIRE_PURGE_TAG_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_TAG;
        ptr = ESI_WIRE_PURGE_TAG_PTR;
        break;

    case ESI_WIRE_PURGE_KEY_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_KEY;
        ptr = ESI_WIRE_PURGE_KEY_PTR;
        break;

    default:
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: purge order %uD of unknown kind %ud",
                      order, which);
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    /* the ring slot is released after this returns: keep copies */

    if (esi_wire_get_text(&purge, ptr, &text, &n) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge order from esid");
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    p->key.len = n;
    p->key.data = ngx_pnalloc(pool, n + 1);
    if (p->key.data == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    ngx_memcpy(p->key.data, text, n);

    if (p->kind == NGX_HTTP_ESI_PURGE_TAG) {
        p->tags = ngx_array_create(pool, 1, sizeof(ngx_str_t));
        if (p->tags == NULL) {
            ngx_destroy_pool(pool);
            return NGX_ERROR;
        }

        tag = ngx_array_push(p->tags);
        *tag = p->key;
    }

    ngx_log_error(NGX_LOG_INFO, d->log, 0,
                  "esi: esid relays purge order %uD of \"%V\" in zone \"%V\"",
                  order, &p->key, &zone);

    zones = d->conf->purge_zones.elts;

    for (i = 0; i < d->conf->purge_zones.nelts; i++) {
        if (zones[i]->shm.name.len == zone.len
            && ngx_strncmp(zones[i]->shm.name.data, zone.data, zone.len) == 0)
        {
            break;
        }
    }

    if (i == d->conf->purge_zones.nelts) {
        ngx_str_set(&p->error, "this worker serves no such zone");
        ngx_http_esi_purge_report(p);
        return NGX_OK;
    }

    if (ngx_http_esi_purge_init(p, zones[i]) != NGX_OK
        || ngx_http_esi_purge_send(p) != NGX_OK)
    {
        ngx_str_set(&p->error, "cannot ask esid");
        ngx_http_esi_purge_report(p);
    }

    return NGX_OK;
}


/* a Surrogate-Key request header makes it a purge by tag, one per tag */

static ngx_int_t
ngx_http_esi_purge_tags(ngx_http_request_t *r, ngx_http_esi_purge_t *p)
{
    u_char           *s, *e, *end;
    ngx_str_t        *tag;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof("Surrogate-Key") - 1
            || ngx_strncasecmp(h[i].key.data, (u_char *) "Surrogate-Key",
                               h[i].key.len)
               != 0)
        {
            continue;
        }

        if (p->tags == NULL) {
            p->tags = ngx_array_create(r->pool, 4, sizeof(ngx_str_t));
            if (p->tags == NULL) {
                return NGX_ERROR;
            }

            p->kind = NGX_HTTP_ESI_PURGE_TAG;
            p->key = h[i].value;
        }

        end = h[i].value.data + h[i].value.len;

        for (s = h[i].value.data; s < end; s = e) {
            while (s < end && (*s == ' ' || *s == '\t' || *s == ',')) {
                s++;
            }

            for (e = s; e < end && *e != ' ' && *e != '\t' && *e != ','; e++)
            {
                /* void */
            }

            if (e == s) {
                continue;
            }

            tag = ngx_array_push(p->tags);
            if (tag == NULL) {
                return NGX_ERROR;
            }

            tag->data = s;
            tag->len = e - s;
        }
    }

    return NGX_OK;
}


/* Request{purge} under a fresh id, from the id space of the streams */

static ngx_int_t
ngx_http_esi_purge_send(ngx_http_esi_purge_t *p)
{
    size_t                  need;
    u_char                 *buf;
    uint16_t                which;
    unsigned                ptr;
    ngx_str_t              *value, *zone, *tag;
    esi_wire_out_t          req, purge;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;
    zone = &p->zone->shm.name;

    switch (p->kind) {

    case NGX_HTTP_ESI_PURGE_PREFIX:
        which = ESI_WIRE_PURGE_KEY_PREFIX_WHICH;
        ptr = ESI_WIRE_PURGE_KEY_PREFIX_PTR;
        value = &p->key;
        break;

    case NGX_HTTP_ESI_PURGE_TAG:
        which = ESI_WIRE_PURGE_TAG_WHICH;
        ptr = ESI_WIRE_PURGE_TAG_PTR;
        tag = p->tags->elts;
        value = &tag[p->next_tag++];
        break;

    default: /* NGX_HTTP_ESI_PURGE_KEY */
        which = ESI_WIRE_PURGE_KEY_WHICH;
        ptr = ESI_WIRE_PURGE_KEY_PTR;
        value = &p->key;
        break;
    }

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_PURGE_DATA_WORDS
                         + ESI_WIRE_PURGE_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(value->len + 1));

    buf = ngx_palloc(p->pool, need);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    p->node.key = d->next_id++;

    esi_wire_builder_init(&b, buf, need);

    (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                         ESI_WIRE_REQUEST_POINTERS, &req);
    esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET,
                     (uint32_t) p->node.key);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                     ESI_WIRE_REQUEST_PURGE_WHICH);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_PURGE_PTR,
                               ESI_WIRE_PURGE_DATA_WORDS,
                               ESI_WIRE_PURGE_POINTERS, &purge);
    (void) esi_wire_set_text(&purge, ESI_WIRE_PURGE_ZONE_PTR,
                             (const char *) zone->data, zone->len);
    esi_wire_set_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET, which);
    (void) esi_wire_set_text(&purge, ptr, (const char *) value->data,
                             value->len);

    if (esi_wire_finish(&b) != need) {
        return NGX_ERROR;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, p->log, 0,
                   "esi purge %ui \"%V\"", p->node.key, value);

    if (ngx_http_esi_post(d, buf, need) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_rbtree_insert(&d->purges, &p->node);
    p->in_table = 1;

    ngx_add_timer(&p->timer, d->conf->purge_timeout);

    return NGX_OK;
}


/*
 * Removes one file esid named: marks its keys_zone node as a purge must
 * (under the zone's mutex; a node someone else already marked is left
 * alone), then unlinks the file.  Returns 1 when the file was purged.
 */

static ngx_uint_t
ngx_http_esi_purge_file(ngx_http_esi_purge_t *p, const u_char *key)
{
    u_char                      *last;
    ngx_err_t                    err;
    ngx_uint_t                   marked, unlinked;
    ngx_http_file_cache_t       *cache;
    ngx_http_file_cache_node_t  *fcn;

    cache = p->cache;
    marked = 0;
    unlinked = 0;

    ngx_shmtx_lock(&cache->shpool->mutex);

    fcn = ngx_http_esi_cache_lookup(cache, key);

    if (fcn && fcn->exists) {
        cache->sh->size -= fcn->fs_size;
        fcn->fs_size = 0;
        fcn->exists = 0;
        fcn->updating = 0;
        marked = 1;
    }

    ngx_shmtx_unlock(&cache->shpool->mutex);

    last = ngx_hex_dump(p->name + cache->path->name.len + 1 + cache->path->len,
                        (u_char *) key, NGX_HTTP_CACHE_KEY_LEN);
    *last = '\0';

    ngx_create_hashed_filename(cache->path, p->name, p->name_len);

    if (ngx_delete_file(p->name) == NGX_FILE_ERROR) {
        err = ngx_errno;

        if (err != NGX_ENOENT) {
            ngx_log_error(NGX_LOG_CRIT, p->log, err,
                          ngx_delete_file_n " \"%s\" failed", p->name);
        }

    } else {
        unlinked = 1;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, p->log, 0,
                   "esi purge file \"%s\" marked:%ui unlinked:%ui",
                   p->name, marked, unlinked);

    return marked || unlinked;
}


/* ngx_http_file_cache_lookup(), which is static */

static ngx_http_file_cache_node_t *
ngx_http_esi_cache_lookup(ngx_http_file_cache_t *cache, const u_char *key)
{
    ngx_int_t                    rc;
    ngx_rbtree_key_t             node_key;
    ngx_rbtree_node_t           *node, *sentinel;
    ngx_http_file_cache_node_t  *fcn;

    ngx_memcpy((u_char *) &node_key, key, sizeof(ngx_rbtree_key_t));

    node = cache->sh->rbtree.root;
    sentinel = cache->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (node_key < node->key) {
            node = node->left;
            continue;
        }

        if (node_key > node->key) {
            node = node->right;
            continue;
        }

        /* node_key == node->key */

        fcn = (ngx_http_file_cache_node_t *) node;

        rc = ngx_memcmp(&key[sizeof(ngx_rbtree_key_t)], fcn->key,
                        NGX_HTTP_CACHE_KEY_LEN - sizeof(ngx_rbtree_key_t));

        if (rc == 0) {
            return fcn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


/* the answer goes out from a posted event, never from inside the caller */

static void
ngx_http_esi_purge_done(ngx_http_esi_purge_t *p, ngx_uint_t status,
    const char *error)
{
    if (p->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.purges, &p->node);
        p->in_table = 0;
    }

    if (p->timer.timer_set) {
        ngx_del_timer(&p->timer);
    }

    p->status = status;

    if (error) {
        p->error.data = (u_char *) error;
        p->error.len = ngx_strlen(error);
    }

    if (!p->finish.posted) {
        ngx_post_event(&p->finish, &ngx_posted_events);
    }
}


/*
 * esid already forgot what it told us about; an answer we ignore would
 * leave files on disk that its index no longer lists.  So a late esid is
 * dropped, as for streams: when the connection ends esid doubts the zone,
 * and the next purge of it reads the directory.
 */

static void
ngx_http_esi_purge_timeout_handler(ngx_event_t *ev)
{
    ngx_http_esi_purge_t  *p;

    p = ev->data;

    ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                  "esi: esid did not answer purge %ui in time",
                  p->node.key);

    ngx_http_esi_drop(&ngx_http_esi_daemon, NGX_LOG_ERR,
                      "esi: dropping the connection to esid");
}


static void
ngx_http_esi_purge_finish_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c;
    ngx_http_request_t    *r;
    ngx_http_esi_purge_t  *p;

    p = ev->data;
    r = p->request;

    if (r == NULL) {
        ngx_http_esi_purge_report(p);
        return;
    }

    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_http_finalize_request(r, ngx_http_esi_purge_respond(r, p));
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_esi_purge_respond(ngx_http_request_t *r, ngx_http_esi_purge_t *p)
{
    size_t            len;
    u_char           *last;
    uintptr_t         escape;
    ngx_int_t         rc;
    ngx_buf_t        *b;
    ngx_str_t        *kind;
    ngx_chain_t       out;
    ngx_table_elt_t  *h;

    kind = &ngx_http_esi_purge_kinds[p->kind];

    if (p->status == 0) {
        p->status = p->count ? NGX_HTTP_OK : NGX_HTTP_NOT_FOUND;
    }

    ngx_http_esi_purge_log(p);

    r->headers_out.status = p->status;

    if (p->status != NGX_HTTP_SERVICE_UNAVAILABLE) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Cache-Purge-Result");

        h->value.data = ngx_pnalloc(r->pool,
                                    kind->len + sizeof("; count=") - 1
                                    + NGX_INT_T_LEN);
        if (h->value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->value.len = ngx_sprintf(h->value.data, "%V; count=%ui",
                                   kind, p->count)
                       - h->value.data;
    }

    escape = 2 * ngx_escape_html(NULL, p->key.data, p->key.len)
             + 2 * ngx_escape_html(NULL, p->error.data, p->error.len);

    len = sizeof("<html><head><title>Purge unavailable</title></head>"
                 "<body><h1>Purge unavailable</h1><p>Key: </p>"
                 "<p>: 18446744073709551615 file(s) removed</p><p></p>"
                 "</body></html>" CRLF)
          + sizeof("wildcard") + p->key.len + p->error.len + escape;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    last = b->last;

    switch (p->status) {

    case NGX_HTTP_OK:
        last = ngx_cpymem(last, "<html><head><title>Successful purge</title>"
                          "</head><body><h1>Successful purge</h1>",
                          sizeof("<html><head><title>Successful purge</title>"
                                 "</head><body><h1>Successful purge</h1>")
                          - 1);
        break;

    case NGX_HTTP_NOT_FOUND:
        last = ngx_cpymem(last, "<html><head><title>Not cached</title>"
                          "</head><body><h1>Not cached</h1>",
                          sizeof("<html><head><title>Not cached</title>"
                                 "</head><body><h1>Not cached</h1>") - 1);
        break;

    default:
        last = ngx_cpymem(last, "<html><head><title>Purge unavailable</title>"
                          "</head><body><h1>Purge unavailable</h1>",
                          sizeof("<html><head><title>Purge unavailable"
                                 "</title></head><body><h1>Purge unavailable"
                                 "</h1>") - 1);
        break;
    }

    last = ngx_sprintf(last, "<p>%s: ",
                       p->kind == NGX_HTTP_ESI_PURGE_TAG ? "Tag"
                       : p->kind == NGX_HTTP_ESI_PURGE_PREFIX ? "Prefix"
                       : "Key");
    last = (u_char *) ngx_escape_html(last, p->key.data, p->key.len);
    last = ngx_sprintf(last, "</p><p>%V: %ui file(s) removed</p>",
                       kind, p->count);

    if (p->error.len) {
        last = ngx_cpymem(last, "<p>", 3);
        last = (u_char *) ngx_escape_html(last, p->error.data, p->error.len);
        last = ngx_cpymem(last, "</p>", 4);
    }

    last = ngx_cpymem(last, "</body></html>" CRLF,
                      sizeof("</body></html>" CRLF) - 1);

    b->last = last;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    ngx_str_set(&r->headers_out.content_type, "text/html");
    r->headers_out.content_type_len = sizeof("text/html") - 1;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


static void
ngx_http_esi_purge_log(ngx_http_esi_purge_t *p)
{
    ngx_log_error(NGX_LOG_INFO, p->log, 0,
                  "esi: %V purge of \"%V\": %ui file(s) removed%s%s%V",
                  &ngx_http_esi_purge_kinds[p->kind], &p->key, p->count,
                  p->scanned ? ", zone directory read" : ", via variant index",
                  p->error.len ? ", " : "", &p->error);
}


/* Request{purgeDone} for an order; the order's pool goes with it */

static void
ngx_http_esi_purge_report(ngx_http_esi_purge_t *p)
{
    size_t                  need;
    u_char                 *buf;
    esi_wire_out_t          req, done;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (p->status == NGX_HTTP_SERVICE_UNAVAILABLE && p->error.len == 0) {
        ngx_str_set(&p->error, "esid could not answer");
    }

    ngx_http_esi_purge_log(p);

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_PURGE_DONE_DATA_WORDS
                         + ESI_WIRE_PURGE_DONE_POINTERS,
                         esi_wire_blob(p->error.len + 1));

    buf = ngx_palloc(p->pool, need);

    if (buf) {
        esi_wire_builder_init(&b, buf, need);

        (void) esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                             ESI_WIRE_REQUEST_POINTERS, &req);
        esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, p->order);
        esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET,
                         ESI_WIRE_REQUEST_PURGE_DONE_WHICH);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_PURGE_DONE_PTR,
                                   ESI_WIRE_PURGE_DONE_DATA_WORDS,
                                   ESI_WIRE_PURGE_DONE_POINTERS, &done);
        esi_wire_set_u64(&done, ESI_WIRE_PURGE_DONE_COUNT_OFFSET,
                         (uint64_t) p->count);
        esi_wire_set_bool(&done, ESI_WIRE_PURGE_DONE_SCANNED_BIT, p->scanned);
        (void) esi_wire_set_text(&done, ESI_WIRE_PURGE_DONE_ERROR_PTR,
                                 (const char *) p->error.data, p->error.len);

        /* esid fails the order itself when the connection is gone */

        if (esi_wire_finish(&b) == need) {
            (void) ngx_http_esi_post(d, buf, need);
        }
    }

    ngx_destroy_pool(p->pool);
}


static void
ngx_http_esi_purge_cleanup(void *data)
{
    ngx_http_esi_purge_t  *p = data;

    if (p->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.purges, &p->node);
        p->in_table = 0;
    }

    if (p->timer.timer_set) {
        ngx_del_timer(&p->timer);
    }

    if (p->finish.posted) {
        ngx_delete_posted_event(&p->finish);
    }
}


/* Surrogate headers (W3C Note "Edge Architecture Specification 1.0") */

/*
 * esi_surrogate: the request upstream says Surrogate-Capability NAME=
 * "ESI/1.0", ours only: a client's would let it ask the origin for markup
 * meant for us, or pretend to be a surrogate in front of us.
 */

static ngx_int_t
ngx_http_esi_capability(ngx_http_request_t *r)
{
    ngx_uint_t                i, ours, forged;
    ngx_list_t                headers;
    ngx_list_part_t          *part;
    ngx_table_elt_t          *h, *nh;
    ngx_http_esi_loc_conf_t  *elcf;

    static u_char  name[] = "Surrogate-Capability";
    static u_char  lowcase[] = "surrogate-capability";

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->capability.len == 0) {
        return NGX_DECLINED;
    }

    ours = 0;
    forged = 0;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len != sizeof(name) - 1
            || ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1) != 0)
        {
            continue;
        }

        if (!ours
            && h[i].value.len == elcf->capability.len
            && ngx_strncmp(h[i].value.data, elcf->capability.data,
                           elcf->capability.len) == 0)
        {
            ours = 1;

        } else {
            forged = 1;
        }
    }

    if (ours && !forged) {
        return NGX_DECLINED;
    }

    /*
     * A subrequest's list shares its parts with the parent's, so it is
     * never pushed to; a client's header cannot be taken out of a list:
     * either way the list is built anew, without them
     */

    if (forged || r != r->main) {
        if (ngx_list_init(&headers, r->pool, 20, sizeof(ngx_table_elt_t))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        part = &r->headers_in.headers.part;
        h = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (h[i].key.len == sizeof(name) - 1
                && ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1)
                   == 0)
            {
                continue;
            }

            nh = ngx_list_push(&headers);
            if (nh == NULL) {
                return NGX_ERROR;
            }

            *nh = h[i];
        }

        r->headers_in.headers = headers;

        if (headers.last == &headers.part) {
            r->headers_in.headers.last = &r->headers_in.headers.part;
        }
    }

    nh = ngx_list_push(&r->headers_in.headers);
    if (nh == NULL) {
        return NGX_ERROR;
    }

    nh->hash = ngx_hash_key(lowcase, sizeof(lowcase) - 1);
    nh->key.len = sizeof(name) - 1;
    nh->key.data = name;
    nh->value = elcf->capability;
    nh->lowcase_key = lowcase;

    return NGX_DECLINED;
}


/*
 * esi_surrogate_control on: a response is ours to process only when its
 * Surrogate-Control says content="ESI/1.0" to us; its no-store and max-age
 * decide for the cached object, as Cache-Control does for others (this
 * header filter runs before the upstream module decides to store it).  The
 * client never sees the header; the cache file keeps it, so that a hit
 * decides the same way.  NGX_DECLINED: not for ESI.
 */

static ngx_int_t
ngx_http_esi_surrogate_control(ngx_http_request_t *r,
    ngx_http_esi_loc_conf_t *elcf)
{
    time_t                     max_age;
    ngx_uint_t                 i;
    ngx_list_part_t           *part;
    ngx_table_elt_t           *h;
    ngx_http_upstream_t       *u;
    ngx_http_esi_surrogate_t   sc;

    static u_char  name[] = "Surrogate-Control";

    sc.max_age = -1;
    sc.max_age_targeted = -1;
    sc.esi = 0;
    sc.no_store = 0;

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash == 0
            || h[i].key.len != sizeof(name) - 1
            || ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1) != 0)
        {
            continue;
        }

        ngx_http_esi_surrogate_parse(&h[i].value, &elcf->surrogate, &sc);

        h[i].hash = 0;
    }

    u = r->upstream;

    if (u && r->cache && u->cacheable && !r->cached) {
        max_age = sc.max_age_targeted >= 0 ? sc.max_age_targeted
                                           : sc.max_age;

        if (sc.no_store || max_age == 0) {
            u->cacheable = 0;

        } else if (max_age > 0) {
            r->cache->valid_sec = ngx_time() + max_age;
        }
    }

    return sc.esi ? NGX_OK : NGX_DECLINED;
}


/*
 * One Surrogate-Control value: comma-separated directives, each with an
 * optional ";target"; those without a target or for ours are taken.
 * Anything else, malformed or unknown, is skipped.
 */

static void
ngx_http_esi_surrogate_parse(ngx_str_t *value, ngx_str_t *name,
    ngx_http_esi_surrogate_t *sc)
{
    u_char     *p, *end, *start, *last, *target, *v, *q;
    time_t      n;
    size_t      len;
    ngx_uint_t  quoted, targeted;

    p = value->data;
    end = p + value->len;

    while (p < end) {

        /* one directive: up to a comma outside quotes */

        start = p;
        target = NULL;
        quoted = 0;

        for ( /* void */ ; p < end; p++) {
            if (*p == '"') {
                quoted = !quoted;

            } else if (!quoted && *p == ',') {
                break;

            } else if (!quoted && *p == ';' && target == NULL) {
                target = p;
            }
        }

        last = target ? target : p;
        p++;        /* past the comma */

        while (start < last && (*start == ' ' || *start == '\t')) {
            start++;
        }

        while (last > start && (last[-1] == ' ' || last[-1] == '\t')) {
            last--;
        }

        targeted = 0;

        if (target) {
            target++;
            q = ngx_min(p - 1, end);

            while (target < q && (*target == ' ' || *target == '\t')) {
                target++;
            }

            while (q > target && (q[-1] == ' ' || q[-1] == '\t')) {
                q--;
            }

            len = q - target;

            if (len != name->len || len == 0
                || ngx_strncasecmp(target, name->data, len) != 0)
            {
                continue;
            }

            targeted = 1;
        }

        len = last - start;

        if (len == sizeof("no-store") - 1
            && ngx_strncasecmp(start, (u_char *) "no-store", len) == 0)
        {
            sc->no_store = 1;
            continue;
        }

        v = ngx_strlchr(start, last, '=');
        if (v == NULL) {
            continue;
        }

        len = v - start;
        v++;

        if (len == sizeof("max-age") - 1
            && ngx_strncasecmp(start, (u_char *) "max-age", len) == 0)
        {
            /* max-age=N[+M]: M is for stale content, N is ours */

            q = ngx_strlchr(v, last, '+');
            n = ngx_atotm(v, (q ? q : last) - v);

            if (n == NGX_ERROR) {
                continue;
            }

            if (targeted) {
                sc->max_age_targeted = n;

            } else {
                sc->max_age = n;
            }

            continue;
        }

        if (len == sizeof("content") - 1
            && ngx_strncasecmp(start, (u_char *) "content", len) == 0)
        {
            /* content="ESI/1.0 ESI-INLINE/1.0": a space-separated list */

            if (v < last && *v == '"') {
                v++;
            }

            if (last > v && last[-1] == '"') {
                last--;
            }

            while (v < last) {
                while (v < last && *v == ' ') {
                    v++;
                }

                q = v;

                while (q < last && *q != ' ') {
                    q++;
                }

                if (q - v == sizeof("ESI/1.0") - 1
                    && ngx_strncasecmp(v, (u_char *) "ESI/1.0", q - v) == 0)
                {
                    sc->esi = 1;
                }

                v = q;
            }
        }
    }
}


static ngx_int_t
ngx_http_esi_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx == NULL || ctx->status == NGX_HTTP_ESI_STATUS_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ngx_http_esi_status_names[ctx->status].len;
    v->data = ngx_http_esi_status_names[ctx->status].data;
    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_esi_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static void *
ngx_http_esi_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_esi_main_conf_t  *emcf;

    emcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_main_conf_t));
    if (emcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     emcf->daemon = { 0, NULL };
     *     emcf->url = { 0 };
     */

    emcf->timeout = NGX_CONF_UNSET_MSEC;
    emcf->used = 0;
    emcf->purge_index = NGX_CONF_UNSET_SIZE;
    emcf->purge_timeout = NGX_CONF_UNSET_MSEC;

    if (ngx_array_init(&emcf->purge_zones, cf->pool, 4,
                       sizeof(ngx_shm_zone_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&emcf->plan_zones, cf->pool, 2,
                       sizeof(ngx_http_esi_plan_zone_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return emcf;
}


static char *
ngx_http_esi_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    ngx_conf_init_msec_value(emcf->timeout, 2000);
    ngx_conf_init_size_value(emcf->purge_index, 64 * 1024 * 1024);
    ngx_conf_init_msec_value(emcf->purge_timeout, 60000);

    if (emcf->daemon.data == NULL) {
        ngx_str_set(&emcf->daemon, "unix:/run/esid/esid.sock");
    }

    emcf->url.url = emcf->daemon;
    emcf->url.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &emcf->url) != NGX_OK
        || emcf->url.naddrs == 0
        || emcf->url.addrs[0].sockaddr->sa_family != AF_UNIX)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_daemon\" must be \"unix:PATH\", not \"%V\"",
                           &emcf->daemon);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_esi_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_loc_conf_t));
    if (elcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     elcf->types = { NULL };
     *     elcf->types_keys = NULL;
     *     elcf->purge = NGX_HTTP_ESI_PURGE_OFF;
     *     elcf->purge_method = { 0, NULL };
     *     elcf->purge_from = NULL;
     *     elcf->purge_zone = NULL;
     *     elcf->purge_key = NULL;
     *     elcf->surrogate = { 0, NULL };
     *     elcf->capability = { 0, NULL };
     */

    elcf->enable = NGX_CONF_UNSET;
    elcf->silent_errors = NGX_CONF_UNSET;
    elcf->fallback = NGX_CONF_UNSET_UINT;
    elcf->buffer_size = NGX_CONF_UNSET_SIZE;
    elcf->max_depth = NGX_CONF_UNSET;
    elcf->max_includes = NGX_CONF_UNSET_UINT;
    elcf->max_page_size = NGX_CONF_UNSET;
    elcf->max_tag_size = NGX_CONF_UNSET_SIZE;
    elcf->max_fragment_size = NGX_CONF_UNSET;
    elcf->plan = NGX_CONF_UNSET_PTR;
    elcf->plan_reuse = NGX_CONF_UNSET_MSEC;
    elcf->stitch = NGX_CONF_UNSET;
    elcf->stitch_level = NGX_CONF_UNSET_UINT;
    elcf->cookies = NGX_CONF_UNSET_PTR;
    elcf->surrogate_control = NGX_CONF_UNSET;

    return elcf;
}


static char *
ngx_http_esi_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_esi_loc_conf_t *prev = parent;
    ngx_http_esi_loc_conf_t *conf = child;

    ngx_http_upstream_conf_t          *ucf;
    ngx_http_esi_main_conf_t          *emcf;
    ngx_http_compile_complex_value_t   ccv;

    static ngx_str_t  default_key = ngx_string("$uri$is_args$args");

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_value(conf->silent_errors, prev->silent_errors, 0);
    ngx_conf_merge_uint_value(conf->fallback, prev->fallback,
                              NGX_HTTP_ESI_PASSTHROUGH);
    ngx_conf_merge_size_value(conf->buffer_size, prev->buffer_size,
                              16 * 1024);
    ngx_conf_merge_value(conf->max_depth, prev->max_depth, 5);
    ngx_conf_merge_uint_value(conf->max_includes, prev->max_includes, 256);
    ngx_conf_merge_off_value(conf->max_page_size, prev->max_page_size,
                             64 * 1024 * 1024);
    ngx_conf_merge_size_value(conf->max_tag_size, prev->max_tag_size,
                              8 * 1024);
    ngx_conf_merge_off_value(conf->max_fragment_size,
                             prev->max_fragment_size, 16 * 1024 * 1024);
    ngx_conf_merge_ptr_value(conf->plan, prev->plan,
                             &ngx_http_esi_default_plan);
    ngx_conf_merge_msec_value(conf->plan_reuse, prev->plan_reuse, 1000);
    ngx_conf_merge_value(conf->stitch, prev->stitch,
                         NGX_HTTP_ESI_STITCH_GZIP);
    ngx_conf_merge_uint_value(conf->stitch_level, prev->stitch_level, 6);
    ngx_conf_merge_ptr_value(conf->cookies, prev->cookies, NULL);
    ngx_conf_merge_str_value(conf->surrogate, prev->surrogate, "");
    ngx_conf_merge_value(conf->surrogate_control, prev->surrogate_control, 0);

    if (conf->surrogate.len) {
        conf->capability.len = conf->surrogate.len
                               + sizeof("=\"ESI/1.0\"") - 1;
        conf->capability.data = ngx_pnalloc(cf->pool, conf->capability.len);
        if (conf->capability.data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_sprintf(conf->capability.data, "%V=\"ESI/1.0\"",
                    &conf->surrogate);
    }

    if (conf->buffer_size < 8) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_buffer_size\" is too small");
        return NGX_CONF_ERROR;
    }

    if (conf->stitch == 1 && ngx_http_esi_stitch_check(cf, conf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->stitch == NGX_HTTP_ESI_STITCH_GZIP
        && !ngx_http_esi_stitch_available(cf))
    {
        conf->stitch = 0;
    }

    if (ngx_http_merge_types(cf, &conf->types_keys, &conf->types,
                             &prev->types_keys, &prev->types,
                             ngx_http_html_default_types)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);

    if (conf->enable) {
        emcf->used = 1;
    }

    if (conf->purge_key == NULL) {
        conf->purge_key = prev->purge_key;
    }

    if (conf->purge_key == NULL) {
        ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

        ccv.cf = cf;
        ccv.value = &default_key;
        ccv.complex_value = ngx_palloc(cf->pool,
                                       sizeof(ngx_http_complex_value_t));
        if (ccv.complex_value == NULL) {
            return NGX_CONF_ERROR;
        }

        if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

        conf->purge_key = ccv.complex_value;
    }

    if (conf->purge == NGX_HTTP_ESI_PURGE_METHOD) {

        /*
         * The zone is the location's proxy_cache zone.  The proxy module's
         * loc conf is private, but it starts with its ngx_http_upstream_conf_t
         * (public), whose cache_zone is the zone "proxy_cache NAME" set.  A
         * dynamic module comes after the proxy module, so the proxy's loc
         * conf is already merged here.
         */

        ucf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_proxy_module);

        if (ucf == NULL || ucf->cache_zone == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"esi_cache_purge %V\" needs \"proxy_cache\" "
                               "with a zone name in the same location, or "
                               "use \"esi_cache_purge zone=NAME key=KEY\" "
                               "in a location of its own",
                               &conf->purge_method);
            return NGX_CONF_ERROR;
        }

        conf->purge_zone = ucf->cache_zone;

        if (ngx_http_esi_add_zone(cf, conf->purge_zone) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * esi_cache_purge METHOD from all | ADDRESS|CIDR ...;
 * esi_cache_purge zone=NAME key=KEY;
 */

static char *
ngx_http_esi_cache_purge(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_loc_conf_t *elcf = conf;

    ngx_int_t                          rc;
    ngx_str_t                         *value, name, key;
    ngx_uint_t                         i;
    ngx_cidr_t                        *cidr;
    ngx_shm_zone_t                    *zone;
    ngx_http_core_loc_conf_t          *clcf;
    ngx_http_compile_complex_value_t   ccv;

    if (elcf->purge != NGX_HTTP_ESI_PURGE_OFF) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strncmp(value[1].data, "zone=", 5) == 0
        || ngx_strncmp(value[1].data, "key=", 4) == 0)
    {
        ngx_str_null(&name);
        ngx_str_null(&key);

        for (i = 1; i < cf->args->nelts; i++) {

            if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
                name.data = value[i].data + 5;
                name.len = value[i].len - 5;
                continue;
            }

            if (ngx_strncmp(value[i].data, "key=", 4) == 0) {
                key.data = value[i].data + 4;
                key.len = value[i].len - 4;
                continue;
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\"", &value[i]);
            return NGX_CONF_ERROR;
        }

        if (name.len == 0 || key.len == 0) {
            return "needs \"zone=NAME\" and \"key=KEY\"";
        }

        /* the tag proxy_cache_path uses; its data is the cache at run time */

        zone = ngx_shared_memory_add(cf, &name, 0, &ngx_http_proxy_module);
        if (zone == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

        ccv.cf = cf;
        ccv.value = &key;
        ccv.complex_value = ngx_palloc(cf->pool,
                                       sizeof(ngx_http_complex_value_t));
        if (ccv.complex_value == NULL) {
            return NGX_CONF_ERROR;
        }

        if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

        elcf->purge = NGX_HTTP_ESI_PURGE_LOCATION;
        elcf->purge_zone = zone;
        elcf->purge_key = ccv.complex_value;

        clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
        clcf->handler = ngx_http_esi_purge_handler;

        if (ngx_http_esi_add_zone(cf, zone) != NGX_OK) {
            return NGX_CONF_ERROR;
        }

        return NGX_CONF_OK;
    }

    if (cf->args->nelts < 4
        || value[2].len != 4
        || ngx_strncmp(value[2].data, "from", 4) != 0)
    {
        return "must be \"METHOD from all|ADDRESS ...\" or "
               "\"zone=NAME key=KEY\"";
    }

    for (i = 0; i < value[1].len; i++) {
        if ((value[1].data[i] < 'A' || value[1].data[i] > 'Z')
            && value[1].data[i] != '_' && value[1].data[i] != '-')
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid method \"%V\"", &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    elcf->purge = NGX_HTTP_ESI_PURGE_METHOD;
    elcf->purge_method = value[1];

    if (cf->args->nelts == 4 && value[3].len == 3
        && ngx_strncmp(value[3].data, "all", 3) == 0)
    {
        return NGX_CONF_OK;
    }

    elcf->purge_from = ngx_array_create(cf->pool, cf->args->nelts - 3,
                                        sizeof(ngx_cidr_t));
    if (elcf->purge_from == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 3; i < cf->args->nelts; i++) {
        cidr = ngx_array_push(elcf->purge_from);
        if (cidr == NULL) {
            return NGX_CONF_ERROR;
        }

        rc = ngx_ptocidr(&value[i], cidr);

        if (rc == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid address \"%V\"", &value[i]);
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_DONE) {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "low address bits of %V are meaningless",
                               &value[i]);
        }
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_esi_purge_index(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    ngx_str_t  *value;

    if (emcf->purge_index != NGX_CONF_UNSET_SIZE) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        emcf->purge_index = 0;
        return NGX_CONF_OK;
    }

    emcf->purge_index = ngx_parse_size(&value[1]);

    if (emcf->purge_index == (size_t) NGX_ERROR) {
        return "invalid value";
    }

    return NGX_CONF_OK;
}


/* a zone esid indexes: announced on every connection, its files reported */

/* esi_plan_zone name:size */

static char *
ngx_http_esi_plan_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    u_char                    *colon;
    ssize_t                    size;
    ngx_str_t                 *value, name, s;
    ngx_uint_t                 i;
    ngx_http_esi_plan_zone_t  *zone, **zones;

    value = cf->args->elts;

    colon = ngx_strlchr(value[1].data, value[1].data + value[1].len, ':');

    if (colon == NULL || colon == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid plan zone \"%V\", expected name:size",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = colon - value[1].data;

    if (name.len == ngx_http_esi_default_plan.name.len
        && ngx_strncmp(name.data, ngx_http_esi_default_plan.name.data,
                       name.len)
           == 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "plan zone \"default\" is esid's own: its "
                           "size is esid's plan_store setting");
        return NGX_CONF_ERROR;
    }

    s.data = colon + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    if (size == NGX_ERROR || size < (ssize_t) (64 * 1024)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid plan zone size \"%V\", at least 64k",
                           &s);
        return NGX_CONF_ERROR;
    }

    zones = emcf->plan_zones.elts;

    for (i = 0; i < emcf->plan_zones.nelts; i++) {
        if (zones[i]->name.len == name.len
            && ngx_strncmp(zones[i]->name.data, name.data, name.len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate plan zone \"%V\"", &name);
            return NGX_CONF_ERROR;
        }
    }

    zone = ngx_palloc(cf->pool, sizeof(ngx_http_esi_plan_zone_t));
    if (zone == NULL) {
        return NGX_CONF_ERROR;
    }

    zones = ngx_array_push(&emcf->plan_zones);
    if (zones == NULL) {
        return NGX_CONF_ERROR;
    }

    *zones = zone;
    zone->name = name;
    zone->size = size;

    return NGX_CONF_OK;
}


/* esi_plan zone | off; the zone must have been declared above */

static char *
ngx_http_esi_tag_size_bounds(ngx_conf_t *cf, void *post, void *data)
{
    size_t  *sp = data;

    if (*sp < NGX_HTTP_ESI_TAG_SIZE_MIN || *sp > NGX_HTTP_ESI_TAG_SIZE_MAX) {
        return "must be between 256 and 1m";
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_esi_plan_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_loc_conf_t *elcf = conf;

    ngx_str_t                 *value;
    ngx_uint_t                 i;
    ngx_http_esi_plan_zone_t **zones;
    ngx_http_esi_main_conf_t  *emcf;

    if (elcf->plan != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        elcf->plan = NULL;
        return NGX_CONF_OK;
    }

    if (value[1].len == ngx_http_esi_default_plan.name.len
        && ngx_strncmp(value[1].data, ngx_http_esi_default_plan.name.data,
                       value[1].len)
           == 0)
    {
        elcf->plan = &ngx_http_esi_default_plan;
        return NGX_CONF_OK;
    }

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);
    zones = emcf->plan_zones.elts;

    for (i = 0; i < emcf->plan_zones.nelts; i++) {
        if (zones[i]->name.len == value[1].len
            && ngx_strncmp(zones[i]->name.data, value[1].data, value[1].len)
               == 0)
        {
            elcf->plan = zones[i];
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown plan zone \"%V\": declare it with "
                       "\"esi_plan_zone %V:size\" above", &value[1],
                       &value[1]);

    return NGX_CONF_ERROR;
}


/* esi_cookies name ...: a "*" among them stands alone, for all */

static char *
ngx_http_esi_cookies_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_loc_conf_t *elcf = conf;

    ngx_str_t   *value, *name;
    ngx_uint_t   i;

    if (elcf->cookies != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    elcf->cookies = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                     sizeof(ngx_str_t));
    if (elcf->cookies == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        if (value[i].len == 1 && value[i].data[0] == '*') {
            elcf->cookies->nelts = 0;
            name = ngx_array_push(elcf->cookies);
            *name = value[i];
            return NGX_CONF_OK;
        }

        name = ngx_array_push(elcf->cookies);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        *name = value[i];
    }

    return NGX_CONF_OK;
}


/*
 * Whether r's response is stitched for gzip clients: esi_stitch on, or by
 * default wherever plans are kept and the gzip filter would compress it.
 */

static ngx_uint_t
ngx_http_esi_stitches(ngx_http_request_t *r, ngx_http_esi_loc_conf_t *elcf)
{
    if (elcf->stitch != NGX_HTTP_ESI_STITCH_GZIP) {
        return elcf->stitch;
    }

#if (NGX_ZLIB && NGX_HTTP_GZIP)
    return elcf->plan != NULL && ngx_http_esi_stitch_gzip_on(r);
#else
    return 0;
#endif
}


/* what esi_stitch on requires of the build, without its errors */

static ngx_uint_t
ngx_http_esi_stitch_available(ngx_conf_t *cf)
{
#if (NGX_ZLIB && NGX_HTTP_GZIP)
    return ngx_http_esi_stitch_placed(cf->cycle);
#else
    return 0;
#endif
}


/* esi_stitch keeps its segments with the plans, and weaves below postpone */

static ngx_int_t
ngx_http_esi_stitch_check(ngx_conf_t *cf, ngx_http_esi_loc_conf_t *elcf)
{
#if (NGX_ZLIB && NGX_HTTP_GZIP)

    if (elcf->plan == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_stitch\" requires \"esi_plan\": its "
                           "segments are kept with the plans");
        return NGX_ERROR;
    }

    if (!ngx_http_esi_stitch_placed(cf->cycle)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_stitch\" requires the module loaded with "
                           "load_module, where its second filter sits below "
                           "postpone; it was built into nginx");
        return NGX_ERROR;
    }

    return NGX_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"esi_stitch\" requires an nginx built with zlib "
                       "and the gzip or gunzip module");
    return NGX_ERROR;

#endif
}


static ngx_int_t
ngx_http_esi_add_zone(ngx_conf_t *cf, ngx_shm_zone_t *zone)
{
    ngx_uint_t                 i;
    ngx_shm_zone_t           **z;
    ngx_http_esi_main_conf_t  *emcf;

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);
    emcf->used = 1;

    z = emcf->purge_zones.elts;

    for (i = 0; i < emcf->purge_zones.nelts; i++) {
        if (z[i] == zone) {
            return NGX_OK;
        }
    }

    z = ngx_array_push(&emcf->purge_zones);
    if (z == NULL) {
        return NGX_ERROR;
    }

    *z = zone;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_filter_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    /*
     * the same-location purge: before the access phase, so that "satisfy
     * any" cannot let a client outside "from" purge
     */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_purge_access;

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_REWRITE_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_capability;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_esi_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_esi_body_filter;

    return NGX_OK;
}
