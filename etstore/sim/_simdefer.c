/*
 * Collectives the native event loop expands as they start (etstore.sim._simloop).
 *
 * Why this exists: expanding every collective instance into its ranks' sends, receives
 * and reductions before the loop starts costs memory in proportion to the whole
 * expanded workload (30M sub-ops, 12 GiB, for a 1,024-rank transformer), while only
 * the instances in flight matter at any moment. Here an instance's sub-ops are made
 * from its template (one per algorithm, collective size and group, built by Python)
 * when the first of its ranks starts it, and their memory goes back to a pool when the
 * last of its ranks has joined: memory grows with what is in flight, not with the
 * run. The loop walks the same ops in the same order as with every sub-op made up
 * front (etstore/sim/_defer.py; tests/sim/test_simloop.py compares both), so results
 * are identical bit for bit.
 *
 * Memory follows the parts in flight: a rank's part of an instance is made when that
 * rank starts the collective and given back once each of its ops has ended and each of
 * its sends has been matched (a receive may still take a send that has landed). A
 * sub-op is op n + x of the loop's arrays (n static ops); the arrays grow as the pool
 * does. An instance's sends and receives match on keys of their own, a block of the
 * dense key space taken with its first part and given back with its last. Sub-op messages are not
 * kept: the per-(source, destination) NPU pair totals the caller's link tables need
 * (first start, last arrival, bytes, count) are summed as they arrive.
 */
#include "_simstate.h"

#include <stdlib.h>
#include <string.h>

enum { D_TOP, D_TNKEYS, D_TN, D_TPOFF, D_PSTART, D_TKIND, D_TPEER, D_TKEY, D_TINDEG, D_TPART, D_TSINK,
       D_TSPTR, D_TSUCC, D_TDUR, D_TSIZE, D_BTID, D_BGOFF, D_BMTOFF, D_GRP, D_BMT, D_IBIND, D_IJOFF, D_IJOIN,
       D_COLLINST, D_COLLP };

#define GROW(field, type, cap)                                              \
    do {                                                                    \
        type *q_ = realloc((field), (size_t)(cap) * sizeof(type));          \
        if (!q_) return -1;                                                 \
        (field) = q_;                                                       \
    } while (0)

/* Room for ops 0..need-1 in every per-op array. */
static int grow_ops(Loop *s, Py_ssize_t need)
{
    Defer *d = &s->d;
    if (need <= d->cap) return 0;
    if (need >= INT32_MAX) return -1; /* op indices are int32 in the queues */
    Py_ssize_t cap = d->cap * 2 > need ? d->cap * 2 : need;
    if (cap >= INT32_MAX) cap = INT32_MAX - 1;
    GROW(s->indeg, int64_t, cap);
    GROW(s->cur, int64_t, cap);
    GROW(s->partner, int32_t, cap);
    GROW(s->qnext, int32_t, cap);
    GROW(s->arrived, uint8_t, cap);
    if (s->tail) GROW(s->tail, double, cap);
    GROW(d->opart, int32_t, cap);
    GROW(d->t0, double, cap);
    d->cap = cap;
    return 0;
}

/* Room for dense keys 0..need-1 in every per-key array. */
static int grow_keys(Loop *s, Py_ssize_t need)
{
    Defer *d = &s->d;
    if (need <= d->kcap) return 0;
    Py_ssize_t cap = d->kcap * 2 > need ? d->kcap * 2 : need;
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

/* The instance's key block, taken with its first part. */
static int open_keys(Loop *s, int64_t inst, int64_t k)
{
    Defer *d = &s->d;
    int64_t nk = d->t_nkeys[k];
    int64_t kb = take_block(d->fk, &d->nfk, nk);
    if (kb < 0) {
        if (grow_keys(s, d->ktop + nk) < 0) return -1;
        kb = d->ktop;
        d->ktop += nk;
    }
    for (int64_t q = kb; q < kb + nk; q++) s->shead[q] = s->stail[q] = s->rhead[q] = s->rtail[q] = -1;
    const int64_t *ps = d->pstart + d->t_poff[k];
    int64_t parts = 0;
    for (int64_t p = 0; p < d->t_n[k]; p++) parts += ps[p + 1] > ps[p];
    d->i_kbase[inst] = kb;
    d->i_parts[inst] = parts;
    return 0;
}

int defer_open(Loop *s, int64_t inst, int64_t p)
{
    Defer *d = &s->d;
    int64_t b = d->i_bind[inst], k = d->b_tid[b], part = d->i_joff[inst] + p;
    const int64_t *ps = d->pstart + d->t_poff[k];
    int64_t g0 = d->t_op[k] + ps[p], m = ps[p + 1] - ps[p];
    if (m == 0) return 0; /* nothing to do on this rank: its join follows the collective op */
    if (d->i_kbase[inst] < 0 && open_keys(s, inst, k) < 0) return -1;
    int64_t base = take_block(d->fb, &d->nfb, m);
    if (base < 0) {
        if (grow_ops(s, d->top + m) < 0) return -1;
        base = d->top;
        d->top += m;
    }
    int64_t sends = 0;
    for (int64_t q = 0; q < m; q++) { /* what changes as it runs; the rest is read from the template */
        int64_t j = base + q;
        int64_t tin = d->tindeg[g0 + q];
        s->indeg[j] = tin ? tin : 1; /* a root waits for its collective op */
        s->cur[j] = d->grp[d->b_goff[b] + p];
        s->partner[j] = -1;
        s->arrived[j] = 0;
        if (s->tail) s->tail[j] = 0.0;
        d->opart[j] = (int32_t)part;
        sends += d->tkind[g0 + q] == K_SEND;
    }
    d->p_kb[part] = d->i_kbase[inst];
    d->p_goff[part] = d->b_goff[b];
    d->p_mtshift[part] = d->b_mtoff[b] - d->t_op[k]; /* read only when b_mtoff >= 0 (unaware) */
    d->p_shift[part] = base - g0;
    d->p_left[part] = m + sends; /* every op ends, every send is matched */
    d->made += m;
    d->live += m;
    if (d->live > d->peak) d->peak = d->live;
    return 0;
}

/* One reference of sub-op j's part is gone (an op ended, a send was matched); the last frees it. */
void defer_release(Loop *s, int64_t j)
{
    Defer *d = &s->d;
    int64_t part = d->opart[j];
    if (--d->p_left[part] > 0) return;
    int64_t inst = d->p_inst[part], k = d->b_tid[d->i_bind[inst]];
    const int64_t *ps = d->pstart + d->t_poff[k];
    int64_t p = part - d->i_joff[inst], m = ps[p + 1] - ps[p];
    give_block(&d->fb, &d->nfb, &d->fbcap, d->p_shift[part] + d->t_op[k] + ps[p], m);
    d->live -= m;
    if (--d->i_parts[inst] == 0) {
        give_block(&d->fk, &d->nfk, &d->fkcap, d->i_kbase[inst], d->t_nkeys[k]);
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
    int64_t key = d->p_npu[d->opart[snd]] * d->nnpu + op_dstn(s, snd);
    size_t mask = (size_t)(d->pcap - 1);
    size_t i = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
    while (d->pk[i] >= 0 && d->pk[i] != key) i = (i + 1) & mask;
    if (d->pk[i] < 0) {
        d->pk[i] = key;
        d->pfirst[i] = d->t0[snd];
        d->plast[i] = t;
        d->plen++;
    } else {
        if (d->t0[snd] < d->pfirst[i]) d->pfirst[i] = d->t0[snd];
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

/* The caller's per-op arrays that sub-ops extend: replaced by private, growable copies. */
#define NDUP 2
static void **dup_field(Loop *s, int i, size_t *size)
{
    *size = sizeof(int64_t);
    return i == 0 ? (void **)&s->indeg : (void **)&s->cur;
}

static int check(Loop *s)
{
    Defer *d = &s->d;
    const char *bad = NULL;
    for (Py_ssize_t k = 0; !bad && k < d->ntmpl; k++) {
        if (d->t_op[k + 1] < d->t_op[k] || d->t_op[k + 1] > d->ntops) bad = "t_op";
        else if (d->t_n[k] < 1 || d->t_nkeys[k] < 0) bad = "t_n/t_nkeys";
        else if (d->t_poff[k] < 0) bad = "t_poff";
        else {
            const int64_t *ps = d->pstart + d->t_poff[k];
            int64_t m = d->t_op[k + 1] - d->t_op[k];
            if (ps[0] != 0 || ps[d->t_n[k]] != m) bad = "pstart (0 .. ops of the template)";
            for (int64_t p = 0; !bad && p < d->t_n[k]; p++)
                if (ps[p + 1] < ps[p]) bad = "pstart (must not decrease)";
            for (int64_t q = 0; !bad && q < m; q++) {
                int64_t g = d->t_op[k] + q, kd = d->tkind[g];
                if (kd != K_SEND && kd != K_RECV && kd != K_DELAY) bad = "tkind (send, receive or delay)";
                else if (d->tpart[g] < 0 || d->tpart[g] >= d->t_n[k]) bad = "tpart";
                else if (d->tpeer[g] < -1 || d->tpeer[g] >= d->t_n[k]) bad = "tpeer";
                else if ((kd == K_SEND || kd == K_RECV) && (d->tpeer[g] < 0 || d->tkey[g] < 0))
                    bad = "tpeer/tkey (a message has a peer and a key)";
                else if (d->tkey[g] >= d->t_nkeys[k]) bad = "tkey";
                else if (d->tindeg[g] < 0) bad = "tindeg";
                else if (d->tsptr[g + 1] < d->tsptr[g]) bad = "tsptr";
                else if (d->tsink[g] && d->tsptr[g + 1] > d->tsptr[g]) bad = "tsink (a sink has no successor)";
                for (int64_t e = d->tsptr[g]; !bad && e < d->tsptr[g + 1]; e++)
                    if (d->tsucc[e] < d->t_op[k] || d->tsucc[e] >= d->t_op[k + 1] ||
                        d->tpart[d->tsucc[e]] != d->tpart[g])
                        bad = "tsucc (a row of its template and rank)";
            }
        }
    }
    for (Py_ssize_t b = 0; !bad && b < d->nbind; b++) {
        if (d->b_tid[b] < 0 || d->b_tid[b] >= d->ntmpl) bad = "b_tid";
        else if (d->b_goff[b] < 0) bad = "b_goff";
        else
            for (int64_t p = 0; !bad && p < d->t_n[d->b_tid[b]]; p++) {
                int64_t npu = d->grp[d->b_goff[b] + p];
                if (npu < 0 || npu >= d->nnpu || (s->aware && npu >= s->nn)) bad = "grp (an NPU index)";
            }
    }
    int64_t next = 0;
    for (Py_ssize_t i = 0; !bad && i < d->ninst; i++) {
        int64_t k = d->b_tid[d->i_bind[i]];
        if (d->i_joff[i] != next) bad = "i_joff (parts packed instance after instance)";
        next += d->t_n[k];
        for (int64_t p = 0; !bad && p < d->t_n[k]; p++) {
            int64_t j = d->i_join[d->i_joff[i] + p];
            if (j < 0 || j >= s->n || s->kind[j] != K_JOIN) bad = "i_join (a join op)";
        }
    }
    if (!bad && next != d->nparts) bad = "i_join (one join per part)";
    uint8_t *seen = bad ? NULL : calloc((size_t)(d->nparts ? d->nparts : 1), 1);
    if (!bad && !seen) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; !bad && j < s->n; j++) {
        int64_t i = d->coll_inst[j];
        if (i < -1 || i >= d->ninst) bad = "coll_inst";
        else if (i >= 0 && (s->kind[j] != K_COLL || d->coll_p[j] < 0 ||
                            d->coll_p[j] >= d->t_n[d->b_tid[d->i_bind[i]]]))
            bad = "coll_p";
        else if (i >= 0 && seen[d->i_joff[i] + d->coll_p[j]]++)
            bad = "coll_inst/coll_p (one collective op per part)";
    }
    free(seen);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: bad deferred collectives: %s", bad);
        return -1;
    }
    return 0;
}

int defer_setup(Loop *s, PyObject *spec, Py_buffer *bufs, int *held)
{
    Defer *d = &s->d;
    static const struct {
        char type;
        const char *name;
    } kinds[DEFER_NBUF] = {
        {'q', "t_op"},  {'q', "t_nkeys"}, {'q', "t_n"},    {'q', "t_poff"}, {'q', "pstart"},
        {'q', "tkind"}, {'q', "tpeer"},   {'q', "tkey"},   {'q', "tindeg"}, {'q', "tpart"},
        {'q', "tsink"}, {'q', "tsptr"}, {'q', "tsucc"},   {'d', "tdur"},   {'d', "tsize"},  {'q', "b_tid"},
        {'q', "b_goff"}, {'q', "b_mtoff"}, {'q', "grp"},   {'d', "bmt"},    {'q', "i_bind"},
        {'q', "i_joff"}, {'q', "i_join"}, {'q', "coll_inst"}, {'q', "coll_p"},
    };
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != DEFER_NBUF + 1) {
        PyErr_SetString(PyExc_ValueError, "_simloop.run: deferred collectives must be a tuple of 26");
        return -1;
    }
    for (int q = 0; q < DEFER_NBUF; q++) {
        Py_ssize_t len = (q >= D_COLLINST) ? s->n : -1;
        if (simloop_buf(PyTuple_GET_ITEM(spec, q), &bufs[q], kinds[q].type, 0, len, kinds[q].name) < 0)
            return -1;
        (*held)++;
    }
    d->nnpu = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, DEFER_NBUF));
    if (d->nnpu < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_simloop.run: bad deferred NPU count");
        return -1;
    }
#define B64(i) ((const int64_t *)bufs[i].buf)
#define LEN(i) (bufs[i].len / 8)
    d->ntmpl = LEN(D_TOP) - 1;
    d->nbind = LEN(D_BTID);
    d->ninst = LEN(D_IBIND);
    d->ntops = LEN(D_TKIND);
    d->nparts = LEN(D_IJOIN);
    d->t_op = B64(D_TOP);
    d->t_nkeys = B64(D_TNKEYS);
    d->t_n = B64(D_TN);
    d->t_poff = B64(D_TPOFF);
    d->pstart = B64(D_PSTART);
    d->tkind = B64(D_TKIND);
    d->tpeer = B64(D_TPEER);
    d->tkey = B64(D_TKEY);
    d->tindeg = B64(D_TINDEG);
    d->tpart = B64(D_TPART);
    d->tsink = B64(D_TSINK);
    d->tsptr = B64(D_TSPTR);
    d->tsucc = B64(D_TSUCC);
    d->tdur = (const double *)bufs[D_TDUR].buf;
    d->tsize = (const double *)bufs[D_TSIZE].buf;
    d->b_tid = B64(D_BTID);
    d->b_goff = B64(D_BGOFF);
    d->b_mtoff = B64(D_BMTOFF);
    d->grp = B64(D_GRP);
    d->bmt = (const double *)bufs[D_BMT].buf;
    d->i_bind = B64(D_IBIND);
    d->i_joff = B64(D_IJOFF);
    d->i_join = B64(D_IJOIN);
    d->coll_inst = B64(D_COLLINST);
    d->coll_p = B64(D_COLLP);
    /* the lengths every index below relies on */
    const char *bad = NULL;
    if (d->ntmpl < 0 || LEN(D_TNKEYS) != d->ntmpl || LEN(D_TN) != d->ntmpl || LEN(D_TPOFF) != d->ntmpl)
        bad = "template arrays (t_op has one more entry than t_nkeys, t_n and t_poff)";
    else if (LEN(D_TPEER) != d->ntops || LEN(D_TKEY) != d->ntops || LEN(D_TINDEG) != d->ntops ||
             LEN(D_TPART) != d->ntops || LEN(D_TSINK) != d->ntops || LEN(D_TDUR) != d->ntops || LEN(D_TSIZE) != d->ntops ||
             LEN(D_TSPTR) != d->ntops + 1)
        bad = "template op arrays (one length; tsptr one more)";
    else if (d->ntops && (d->tsptr[0] != 0 || d->tsptr[d->ntops] != LEN(D_TSUCC)))
        bad = "tsptr (0 .. len(tsucc))";
    else if (LEN(D_BGOFF) != d->nbind || LEN(D_BMTOFF) != d->nbind || LEN(D_IJOFF) != d->ninst)
        bad = "binding/instance arrays (one length each)";
    for (Py_ssize_t k = 0; !bad && k < d->ntmpl; k++)
        if (d->t_poff[k] < 0 || d->t_n[k] < 1 || d->t_poff[k] + d->t_n[k] + 1 > LEN(D_PSTART)) bad = "t_poff";
    for (Py_ssize_t b = 0; !bad && b < d->nbind; b++) {
        int64_t k = d->b_tid[b];
        if (k < 0 || k >= d->ntmpl) bad = "b_tid";
        else if (d->b_goff[b] < 0 || d->b_goff[b] + d->t_n[k] > LEN(D_GRP)) bad = "b_goff";
        else if (d->b_mtoff[b] < -1 || (d->b_mtoff[b] >= 0 &&
                 d->b_mtoff[b] + (d->t_op[k + 1] - d->t_op[k]) > LEN(D_BMT)))
            bad = "b_mtoff";
    }
    for (Py_ssize_t i = 0; !bad && i < d->ninst; i++) {
        int64_t b = d->i_bind[i];
        if (b < 0 || b >= d->nbind) bad = "i_bind";
        else if (d->i_joff[i] < 0 || d->i_joff[i] + d->t_n[d->b_tid[b]] > LEN(D_IJOIN)) bad = "i_joff";
    }
#undef B64
#undef LEN
    if (bad) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: bad deferred collectives: %s", bad);
        return -1;
    }
    if (check(s) < 0) return -1;
    /* per instance and per part state, then private copies of the per-op and per-key arrays with room to grow */
    Py_ssize_t ni = d->ninst ? d->ninst : 1, np_ = d->nparts ? d->nparts : 1;
    d->i_kbase = malloc((size_t)ni * sizeof(int64_t));
    d->i_parts = calloc((size_t)ni, sizeof(int64_t));
    d->p_inst = malloc((size_t)np_ * sizeof(int64_t));
    d->p_npu = malloc((size_t)np_ * sizeof(int64_t));
    d->p_shift = calloc((size_t)np_, sizeof(int64_t));
    d->p_left = calloc((size_t)np_, sizeof(int64_t));
    d->p_kb = calloc((size_t)np_, sizeof(int64_t));
    d->p_goff = calloc((size_t)np_, sizeof(int64_t));
    d->p_mtshift = calloc((size_t)np_, sizeof(int64_t));
    if (!d->i_kbase || !d->i_parts || !d->p_inst || !d->p_npu || !d->p_shift || !d->p_left || !d->p_kb ||
        !d->p_goff || !d->p_mtshift)
        goto nomem;
    memset(d->i_kbase, 0xff, (size_t)ni * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < d->ninst; i++) {
        int64_t b = d->i_bind[i];
        for (int64_t p = 0; p < d->t_n[d->b_tid[b]]; p++) {
            d->p_inst[d->i_joff[i] + p] = i;
            d->p_npu[d->i_joff[i] + p] = d->grp[d->b_goff[b] + p];
        }
    }
    Py_ssize_t cap = s->n + 1024;
    for (int i = 0; i < NDUP; i++) {
        size_t size;
        void **field = dup_field(s, i, &size);
        void *q = malloc((size_t)cap * size);
        if (!q) goto nomem;
        if (s->n) memcpy(q, *field, (size_t)s->n * size);
        *field = q;
        d->ndup++;
    }
    d->on = 1;
    d->cap = s->n; /* partner, qnext, arrived and tail hold n so far: grow_ops reallocates all */
    d->opart = malloc((size_t)cap * sizeof(int32_t));
    d->t0 = malloc((size_t)cap * sizeof(double));
    if (!d->opart || !d->t0 || grow_ops(s, cap) < 0) goto nomem;
    d->top = s->n;
    d->kcap = s->nkeys;
    d->ktop = s->nkeys;
    if (grow_keys(s, s->nkeys + 1024) < 0) goto nomem;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

void defer_free(Loop *s, Py_buffer *bufs, int held)
{
    Defer *d = &s->d;
    for (int i = 0; i < d->ndup; i++) {
        size_t size;
        free(*dup_field(s, i, &size));
    }
    free(d->i_kbase);
    free(d->i_parts);
    free(d->p_inst);
    free(d->p_npu);
    free(d->p_shift);
    free(d->p_left);
    free(d->p_kb);
    free(d->p_goff);
    free(d->p_mtshift);
    free(d->opart);
    free(d->t0);
    free(d->fb);
    free(d->fk);
    free(d->pk);
    free(d->pcount);
    free(d->pfirst);
    free(d->plast);
    free(d->pbytes);
    for (int q = 0; q < held; q++) PyBuffer_Release(&bufs[q]);
}
