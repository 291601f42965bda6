/*
 * The state the native event loop's two units share (etstore.sim._simloop): the loop's,
 * kept by _simloop.c, and that of the collectives it expands as they start, kept by
 * _simdefer.c (see there for why); what the loop reads of an op; typed buffer views.
 */
#ifndef ETSTORE_SIMSTATE_H
#define ETSTORE_SIMSTATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* op kinds, as K_* in etstore/sim/_kinds.py */
enum { K_COMP, K_CPU, K_SEND, K_RECV, K_COLL, K_JOIN, K_DELAY, K_MEM };

typedef struct {
    double t;     /* when */
    uint64_t seq; /* insertion order: ties at one time run first-scheduled first */
    int64_t x;    /* >= 0: op x finishes; < 0: message of send ~x moves (hop or arrival), or link
                   * ~x - LINK_ITEM becomes free (store-and-forward) */
} Item;

typedef struct {
    Item *a;
    Py_ssize_t len, cap;
} Heap;

/* Collectives expanded as they start (_simdefer.c). Ops n.. are their sub-ops: a rank's
 * part of an instance is made from its template when that rank starts the collective,
 * and its memory is reused once every op of the part has ended and every send of it has
 * been matched. Everything here is empty when the caller expanded every collective itself. */
typedef struct {
    int on, ndup; /* expanding as they start; caller's arrays copied so far */
    Py_ssize_t nnpu;
    /* templates, packed: op q of template k is row t_op[k] + q; rank p's ops are rows
     * t_op[k] + pstart[t_poff[k] + p] .. t_op[k] + pstart[t_poff[k] + p + 1] */
    Py_ssize_t ntmpl, nbind, ninst, ntops, nparts;
    const int64_t *t_op, *t_nkeys, *t_n, *t_poff, *pstart;
    const int64_t *tkind, *tpeer, *tkey, *tindeg, *tpart, *tsink, *tsptr, *tsucc; /* tsucc: packed rows */
    const double *tdur, *tsize;
    /* bindings: a template on one group of NPUs (grp[b_goff[b] + p] is rank p's NPU) */
    const int64_t *b_tid, *b_goff, *b_mtoff, *grp;
    const double *bmt; /* congestion-unaware message times, per binding and template row */
    /* instances: a binding; part p of instance i is part i_joff[i] + p, ending with join i_join[that] */
    const int64_t *i_bind, *i_joff, *i_join;
    /* per static op: the instance a collective op starts, and its rank in it */
    const int64_t *coll_inst, *coll_p;
    int64_t *i_kbase, *i_parts; /* per instance: first key (-1: none yet), parts not yet given back */
    /* per part: instance, NPU, op = packed row + shift, refs left, first key, first NPU of its
     * group in grp, message time of packed row g at bmt[g + p_mtshift] */
    int64_t *p_inst, *p_npu, *p_shift, *p_left, *p_kb, *p_goff, *p_mtshift;
    /* pools: op arrays hold cap ops, ops top.. never used; key arrays likewise */
    Py_ssize_t cap, top, kcap, ktop;
    int64_t *fb, nfb, fbcap; /* free op blocks: (base, size) pairs */
    int64_t *fk, nfk, fkcap; /* free key blocks */
    int32_t *opart;          /* per sub-op: its part */
    double *t0;              /* per sub-op send: when it started */
    int64_t made, live, peak; /* sub-ops made; in use now; most in use at once */
    /* per (src, dst) NPU pair of sub-op messages: first start, last arrival, bytes, count */
    int64_t *pk, *pcount;
    double *pfirst, *plast, *pbytes;
    Py_ssize_t pcap, plen;
} Defer;

typedef struct {
    Py_ssize_t n, nres, nl, nn, nkeys;
    /* per op, read through op_*() below: the caller's arrays hold the static ops', a
     * deferred collective's sub-ops read their template */
    const int64_t *kind, *acq, *rel, *dstn;
    const double *dur, *mt, *size;
    /* per op, updated: the caller's arrays, or (deferred collectives) copies that grow with the pool */
    int64_t *indeg, *cur;
    /* inputs (read-only) */
    const int64_t *sptr, *succ, *mkey, *ldst;
    const double *llat, *lbw;
    const int64_t *prio; /* issue order among ops waiting for one slot */
    const int32_t *hop;  /* [dst * nn + src] -> next link, or NULL when congestion-unaware */
    int aware, integer_ns;
    int cut_through; /* congestion-aware hops: 0 store-and-forward, 1 cut-through */
    double overhead;
    /* inputs updated in place (static ops only) */
    int64_t *lmsgs;
    double *free_, *start, *end, *lfree, *lbusy, *lbytes;
    /* loop state */
    int32_t *partner, *qnext; /* op indices (ops number below 2^31: checked) */
    int64_t *dkey, *keyval; /* dense message key per op (-1: none) and its mkey */
    uint8_t *arrived;
    double *tail; /* cut-through: when each message's last byte reaches its current node */
    /* store-and-forward (ASTRA-sim's congestion-aware Link): a link serializes one message
     * until `lfin`; the item that frees it has sequence number `lseq` and is put in the heap
     * (`lpush`) only once a message waits for it in its FIFO, a pool of (message, next) */
    double *lfin;
    int64_t *lseq;
    uint8_t *lpush;
    int64_t *phead, *ptail, *pmsg, *pnext, pfree, pcap, ptop;
    int64_t *whead, *wtail;                 /* slot ready queues, per resource, sorted by (prio, op) */
    uint8_t *touched;                       /* per resource: in `dirty` */
    int64_t *dirty, ndirty;                 /* resources to hand out after the running item */
    int64_t *shead, *stail, *sorder;        /* sends waiting for a receive, per dense key */
    int64_t *rhead, *rtail, *rorder;        /* receives waiting for a send, per dense key */
    int64_t screated, rcreated;             /* creation counters: dict order of the reference */
    int64_t *items, nitems, items_cap;      /* the running round */
    int64_t *iseq, npopped;                 /* its items' sequence numbers: the first npopped came from the heap */
    int64_t key;                            /* the running item's place: its sequence number (-1 before the loop) */
    uint64_t s0;                            /* the sequence counter when the running round began */
    Heap heap;
    uint64_t seq;
    double t;
    int64_t events;
    Defer d;
    /* error raised after the loop, with the GIL */
    int err;
    int64_t err_u, err_d; /* ERR_ROUTE: the NPUs; ERR_TIME: err_u is the item whose time is not a number */
} Loop;

enum { ERR_NONE, ERR_MEMORY, ERR_ROUTE, ERR_TIME };

/* items ~(LINK_ITEM + link): a link finishes serializing a message (as LINK_ITEM in _loop.py) */
#define LINK_ITEM ((int64_t)1 << 62)

/* What the loop reads of op j: its own entry for a static op, its template's for a sub-op. */
#define SUB_ROW(s, j) ((j) - (s)->d.p_shift[(s)->d.opart[j]])
static inline int64_t op_kind(const Loop *s, int64_t j)
{
    return j < s->n ? s->kind[j] : s->d.tkind[SUB_ROW(s, j)];
}
static inline double op_dur(const Loop *s, int64_t j) { return j < s->n ? s->dur[j] : s->d.tdur[SUB_ROW(s, j)]; }
static inline int64_t op_acq(const Loop *s, int64_t j) { return j < s->n ? s->acq[j] : -1; }
static inline int64_t op_rel(const Loop *s, int64_t j) { return j < s->n ? s->rel[j] : -1; }
static inline double op_size(const Loop *s, int64_t j) { return j < s->n ? s->size[j] : s->d.tsize[SUB_ROW(s, j)]; }
static inline int64_t op_dkey(const Loop *s, int64_t j)
{
    return j < s->n ? s->dkey[j] : s->d.p_kb[s->d.opart[j]] + s->d.tkey[SUB_ROW(s, j)];
}
static inline double op_mt(const Loop *s, int64_t j)
{
    return j < s->n ? s->mt[j] : s->d.bmt[SUB_ROW(s, j) + s->d.p_mtshift[s->d.opart[j]]];
}
static inline int64_t op_dstn(const Loop *s, int64_t j) /* a send's destination NPU */
{
    return j < s->n ? s->dstn[j] : s->d.grp[s->d.p_goff[s->d.opart[j]] + s->d.tpeer[SUB_ROW(s, j)]];
}

/* Typed view of a 1-d C-contiguous buffer: 'q' int64, 'i' int32, 'd' float64. */
static inline int simloop_buf(PyObject *obj, Py_buffer *v, char type, int writable, Py_ssize_t len, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) return -1;
    const char *f = v->format ? v->format : "B";
    char fc = f[strlen(f) - 1];
    if (f[0] != '@' && f[0] != '=' && f[0] != '<' && strlen(f) > 1) fc = 0; /* e.g. big-endian */
    int ok;
    if (type == 'd')
        ok = fc == 'd' && v->itemsize == 8;
    else if (type == 'q')
        ok = (fc == 'q' || fc == 'l' || fc == 'n') && v->itemsize == 8;
    else
        ok = (fc == 'i' || fc == 'l') && v->itemsize == 4;
    if (!ok || v->ndim > 1) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: %s must be a 1-d %s array, got format %s", name,
                     type == 'd' ? "float64" : type == 'q' ? "int64" : "int32", f);
        PyBuffer_Release(v);
        return -1;
    }
    if (len >= 0 && v->len / v->itemsize != len) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: %s has %zd items, expected %zd", name,
                     v->len / v->itemsize, len);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* _simdefer.c */
int defer_setup(Loop *s, PyObject *spec, Py_buffer *bufs, int *held);
int defer_open(Loop *s, int64_t inst, int64_t p);
void defer_release(Loop *s, int64_t j);
int defer_pair(Loop *s, int64_t snd, double t);
PyObject *defer_stats(Loop *s);
void defer_free(Loop *s, Py_buffer *bufs, int held);

#define DEFER_NBUF 25 /* buffers in the deferred-collectives spec */

#endif
