/*
 * The state the native event loop's units share (etstore.sim._simloop): the loop's,
 * kept by _simloop.c, and that of the collectives it expands as they run, kept by
 * _simdefer.c (see there for why) and set up by _simdefer_spec.c; what the loop reads of
 * an op; typed buffer views.
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

/* A rank's part of a deferred collective instance while it runs (_simdefer.c). Its ops are
 * the rows g0 .. g0 + m - 1 of the packed templates; row q has a loop op (a slot) from when
 * it is first due until it has ended and, a send, been matched. `win` maps the rows
 * lo .. lo + wcap - 1 to their slots (-1: not made yet, -2: done), a ring of wcap (a power
 * of two) entries; every row below lo is done. */
typedef struct {
    int64_t inst, p, k, prog;    /* instance, rank in it, template, program (index into pstart) */
    int64_t npu, g0, m, kb, goff; /* its NPU; first packed row, rows; first key; group in grp */
    int64_t mtbase;              /* congestion-unaware message time of row g: bmt[mtbase + tmtc[g]]; -1: none */
    int64_t join;                /* the join op its sinks end */
    int64_t lo, hi, left, wcap;  /* window; rows not yet done */
    int32_t *win;
} Part;

/* Collectives expanded as they run (_simdefer.c). Ops n.. are their sub-ops: a slot is
 * taken by a row of a running part when that row first becomes due (its part started, or
 * a predecessor ended) and given back once it has ended and, a send, been matched, so
 * memory follows the sub-ops in flight. A template is either every rank's rows laid out
 * (a program per rank) or one program for all ranks whose peers, match keys and message
 * times are computed per rank (t_comp). Everything here is empty when the caller expanded
 * every collective itself. */
typedef struct {
    int on, ndup; /* expanding as they start; caller's arrays copied so far */
    Py_ssize_t nnpu;
    /* templates, packed: op q of template k is row t_op[k] + q; program r (a rank's, or the
     * one of a t_comp template) is rows t_op[k] + pstart[t_poff[k] + r] .. + pstart[.. + r + 1],
     * its roots rrow[rptr[t_poff[k] + r] .. rptr[t_poff[k] + r + 1]] (packed rows) */
    Py_ssize_t ntmpl, nbind, ninst, ntops, nparts, nprog, nroot, nrule;
    const int64_t *t_op, *t_nkeys, *t_n, *t_poff, *pstart, *t_comp, *t_kstride, *t_mtstride, *rptr, *rrow;
    const int64_t *tkind, *tpeer, *tkey, *tindeg, *tpart, *tsink, *tsptr, *tsucc; /* tsucc: packed rows */
    const int64_t *trule, *tmtc; /* a row's peer rule (-1: tpeer is the peer) and message-time slot */
    const int64_t *r_mode, *r_dn, *r_stride; /* rules: rotate or xor the index in a dimension */
    const double *tdur, *tsize;
    /* bindings: a template on one group of NPUs (grp[b_goff[b] + p] is rank p's NPU) */
    const int64_t *b_tid, *b_goff, *b_mtoff, *grp;
    const double *bmt; /* congestion-unaware message times, per binding and message-time slot */
    /* instances: a binding; part p of instance i ends with join i_join[i_joff[i] + p] */
    const int64_t *i_bind, *i_joff, *i_join;
    /* per static op: the instance a collective op starts, and its rank in it */
    const int64_t *coll_inst, *coll_p;
    int64_t *i_kbase, *i_parts; /* per instance: first key (-1: none yet), parts not yet done */
    Part *parts;                /* running parts; free records chained through pfree */
    int64_t npcap, nptop, *pfree, npfree;
    /* slots: per-op arrays hold cap ops; free slots are a stack */
    Py_ssize_t cap, top, kcap, ktop;
    int32_t *sfree;
    int64_t nsfree;
    int64_t *fk, nfk, fkcap; /* free key blocks: (base, size) pairs */
    /* per sub-op slot: its part, packed row, match key, destination NPU, message time, references
     * left (its end, and a send's match), when a send started */
    int32_t *opart;
    int64_t *orow, *okey, *odst;
    double *omt, *t0;
    uint8_t *oref;
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

/* Sub-op j's entry in the arrays only sub-ops have (opart, orow, okey, ...): they start at op n. */
#define SUB(s, j) ((j) - (s)->n)

/* What the loop reads of op j: its own entry for a static op; for a sub-op, its template
 * row's, or what its slot was given when made (key, destination, message time). */
static inline int64_t op_kind(const Loop *s, int64_t j)
{
    return j < s->n ? s->kind[j] : s->d.tkind[s->d.orow[SUB(s, j)]];
}
static inline double op_dur(const Loop *s, int64_t j)
{
    return j < s->n ? s->dur[j] : s->d.tdur[s->d.orow[SUB(s, j)]];
}
static inline int64_t op_acq(const Loop *s, int64_t j) { return j < s->n ? s->acq[j] : -1; }
static inline int64_t op_rel(const Loop *s, int64_t j) { return j < s->n ? s->rel[j] : -1; }
static inline double op_size(const Loop *s, int64_t j)
{
    return j < s->n ? s->size[j] : s->d.tsize[s->d.orow[SUB(s, j)]];
}
static inline int64_t op_dkey(const Loop *s, int64_t j) { return j < s->n ? s->dkey[j] : s->d.okey[SUB(s, j)]; }
static inline double op_mt(const Loop *s, int64_t j) { return j < s->n ? s->mt[j] : s->d.omt[SUB(s, j)]; }
static inline int64_t op_dstn(const Loop *s, int64_t j) /* a send's destination NPU */
{
    return j < s->n ? s->dstn[j] : s->d.odst[SUB(s, j)];
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

enum { P_ROT = 1, P_XOR = 2 }; /* peer rules of a one-program template, as P_* in _templates.py */

/* _simdefer_spec.c */
int defer_setup(Loop *s, PyObject *spec, Py_buffer *bufs, int *held);
void defer_free(Loop *s, Py_buffer *bufs, int held);

/* _simdefer.c */
int defer_grow_ops(Loop *s, Py_ssize_t need);
int defer_grow_keys(Loop *s, Py_ssize_t need);
int64_t defer_open(Loop *s, int64_t inst, int64_t p);
int64_t defer_make(Loop *s, int64_t part, int64_t q);
void defer_release(Loop *s, int64_t j);
int defer_pair(Loop *s, int64_t snd, double t);
PyObject *defer_stats(Loop *s);

#define DEFER_NBUF 35 /* buffers in the deferred-collectives spec */

#endif
