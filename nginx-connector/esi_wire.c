/*
 * Cap'n Proto single-segment reader and writer in C.  See esi_wire.h.
 * Wire facts used here (capnproto.org/encoding.html): little-endian 64-bit
 * words; a struct pointer is {kind 0, offset:30, data words:16,
 * pointers:16}; a list pointer is {kind 1, offset:30, element size:3,
 * count:29}; offsets count words from the end of the pointer.
 */

#include <string.h>

#include "esi_wire.h"


#define ESI_WIRE_KIND_STRUCT     0
#define ESI_WIRE_KIND_LIST       1
#define ESI_WIRE_LIST_BYTE       2
#define ESI_WIRE_LIST_COMPOSITE  7
#define ESI_WIRE_BUDGET_FACTOR   8


static uint64_t
esi_wire_load64(const uint8_t *p)
{
    uint64_t  v;

    memcpy(&v, p, 8);
    return v;
}


static void
esi_wire_store64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}


int
esi_wire_open(esi_wire_msg_t *msg, const void *buf, size_t len,
    esi_wire_struct_t *root)
{
    const uint8_t  *p = buf;
    uint32_t        hdr[2];
    esi_wire_struct_t  frame;
    uint8_t         zero[8];

    if (len < 16 || (len & 7)) {
        return -1;
    }

    memcpy(hdr, p, 8);

    /* one segment, exactly filling the record */
    if (hdr[0] != 0 || (size_t) hdr[1] * 8 != len - 8 || hdr[1] == 0) {
        return -1;
    }

    msg->seg = p + 8;
    msg->words = hdr[1];
    msg->budget = (size_t) hdr[1] * ESI_WIRE_BUDGET_FACTOR;

    /* the root pointer is pointer 0 of a zero-size frame at word 0 */
    memset(zero, 0, sizeof(zero));
    frame.msg = msg;
    frame.data = zero;
    frame.ptrs = msg->seg;
    frame.data_bytes = 0;
    frame.ptr_count = 1;

    return esi_wire_get_struct(&frame, 0, root);
}


uint8_t
esi_wire_u8(const esi_wire_struct_t *s, unsigned off)
{
    return off + 1 <= s->data_bytes ? s->data[off] : 0;
}


uint16_t
esi_wire_u16(const esi_wire_struct_t *s, unsigned off)
{
    uint16_t  v = 0;

    if (off + 2 <= s->data_bytes) {
        memcpy(&v, s->data + off, 2);
    }

    return v;
}


uint32_t
esi_wire_u32(const esi_wire_struct_t *s, unsigned off)
{
    uint32_t  v = 0;

    if (off + 4 <= s->data_bytes) {
        memcpy(&v, s->data + off, 4);
    }

    return v;
}


uint64_t
esi_wire_u64(const esi_wire_struct_t *s, unsigned off)
{
    uint64_t  v = 0;

    if (off + 8 <= s->data_bytes) {
        memcpy(&v, s->data + off, 8);
    }

    return v;
}


int
esi_wire_bool(const esi_wire_struct_t *s, unsigned bit)
{
    return bit / 8 < s->data_bytes ? (s->data[bit / 8] >> (bit % 8)) & 1 : 0;
}


/*
 * Resolves pointer ptr of s.  Returns 0 with *target the word index the
 * pointer leads to and *word the pointer itself, 1 for a null pointer, -1 for
 * anything outside the segment or of a kind we refuse.
 */
static int
esi_wire_follow(const esi_wire_struct_t *s, unsigned ptr, unsigned kind,
    uint64_t *word, size_t *target)
{
    const uint8_t  *at;
    int64_t         offset;
    size_t          here;

    if (ptr >= s->ptr_count) {
        return 1;
    }

    at = s->ptrs + (size_t) ptr * 8;
    *word = esi_wire_load64(at);

    if (*word == 0) {
        return 1;
    }

    if ((*word & 3) != kind) {
        return -1;
    }

    offset = (int32_t) (uint32_t) *word >> 2;
    here = (size_t) (at - s->msg->seg) / 8 + 1;

    if (offset < -(int64_t) here || here + offset > s->msg->words) {
        return -1;
    }

    *target = here + offset;
    return 0;
}


static int
esi_wire_spend(esi_wire_msg_t *msg, size_t words)
{
    if (words > msg->budget) {
        return -1;
    }

    msg->budget -= words;
    return 0;
}


int
esi_wire_get_struct(const esi_wire_struct_t *s, unsigned ptr,
    esi_wire_struct_t *out)
{
    int       rc;
    size_t    target, words;
    uint64_t  w;
    uint16_t  data_words;

    out->msg = s->msg;
    out->data = s->msg->seg;
    out->ptrs = s->msg->seg;
    out->data_bytes = 0;
    out->ptr_count = 0;

    rc = esi_wire_follow(s, ptr, ESI_WIRE_KIND_STRUCT, &w, &target);
    if (rc != 0) {
        return rc > 0 ? 0 : -1;
    }

    data_words = (uint16_t) (w >> 32);
    out->ptr_count = (uint16_t) (w >> 48);
    words = (size_t) data_words + out->ptr_count;

    if (target + words > s->msg->words
        || esi_wire_spend(s->msg, words ? words : 1) != 0)
    {
        return -1;
    }

    out->data = s->msg->seg + target * 8;
    out->data_bytes = (uint32_t) data_words * 8;
    out->ptrs = out->data + out->data_bytes;

    return 0;
}


int
esi_wire_get_list(const esi_wire_struct_t *s, unsigned ptr,
    esi_wire_list_t *out)
{
    int       rc;
    size_t    target, words, cost;
    uint64_t  w, tag;

    out->msg = s->msg;
    out->first = s->msg->seg;
    out->count = 0;
    out->data_words = 0;
    out->ptr_count = 0;

    rc = esi_wire_follow(s, ptr, ESI_WIRE_KIND_LIST, &w, &target);
    if (rc != 0) {
        return rc > 0 ? 0 : -1;
    }

    if (((w >> 32) & 7) != ESI_WIRE_LIST_COMPOSITE) {
        return -1;
    }

    words = (size_t) (w >> 35);

    if (target + 1 + words > s->msg->words) {
        return -1;
    }

    tag = esi_wire_load64(s->msg->seg + target * 8);

    if ((tag & 3) != ESI_WIRE_KIND_STRUCT) {
        return -1;
    }

    out->count = (uint32_t) ((uint32_t) tag >> 2);
    out->data_words = (uint16_t) (tag >> 32);
    out->ptr_count = (uint16_t) (tag >> 48);

    /* elements of no size still cost a word each, as capnp charges them */

    cost = words > out->count ? words : out->count;

    if ((uint64_t) out->count * (out->data_words + out->ptr_count) > words
        || esi_wire_spend(s->msg, cost) != 0)
    {
        return -1;
    }

    out->first = s->msg->seg + (target + 1) * 8;

    return 0;
}


void
esi_wire_list_at(const esi_wire_list_t *l, uint32_t i, esi_wire_struct_t *out)
{
    size_t  step = (size_t) l->data_words + l->ptr_count;

    out->msg = l->msg;
    out->data = l->first + (size_t) i * step * 8;
    out->data_bytes = (uint32_t) l->data_words * 8;
    out->ptrs = out->data + out->data_bytes;
    out->ptr_count = l->ptr_count;
}


static int
esi_wire_get_bytes(const esi_wire_struct_t *s, unsigned ptr,
    const uint8_t **p, size_t *len)
{
    int       rc;
    size_t    target, count;
    uint64_t  w;

    *p = NULL;
    *len = 0;

    rc = esi_wire_follow(s, ptr, ESI_WIRE_KIND_LIST, &w, &target);
    if (rc != 0) {
        return rc > 0 ? 1 : -1;
    }

    if (((w >> 32) & 7) != ESI_WIRE_LIST_BYTE) {
        return -1;
    }

    count = (size_t) (w >> 35);

    if (count > (s->msg->words - target) * 8
        || esi_wire_spend(s->msg, (count + 7) / 8) != 0)
    {
        return -1;
    }

    *p = s->msg->seg + target * 8;
    *len = count;

    return 0;
}


int
esi_wire_get_data(const esi_wire_struct_t *s, unsigned ptr,
    const uint8_t **p, size_t *len)
{
    return esi_wire_get_bytes(s, ptr, p, len) < 0 ? -1 : 0;
}


int
esi_wire_get_text(const esi_wire_struct_t *s, unsigned ptr,
    const char **p, size_t *len)
{
    int             rc;
    const uint8_t  *b;
    size_t          n;

    rc = esi_wire_get_bytes(s, ptr, &b, &n);

    if (rc > 0) {
        *p = "";
        *len = 0;
        return 0;
    }

    if (rc < 0 || n == 0 || b[n - 1] != '\0' || memchr(b, '\0', n - 1)) {
        return -1;
    }

    *p = (const char *) b;
    *len = n - 1;

    return 0;
}


void
esi_wire_builder_init(esi_wire_builder_t *b, void *buf, size_t len)
{
    b->buf = buf;
    b->cap_words = len / 8;
    b->used_words = 2;              /* segment table, root pointer */
    b->overflow = b->cap_words < 2;
}


/* Allocates words in the segment (which starts after the table). */
static size_t
esi_wire_alloc(esi_wire_builder_t *b, size_t words)
{
    size_t  at;

    if (b->overflow || words > b->cap_words - b->used_words) {
        b->overflow = 1;
        return 0;
    }

    at = b->used_words;
    b->used_words += words;
    memset(b->buf + at * 8, 0, words * 8);

    return at - 1;
}


static uint8_t *
esi_wire_word(esi_wire_builder_t *b, size_t seg_word)
{
    return b->buf + (seg_word + 1) * 8;
}


static void
esi_wire_point(esi_wire_builder_t *b, size_t ptr_word, size_t target,
    uint64_t kind_and_size)
{
    int64_t  offset = (int64_t) target - (int64_t) ptr_word - 1;

    esi_wire_store64(esi_wire_word(b, ptr_word),
                     ((uint64_t) (uint32_t) (offset << 2)) | kind_and_size);
}


static int
esi_wire_new_struct(esi_wire_builder_t *b, size_t ptr_word,
    uint16_t data_words, uint16_t ptr_count, esi_wire_out_t *out)
{
    size_t  at = esi_wire_alloc(b, (size_t) data_words + ptr_count);

    if (b->overflow) {
        return -1;
    }

    out->b = b;
    out->at = at;
    out->data_words = data_words;
    out->ptr_count = ptr_count;

    esi_wire_point(b, ptr_word, at,
                   ESI_WIRE_KIND_STRUCT | ((uint64_t) data_words << 32)
                   | ((uint64_t) ptr_count << 48));
    return 0;
}


int
esi_wire_root(esi_wire_builder_t *b, uint16_t data_words, uint16_t ptr_count,
    esi_wire_out_t *out)
{
    if (b->overflow) {
        return -1;
    }

    memset(b->buf + 8, 0, 8);
    return esi_wire_new_struct(b, 0, data_words, ptr_count, out);
}


int
esi_wire_set_struct(esi_wire_out_t *s, unsigned ptr, uint16_t data_words,
    uint16_t ptr_count, esi_wire_out_t *out)
{
    if (ptr >= s->ptr_count) {
        return -1;
    }

    return esi_wire_new_struct(s->b, s->at + s->data_words + ptr, data_words,
                               ptr_count, out);
}


static uint8_t *
esi_wire_field(esi_wire_out_t *s, unsigned off, unsigned size)
{
    if (off + size > (unsigned) s->data_words * 8) {
        return NULL;
    }

    return esi_wire_word(s->b, s->at) + off;
}


void
esi_wire_set_u8(esi_wire_out_t *s, unsigned off, uint8_t v)
{
    uint8_t  *p = esi_wire_field(s, off, 1);

    if (p) {
        *p = v;
    }
}


void
esi_wire_set_u16(esi_wire_out_t *s, unsigned off, uint16_t v)
{
    uint8_t  *p = esi_wire_field(s, off, 2);

    if (p) {
        memcpy(p, &v, 2);
    }
}


void
esi_wire_set_u32(esi_wire_out_t *s, unsigned off, uint32_t v)
{
    uint8_t  *p = esi_wire_field(s, off, 4);

    if (p) {
        memcpy(p, &v, 4);
    }
}


void
esi_wire_set_u64(esi_wire_out_t *s, unsigned off, uint64_t v)
{
    uint8_t  *p = esi_wire_field(s, off, 8);

    if (p) {
        memcpy(p, &v, 8);
    }
}


void
esi_wire_set_bool(esi_wire_out_t *s, unsigned bit, int v)
{
    uint8_t  *p = esi_wire_field(s, bit / 8, 1);

    if (p) {
        *p = (uint8_t) ((*p & ~(1u << (bit % 8)))
                        | ((v ? 1u : 0) << (bit % 8)));
    }
}


uint8_t *
esi_wire_alloc_data(esi_wire_out_t *s, unsigned ptr, size_t len)
{
    size_t  at;

    if (ptr >= s->ptr_count || len >= ((size_t) 1 << 29)) {
        return NULL;
    }

    at = esi_wire_alloc(s->b, (len + 7) / 8);
    if (s->b->overflow) {
        return NULL;
    }

    esi_wire_point(s->b, s->at + s->data_words + ptr, at,
                   ESI_WIRE_KIND_LIST | ((uint64_t) ESI_WIRE_LIST_BYTE << 32)
                   | ((uint64_t) len << 35));

    return esi_wire_word(s->b, at);
}


int
esi_wire_set_text(esi_wire_out_t *s, unsigned ptr, const char *p, size_t len)
{
    uint8_t  *dst = esi_wire_alloc_data(s, ptr, len + 1);

    if (dst == NULL) {
        return -1;
    }

    if (len) {
        memcpy(dst, p, len);    /* p may be NULL when len is 0 */
    }

    dst[len] = '\0';

    return 0;
}


size_t
esi_wire_finish(esi_wire_builder_t *b)
{
    uint32_t  hdr[2];

    if (b->overflow) {
        return 0;
    }

    hdr[0] = 0;
    hdr[1] = (uint32_t) (b->used_words - 1);
    memcpy(b->buf, hdr, 8);

    return b->used_words * 8;
}


size_t
esi_wire_size(size_t struct_words, size_t blob_bytes)
{
    return 16 + struct_words * 8 + blob_bytes;
}
