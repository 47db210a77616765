
/*
 * Copyright (C) The ESI project authors
 *
 * ESI for NGINX: the response body is streamed to esid through a shared
 * ring; esid answers with splice instructions that this filter executes:
 * verbatim runs are emitted as buffers pointing into the held input, and
 * includes become subrequests.  The wire protocol is proto/README.md.
 *
 * What the module's files share: types, constants, and the functions
 * that cross files, grouped by the file that defines them.
 */


#ifndef _NGX_HTTP_ESI_H_INCLUDED_
#define _NGX_HTTP_ESI_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/mman.h>

#include <esi/ring.h>
#include "esi_wire.h"
#include "esi_tags.h"
#include "esi_surrogate.h"

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

/* last_err of a connection refused because esid's user was not trusted */
#define NGX_HTTP_ESI_UNTRUSTED         (-1)

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

/*
 * the buffers a gzipped body is inflated into: tagged with an address of
 * the module's that no other buffer carries (&ngx_http_esi_module tags its
 * output)
 */
#define NGX_HTTP_ESI_INFLATED          ((ngx_buf_tag_t) &ngx_http_esi_daemon)

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
#define NGX_HTTP_ESI_REPORT_DELAY      100  /* esid reads reports, ms */
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
#define NGX_HTTP_ESI_PURGE_ALL         3    /* every object of the zone */
#define NGX_HTTP_ESI_PURGE_PATTERN     4    /* a tag pattern esid evaluates */

/*
 * the most tag bytes a report carries (Stored.tags, as esid takes them):
 * as much as a cache file's header, addressed with 16-bit offsets, holds
 */
#define NGX_HTTP_ESI_PURGE_TAGS_MAX    (64 * 1024)

/* the longest tag pattern esid takes (Purge.tagPattern) */
#define NGX_HTTP_ESI_PURGE_PATTERN_MAX (64 * 1024)

/* esi_cache_purge_response_type */
#define NGX_HTTP_ESI_PURGE_HTML        0
#define NGX_HTTP_ESI_PURGE_JSON        1
#define NGX_HTTP_ESI_PURGE_XML         2
#define NGX_HTTP_ESI_PURGE_TEXT        3

/*
 * how a purge is answered: one that left a file it should have purged
 * (a read-only or failing file system) failed; one that removes nothing
 * is a miss for a key's
 */
#define ngx_http_esi_purge_found(p)                                           \
    ((p)->count || (p)->kind == NGX_HTTP_ESI_PURGE_TAG                        \
     || (p)->kind == NGX_HTTP_ESI_PURGE_ALL                                   \
     || (p)->kind == NGX_HTTP_ESI_PURGE_PATTERN)
#define ngx_http_esi_purge_status(p)                                          \
    ((p)->failed ? NGX_HTTP_INTERNAL_SERVER_ERROR                             \
     : ngx_http_esi_purge_found(p) ? NGX_HTTP_OK : (p)->miss)


typedef struct {
    ngx_str_t                  daemon;
    ngx_url_t                  url;
    ngx_uid_t                  daemon_user;  /* esi_daemon_user, or unset */
    ngx_msec_t                 timeout;
    ngx_flag_t                 used;

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
    ngx_uint_t                 max_request_includes;
    off_t                      max_page_size;
    size_t                     max_tag_size;
    off_t                      max_fragment_size;

    ngx_hash_t                 types;
    ngx_array_t               *types_keys;

    ngx_http_esi_plan_zone_t  *plan;        /* NULL: esi_plan off */
    ngx_msec_t                 plan_reuse;  /* 0: esid is always asked */
    ngx_flag_t                 stitch;
    ngx_uint_t                 stitch_level;

    ngx_array_t               *cookies;     /* of ngx_str_t; NULL: none */

    ngx_str_t                  surrogate;   /* esi_surrogate NAME */
    ngx_str_t                  capability;  /* NAME="ESI/1.0" */
    ngx_flag_t                 surrogate_control;

    ngx_flag_t                 include_access; /* esi_include_access */
} ngx_http_esi_loc_conf_t;


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
 * An include's subrequest as its r->post_subrequest finds it: unlike the
 * module's context of the subrequest, which an internal redirect
 * (error_page, try_files, a named location) clears, it stays with the
 * subrequest wherever it goes.
 */

typedef struct {
    ngx_http_post_subrequest_t  post;       /* first: r->post_subrequest */
    unsigned                    access:1;   /* esi_include_access on */
} ngx_http_esi_include_t;


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
    ngx_uint_t                 tree_includes; /* the client request's, at
                                                 its outermost page */
    ngx_http_esi_mapping_t    *arena;       /* the plan's segments are here */
    ngx_http_esi_mapping_t    *pins;        /* ... pinned in this table */
    uint32_t                   pin;         /* ... at this slot + 1 */
    off_t                      passed;      /* fallen: input a segment sent */
    off_t                      fragment_room; /* esi_max_fragment_size left */
    ngx_file_t                *body_file;   /* bodiless: the cache file */
    off_t                      body_start;  /* ... and its body's offset */

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
    unsigned                   denied:1;    /* its location's access checks
                                               refused it */
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
    unsigned                   memory_above:1; /* a filter above needs the
                                                  body in memory */
    unsigned                   bodiless:1;   /* the plan needs no byte of
                                                the body: it is not read */
} ngx_http_esi_ctx_t;


/* ngx_http_esi_purge_module's configuration */

typedef struct {
    size_t                     index;       /* esi_purge_index; 0: off */
    ngx_msec_t                 timeout;
    ngx_array_t                zones;       /* of ngx_shm_zone_t * */
    ngx_array_t               *tag_headers; /* of ngx_str_t */
    ngx_str_t                  tag_names;   /* the same, space separated */
    ngx_http_complex_value_t  *default_key; /* $uri$is_args$args */
    ngx_array_t                named;       /* zone=NAME locations, of
                                               ngx_http_esi_purge_loc_conf_t *,
                                               their zones found at the end */
    ngx_array_t                uses;        /* of ngx_http_esi_purge_use_t,
                                               configuration time only */
    ngx_flag_t                 queue;       /* cache_purge_background_queue:
                                               wildcards answer 202 */

    /*
     * ngx_cache_purge 3.0's queue and Vary scan, validated as it does and
     * otherwise unused: no purge waits in a queue on a worker (esid does
     * the work off the event loop at once), and every purge removes every
     * Vary variant
     */
    ngx_int_t                  queue_size;
    ngx_int_t                  batch_size;
    ngx_msec_t                 throttle;
    ngx_flag_t                 vary_aware;
} ngx_http_esi_purge_main_conf_t;


typedef struct {
    ngx_uint_t                 purge;
    ngx_array_t               *methods;     /* of ngx_str_t */
    ngx_array_t               *from;        /* of ngx_cidr_t; NULL: all */
    ngx_shm_zone_t            *zone;
    ngx_str_t                  zone_name;   /* zone=NAME */
    ngx_str_t                  zone_where;  /* "DIRECTIVE" in FILE:LINE */
    ngx_http_complex_value_t  *key;
    ngx_flag_t                 key_checked; /* against a cached response's */
    ngx_flag_t                 soft;        /* esi_cache_purge_soft */
    ngx_uint_t                 response_type;
    ngx_flag_t                 legacy_status;  /* cache_purge_legacy_status */
    unsigned                   compat:1;    /* set by proxy_cache_purge ... */
    unsigned                   proxy:1;     /* ... by proxy_cache_purge */
    unsigned                   all:1;       /* its purge_all */
} ngx_http_esi_purge_loc_conf_t;


/*
 * A location that caches in a zone or purges it, as the configuration is
 * merged: servers of different names that share a zone whose purge key
 * names no host purge each other's objects (a [warn] says so).
 */

typedef struct {
    ngx_shm_zone_t                 *zone;      /* NULL: purge->zone, once
                                                  zone=NAME is found */
    ngx_http_esi_purge_loc_conf_t  *purge;     /* NULL: it caches only */
    ngx_http_core_srv_conf_t       *server;
    ngx_http_core_loc_conf_t       *location;
} ngx_http_esi_purge_use_t;


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
    ngx_str_t                  key;         /* the key, prefix, tags or
                                               pattern */
    ngx_array_t               *tags;        /* of ngx_str_t */
    ngx_str_t                  pattern;     /* X-Magento-Tags-Pattern that
                                               esid evaluates */
    ngx_uint_t                 next_tag;
    u_char                    *name;        /* a cache file's path */
    size_t                     name_len;

    ngx_uint_t                 count;       /* files removed */
    ngx_uint_t                 failed;      /* files it could not purge */
    ngx_uint_t                 status;
    ngx_str_t                  error;
    ngx_str_t                 *fleet;       /* Cache-Purge-Fleet, or NULL */

    ngx_event_t                timer;
    ngx_event_t                finish;

    unsigned                   in_table:1;
    unsigned                   scanned:1;
    unsigned                   soft:1;      /* mark stale, keep the files */
    ngx_uint_t                 miss;        /* the status of a miss */
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


typedef struct ngx_http_esi_daemon_s  ngx_http_esi_daemon_t;


/* one of esid's answers, as ngx_http_esi_daemon.c hands it on */

typedef struct {
    uint32_t                   id;          /* Response.stream */
    ngx_rbtree_node_t         *node;        /* id's in the handler's table */
    esi_wire_struct_t         *root;
    const uint8_t             *message;     /* as esid wrote it */
    size_t                     len;
} ngx_http_esi_answer_t;

typedef ngx_int_t (*ngx_http_esi_answer_pt)(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
typedef ngx_int_t (*ngx_http_esi_daemon_pt)(ngx_http_esi_daemon_t *d);

/* runs esid's plan for a stream, as it came or from the worker's copy */
typedef ngx_int_t (*ngx_http_esi_plan_pt)(ngx_http_esi_ctx_t *ctx,
    esi_wire_struct_t *root, const uint8_t *message, size_t len);

/* runs a request's ESI on input, or on none once esid or a timer woke it */
typedef ngx_int_t (*ngx_http_esi_process_pt)(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);


/*
 * What to do with an answer of one kind (Response.which), registered by
 * the file it concerns, as HTTP/2's state table routes frames: "table" is
 * where its id is looked up (NULL: the answer is esid's own, as an order
 * relayed from esictl), "stale" what an id that left the table gets
 * (NULL: nothing).
 */

typedef struct {
    ngx_http_esi_answer_pt     handler;
    ngx_rbtree_t              *table;
    ngx_http_esi_answer_pt     stale;
} ngx_http_esi_answer_handler_t;


#define NGX_HTTP_ESI_ANSWERS  (ESI_WIRE_RESPONSE_FORGET_WHICH + 1)


struct ngx_http_esi_daemon_s {
    ngx_http_esi_main_conf_t  *conf;
    ngx_http_esi_purge_main_conf_t *purge;  /* its zones and timeout */
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
    ngx_event_t                kick_event;  /* esid's eventfd, once */
    ngx_event_t                report_timer; /* esid owes a read */
    ngx_msec_t                 backoff;
    ngx_err_t                  last_err;    /* of the last failed connect,
                                               or NGX_HTTP_ESI_UNTRUSTED */

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

    /* set by the files that register with the connection */
    ngx_http_esi_answer_handler_t  answers[NGX_HTTP_ESI_ANSWERS];
    ngx_http_esi_daemon_pt     attached;    /* the connection is up */
    ngx_http_esi_daemon_pt     writable;    /* the ring has room: NGX_AGAIN
                                               while it lacks more */
    ngx_http_esi_daemon_pt     closed;      /* the connection is gone */
    ngx_http_esi_daemon_pt     lost[2];     /* ... and what waited for an
                                               answer fails */
    ngx_uint_t                 nlost;
};


extern ngx_module_t           ngx_http_esi_module;
extern ngx_module_t           ngx_http_esi_purge_module;
extern ngx_http_esi_daemon_t  ngx_http_esi_daemon;


/* ngx_http_esi_daemon.c */
ngx_int_t ngx_http_esi_daemon_init_process(ngx_cycle_t *cycle);
void ngx_http_esi_daemon_exit_process(ngx_cycle_t *cycle);
void ngx_http_esi_daemon_connect(ngx_http_esi_daemon_t *d);
void ngx_http_esi_daemon_unmap(ngx_http_esi_mapping_t *m);
void ngx_http_esi_daemon_unpin(ngx_http_esi_mapping_t *pins, uint32_t pin);
void ngx_http_esi_daemon_drop(ngx_http_esi_daemon_t *d, ngx_uint_t level,
    const char *reason);
void ngx_http_esi_daemon_flush(ngx_http_esi_daemon_t *d);
ngx_int_t ngx_http_esi_daemon_post(ngx_http_esi_daemon_t *d, void *buf,
    size_t len);
void ngx_http_esi_daemon_report(ngx_http_esi_daemon_t *d, void *buf,
    size_t len);
ngx_int_t ngx_http_esi_daemon_enqueue(ngx_http_esi_daemon_t *d, void *buf,
    size_t len, ngx_queue_t *before);
void *ngx_http_esi_daemon_reserve(ngx_http_esi_daemon_t *d, size_t need);
void ngx_http_esi_daemon_commit(ngx_http_esi_daemon_t *d, size_t len);
void ngx_http_esi_daemon_request(esi_wire_builder_t *b, void *buf, size_t len,
    uint32_t id, uint16_t which, esi_wire_out_t *req);
ngx_int_t ngx_http_esi_daemon_send_short(ngx_http_esi_daemon_t *d, uint32_t id,
    uint16_t which);


/* ngx_http_esi_stream.c */
ngx_int_t ngx_http_esi_stream_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle, ngx_http_esi_process_pt process);
void ngx_http_esi_stream_unlink(ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_stream_fail(ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_stream_forget(ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_stream_schedule(ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_stream_timer(ngx_http_esi_ctx_t *ctx, ngx_uint_t reset);
ngx_int_t ngx_http_esi_stream_open(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_stream_start(ngx_http_esi_ctx_t *ctx);


/* ngx_http_esi_filter.c */
ngx_int_t ngx_http_esi_filter_process(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
ngx_int_t ngx_http_esi_filter_init(ngx_conf_t *cf);


/* ngx_http_esi_output.c */
void ngx_http_esi_output_init(ngx_http_output_body_filter_pt next);
ngx_int_t ngx_http_esi_output_next(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
ngx_int_t ngx_http_esi_output_final(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
ngx_chain_t *ngx_http_esi_output_link(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
ngx_int_t ngx_http_esi_output_pack(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, u_char *data, size_t len);
ngx_int_t ngx_http_esi_output(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx);
void ngx_http_esi_output_release(ngx_http_esi_ctx_t *ctx);
ngx_int_t ngx_http_esi_output_flush_held(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);


/* ngx_http_esi_splice.c */
ngx_int_t ngx_http_esi_splice_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle);
ngx_int_t ngx_http_esi_splice_include(ngx_http_request_t *r,
    esi_wire_struct_t *inc, ngx_http_esi_insn_t *insn);
ngx_int_t ngx_http_esi_splice_try_insn(ngx_http_esi_ctx_t *ctx,
    ngx_uint_t type);
ngx_http_esi_insn_t *ngx_http_esi_splice_insn(ngx_http_esi_ctx_t *ctx);
ngx_int_t ngx_http_esi_splice_execute(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
ngx_int_t ngx_http_esi_splice_verbatim(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, off_t offset, off_t end);
void ngx_http_esi_splice_try_close(ngx_http_esi_ctx_t *ctx, ngx_uint_t keep);


/* ngx_http_esi_include.c */
ngx_int_t ngx_http_esi_include(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn, ngx_uint_t alt);
ngx_int_t ngx_http_esi_include_failed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn, ngx_uint_t alt);
ngx_int_t ngx_http_esi_include_header(ngx_http_request_t *r,
    ngx_http_esi_ctx_t **ctxp);
ngx_int_t ngx_http_esi_include_limit(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t **in);
ngx_int_t ngx_http_esi_include_marker(ngx_http_request_t *r);
ngx_int_t ngx_http_esi_include_access(ngx_http_request_t *r);


/* ngx_http_esi_plan.c */
ngx_int_t ngx_http_esi_plan_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle);
ngx_int_t ngx_http_esi_plan(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *root,
    const uint8_t *message, size_t len);
ngx_int_t ngx_http_esi_plan_run(ngx_http_esi_ctx_t *ctx);


/* ngx_http_esi_replay.c */
ngx_int_t ngx_http_esi_replay_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle);
void ngx_http_esi_replay_identify(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_loc_conf_t *elcf);
ngx_http_esi_plain_t *ngx_http_esi_replay_plain(ngx_http_esi_ctx_t *ctx);
ngx_int_t ngx_http_esi_replay(ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_plan_pt plan);
void ngx_http_esi_replay_keep(ngx_http_esi_ctx_t *ctx, const uint8_t *message,
    size_t len, uint32_t pin);
void ngx_http_esi_replay_forget(ngx_http_esi_ctx_t *ctx);


#if (NGX_ZLIB)
/* ngx_http_esi_gunzip.c */
ngx_int_t ngx_http_esi_gunzip(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in, ngx_chain_t **out);
ngx_uint_t ngx_http_esi_gunzip_room(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
#endif


/* ngx_http_esi_surrogate.c */
void ngx_http_esi_surrogate_hide(ngx_http_request_t *r);
ngx_table_elt_t *ngx_http_esi_surrogate_find_header(ngx_list_t *headers,
    const char *name);
ngx_int_t ngx_http_esi_surrogate_capability(ngx_http_request_t *r);
ngx_int_t ngx_http_esi_surrogate_control(ngx_http_request_t *r,
    ngx_http_esi_loc_conf_t *elcf);


/* ngx_http_esi_purge.c */
ngx_int_t ngx_http_esi_purge_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle);
ngx_int_t ngx_http_esi_purge_handler(ngx_http_request_t *r);


/* ngx_http_esi_purge_index.c */
ngx_int_t ngx_http_esi_purge_index_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle);
void ngx_http_esi_purge_index_report(ngx_http_request_t *r,
    ngx_http_esi_purge_main_conf_t *pmcf);
ngx_uint_t ngx_http_esi_purge_index_tag_header(
    ngx_http_esi_purge_main_conf_t *pmcf, ngx_str_t *name);


/* ngx_http_esi_layout.c */
ngx_int_t ngx_http_esi_layout_check(ngx_conf_t *cf);
ngx_int_t ngx_http_esi_layout_cache_key(ngx_conf_t *cf, ngx_module_t *m,
    ngx_uint_t *offset);


/* an include failed for good: so did the innermost attempt around it */

static ngx_inline void
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


/*
 * Whether r's response is stitched for gzip clients: esi_stitch on, or by
 * default wherever plans are kept and the gzip filter would compress it.
 */

static ngx_inline ngx_uint_t
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


#endif /* _NGX_HTTP_ESI_H_INCLUDED_ */
