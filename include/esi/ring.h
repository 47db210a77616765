/*
 * Single-producer single-consumer byte ring in shared memory, used in both
 * directions between an NGINX worker and esid.  Plain C so that the connector
 * and the daemon share one implementation.  The layout and the wake-up rule
 * are described in proto/README.md.
 *
 * Neither side trusts the other: each keeps its own index privately and only
 * publishes it, and every index or record header read from shared memory is
 * checked before use.
 */

#ifndef ESI_RING_H
#define ESI_RING_H

#include <stddef.h>
#include <stdint.h>


#define ESI_SHM_MAGIC         0x31495345u     /* "ESI1" little-endian */
#define ESI_SHM_HEADER_SIZE   4096u
#define ESI_RING_MIN_SIZE     4096u
#define ESI_RING_MAX_SIZE     (64u * 1024 * 1024)
#define ESI_RECORD_HEADER     8u
#define ESI_PIN_SLOTS         4096u         /* u32 pin counts after the rings */

#define ESI_RECORD_MESSAGE    1u
#define ESI_RECORD_PADDING    2u


typedef struct {
    uint32_t  head;                 /* written by the consumer only */
    uint32_t  consumer_waiting;     /* consumer sleeps until data arrives */
    uint8_t   pad0[56];
    uint32_t  tail;                 /* written by the producer only */
    uint32_t  producer_waiting;     /* producer sleeps until space frees */
    uint8_t   pad1[56];
} esi_ring_ctl_t;


typedef struct {
    uint32_t        magic;
    uint32_t        version;
    uint32_t        ring_size;
    uint8_t         pad[52];
    esi_ring_ctl_t  to_daemon;
    esi_ring_ctl_t  to_worker;
} esi_shm_header_t;


typedef struct {
    esi_ring_ctl_t  *ctl;
    uint8_t         *data;
    uint32_t         size;          /* a power of two */
    uint32_t         head;          /* private copy of the consumer index */
    uint32_t         tail;          /* private copy of the producer index */
    uint32_t         record;        /* consumer: bytes of the current record */
} esi_ring_t;


typedef enum {
    ESI_RING_EMPTY = 0,
    ESI_RING_OK,
    ESI_RING_CORRUPT
} esi_ring_rc_e;


static inline size_t
esi_shm_size(uint32_t ring_size)
{
    return ESI_SHM_HEADER_SIZE + 2 * (size_t) ring_size
           + ESI_PIN_SLOTS * sizeof(uint32_t);
}


/*
 * Where the pin table starts (page aligned): one count per slot of esid's
 * segment arena, which esid raises before it names a slot's segments in a
 * plan and the worker lowers once it no longer sends them.  Each side maps
 * it apart from the rings, so that it can outlive the connection.
 */
static inline size_t
esi_shm_pins_offset(uint32_t ring_size)
{
    return ESI_SHM_HEADER_SIZE + 2 * (size_t) ring_size;
}


static inline int
esi_ring_size_valid(uint32_t size)
{
    return size >= ESI_RING_MIN_SIZE && size <= ESI_RING_MAX_SIZE
           && (size & (size - 1)) == 0;
}


static inline uint32_t
esi_ring_align(uint32_t n)
{
    return (n + 7u) & ~7u;
}


/* Largest payload that can ever be reserved in a ring of this size. */
static inline uint32_t
esi_ring_max_payload(const esi_ring_t *r)
{
    return r->size / 2 - ESI_RECORD_HEADER;
}


/*
 * Attach to one ring of a mapped region.  as_producer selects which index is
 * ours; the other side's index is read from shared memory on every use.
 */
static inline void
esi_ring_attach(esi_ring_t *r, esi_ring_ctl_t *ctl, uint8_t *data,
    uint32_t size)
{
    r->ctl = ctl;
    r->data = data;
    r->size = size;
    r->head = __atomic_load_n(&ctl->head, __ATOMIC_ACQUIRE);
    r->tail = __atomic_load_n(&ctl->tail, __ATOMIC_ACQUIRE);
    r->record = 0;
}


/*
 * Producer: returns where len payload bytes may be written contiguously, or
 * NULL when the ring has no room now.  Nothing is visible until commit.
 */
static inline void *
esi_ring_reserve(esi_ring_t *r, uint32_t len)
{
    uint32_t  head, used, pos, need, skip;

    if (len > esi_ring_max_payload(r)) {
        return NULL;
    }

    head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
    used = r->tail - head;

    if (used > r->size) {
        return NULL;                /* the consumer published nonsense */
    }

    pos = r->tail & (r->size - 1);
    need = ESI_RECORD_HEADER + esi_ring_align(len);
    skip = (pos + need > r->size) ? r->size - pos : 0;

    if (r->size - used < skip + need) {
        return NULL;
    }

    return r->data + (skip ? 0 : pos) + ESI_RECORD_HEADER;
}


/*
 * Producer: publish a record of len bytes written at the pointer reserve()
 * returned for at least len bytes, and leave a sleeping consumer asleep: for
 * a record that can wait until the consumer wakes for another.  The producer
 * then owes it a wake-up (esi_ring_wake_due()) within a bounded time.
 */
static inline void
esi_ring_commit_quiet(esi_ring_t *r, uint32_t len)
{
    uint32_t  pos, need, skip, *hdr;

    pos = r->tail & (r->size - 1);
    need = ESI_RECORD_HEADER + esi_ring_align(len);

    if (pos + need > r->size) {
        skip = r->size - pos;
        hdr = (uint32_t *) (r->data + pos);
        hdr[0] = skip - ESI_RECORD_HEADER;
        hdr[1] = ESI_RECORD_PADDING;
        r->tail += skip;
        pos = 0;
    }

    hdr = (uint32_t *) (r->data + pos);
    hdr[0] = len;
    hdr[1] = ESI_RECORD_MESSAGE;
    r->tail += need;

    __atomic_store_n(&r->ctl->tail, r->tail, __ATOMIC_RELEASE);
}


/*
 * Producer: publish as esi_ring_commit_quiet() does.  Returns 1 when the
 * consumer is asleep and must be woken.
 */
static inline int
esi_ring_commit(esi_ring_t *r, uint32_t len)
{
    esi_ring_commit_quiet(r, len);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    return __atomic_exchange_n(&r->ctl->consumer_waiting, 0, __ATOMIC_ACQ_REL)
           != 0;
}


/*
 * Producer that committed quietly: returns 1 when the consumer sleeps with
 * records unread, and must be woken.
 */
static inline int
esi_ring_wake_due(esi_ring_t *r)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    if (__atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE) == r->tail) {
        return 0;
    }

    return __atomic_exchange_n(&r->ctl->consumer_waiting, 0, __ATOMIC_ACQ_REL)
           != 0;
}


/* Producer: bytes published that the consumer has not released yet. */
static inline uint32_t
esi_ring_used(esi_ring_t *r)
{
    return r->tail - __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
}


/*
 * Consumer: the next message record, skipping padding.  On ESI_RING_OK *msg
 * and *len describe the payload, 8-byte aligned, valid until release().
 */
static inline esi_ring_rc_e
esi_ring_peek(esi_ring_t *r, const uint8_t **msg, uint32_t *len)
{
    uint32_t         tail, avail, pos, rlen, type;
    const uint32_t  *hdr;

    for ( ;; ) {
        tail = __atomic_load_n(&r->ctl->tail, __ATOMIC_ACQUIRE);
        avail = tail - r->head;

        if (avail == 0) {
            return ESI_RING_EMPTY;
        }

        if (avail > r->size || (avail & 7u) || avail < ESI_RECORD_HEADER) {
            return ESI_RING_CORRUPT;
        }

        pos = r->head & (r->size - 1);
        hdr = (const uint32_t *) (r->data + pos);
        rlen = __atomic_load_n(&hdr[0], __ATOMIC_RELAXED);
        type = __atomic_load_n(&hdr[1], __ATOMIC_RELAXED);

        if (rlen > r->size - pos - ESI_RECORD_HEADER
            || ESI_RECORD_HEADER + esi_ring_align(rlen) > avail)
        {
            return ESI_RING_CORRUPT;
        }

        if (type == ESI_RECORD_PADDING) {
            if (pos + ESI_RECORD_HEADER + rlen != r->size) {
                return ESI_RING_CORRUPT;
            }

            r->head += ESI_RECORD_HEADER + rlen;
            continue;
        }

        if (type != ESI_RECORD_MESSAGE) {
            return ESI_RING_CORRUPT;
        }

        r->record = ESI_RECORD_HEADER + esi_ring_align(rlen);
        *msg = r->data + pos + ESI_RECORD_HEADER;
        *len = rlen;

        return ESI_RING_OK;
    }
}


/*
 * Consumer: done with the record peek() returned.  Returns 1 when the
 * producer is waiting for space and must be woken.
 */
static inline int
esi_ring_release(esi_ring_t *r)
{
    r->head += r->record;
    r->record = 0;

    __atomic_store_n(&r->ctl->head, r->head, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    return __atomic_exchange_n(&r->ctl->producer_waiting, 0, __ATOMIC_ACQ_REL)
           != 0;
}


/*
 * Consumer about to sleep: advertise it, then look again.  Returns 1 when it
 * may sleep on its eventfd, 0 when data arrived meanwhile.
 */
static inline int
esi_ring_wait_data(esi_ring_t *r)
{
    __atomic_store_n(&r->ctl->consumer_waiting, 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    return __atomic_load_n(&r->ctl->tail, __ATOMIC_ACQUIRE) == r->head;
}


/*
 * Producer that found no room for len bytes: advertise it, then look again.
 * Returns 1 when it may sleep, 0 when room appeared meanwhile.
 */
static inline int
esi_ring_wait_space(esi_ring_t *r, uint32_t len)
{
    __atomic_store_n(&r->ctl->producer_waiting, 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    return esi_ring_reserve(r, len) == NULL;
}


#endif /* ESI_RING_H */
