/*
 * A minimal Cap'n Proto reader and writer for single-segment messages, in C,
 * for the connector.  Offsets come from esi_wire_layout.h, generated from
 * proto/esi.capnp at build time.
 *
 * The reader trusts nothing: every pointer is bounds-checked against the
 * segment, far and capability pointers are refused, and a traversal budget
 * stops a message from pointing at the same bytes over and over.
 */

#ifndef ESI_WIRE_H
#define ESI_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "esi_wire_layout.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct {
    const uint8_t  *seg;
    size_t          words;
    size_t          budget;         /* words left to traverse */
} esi_wire_msg_t;


typedef struct {
    esi_wire_msg_t  *msg;
    const uint8_t   *data;
    const uint8_t   *ptrs;
    uint32_t         data_bytes;
    uint16_t         ptr_count;
} esi_wire_struct_t;


typedef struct {
    esi_wire_msg_t  *msg;
    const uint8_t   *first;         /* first element */
    uint32_t         count;
    uint32_t         data_words;
    uint16_t         ptr_count;
} esi_wire_list_t;


/* Returns 0 and the root struct, or -1 when buf is not a valid message. */
int esi_wire_open(esi_wire_msg_t *msg, const void *buf, size_t len,
    esi_wire_struct_t *root);

uint8_t esi_wire_u8(const esi_wire_struct_t *s, unsigned off);
uint16_t esi_wire_u16(const esi_wire_struct_t *s, unsigned off);
uint32_t esi_wire_u32(const esi_wire_struct_t *s, unsigned off);
uint64_t esi_wire_u64(const esi_wire_struct_t *s, unsigned off);
int esi_wire_bool(const esi_wire_struct_t *s, unsigned bit);

/* A null pointer reads as an empty struct, list or blob.  -1: malformed. */
int esi_wire_get_struct(const esi_wire_struct_t *s, unsigned ptr,
    esi_wire_struct_t *out);
int esi_wire_get_list(const esi_wire_struct_t *s, unsigned ptr,
    esi_wire_list_t *out);
void esi_wire_list_at(const esi_wire_list_t *l, uint32_t i,
    esi_wire_struct_t *out);
int esi_wire_get_data(const esi_wire_struct_t *s, unsigned ptr,
    const uint8_t **p, size_t *len);
/* Text must be NUL-terminated on the wire and hold no other NUL. */
int esi_wire_get_text(const esi_wire_struct_t *s, unsigned ptr,
    const char **p, size_t *len);


typedef struct {
    uint8_t   *buf;
    size_t     cap_words;
    size_t     used_words;
    unsigned   overflow:1;
} esi_wire_builder_t;


typedef struct {
    esi_wire_builder_t  *b;
    size_t               at;        /* word index of the data section */
    uint16_t             data_words;
    uint16_t             ptr_count;
} esi_wire_out_t;


/* buf must be 8-byte aligned; len a multiple of 8. */
void esi_wire_builder_init(esi_wire_builder_t *b, void *buf, size_t len);
int esi_wire_root(esi_wire_builder_t *b, uint16_t data_words,
    uint16_t ptr_count, esi_wire_out_t *out);
int esi_wire_set_struct(esi_wire_out_t *s, unsigned ptr, uint16_t data_words,
    uint16_t ptr_count, esi_wire_out_t *out);

void esi_wire_set_u8(esi_wire_out_t *s, unsigned off, uint8_t v);
void esi_wire_set_u16(esi_wire_out_t *s, unsigned off, uint16_t v);
void esi_wire_set_u32(esi_wire_out_t *s, unsigned off, uint32_t v);
void esi_wire_set_u64(esi_wire_out_t *s, unsigned off, uint64_t v);
void esi_wire_set_bool(esi_wire_out_t *s, unsigned bit, int v);

/* Returns where len bytes of Data (or Text, NUL added) go, or NULL. */
uint8_t *esi_wire_alloc_data(esi_wire_out_t *s, unsigned ptr, size_t len);
int esi_wire_set_text(esi_wire_out_t *s, unsigned ptr, const char *p,
    size_t len);

/* Bytes of the finished message, or 0 when it did not fit. */
size_t esi_wire_finish(esi_wire_builder_t *b);

/* Bytes a blob of len takes in a segment; add one for Text's NUL. */
#define esi_wire_blob(len)  (((size_t) (len) + 7) & ~(size_t) 7)

/* Bytes a message needs: its structs' words plus its esi_wire_blob()s. */
size_t esi_wire_size(size_t struct_words, size_t blob_bytes);


#ifdef __cplusplus
}
#endif

#endif /* ESI_WIRE_H */
