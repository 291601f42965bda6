/*
 * Native codec for Chakra .et files (etstore.formats._etcodec).
 *
 * Why this exists: decoding one protobuf message per node through the Python
 * runtime caps ingest near the speed of Chakra's own reader loop. This module
 * walks the wire format directly and writes Arrow-layout column buffers, so a
 * rank file becomes a handful of malloc'd buffers with no Python object per
 * node. The pure-Python decoder in et.py is the reference: every rule here
 * (promotion, validation, error messages) mirrors it, and the test-suite checks
 * both paths against each other.
 *
 * Validation follows what the upb protobuf runtime accepts: a frame is rejected
 * exactly when Node.FromString would raise (bad wire types 6/7, field 0, tags
 * over 32 bits, varints over 10 bytes, lengths past the end, unbalanced groups,
 * nesting deeper than 100, packed fixed-width lists of a wrong length, invalid
 * UTF-8 in proto3 string fields). Known fields that arrive with another wire
 * type are unknown fields, as in upb.
 *
 * The parse runs without the GIL: it only touches the input buffer and memory
 * from malloc. Buffers are handed to Python as `_etcodec.Buffer` objects (buffer
 * protocol, owned memory), which pyarrow wraps without copying.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 100 /* upb's default recursion limit for Python parses */

/* ------------------------------------------------------------------ tables */

static const char *const NODE_TYPES[] = {
    "INVALID_NODE",   "METADATA_NODE",  "MEM_LOAD_NODE",  "MEM_STORE_NODE",
    "COMP_NODE",      "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE",
};
#define N_NODE_TYPES 8

static const char *const COMM_TYPES[] = {
    "ALL_REDUCE", "REDUCE",         "ALL_GATHER",     "GATHER",
    "SCATTER",    "BROADCAST",      "ALL_TO_ALL",     "REDUCE_SCATTER",
    "REDUCE_SCATTER_BLOCK", "BARRIER",
};
#define N_COMM_TYPES 10

enum { K_BOOL, K_CTYPE, K_I64, K_I32, K_STR };
static const char *const KIND_NAMES[] = {"bool", "comm_type", "int64", "int32", "string"};

/* Promoted attribute columns, in OPS_SCHEMA order (checked against the model at import). */
#define NCOL 13
static const struct {
    const char *name;
    int kind;
    int member; /* oneof member written when attr_order does not say */
} COLS[NCOL] = {
    {"is_cpu_op", K_BOOL, 27},      {"comm_type", K_CTYPE, 9},      {"comm_size", K_I64, 9},
    {"comm_src", K_I32, 7},         {"comm_dst", K_I32, 7},         {"comm_tag", K_I32, 7},
    {"pg_name", K_STR, 29},         {"msg_chunk_cnt", K_I64, 9},    {"msg_chunk_idx", K_I64, 9},
    {"total_chunk_cnt", K_I64, 9},  {"chunk_offset", K_I64, 9},     {"tb_id", K_I64, 9},
    {"local_time_step", K_I64, 9},
};

/* Element class of each AttributeProto oneof kind (double, float, int32, ... bytes). */
enum { E_VARINT, E_F64, E_F32, E_STR, E_BYTES };
static const int KIND_ELEM[15] = {
    E_F64,    E_F32,    E_VARINT, E_VARINT, E_VARINT, E_VARINT, E_VARINT, E_VARINT,
    E_F32,    E_F64,    E_F32,    E_F64,    E_VARINT, E_STR,    E_BYTES,
};
static const int ELEM_WT[5] = {0, 1, 5, 2, 2};

static int is_int_member(int m)
{
    return m == 7 || m == 9 || m == 11 || m == 13 || m == 15 || m == 17 || m == 19 || m == 21 ||
           m == 23 || m == 25;
}

/* ------------------------------------------------------- growable buffers */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra)
{
    size_t need = b->len + extra, cap = b->cap ? b->cap : 256;
    if (need < b->len) return -1;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n)
{
    if (b->cap - b->len < n && buf_grow(b, n)) return -1;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_u64(Buf *b, uint64_t v) { return buf_put(b, &v, 8); }
static inline int buf_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }

/* ------------------------------------------------------------ wire reading */

static inline const uint8_t *rd_varint(const uint8_t *p, const uint8_t *e, uint64_t *v)
{
    if (p < e && *p < 0x80) {
        *v = *p;
        return p + 1;
    }
    uint64_t r = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= e) return NULL;
        uint64_t b = *p++;
        r |= (b & 0x7F) << (7 * i); /* bits past 64 are dropped, as upb does */
        if (!(b & 0x80)) {
            *v = r;
            return p;
        }
    }
    return NULL;
}

/* A tag: at most 5 bytes and fits 32 bits (field 0 is for the caller to judge). */
static inline const uint8_t *rd_tag_any(const uint8_t *p, const uint8_t *e, uint32_t *field, int *wt)
{
    uint64_t r = 0;
    if (p < e && *p < 0x80) {
        r = *p++;
    } else {
        for (int i = 0;; i++) {
            if (i == 5 || p >= e) return NULL;
            uint64_t b = *p++;
            r |= (b & 0x7F) << (7 * i);
            if (!(b & 0x80)) break;
        }
        if (r > 0xFFFFFFFFu) return NULL;
    }
    *field = (uint32_t)(r >> 3);
    *wt = (int)(r & 7);
    return p;
}

/* A field tag in a message: field number 0 is malformed there. */
static inline const uint8_t *rd_tag(const uint8_t *p, const uint8_t *e, uint32_t *field, int *wt)
{
    p = rd_tag_any(p, e, field, wt);
    return p && *field ? p : NULL;
}

/* A length prefix: at most 5 bytes and no longer than what is left. */
static inline const uint8_t *rd_len(const uint8_t *p, const uint8_t *e, size_t *n)
{
    uint64_t r = 0;
    if (p < e && *p < 0x80) {
        r = *p++;
    } else {
        for (int i = 0;; i++) {
            if (i == 5 || p >= e) return NULL;
            uint64_t b = *p++;
            r |= (b & 0x7F) << (7 * i);
            if (!(b & 0x80)) break;
        }
    }
    if (r > (uint64_t)(e - p)) return NULL;
    *n = (size_t)r;
    return p;
}

static inline uint64_t le64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF), like upb. */
static int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (n - i < 3 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0;
            if (c == 0xED && s[i + 1] > 0x9F) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (n - i < 4 || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static const uint8_t *skip_field(const uint8_t *p, const uint8_t *e, uint32_t field, int wt,
                                 int depth);

/* Skip an unknown group up to its matching end tag; `depth` is the budget inside it.
 * upb skips group contents without looking at field numbers, so 0 is accepted here. */
static const uint8_t *skip_group(const uint8_t *p, const uint8_t *e, uint32_t field, int depth)
{
    if (depth < 0) return NULL;
    while (p < e) {
        uint32_t f;
        int wt;
        p = rd_tag_any(p, e, &f, &wt);
        if (!p) return NULL;
        if (wt == 4) return f == field ? p : NULL;
        p = skip_field(p, e, f, wt, depth);
        if (!p) return NULL;
    }
    return NULL;
}

/* Skip one field value of an unknown (or mistyped) field; NULL if malformed. */
static const uint8_t *skip_field(const uint8_t *p, const uint8_t *e, uint32_t field, int wt,
                                 int depth)
{
    uint64_t v;
    size_t n;
    switch (wt) {
    case 0:
        return rd_varint(p, e, &v);
    case 1:
        return e - p >= 8 ? p + 8 : NULL;
    case 2:
        p = rd_len(p, e, &n);
        return p ? p + n : NULL;
    case 3:
        return skip_group(p, e, field, depth - 1);
    case 5:
        return e - p >= 4 ? p + 4 : NULL;
    default: /* 4 outside a group, 6, 7 */
        return NULL;
    }
}

/* IOInfo: three strings. Returns 0 if well-formed. */
static int parse_io(const uint8_t *p, const uint8_t *e, int depth)
{
    while (p < e) {
        uint32_t f;
        int wt;
        size_t n;
        p = rd_tag(p, e, &f, &wt);
        if (!p) return -1;
        if (f <= 3 && wt == 2) {
            p = rd_len(p, e, &n);
            if (!p || !utf8_ok(p, n)) return -1;
            p += n;
        } else {
            p = skip_field(p, e, f, wt, depth);
            if (!p) return -1;
        }
    }
    return 0;
}

/* One of the *List messages: `repeated <elem> values = 1`, packed or not. */
static int parse_list(const uint8_t *p, const uint8_t *e, int depth, int elem)
{
    while (p < e) {
        uint32_t f;
        int wt;
        size_t n;
        uint64_t v;
        p = rd_tag(p, e, &f, &wt);
        if (!p) return -1;
        if (f == 1) {
            if (wt == ELEM_WT[elem] && wt != 2) {
                p = skip_field(p, e, f, wt, depth); /* a single varint / fixed value */
                if (!p) return -1;
                continue;
            }
            if (wt == 2) {
                p = rd_len(p, e, &n);
                if (!p) return -1;
                const uint8_t *q = p, *qe = p + n;
                if (elem == E_VARINT) {
                    while (q < qe)
                        if (!(q = rd_varint(q, qe, &v))) return -1;
                } else if (elem == E_F64) {
                    if (n % 8) return -1;
                } else if (elem == E_F32) {
                    if (n % 4) return -1;
                } else if (elem == E_STR) {
                    if (!utf8_ok(p, n)) return -1;
                }
                p = qe;
                continue;
            }
        }
        p = skip_field(p, e, f, wt, depth);
        if (!p) return -1;
    }
    return 0;
}

typedef struct {
    const uint8_t *name;
    size_t name_len;
    size_t doc_len;
    int member;   /* oneof field number of the member set last, 0 if none */
    uint64_t raw; /* varint or little-endian fixed value of a scalar member */
    const uint8_t *str;
    size_t str_len;
    int unknown; /* saw unknown or mistyped fields: never promote, keep the bytes */
} AttrInfo;

/* AttributeProto, with what promotion needs. Returns 0 if well-formed. */
static int parse_attr(const uint8_t *p, const uint8_t *e, int depth, AttrInfo *a)
{
    memset(a, 0, sizeof *a);
    while (p < e) {
        uint32_t f;
        int wt;
        size_t n;
        p = rd_tag(p, e, &f, &wt);
        if (!p) return -1;
        if ((f == 1 || f == 2) && wt == 2) {
            p = rd_len(p, e, &n);
            if (!p || !utf8_ok(p, n)) return -1;
            if (f == 1) {
                a->name = p;
                a->name_len = n;
            } else {
                a->doc_len = n;
            }
            p += n;
            continue;
        }
        if (f >= 3 && f <= 32) {
            int elem = KIND_ELEM[(f - 3) / 2];
            if (f & 1) { /* scalar member */
                if (wt == ELEM_WT[elem]) {
                    if (wt == 0) {
                        p = rd_varint(p, e, &a->raw);
                        if (!p) return -1;
                    } else if (wt == 1) {
                        if (e - p < 8) return -1;
                        a->raw = le64(p);
                        p += 8;
                    } else if (wt == 5) {
                        if (e - p < 4) return -1;
                        a->raw = le32(p);
                        p += 4;
                    } else {
                        p = rd_len(p, e, &n);
                        if (!p || (elem == E_STR && !utf8_ok(p, n))) return -1;
                        a->str = p;
                        a->str_len = n;
                        p += n;
                    }
                    a->member = (int)f;
                    continue;
                }
            } else if (wt == 2) { /* list member: a nested message */
                p = rd_len(p, e, &n);
                if (!p || depth - 1 < 0 || parse_list(p, p + n, depth - 1, elem)) return -1;
                p += n;
                a->member = (int)f;
                continue;
            }
        }
        a->unknown = 1;
        p = skip_field(p, e, f, wt, depth);
        if (!p) return -1;
    }
    return 0;
}

/* Whether a file's first frame is a Node rather than a GlobalMetadata: Chakra files
   written before GlobalMetadata existed (2023 ASTRA-sim examples) start with a node. A
   GlobalMetadata has only length-delimited fields 1 and 2; a Node shows itself by its
   varint id (field 1) or any of fields 3..10. The scan stops at the first malformed
   field; et._looks_like_node is the same rule. */
static int looks_like_node(const uint8_t *p, const uint8_t *e)
{
    while (p < e) {
        uint64_t tag = 0, v;
        int i;
        for (i = 0; i < 5; i++) {
            if (p >= e) return 0;
            uint64_t b = *p++;
            tag |= (b & 0x7F) << (7 * i);
            if (!(b & 0x80)) break;
        }
        if (i == 5) return 0;
        uint64_t f = tag >> 3;
        int wt = (int)(tag & 7);
        if ((f == 1 && wt == 0) || (f >= 3 && f <= 10)) return 1;
        switch (wt) {
        case 0:
            p = rd_varint(p, e, &v);
            if (!p) return 0;
            break;
        case 1:
            if (e - p < 8) return 0;
            p += 8;
            break;
        case 5:
            if (e - p < 4) return 0;
            p += 4;
            break;
        case 2:
            p = rd_varint(p, e, &v);
            if (!p || v > (uint64_t)(e - p)) return 0;
            p += v;
            break;
        default:
            return 0;
        }
    }
    return 0;
}

/* GlobalMetadata; *nonempty says whether ListFields() would be non-empty. */
static int parse_meta(const uint8_t *p, const uint8_t *e, int *nonempty)
{
    size_t version_len = 0, nattr = 0;
    while (p < e) {
        uint32_t f;
        int wt;
        size_t n;
        p = rd_tag(p, e, &f, &wt);
        if (!p) return -1;
        if (f == 1 && wt == 2) {
            p = rd_len(p, e, &n);
            if (!p || !utf8_ok(p, n)) return -1;
            version_len = n;
            p += n;
        } else if (f == 2 && wt == 2) {
            AttrInfo a;
            p = rd_len(p, e, &n);
            if (!p || parse_attr(p, p + n, MAX_DEPTH - 1, &a)) return -1;
            p += n;
            nattr++;
        } else {
            p = skip_field(p, e, f, wt, MAX_DEPTH);
            if (!p) return -1;
        }
    }
    *nonempty = version_len > 0 || nattr > 0;
    return 0;
}

/* strlen of the names above, set at import (hot loops should not call strlen) */
static size_t COL_LEN[NCOL], NODE_TYPE_LEN[N_NODE_TYPES], COMM_TYPE_LEN[N_COMM_TYPES];

/* Column index of a promotable attribute name, or -1. */
static int column_of(const uint8_t *name, size_t len)
{
    if (!name) return -1;
    for (int c = 0; c < NCOL; c++)
        if (COL_LEN[c] == len && COLS[c].name[len - 1] == (char)name[len - 1] &&
            memcmp(COLS[c].name, name, len) == 0)
            return c;
    return -1;
}

/* The integer an integer oneof member holds; *big when it is >= 2**63. */
static int64_t member_int(int member, uint64_t raw, int *big)
{
    *big = 0;
    switch (member) {
    case 7: /* int32 */
    case 23: /* sfixed32 */
        return (int32_t)(uint32_t)raw;
    case 11: /* uint32 */
    case 19: /* fixed32 */
        return (uint32_t)raw;
    case 15: { /* sint32 */
        uint32_t u = (uint32_t)raw;
        return (int32_t)((u >> 1) ^ (0u - (u & 1)));
    }
    case 17: /* sint64 */
        return (int64_t)((raw >> 1) ^ (0 - (raw & 1)));
    case 13: /* uint64 */
    case 21: /* fixed64 */
        *big = raw > (uint64_t)INT64_MAX;
        return (int64_t)raw;
    default: /* int64, sfixed64 */
        return (int64_t)raw;
    }
}

/* model.promotable(), for a parsed attribute and its column. */
static int promotable(int col, const AttrInfo *a, int64_t *value)
{
    int kind = COLS[col].kind, big;
    if (kind == K_BOOL) return a->member == 27;
    if (kind == K_STR) return a->member == 29;
    if (!is_int_member(a->member)) return 0;
    int64_t v = member_int(a->member, a->raw, &big);
    if (big) return 0;
    *value = v;
    if (kind == K_CTYPE) return v >= 0 && v < N_COMM_TYPES;
    if (kind == K_I32) return v >= INT32_MIN && v <= INT32_MAX;
    return 1;
}

/* ----------------------------------------------------------------- decoder */

typedef struct {
    size_t cap, n; /* rows allocated, rows written */
    uint64_t *id, *dur, *start;
    int32_t *name_off, *type_off, *attrs_off, *order_off;
    Buf name, type, attrs, order;
    uint8_t *attrs_valid;
    size_t attrs_nulls;
    void *val[NCOL]; /* int64 / int32 values, or the bool value bitmap */
    uint8_t *valid[NCOL];
    size_t nulls[NCOL];
    int32_t *soff[NCOL]; /* string columns */
    Buf sdata[NCOL];
    Buf src, dst, pos, kind; /* kind: "data"/"ctrl", four bytes per dep */
    size_t ndeps;
    Buf ctrl; /* scratch: this node's ctrl deps, emitted after its data deps */
    Buf tmp;  /* scratch for reordering a node's extra records */
    int nomem, overflow;
} Dec;

static void dec_free(Dec *d)
{
    free(d->id);
    free(d->dur);
    free(d->start);
    free(d->name_off);
    free(d->type_off);
    free(d->attrs_off);
    free(d->order_off);
    free(d->name.p);
    free(d->type.p);
    free(d->attrs.p);
    free(d->order.p);
    free(d->attrs_valid);
    for (int c = 0; c < NCOL; c++) {
        free(d->val[c]);
        free(d->valid[c]);
        free(d->soff[c]);
        free(d->sdata[c].p);
    }
    free(d->src.p);
    free(d->dst.p);
    free(d->pos.p);
    free(d->kind.p);
    free(d->ctrl.p);
    free(d->tmp.p);
    memset(d, 0, sizeof *d);
}

static int dec_alloc(Dec *d, size_t rows)
{
    size_t r = rows ? rows : 1, bm = (r + 7) / 8;
    d->cap = rows;
    d->id = calloc(r, 8);
    d->dur = calloc(r, 8);
    d->start = calloc(r, 8);
    d->name_off = calloc(r + 1, 4);
    d->type_off = calloc(r + 1, 4);
    d->attrs_off = calloc(r + 1, 4);
    d->order_off = calloc(r + 1, 4);
    d->attrs_valid = calloc(bm, 1);
    if (!d->id || !d->dur || !d->start || !d->name_off || !d->type_off || !d->attrs_off ||
        !d->order_off || !d->attrs_valid)
        return -1;
    for (int c = 0; c < NCOL; c++) {
        d->valid[c] = calloc(bm, 1);
        if (!d->valid[c]) return -1;
        switch (COLS[c].kind) {
        case K_BOOL:
            d->val[c] = calloc(bm, 1);
            break;
        case K_I64:
            d->val[c] = calloc(r, 8);
            break;
        case K_I32:
            d->val[c] = calloc(r, 4);
            break;
        default:
            d->soff[c] = calloc(r + 1, 4);
            if (!d->soff[c]) return -1;
            continue;
        }
        if (!d->val[c]) return -1;
    }
    /* a rough first guess; Bufs double as needed */
    if (buf_grow(&d->name, rows * 16) || buf_grow(&d->type, rows * 12) ||
        buf_grow(&d->order, rows * 8) || buf_grow(&d->src, rows * 16) ||
        buf_grow(&d->dst, rows * 16) || buf_grow(&d->pos, rows * 8) ||
        buf_grow(&d->kind, rows * 8))
        return -1;
    return 0;
}

static inline void set_bit(uint8_t *bm, size_t i) { bm[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* Append an attr_order token: "name:member", or "*" for a kept attribute (no snprintf: hot). */
static int put_token(Buf *b, int first, int col, int member)
{
    size_t nlen = col >= 0 ? COL_LEN[col] : 0;
    if (b->cap - b->len < nlen + 8 && buf_grow(b, nlen + 8)) return -1;
    uint8_t *w = b->p + b->len;
    if (!first) *w++ = ',';
    if (col < 0) {
        *w++ = '*';
    } else {
        memcpy(w, COLS[col].name, nlen);
        w += nlen;
        *w++ = ':';
        if (member >= 10) *w++ = (uint8_t)('0' + member / 10);
        *w++ = (uint8_t)('0' + member % 10);
    }
    b->len = (size_t)(w - b->p);
    return 0;
}

/* Put a node's kept records in field order (inputs, outputs, attrs; stable), as export
 * writes them, so decoding what we wrote gives back the same cell. Rarely needed. */
static int sort_extras(Dec *d, size_t from)
{
    const uint8_t *seg = d->attrs.p + from, *end = d->attrs.p + d->attrs.len;
    d->tmp.len = 0;
    for (uint32_t want = 8; want <= 10; want++) {
        const uint8_t *p = seg;
        while (p < end) {
            const uint8_t *rec = p;
            uint32_t f = 0;
            int wt;
            size_t n = 0;
            /* records we validated and copied ourselves; the checks only guard the reads */
            if (!(p = rd_tag(p, end, &f, &wt)) || !(p = rd_len(p, end, &n))) return -1;
            p += n;
            if (f == want && buf_put(&d->tmp, rec, (size_t)(p - rec))) return -1;
        }
    }
    memcpy(d->attrs.p + from, d->tmp.p, d->tmp.len);
    return 0;
}

/* Decode one node frame into row d->n. 0 ok, -1 malformed, -2 out of memory / too large. */
static int parse_node(Dec *d, const uint8_t *p, const uint8_t *e)
{
    size_t row = d->n, dep_first = d->ndeps, attrs_before = d->attrs.len;
    uint64_t id = 0, start = 0, dur = 0, v;
    uint32_t type = 0;
    const uint8_t *name = NULL;
    size_t name_len = 0, n;
    int32_t ndata = 0;
    unsigned promoted = 0;
    int ntok = 0, last_extra = 0, unsorted = 0;
    d->ctrl.len = 0;

#define OOM()                                                                                     \
    do {                                                                                          \
        d->nomem = 1;                                                                             \
        return -2;                                                                                \
    } while (0)
#define PUSH_DEP(f, val)                                                                          \
    do {                                                                                          \
        if ((f) == 5) {                                                                           \
            if (buf_u64(&d->src, (val)) || buf_i32(&d->pos, ndata++) ||                    \
                buf_put(&d->kind, "data", 4))                                              \
                OOM();                     \
            d->ndeps++;                                                                           \
        } else if (buf_u64(&d->ctrl, (val))) {                                                    \
            OOM();                                                                                \
        }                                                                                         \
    } while (0)

    while (p < e) {
        const uint8_t *rec = p;
        uint32_t f;
        int wt;
        p = rd_tag(p, e, &f, &wt);
        if (!p) return -1;
        switch (f) {
        case 1:
            if (wt != 0) break;
            if (!(p = rd_varint(p, e, &id))) return -1;
            continue;
        case 2:
            if (wt != 2) break;
            if (!(p = rd_len(p, e, &n)) || !utf8_ok(p, n)) return -1;
            name = p;
            name_len = n;
            p += n;
            continue;
        case 3:
            if (wt != 0) break;
            if (!(p = rd_varint(p, e, &v))) return -1;
            type = (uint32_t)v; /* an int32 enum: upb keeps the low 32 bits */
            continue;
        case 4:
        case 5:
            if (wt == 0) {
                if (!(p = rd_varint(p, e, &v))) return -1;
                PUSH_DEP(f, v);
                continue;
            }
            if (wt == 2) {
                if (!(p = rd_len(p, e, &n))) return -1;
                const uint8_t *q = p, *qe = p + n;
                while (q < qe) {
                    if (!(q = rd_varint(q, qe, &v))) return -1;
                    PUSH_DEP(f, v);
                }
                p = qe;
                continue;
            }
            break;
        case 6:
        case 7:
            if (wt != 0) break;
            if (!(p = rd_varint(p, e, f == 6 ? &start : &dur))) return -1;
            continue;
        case 8:
        case 9:
            if (wt != 2) break;
            if (!(p = rd_len(p, e, &n)) || parse_io(p, p + n, MAX_DEPTH - 1)) return -1;
            p += n;
            if (buf_put(&d->attrs, rec, (size_t)(p - rec))) OOM();
            if ((int)f < last_extra) unsorted = 1;
            last_extra = (int)f;
            continue;
        case 10: {
            AttrInfo a;
            int64_t value = 0;
            if (wt != 2) break;
            if (!(p = rd_len(p, e, &n)) || parse_attr(p, p + n, MAX_DEPTH - 1, &a)) return -1;
            p += n;
            int c = column_of(a.name, a.name_len);
            if (c >= 0 && !(promoted & (1u << c)) && a.member && !a.doc_len && !a.unknown &&
                promotable(c, &a, &value)) {
                promoted |= 1u << c;
                set_bit(d->valid[c], row);
                switch (COLS[c].kind) {
                case K_BOOL:
                    if (a.raw) set_bit(d->val[c], row);
                    break;
                case K_I64:
                    ((int64_t *)d->val[c])[row] = value;
                    break;
                case K_I32:
                    ((int32_t *)d->val[c])[row] = (int32_t)value;
                    break;
                case K_CTYPE:
                    if (buf_put(&d->sdata[c], COMM_TYPES[value], COMM_TYPE_LEN[value])) OOM();
                    break;
                default:
                    if (buf_put(&d->sdata[c], a.str, a.str_len)) OOM();
                }
                if (put_token(&d->order, ntok++ == 0, c, a.member)) OOM();
            } else {
                if (buf_put(&d->attrs, rec, (size_t)(p - rec))) OOM();
                if (put_token(&d->order, ntok++ == 0, -1, 0)) OOM();
                last_extra = 10;
            }
            continue;
        }
        default:
            break;
        }
        if (!(p = skip_field(p, e, f, wt, MAX_DEPTH))) return -1;
    }

    if (unsorted && sort_extras(d, attrs_before)) OOM();

    /* ctrl deps after data deps, then every dep of this node gets its (final) id as dst */
    size_t nctrl = d->ctrl.len / 8;
    for (size_t i = 0; i < nctrl; i++) {
        uint64_t s;
        memcpy(&s, d->ctrl.p + 8 * i, 8);
        if (buf_u64(&d->src, s) || buf_i32(&d->pos, (int32_t)i) || buf_put(&d->kind, "ctrl", 4))
            OOM();
    }
    d->ndeps += nctrl;
    if (d->ndeps > INT32_MAX / 4) { /* kind offsets are 4 * i in int32 */
        d->overflow = 1;
        return -2;
    }
    for (size_t i = dep_first; i < d->ndeps; i++)
        if (buf_u64(&d->dst, id)) OOM();

    d->id[row] = id;
    d->start[row] = start;
    d->dur[row] = dur;
    if (buf_put(&d->name, name, name_len)) OOM();
    int32_t t = (int32_t)type;
    if (t >= 0 && t < N_NODE_TYPES) {
        if (buf_put(&d->type, NODE_TYPES[t], NODE_TYPE_LEN[t])) OOM();
    } else {
        char tmp[32];
        int k = snprintf(tmp, sizeof tmp, "NODE_TYPE_%d", (int)t);
        if (buf_put(&d->type, tmp, (size_t)k)) OOM();
    }
    if (d->attrs.len == attrs_before)
        d->attrs_nulls++;
    else
        set_bit(d->attrs_valid, row);
    for (int c = 0; c < NCOL; c++) {
        if (!(promoted & (1u << c))) d->nulls[c]++;
        if (d->soff[c]) {
            if (d->sdata[c].len > INT32_MAX) d->overflow = 1;
            d->soff[c][row + 1] = (int32_t)d->sdata[c].len;
        }
    }
    if (d->name.len > INT32_MAX || d->type.len > INT32_MAX || d->attrs.len > INT32_MAX ||
        d->order.len > INT32_MAX || d->overflow) {
        d->overflow = 1;
        return -2;
    }
    d->name_off[row + 1] = (int32_t)d->name.len;
    d->type_off[row + 1] = (int32_t)d->type.len;
    d->attrs_off[row + 1] = (int32_t)d->attrs.len;
    d->order_off[row + 1] = (int32_t)d->order.len;
    d->n++;
    return 0;
#undef PUSH_DEP
#undef OOM
}

/* The frame-length varint as _frames.varint reads it: -1 truncated, -2 longer than 5 bytes. */
static int frame_varint(const uint8_t *data, size_t n, size_t *pos, uint64_t *out)
{
    uint64_t r = 0;
    for (int shift = 0;; shift += 7) {
        if (shift >= 35) return -2;
        if (*pos >= n) return -1;
        uint8_t b = data[(*pos)++];
        r |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = r;
            return 0;
        }
    }
}

typedef struct {
    size_t meta_off, meta_len;
    int no_meta; /* the file starts with a node (no GlobalMetadata frame) */
    size_t max_rows; /* refuse (-4) a file of more node frames than this; 0: no limit */
    size_t rows;     /* node frames the pre-scan counted */
    char msg[256]; /* error text after "{path}: " */
} RunInfo;

/* The whole file. 0 ok, -1 format error (info->msg), -2 out of memory, -3 too large,
 * -4 more node frames than info->max_rows (info->rows; nothing allocated). */
static int run_decode(Dec *d, const uint8_t *data, size_t n, RunInfo *info)
{
    size_t pos = 0, start;
    uint64_t len;
    int r = frame_varint(data, n, &pos, &len);
    if (r) {
        snprintf(info->msg, sizeof info->msg, "byte 0: %s",
                 r == -1 ? "truncated frame length at end of file" : "frame length is not a varint32");
        return -1;
    }
    if (len > n - pos) {
        snprintf(info->msg, sizeof info->msg,
                 "byte 0: GlobalMetadata frame claims %llu bytes but only %zu remain (truncated, or "
                 "not a Chakra ET file)",
                 (unsigned long long)len, n - pos);
        return -1;
    }
    int nonempty = 0;
    if (len && looks_like_node(data + pos, data + pos + len)) {
        info->no_meta = 1; /* frame 1 is this node, at byte 0 */
        info->meta_off = 0;
        info->meta_len = 0;
        pos = 0;
    } else if (parse_meta(data + pos, data + pos + len, &nonempty) || (len && !nonempty)) {
        snprintf(info->msg, sizeof info->msg, "byte 0: first frame is not a Chakra GlobalMetadata");
        return -1;
    } else {
        info->meta_off = pos;
        info->meta_len = (size_t)len;
        pos += (size_t)len;
    }

    /* count the frames first, so fixed-width columns are allocated once, exactly */
    size_t rows = 0, scan = pos;
    while (scan < n) {
        if (frame_varint(data, n, &scan, &len) || len > n - scan) break;
        scan += (size_t)len;
        rows++;
    }
    info->rows = rows;
    if (info->max_rows && rows > info->max_rows) return -4;
    if (dec_alloc(d, rows)) return -2;

    for (size_t frame = 1; pos < n; frame++) {
        start = pos;
        r = frame_varint(data, n, &pos, &len);
        if (r) {
            snprintf(info->msg, sizeof info->msg, "byte %zu: %s", start,
                     r == -1 ? "truncated frame length at end of file"
                             : "frame length is not a varint32");
            return -1;
        }
        if (len > n - pos) {
            snprintf(info->msg, sizeof info->msg,
                     "byte %zu: node frame %zu claims %llu bytes but only %zu remain (truncated file?)",
                     start, frame, (unsigned long long)len, n - pos);
            return -1;
        }
        if (d->n >= d->cap) return -2; /* cannot happen: the pre-scan saw this frame */
        r = parse_node(d, data + pos, data + pos + len);
        if (r == -1) {
            snprintf(info->msg, sizeof info->msg, "byte %zu: frame %zu is not a Chakra Node", start,
                     frame);
            return -1;
        }
        if (r == -2) return d->overflow ? -3 : -2;
        pos += (size_t)len;
    }
    return 0;
}

/* --------------------------------------------------------- Buffer object */

typedef struct {
    PyObject_HEAD
    void *ptr;
    Py_ssize_t len;
} BufferObject;

static void buffer_dealloc(BufferObject *self)
{
    free(self->ptr);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int buffer_getbuffer(BufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 0, flags);
}

static Py_ssize_t buffer_length(BufferObject *self) { return self->len; }

static PyBufferProcs buffer_as_buffer = {(getbufferproc)buffer_getbuffer, NULL};
static PySequenceMethods buffer_as_sequence = {.sq_length = (lenfunc)buffer_length};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "etstore.formats._etcodec.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_as_buffer = &buffer_as_buffer,
    .tp_as_sequence = &buffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory owned by the codec, exposed through the buffer protocol (zero-copy).",
};

/* Hand `*ptr` (len bytes, shrunk to fit) to a new Buffer; *ptr becomes NULL. */
static PyObject *take(void **ptr, size_t len)
{
    BufferObject *b = PyObject_New(BufferObject, &BufferType);
    if (!b) return NULL;
    void *p = *ptr;
    if (!p || len == 0) {
        free(p);
        p = malloc(1);
        if (!p) {
            b->ptr = NULL;
            b->len = 0;
            Py_DECREF(b);
            *ptr = NULL;
            return PyErr_NoMemory();
        }
    } else {
        void *q = realloc(p, len);
        if (q) p = q;
    }
    *ptr = NULL;
    b->ptr = p;
    b->len = (Py_ssize_t)len;
    return (PyObject *)b;
}

static PyObject *take_buf(Buf *b) { return take((void **)&b->p, b->len); }

static PyObject *none(void)
{
    Py_INCREF(Py_None);
    return Py_None;
}

/* A column tuple: (validity|None, *buffers, null_count). Steals every argument. */
static PyObject *column(size_t nulls, int nbufs, ...)
{
    PyObject *items[4] = {NULL, NULL, NULL, NULL};
    int ok = 1;
    va_list ap;
    va_start(ap, nbufs);
    for (int i = 0; i < nbufs; i++) {
        items[i] = va_arg(ap, PyObject *);
        if (!items[i]) ok = 0;
    }
    va_end(ap);
    PyObject *t = ok ? PyTuple_New(nbufs + 1) : NULL;
    PyObject *nc = t ? PyLong_FromSize_t(nulls) : NULL;
    if (!nc) {
        Py_XDECREF(t);
        for (int i = 0; i < nbufs; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (int i = 0; i < nbufs; i++) PyTuple_SET_ITEM(t, i, items[i]);
    PyTuple_SET_ITEM(t, nbufs, nc);
    return t;
}

/* The validity bitmap as a Buffer, or None (and freed) when nothing is null. */
static PyObject *validity(uint8_t **bm, size_t nulls, size_t rows)
{
    if (nulls == 0) {
        free(*bm);
        *bm = NULL;
        return none();
    }
    return take((void **)bm, (rows + 7) / 8);
}

static int set_col(PyObject *dict, const char *key, PyObject *col)
{
    if (!col) return -1;
    int r = PyDict_SetItemString(dict, key, col);
    Py_DECREF(col);
    return r;
}

static PyObject *raise_format(PyObject *path, const char *msg)
{
    PyObject *mod = PyImport_ImportModule("etstore.errors");
    PyObject *cls = mod ? PyObject_GetAttrString(mod, "TraceFormatError") : NULL;
    Py_XDECREF(mod);
    if (!cls) return NULL;
    PyObject *text = PyUnicode_FromFormat("%S: %s", path, msg);
    if (text) {
        PyErr_SetObject(cls, text);
        Py_DECREF(text);
    }
    Py_DECREF(cls);
    return NULL;
}

PyDoc_STRVAR(decode_doc,
             "decode(data, path, max_rows=0) -> (rows, ndeps, metadata, ops_columns, deps_columns)"
             " | None | int\n\n"
             "Decode one rank's uncompressed .et bytes into Arrow-layout buffers.\n"
             "ops_columns maps every OPS_SCHEMA column except rank, deps_columns maps src, dst,\n"
             "kind and pos; each value is (validity|None, [offsets,] values, null_count).\n"
             "Returns None when a string column would pass 2 GiB (int32 offsets), and the number\n"
             "of node frames, having allocated nothing, when max_rows > 0 and it is more. Raises\n"
             "TraceFormatError('{path}: byte {offset}: ...') exactly where the pure-Python\n"
             "decoder does.");

static PyObject *codec_decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *path, *ops = NULL, *deps = NULL, *meta = NULL, *out = NULL;
    int32_t *koff = NULL;
    (void)self;
    Py_ssize_t max_rows = 0;
    if (!PyArg_ParseTuple(args, "y*O|n:decode", &view, &path, &max_rows)) return NULL;
    Dec d;
    RunInfo info;
    memset(&d, 0, sizeof d);
    memset(&info, 0, sizeof info);
    info.max_rows = max_rows > 0 ? (size_t)max_rows : 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_decode(&d, (const uint8_t *)view.buf, (size_t)view.len, &info);
    Py_END_ALLOW_THREADS
    if (rc == -1) {
        raise_format(path, info.msg);
        goto done;
    }
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc == -3) {
        out = none();
        goto done;
    }
    if (rc == -4) {
        out = PyLong_FromSize_t(info.rows);
        goto done;
    }
    size_t n = d.n, m = d.ndeps;
    meta = info.no_meta ? none()
                        : PyBytes_FromStringAndSize((const char *)view.buf + info.meta_off,
                                                    (Py_ssize_t)info.meta_len);
    ops = PyDict_New();
    deps = PyDict_New();
    if (!meta || !ops || !deps) goto done;
    if (set_col(ops, "id", column(0, 2, none(), take((void **)&d.id, n * 8))) ||
        set_col(ops, "duration_micros", column(0, 2, none(), take((void **)&d.dur, n * 8))) ||
        set_col(ops, "start_time_micros", column(0, 2, none(), take((void **)&d.start, n * 8))) ||
        set_col(ops, "name",
                column(0, 3, none(), take((void **)&d.name_off, (n + 1) * 4), take_buf(&d.name))) ||
        set_col(ops, "type",
                column(0, 3, none(), take((void **)&d.type_off, (n + 1) * 4), take_buf(&d.type))) ||
        set_col(ops, "attr_order",
                column(0, 3, none(), take((void **)&d.order_off, (n + 1) * 4), take_buf(&d.order))) ||
        set_col(ops, "attrs",
                column(d.attrs_nulls, 3, validity(&d.attrs_valid, d.attrs_nulls, n),
                       take((void **)&d.attrs_off, (n + 1) * 4), take_buf(&d.attrs))))
        goto done;
    for (int c = 0; c < NCOL; c++) {
        PyObject *valid = validity(&d.valid[c], d.nulls[c], n), *col;
        switch (COLS[c].kind) {
        case K_BOOL:
            col = column(d.nulls[c], 2, valid, take(&d.val[c], (n + 7) / 8));
            break;
        case K_I64:
            col = column(d.nulls[c], 2, valid, take(&d.val[c], n * 8));
            break;
        case K_I32:
            col = column(d.nulls[c], 2, valid, take(&d.val[c], n * 4));
            break;
        default:
            col = column(d.nulls[c], 3, valid, take((void **)&d.soff[c], (n + 1) * 4),
                         take_buf(&d.sdata[c]));
        }
        if (set_col(ops, COLS[c].name, col)) goto done;
    }
    koff = malloc((m + 1) * 4);
    if (!koff) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i <= m; i++) koff[i] = (int32_t)(4 * i);
    if (set_col(deps, "src", column(0, 2, none(), take_buf(&d.src))) ||
        set_col(deps, "dst", column(0, 2, none(), take_buf(&d.dst))) ||
        set_col(deps, "pos", column(0, 2, none(), take_buf(&d.pos))) ||
        set_col(deps, "kind", column(0, 3, none(), take((void **)&koff, (m + 1) * 4), take_buf(&d.kind))))
        goto done;
    out = Py_BuildValue("(nnOOO)", (Py_ssize_t)n, (Py_ssize_t)m, meta, ops, deps);
done:
    PyBuffer_Release(&view);
    free(koff); /* NULL unless an error stopped before it was handed over */
    dec_free(&d);
    Py_XDECREF(meta);
    Py_XDECREF(ops);
    Py_XDECREF(deps);
    return out;
}

/* ----------------------------------------------------------------- encoder */

static inline uint8_t *w_varint(uint8_t *w, uint64_t v)
{
    while (v >= 0x80) {
        *w++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *w++ = (uint8_t)v;
    return w;
}

static inline size_t varint_size(uint64_t v)
{
    size_t k = 1;
    while (v >= 0x80) {
        v >>= 7;
        k++;
    }
    return k;
}

static inline uint8_t *w_le(uint8_t *w, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++) *w++ = (uint8_t)(v >> (8 * i));
    return w;
}

typedef struct {
    const int32_t *off;
    const uint8_t *data;
    const uint8_t *valid; /* one byte per row, NULL when nothing is null */
} StrCol;

typedef struct {
    const uint8_t *p;
    size_t len;
    int field;
} Rec;

typedef struct {
    Py_buffer views[64]; /* 44 are used */
    int n;
} Views;

static void views_release(Views *vs)
{
    for (int i = 0; i < vs->n; i++) PyBuffer_Release(&vs->views[i]);
    vs->n = 0;
}

/* A contiguous buffer of at least `need` bytes (`optional`: None gives NULL). */
static int get_buf(Views *vs, PyObject *o, size_t need, int optional, const char *what,
                   const void **ptr, size_t *len)
{
    if (o == Py_None && optional) {
        *ptr = NULL;
        if (len) *len = 0;
        return 0;
    }
    if (vs->n >= (int)(sizeof vs->views / sizeof vs->views[0])) {
        PyErr_SetString(PyExc_RuntimeError, "too many buffers");
        return -1;
    }
    Py_buffer *v = &vs->views[vs->n];
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    vs->n++;
    if ((size_t)v->len < need) {
        PyErr_Format(PyExc_ValueError, "encode: %s holds %zd bytes, needs %zu", what, v->len, need);
        return -1;
    }
    *ptr = v->buf;
    if (len) *len = (size_t)v->len;
    return 0;
}

/* (offsets int32[n+1], data, valid uint8[n] | None), with offsets checked against data. */
static int get_strcol(Views *vs, PyObject *t, size_t n, const char *what, StrCol *sc)
{
    const void *off, *data, *valid;
    size_t dlen;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
        PyErr_Format(PyExc_TypeError, "encode: %s must be (offsets, data, valid)", what);
        return -1;
    }
    if (get_buf(vs, PyTuple_GET_ITEM(t, 0), (n + 1) * 4, 0, what, &off, NULL) ||
        get_buf(vs, PyTuple_GET_ITEM(t, 1), 0, 0, what, &data, &dlen) ||
        get_buf(vs, PyTuple_GET_ITEM(t, 2), n, 1, what, &valid, NULL))
        return -1;
    sc->off = off;
    sc->data = data;
    sc->valid = valid;
    if (sc->off[0] < 0 || (size_t)sc->off[n] > dlen) goto bad;
    for (size_t i = 0; i < n; i++)
        if (sc->off[i] > sc->off[i + 1]) goto bad;
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "encode: %s offsets are not monotonic within the data", what);
    return -1;
}

static inline int str_at(const StrCol *sc, size_t i, const uint8_t **p, size_t *len)
{
    if (sc->valid && !sc->valid[i]) return 0;
    *p = sc->data + sc->off[i];
    *len = (size_t)(sc->off[i + 1] - sc->off[i]);
    return 1;
}

typedef struct {
    const uint8_t *val; /* uint8 (bool) or int64 */
    const uint8_t *valid;
    StrCol str;
} PCol;

typedef struct {
    char msg[256];
} EncErr;

/* One promoted attribute record (field 10). Returns the write pointer, NULL on a bad value. */
static uint8_t *emit_promoted(uint8_t *w, int c, int member, const PCol *pc, size_t row, EncErr *err)
{
    int kind = COLS[c].kind;
    const char *name = COLS[c].name;
    size_t nlen = strlen(name), vlen = 0;
    uint64_t u = 0;
    const uint8_t *s = NULL;
    int elem, ok = 1;
    if (member < 3 || member > 32 || !(member & 1)) ok = 0;
    elem = ok ? KIND_ELEM[(member - 3) / 2] : 0;
    if (ok && kind == K_STR) {
        ok = member == 29;
        if (ok) str_at(&pc->str, row, &s, &vlen);
    } else if (ok && kind == K_BOOL && member == 27) {
        u = pc->val[row] != 0;
    } else if (ok) {
        int64_t v = kind == K_BOOL ? (pc->val[row] != 0) : ((const int64_t *)pc->val)[row];
        int in_range = 1;
        switch (member) {
        case 7:
        case 23:
            in_range = v >= INT32_MIN && v <= INT32_MAX;
            u = member == 7 ? (uint64_t)v : (uint32_t)(int32_t)v;
            break;
        case 15:
            in_range = v >= INT32_MIN && v <= INT32_MAX;
            u = ((uint32_t)v << 1) ^ (v < 0 ? 0xFFFFFFFFu : 0u);
            break;
        case 11:
        case 19:
            in_range = v >= 0 && v <= (int64_t)UINT32_MAX;
            u = (uint64_t)v;
            break;
        case 13:
        case 21:
            in_range = v >= 0;
            u = (uint64_t)v;
            break;
        case 17:
            u = ((uint64_t)v << 1) ^ (v < 0 ? ~(uint64_t)0 : 0);
            break;
        case 9:
        case 25:
            u = (uint64_t)v;
            break;
        default:
            ok = 0;
        }
        if (ok && !in_range) {
            snprintf(err->msg, sizeof err->msg, "ops row %zu: %s = %lld does not fit oneof member %d",
                     row, name, (long long)v, member);
            return NULL;
        }
    }
    if (!ok) {
        snprintf(err->msg, sizeof err->msg,
                 "ops row %zu: attr_order gives %s an oneof member (%d) that cannot hold it", row, name,
                 member);
        return NULL;
    }
    int wt = ELEM_WT[elem];
    uint64_t tag = (uint64_t)member << 3 | (uint64_t)wt;
    size_t body;
    if (wt == 0)
        body = varint_size(u);
    else if (wt == 1)
        body = 8;
    else if (wt == 5)
        body = 4;
    else
        body = varint_size(vlen) + vlen;
    size_t inner = 2 + nlen + varint_size(tag) + body;
    *w++ = 0x52;
    w = w_varint(w, inner);
    *w++ = 0x0a;
    *w++ = (uint8_t)nlen;
    memcpy(w, name, nlen);
    w += nlen;
    w = w_varint(w, tag);
    if (wt == 0)
        w = w_varint(w, u);
    else if (wt == 1)
        w = w_le(w, u, 8);
    else if (wt == 5)
        w = w_le(w, u, 4);
    else {
        w = w_varint(w, vlen);
        if (vlen) memcpy(w, s, vlen);
        w += vlen;
    }
    return w;
}

/* Split an attrs cell into its field 8 / 9 / 10 records (validated); others are dropped. */
static int split_attrs(const uint8_t *p, const uint8_t *e, Buf *recs)
{
    recs->len = 0;
    while (p < e) {
        const uint8_t *rec = p;
        uint32_t f;
        int wt;
        size_t n;
        if (!(p = rd_tag(p, e, &f, &wt))) return -1;
        if ((f == 8 || f == 9 || f == 10) && wt == 2) {
            AttrInfo a;
            if (!(p = rd_len(p, e, &n))) return -1;
            if (f == 10 ? parse_attr(p, p + n, MAX_DEPTH - 1, &a) : parse_io(p, p + n, MAX_DEPTH - 1))
                return -1;
            p += n;
            Rec r = {rec, (size_t)(p - rec), (int)f};
            if (buf_put(recs, &r, sizeof r)) return -2;
        } else if (!(p = skip_field(p, e, f, wt, MAX_DEPTH))) {
            return -1;
        }
    }
    return 0;
}

static size_t lower_bound(const uint64_t *a, size_t n, uint64_t key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

typedef struct {
    size_t n, m;
    const uint8_t *meta;
    size_t meta_len;
    const uint64_t *id, *dur, *start;
    const int32_t *type;
    StrCol name, attrs, order;
    PCol pc[NCOL];
    const uint64_t *src, *dst;
    const uint8_t *kind; /* 0 ctrl, 1 data; deps sorted by (dst, kind) */
} EncIn;

static uint8_t *w_packed(uint8_t *w, uint8_t tag, const uint64_t *v, size_t a, size_t b)
{
    if (a == b) return w;
    size_t len = 0;
    for (size_t i = a; i < b; i++) len += varint_size(v[i]);
    *w++ = tag;
    w = w_varint(w, len);
    for (size_t i = a; i < b; i++) w = w_varint(w, v[i]);
    return w;
}

/* The whole rank file into `out`. 0 ok, -1 bad input (err), -2 out of memory. */
static int run_encode(const EncIn *in, Buf *out, EncErr *err)
{
    Buf recs = {0};
    int rc = 0;
    if (buf_grow(out, 16 + in->meta_len + in->n * 64)) return -2;
    uint8_t *w = w_varint(out->p, in->meta_len);
    if (in->meta_len) memcpy(w, in->meta, in->meta_len);
    out->len = (size_t)(w - out->p) + in->meta_len;

    for (size_t i = 0; i < in->n; i++) {
        const uint8_t *name = NULL, *blob = NULL, *order = NULL;
        size_t name_len = 0, blob_len = 0, order_len = 0, pg_len = 0;
        str_at(&in->name, i, &name, &name_len);
        str_at(&in->attrs, i, &blob, &blob_len);
        str_at(&in->order, i, &order, &order_len);
        for (int c = 0; c < NCOL; c++) {
            const uint8_t *s;
            size_t l;
            if (COLS[c].kind == K_STR && str_at(&in->pc[c].str, i, &s, &l)) pg_len += l;
        }
        uint64_t id = in->id[i];
        size_t a = lower_bound(in->dst, in->m, id), b = a, c_end;
        while (b < in->m && in->dst[b] == id && in->kind[b] == 0) b++;
        c_end = b;
        while (c_end < in->m && in->dst[c_end] == id) c_end++;
        if (blob_len) {
            int r = split_attrs(blob, blob + blob_len, &recs);
            if (r == -2) {
                rc = -2;
                break;
            }
            if (r) {
                snprintf(err->msg, sizeof err->msg,
                         "ops row %zu: attrs is not serialized Node fields (inputs/outputs/attr)", i);
                rc = -1;
                break;
            }
        } else {
            recs.len = 0;
        }
        size_t bound = 5 + 11 + 6 + name_len + 11 + 12 + 10 * (c_end - a) + 22 + blob_len +
                       NCOL * 48 + pg_len;
        if (out->cap - out->len < bound && buf_grow(out, bound)) {
            rc = -2;
            break;
        }
        uint8_t *frame = out->p + out->len, *body = frame + 5;
        w = body;
        if (id) {
            *w++ = 0x08;
            w = w_varint(w, id);
        }
        if (name_len) {
            *w++ = 0x12;
            w = w_varint(w, name_len);
            memcpy(w, name, name_len);
            w += name_len;
        }
        if (in->type[i]) {
            *w++ = 0x18;
            w = w_varint(w, (uint64_t)(int64_t)in->type[i]);
        }
        w = w_packed(w, 0x22, in->src, a, b);
        w = w_packed(w, 0x2a, in->src, b, c_end);
        if (in->start[i]) {
            *w++ = 0x30;
            w = w_varint(w, in->start[i]);
        }
        if (in->dur[i]) {
            *w++ = 0x38;
            w = w_varint(w, in->dur[i]);
        }
        const Rec *rv = (const Rec *)recs.p;
        size_t nrec = recs.len / sizeof(Rec), next_extra = 0;
        for (int f = 8; f <= 9; f++)
            for (size_t k = 0; k < nrec; k++)
                if (rv[k].field == f) {
                    memcpy(w, rv[k].p, rv[k].len);
                    w += rv[k].len;
                }
        unsigned written = 0;
        const uint8_t *t = order, *oe = order ? order + order_len : NULL;
        while (t && t < oe) {
            const uint8_t *te = memchr(t, ',', (size_t)(oe - t)), *colon;
            if (!te) te = oe;
            if (te - t == 1 && *t == '*') {
                while (next_extra < nrec && rv[next_extra].field != 10) next_extra++;
                if (next_extra < nrec) {
                    memcpy(w, rv[next_extra].p, rv[next_extra].len);
                    w += rv[next_extra].len;
                    next_extra++;
                }
            } else {
                colon = memchr(t, ':', (size_t)(te - t));
                if (!colon || memchr(colon + 1, ':', (size_t)(te - colon - 1)) || colon + 1 == te) {
                    snprintf(err->msg, sizeof err->msg, "ops row %zu: bad attr_order token %.*s", i,
                             (int)(te - t > 40 ? 40 : te - t), (const char *)t);
                    rc = -1;
                    break;
                }
                int c = column_of(t, (size_t)(colon - t));
                int valid = 0;
                if (c >= 0) {
                    const PCol *pc = &in->pc[c];
                    valid = COLS[c].kind == K_STR ? !pc->str.valid || pc->str.valid[i]
                                                  : !pc->valid || pc->valid[i];
                }
                if (c >= 0 && valid && !(written & (1u << c))) {
                    int member = 0;
                    for (const uint8_t *q = colon + 1; q < te; q++) {
                        if (*q < '0' || *q > '9' || member > 1000) {
                            member = -1;
                            break;
                        }
                        member = member * 10 + (*q - '0');
                    }
                    if (!(w = emit_promoted(w, c, member, &in->pc[c], i, err))) {
                        rc = -1;
                        break;
                    }
                    written |= 1u << c;
                }
            }
            t = te + 1;
        }
        if (rc) break;
        for (int c = 0; c < NCOL; c++) {
            const PCol *pc = &in->pc[c];
            int valid = COLS[c].kind == K_STR ? !pc->str.valid || pc->str.valid[i]
                                              : !pc->valid || pc->valid[i];
            if (valid && !(written & (1u << c)) &&
                !(w = emit_promoted(w, c, COLS[c].member, pc, i, err))) {
                rc = -1;
                break;
            }
        }
        if (rc) break;
        for (; next_extra < nrec; next_extra++)
            if (rv[next_extra].field == 10) {
                memcpy(w, rv[next_extra].p, rv[next_extra].len);
                w += rv[next_extra].len;
            }
        size_t len = (size_t)(w - body), k = varint_size(len);
        if (k < 5) memmove(frame + k, body, len);
        w_varint(frame, len);
        out->len += k + len;
    }
    free(recs.p);
    return rc;
}

PyDoc_STRVAR(encode_doc,
             "encode(metadata, ids, types, durations, starts, names, attrs, orders, promoted, deps)"
             " -> bytes\n\n"
             "One rank's .et bytes. ids/durations/starts: uint64[n]; types: int32[n] NodeType\n"
             "codes; names/attrs/orders: (int32 offsets[n+1], data, uint8 valid[n] | None);\n"
             "promoted: one entry per promoted column in OPS_SCHEMA order, (uint8 values, valid)\n"
             "for bool, (int64 values, valid) for integers and comm_type codes, (offsets, data,\n"
             "valid) for strings; deps: (src uint64[m], dst uint64[m], kind uint8[m]) sorted by\n"
             "(dst, kind, pos) with kind 0 = ctrl, 1 = data. Raises ValueError on values a Node\n"
             "cannot hold or attrs cells that are not serialized Node fields.");

static PyObject *codec_encode(PyObject *self, PyObject *args)
{
    PyObject *ometa, *oid, *otype, *odur, *ostart, *onames, *oattrs, *oorders, *oprom, *odeps;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO:encode", &ometa, &oid, &otype, &odur, &ostart, &onames,
                          &oattrs, &oorders, &oprom, &odeps))
        return NULL;
    Views vs;
    vs.n = 0;
    EncIn in;
    memset(&in, 0, sizeof in);
    const void *ptr;
    size_t len;
    PyObject *result = NULL;
    if (get_buf(&vs, ometa, 0, 0, "metadata", &ptr, &in.meta_len)) goto done;
    in.meta = ptr;
    if (get_buf(&vs, oid, 0, 0, "ids", &ptr, &len)) goto done;
    in.id = ptr;
    in.n = len / 8;
    size_t n = in.n;
    if (get_buf(&vs, otype, n * 4, 0, "types", &ptr, NULL)) goto done;
    in.type = ptr;
    if (get_buf(&vs, odur, n * 8, 0, "durations", &ptr, NULL)) goto done;
    in.dur = ptr;
    if (get_buf(&vs, ostart, n * 8, 0, "starts", &ptr, NULL)) goto done;
    in.start = ptr;
    if (get_strcol(&vs, onames, n, "names", &in.name) || get_strcol(&vs, oattrs, n, "attrs", &in.attrs) ||
        get_strcol(&vs, oorders, n, "orders", &in.order))
        goto done;
    if (!PyTuple_Check(oprom) || PyTuple_GET_SIZE(oprom) != NCOL) {
        PyErr_Format(PyExc_TypeError, "encode: promoted must be a tuple of %d columns", NCOL);
        goto done;
    }
    for (int c = 0; c < NCOL; c++) {
        PyObject *t = PyTuple_GET_ITEM(oprom, c);
        if (COLS[c].kind == K_STR) {
            if (get_strcol(&vs, t, n, COLS[c].name, &in.pc[c].str)) goto done;
            continue;
        }
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_Format(PyExc_TypeError, "encode: %s must be (values, valid)", COLS[c].name);
            goto done;
        }
        if (get_buf(&vs, PyTuple_GET_ITEM(t, 0), COLS[c].kind == K_BOOL ? n : n * 8, 0, COLS[c].name,
                    &ptr, NULL))
            goto done;
        in.pc[c].val = ptr;
        if (get_buf(&vs, PyTuple_GET_ITEM(t, 1), n, 1, COLS[c].name, &ptr, NULL)) goto done;
        in.pc[c].valid = ptr;
    }
    if (!PyTuple_Check(odeps) || PyTuple_GET_SIZE(odeps) != 3) {
        PyErr_SetString(PyExc_TypeError, "encode: deps must be (src, dst, kind)");
        goto done;
    }
    if (get_buf(&vs, PyTuple_GET_ITEM(odeps, 0), 0, 0, "deps src", &ptr, &len)) goto done;
    in.src = ptr;
    in.m = len / 8;
    if (get_buf(&vs, PyTuple_GET_ITEM(odeps, 1), in.m * 8, 0, "deps dst", &ptr, NULL)) goto done;
    in.dst = ptr;
    if (get_buf(&vs, PyTuple_GET_ITEM(odeps, 2), in.m, 0, "deps kind", &ptr, NULL)) goto done;
    in.kind = ptr;
    for (size_t j = 1; j < in.m; j++)
        if (in.dst[j] < in.dst[j - 1] || (in.dst[j] == in.dst[j - 1] && in.kind[j] < in.kind[j - 1])) {
            PyErr_SetString(PyExc_ValueError, "encode: deps must be sorted by (dst, kind)");
            goto done;
        }
    for (int c = 0; c < NCOL; c++)
        if (COLS[c].kind == K_CTYPE)
            for (size_t j = 0; j < n; j++)
                if ((!in.pc[c].valid || in.pc[c].valid[j]) &&
                    (((const int64_t *)in.pc[c].val)[j] < 0 ||
                     ((const int64_t *)in.pc[c].val)[j] >= N_COMM_TYPES)) {
                    PyErr_Format(PyExc_ValueError, "encode: ops row %zu: comm_type code out of range", j);
                    goto done;
                }
    Buf out = {0};
    EncErr err;
    int rc;
    err.msg[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = run_encode(&in, &out, &err);
    Py_END_ALLOW_THREADS
    if (rc == -1)
        PyErr_SetString(PyExc_ValueError, err.msg);
    else if (rc == -2)
        PyErr_NoMemory();
    else
        result = PyBytes_FromStringAndSize((const char *)out.p, (Py_ssize_t)out.len);
    free(out.p);
done:
    views_release(&vs);
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"decode", codec_decode, METH_VARARGS, decode_doc},
    {"encode", codec_encode, METH_VARARGS, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_etcodec",
    "Native Chakra .et codec: wire format <-> Arrow-layout column buffers.", -1, methods, NULL, NULL, NULL, NULL,
};

static PyObject *str_tuple(const char *const *items, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(items[i]);
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

PyMODINIT_FUNC PyInit__etcodec(void)
{
    for (int c = 0; c < NCOL; c++) COL_LEN[c] = strlen(COLS[c].name);
    for (int t = 0; t < N_NODE_TYPES; t++) NODE_TYPE_LEN[t] = strlen(NODE_TYPES[t]);
    for (int t = 0; t < N_COMM_TYPES; t++) COMM_TYPE_LEN[t] = strlen(COMM_TYPES[t]);
    if (PyType_Ready(&BufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    PyObject *cols = PyTuple_New(NCOL);
    for (int c = 0; cols && c < NCOL; c++) {
        PyObject *t = Py_BuildValue("(ssi)", COLS[c].name, KIND_NAMES[COLS[c].kind], COLS[c].member);
        if (!t) {
            Py_CLEAR(cols);
            break;
        }
        PyTuple_SET_ITEM(cols, c, t);
    }
    Py_INCREF(&BufferType);
    if (!cols || PyModule_AddObject(m, "PROMOTED", cols) < 0 ||
        PyModule_AddObject(m, "NODE_TYPES", str_tuple(NODE_TYPES, N_NODE_TYPES)) < 0 ||
        PyModule_AddObject(m, "COMM_TYPES", str_tuple(COMM_TYPES, N_COMM_TYPES)) < 0 ||
        PyModule_AddObject(m, "Buffer", (PyObject *)&BufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
