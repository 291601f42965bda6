/*
 * Collectives the native event loop expands as they run (etstore.sim._simloop).
 *
 * Why this exists: expanding every collective instance into its ranks' sends, receives
 * and reductions before the loop starts costs memory in proportion to the whole
 * expanded workload (30M sub-ops, 12 GiB, for a 1,024-rank transformer), and making a
 * rank's whole part when it starts still holds every step of every running ring at once
 * (a 2,048-rank ring: 49k rows per rank, 30 GB for a 16,384-rank transformer). Only the
 * steps in flight matter at any moment, so a sub-op is made from its template when it
 * first becomes due -- its part started (a root) or a predecessor ended -- and its slot
 * goes back to a pool once it has ended and, a send, been matched (a receive may still
 * take a send that has landed). A part's record and a map of its rows in flight (a ring
 * window, `Part.win`) live while the part runs; an instance's match keys, a block of the
 * dense key space, from its first part's start to its last part's end.
 *
 * Templates come from Python (etstore/sim/_defer.py) one per algorithm, collective size
 * and group size: either every rank's rows laid out, or -- where every rank runs the same
 * ops, as in ASTRA-sim's ring, direct and halving-doubling -- one program whose peers
 * follow a rule of the rank per row (rotate or xor its index in a dimension), with the
 * match key and message time of a row computed per rank from classes. The loop walks
 * the same ops in the same order as with every sub-op made up front (slot numbers are
 * only names: no order depends on them), so results are identical bit for bit
 * (tests/sim/test_simloop.py and test_defer.py compare both). Sub-op messages are not
 * kept: the per-(source, destination) NPU pair totals the caller's link tables need
 * (first start, last arrival, bytes, count) are summed as they arrive.
 */
#include "_simstate.h"

#include <stdlib.h>
#include <string.h>

#define WIN0 16 /* a part's first window: rows in flight it maps before growing */

#define GROW(field, type, cap)                                              \
    do {                                                                    \
        type *q_ = realloc((field), (size_t)(cap) * sizeof(type));          \
        if (!q_) return -1;                                                 \
        (field) = q_;                                                       \
    } while (0)

/* Room for ops 0..need-1 in every per-op array. */
int defer_grow_ops(Loop *s, Py_ssize_t need)
{
    Defer *d = &s->d;
    if (need <= d->cap) return 0;
    if (need >= INT32_MAX) return -1; /* op indices are int32 in the queues */
    /* the sub-op slots (ops n..) double; the static ops' n entries are there once */
    Py_ssize_t have = d->cap - s->n, want = need - s->n;
    Py_ssize_t more = have * 2 > want ? have * 2 : want;
    Py_ssize_t cap = s->n + (more > 1024 ? more : 1024);
    if (cap >= INT32_MAX) cap = INT32_MAX - 1;
    GROW(s->indeg, int64_t, cap);
    GROW(s->cur, int64_t, cap);
    GROW(s->partner, int32_t, cap);
    GROW(s->qnext, int32_t, cap);
    GROW(s->arrived, uint8_t, cap);
    if (s->tail) GROW(s->tail, double, cap);
    Py_ssize_t subs = cap - s->n; /* sub-op slots n .. cap - 1: their own arrays start at 0 */
    GROW(d->opart, int32_t, subs);
    GROW(d->orow, int64_t, subs);
    GROW(d->okey, int64_t, subs);
    GROW(d->odst, int64_t, subs);
    GROW(d->omt, double, subs);
    GROW(d->t0, double, subs);
    GROW(d->oref, uint8_t, subs);
    GROW(d->sfree, int32_t, subs);
    d->cap = cap;
    return 0;
}

/* Room for dense keys 0..need-1 in every per-key array. */
int defer_grow_keys(Loop *s, Py_ssize_t need)
{
    Defer *d = &s->d;
    if (need <= d->kcap) return 0;
    Py_ssize_t have = d->kcap - s->nkeys, want = need - s->nkeys; /* the instances' keys double */
    Py_ssize_t cap = s->nkeys + (have * 2 > want ? have * 2 : want);
    GROW(s->shead, int64_t, cap); /* sorder/rorder stay the trace's own keys' */
    GROW(s->stail, int64_t, cap);
    GROW(s->rhead, int64_t, cap);
    GROW(s->rtail, int64_t, cap);
    d->kcap = cap;
    return 0;
}

/* A free block of exactly `size` from a (base, size) list, or -1. */
static int64_t take_block(int64_t *list, int64_t *len, int64_t size)
{
    for (int64_t b = 0; b < *len; b++) {
        if (list[2 * b + 1] != size) continue;
        int64_t base = list[2 * b];
        list[2 * b] = list[2 * (*len - 1)];
        list[2 * b + 1] = list[2 * (*len - 1) + 1];
        (*len)--;
        return base;
    }
    return -1;
}

/* Give a block back; if the list cannot grow the block is simply not reused. */
static void give_block(int64_t **list, int64_t *len, int64_t *cap, int64_t base, int64_t size)
{
    if (size == 0) return;
    if (*len == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        int64_t *q = realloc(*list, (size_t)c * 2 * sizeof(int64_t));
        if (!q) return;
        *list = q;
        *cap = c;
    }
    (*list)[2 * *len] = base;
    (*list)[2 * *len + 1] = size;
    (*len)++;
}

/* The program rank p of template k runs (its own, or the one of a one-program template), as an
 * index into pstart and rptr. */
static inline int64_t prog_of(const Defer *d, int64_t k, int64_t p)
{
    return d->t_poff[k] + (d->t_comp[k] ? 0 : p);
}

/* The instance's key block, taken with its first part. */
static int open_keys(Loop *s, int64_t inst, int64_t k)
{
    Defer *d = &s->d;
    int64_t nk = d->t_nkeys[k];
    int64_t kb = take_block(d->fk, &d->nfk, nk);
    if (kb < 0) {
        if (defer_grow_keys(s, d->ktop + nk) < 0) return -1;
        kb = d->ktop;
        d->ktop += nk;
    }
    for (int64_t q = kb; q < kb + nk; q++) s->shead[q] = s->stail[q] = s->rhead[q] = s->rtail[q] = -1;
    int64_t parts = 0;
    for (int64_t p = 0; p < d->t_n[k]; p++) {
        int64_t r = prog_of(d, k, p);
        parts += d->pstart[r + 1] > d->pstart[r];
    }
    d->i_kbase[inst] = kb;
    d->i_parts[inst] = parts;
    return 0;
}

/* Rank p's part of instance inst starts: a record for it (the part's id), -2 when the rank
 * has nothing to do (its join follows the collective op), -1 when memory runs out. */
int64_t defer_open(Loop *s, int64_t inst, int64_t p)
{
    Defer *d = &s->d;
    int64_t b = d->i_bind[inst], k = d->b_tid[b], r = prog_of(d, k, p);
    int64_t m = d->pstart[r + 1] - d->pstart[r];
    if (m == 0) return -2;
    if (d->i_kbase[inst] < 0 && open_keys(s, inst, k) < 0) return -1;
    int64_t id;
    if (d->npfree) {
        id = d->pfree[--d->npfree];
    } else {
        if (d->nptop == d->npcap) {
            int64_t cap = d->npcap ? 2 * d->npcap : 1024;
            Part *q = realloc(d->parts, (size_t)cap * sizeof(Part));
            if (!q) return -1;
            d->parts = q;
            int64_t *f = realloc(d->pfree, (size_t)cap * sizeof(int64_t));
            if (!f) return -1;
            d->pfree = f;
            d->npcap = cap;
        }
        id = d->nptop++;
    }
    Part *P = &d->parts[id];
    int64_t wcap = 1;
    while (wcap < m && wcap < WIN0) wcap *= 2;
    P->win = malloc((size_t)wcap * sizeof(int32_t));
    if (!P->win) {
        d->pfree[d->npfree++] = id;
        return -1;
    }
    memset(P->win, 0xff, (size_t)wcap * sizeof(int32_t));
    P->inst = inst;
    P->p = p;
    P->k = k;
    P->prog = r;
    P->npu = d->grp[d->b_goff[b] + p];
    P->g0 = d->t_op[k] + d->pstart[r];
    P->m = m;
    P->kb = d->i_kbase[inst];
    P->goff = d->b_goff[b];
    P->mtbase = d->b_mtoff[b] < 0 ? -1 : d->b_mtoff[b] + (d->t_comp[k] ? p * d->t_mtstride[k] : 0);
    P->join = d->i_join[d->i_joff[inst] + p];
    P->lo = P->hi = 0;
    P->left = m;
    P->wcap = wcap;
    return id;
}

/* Rank p's peer (an algorithm rank) on packed row g: the row's own, or its rule applied to p. */
static inline int64_t peer_of(const Defer *d, int64_t p, int64_t g)
{
    int64_t r = d->trule[g], v = d->tpeer[g];
    if (r < 0) return v;
    int64_t dn = d->r_dn[r], st = d->r_stride[r];
    int64_t i = (p / st) % dn, j = d->r_mode[r] == P_XOR ? (i ^ v) : (i + v) % dn;
    return p + (j - i) * st;
}

/* Room in part P's window for rows lo .. need - 1 (a ring of a power of two). */
static int grow_window(Part *P, int64_t need)
{
    int64_t cap = P->wcap;
    while (cap < need - P->lo) cap *= 2;
    int32_t *w = malloc((size_t)cap * sizeof(int32_t));
    if (!w) return -1;
    memset(w, 0xff, (size_t)cap * sizeof(int32_t));
    for (int64_t q = P->lo; q < P->hi; q++) w[q & (cap - 1)] = P->win[q & (P->wcap - 1)];
    free(P->win);
    P->win = w;
    P->wcap = cap;
    return 0;
}

/* The slot of row q of running part `id`, made now if it was not yet due; -1: no memory. */
int64_t defer_make(Loop *s, int64_t id, int64_t q)
{
    Defer *d = &s->d;
    Part *P = &d->parts[id];
    if (q - P->lo >= P->wcap && grow_window(P, q + 1) < 0) return -1;
    int32_t *w = &P->win[q & (P->wcap - 1)];
    if (*w >= 0) return *w;
    int64_t j;
    if (d->nsfree) {
        j = d->sfree[--d->nsfree];
    } else {
        if (defer_grow_ops(s, d->top + 1) < 0) return -1;
        j = d->top++;
    }
    int64_t g = P->g0 + q, kd = d->tkind[g], tin = d->tindeg[g], x = SUB(s, j);
    s->indeg[j] = tin ? tin : 1; /* a root waits for its collective op */
    s->cur[j] = P->npu;
    s->partner[j] = -1;
    s->arrived[j] = 0;
    if (s->tail) s->tail[j] = 0.0;
    d->opart[x] = (int32_t)id;
    d->orow[x] = g;
    d->oref[x] = kd == K_SEND ? 2 : 1; /* it ends; a send is also matched */
    if (kd == K_SEND || kd == K_RECV) {
        int64_t peer = peer_of(d, P->p, g), k = P->k;
        int64_t sender = kd == K_SEND ? P->p : peer;
        d->okey[x] = P->kb + (d->t_comp[k] ? sender * d->t_kstride[k] : 0) + d->tkey[g];
        if (kd == K_SEND) {
            d->odst[x] = d->grp[P->goff + peer];
            d->omt[x] = P->mtbase >= 0 ? d->bmt[P->mtbase + d->tmtc[g]] : 0.0;
        }
    }
    *w = (int32_t)j;
    if (q >= P->hi) P->hi = q + 1;
    d->made++;
    if (++d->live > d->peak) d->peak = d->live;
    return j;
}

/* One reference of sub-op j is gone (it ended, or a send was matched); the last gives its slot
 * back, and the last row of a part gives the part back (and the instance's keys with its last part). */
void defer_release(Loop *s, int64_t j)
{
    Defer *d = &s->d;
    int64_t x = SUB(s, j);
    if (--d->oref[x] > 0) return;
    int64_t id = d->opart[x];
    Part *P = &d->parts[id];
    int64_t q = d->orow[x] - P->g0, mask = P->wcap - 1;
    P->win[q & mask] = -2;
    d->sfree[d->nsfree++] = (int32_t)j;
    d->live--;
    while (P->lo < P->hi && P->win[P->lo & mask] == -2) {
        P->win[P->lo & mask] = -1;
        P->lo++;
    }
    if (--P->left > 0) return;
    free(P->win);
    P->win = NULL;
    d->pfree[d->npfree++] = id;
    int64_t inst = P->inst;
    if (--d->i_parts[inst] == 0) {
        give_block(&d->fk, &d->nfk, &d->fkcap, d->i_kbase[inst], d->t_nkeys[P->k]);
        d->i_kbase[inst] = -1;
    }
}

static int pair_grow(Defer *d)
{
    Py_ssize_t cap = d->pcap ? d->pcap * 2 : 1024;
    int64_t *pk = malloc((size_t)cap * sizeof(int64_t)), *pc = calloc((size_t)cap, sizeof(int64_t));
    double *pf = malloc((size_t)cap * sizeof(double)), *pl = malloc((size_t)cap * sizeof(double));
    double *pb = calloc((size_t)cap, sizeof(double));
    if (!pk || !pc || !pf || !pl || !pb) {
        free(pk);
        free(pc);
        free(pf);
        free(pl);
        free(pb);
        return -1;
    }
    memset(pk, 0xff, (size_t)cap * sizeof(int64_t));
    for (Py_ssize_t h = 0; h < d->pcap; h++) {
        if (d->pk[h] < 0) continue;
        size_t i = (size_t)(((uint64_t)d->pk[h] * 0x9E3779B97F4A7C15ULL) >> 20) & (size_t)(cap - 1);
        while (pk[i] >= 0) i = (i + 1) & (size_t)(cap - 1);
        pk[i] = d->pk[h];
        pc[i] = d->pcount[h];
        pf[i] = d->pfirst[h];
        pl[i] = d->plast[h];
        pb[i] = d->pbytes[h];
    }
    free(d->pk);
    free(d->pcount);
    free(d->pfirst);
    free(d->plast);
    free(d->pbytes);
    d->pk = pk;
    d->pcount = pc;
    d->pfirst = pf;
    d->plast = pl;
    d->pbytes = pb;
    d->pcap = cap;
    return 0;
}

int defer_pair(Loop *s, int64_t snd, double t)
{
    Defer *d = &s->d;
    if (2 * (d->plen + 1) > d->pcap && pair_grow(d) < 0) return -1;
    int64_t x = SUB(s, snd), key = d->parts[d->opart[x]].npu * d->nnpu + op_dstn(s, snd);
    size_t mask = (size_t)(d->pcap - 1);
    size_t i = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
    while (d->pk[i] >= 0 && d->pk[i] != key) i = (i + 1) & mask;
    if (d->pk[i] < 0) {
        d->pk[i] = key;
        d->pfirst[i] = d->t0[x];
        d->plast[i] = t;
        d->plen++;
    } else {
        if (d->t0[x] < d->pfirst[i]) d->pfirst[i] = d->t0[x];
        if (t > d->plast[i]) d->plast[i] = t;
    }
    d->pbytes[i] += op_size(s, snd);
    d->pcount[i] += 1;
    return 0;
}

/* (made, peak, (keys, first, last, bytes, count)): the pair columns as raw native-endian bytes. */
PyObject *defer_stats(Loop *s)
{
    Defer *d = &s->d;
    Py_ssize_t n = d->plen, w = 0;
    int64_t *k = malloc((size_t)(n ? n : 1) * sizeof(int64_t)), *c = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    double *f = malloc((size_t)(n ? n : 1) * sizeof(double)), *l = malloc((size_t)(n ? n : 1) * sizeof(double));
    double *b = malloc((size_t)(n ? n : 1) * sizeof(double));
    PyObject *out = NULL;
    if (k && c && f && l && b) {
        for (Py_ssize_t h = 0; h < d->pcap; h++) {
            if (d->pk[h] < 0) continue;
            k[w] = d->pk[h];
            c[w] = d->pcount[h];
            f[w] = d->pfirst[h];
            l[w] = d->plast[h];
            b[w] = d->pbytes[h];
            w++;
        }
        out = Py_BuildValue("(LL(y#y#y#y#y#))", (long long)d->made, (long long)d->peak, (char *)k,
                            (Py_ssize_t)(w * 8), (char *)f, (Py_ssize_t)(w * 8), (char *)l,
                            (Py_ssize_t)(w * 8), (char *)b, (Py_ssize_t)(w * 8), (char *)c,
                            (Py_ssize_t)(w * 8));
    } else {
        PyErr_NoMemory();
    }
    free(k);
    free(c);
    free(f);
    free(l);
    free(b);
    return out;
}
