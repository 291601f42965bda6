/*
 * What the native loop is handed about the collectives it expands as they run: checked once,
 * then set up (etstore.sim._simloop; the expansion itself is _simdefer.c, the layout
 * etstore/sim/_defer.py's Deferred.spec). Every index the expansion follows is validated here
 * before the loop starts, so inconsistent input raises ValueError instead of crashing it.
 */
#include "_simstate.h"

#include <stdlib.h>
#include <string.h>

enum { D_TOP, D_TNKEYS, D_TN, D_TPOFF, D_PSTART, D_TKIND, D_TPEER, D_TKEY, D_TINDEG, D_TPART, D_TSINK,
       D_TSPTR, D_TSUCC, D_TDUR, D_TSIZE, D_BTID, D_BGOFF, D_BMTOFF, D_GRP, D_BMT, D_IBIND, D_IJOFF, D_IJOIN,
       D_COLLINST, D_COLLP, D_TCOMP, D_TKSTRIDE, D_TMTSTRIDE, D_RPTR, D_RROW, D_TRULE, D_TMTC, D_RMODE,
       D_RDN, D_RSTRIDE };

/* The caller's per-op arrays that sub-ops extend: replaced by private, growable copies. */
#define NDUP 2
static void **dup_field(Loop *s, int i, size_t *size)
{
    *size = sizeof(int64_t);
    return i == 0 ? (void **)&s->indeg : (void **)&s->cur;
}

/* A rule's peer stays among the template's ranks: n a multiple of the dimension's span, the
 * value an index of it (xor: of a power-of-two dimension). */
static const char *check_rule(const Defer *d, int64_t r, int64_t v, int64_t n)
{
    if (r < 0 || r >= d->nrule) return "trule";
    int64_t mode = d->r_mode[r], dn = d->r_dn[r], st = d->r_stride[r];
    if ((mode != P_ROT && mode != P_XOR) || dn < 1 || st < 1 || dn > n || st > n / dn || n % (dn * st))
        return "rule (a rotation or xor of an index of the template's ranks)";
    if (v < 0 || v >= dn || (mode == P_XOR && (dn & (dn - 1)))) return "tpeer (a rule's value)";
    return NULL;
}

static const char *check_template(const Defer *d, Py_ssize_t k)
{
    if (d->t_op[k + 1] < d->t_op[k] || d->t_op[k + 1] > d->ntops) return "t_op";
    if (d->t_n[k] < 1 || d->t_nkeys[k] < 0) return "t_n/t_nkeys";
    int comp = d->t_comp[k] == 1;
    if (!comp && d->t_comp[k] != 0) return "t_comp";
    if (comp && (d->t_kstride[k] < 0 || d->t_mtstride[k] < 0 || d->t_nkeys[k] != d->t_n[k] * d->t_kstride[k]))
        return "t_kstride/t_nkeys (one program: n ranks of key classes)";
    int64_t nprog = comp ? 1 : d->t_n[k], n = d->t_n[k];
    if (d->t_poff[k] < 0 || d->t_poff[k] + nprog + 1 > d->nprog) return "t_poff";
    const int64_t *ps = d->pstart + d->t_poff[k], *rp = d->rptr + d->t_poff[k];
    int64_t m = d->t_op[k + 1] - d->t_op[k];
    if (ps[0] != 0 || ps[nprog] != m) return "pstart (0 .. ops of the template)";
    for (int64_t r = 0; r < nprog; r++) {
        if (ps[r + 1] < ps[r]) return "pstart (must not decrease)";
        if (rp[r] < 0 || rp[r + 1] < rp[r] || rp[r + 1] > d->nroot) return "rptr";
        for (int64_t x = rp[r]; x < rp[r + 1]; x++) {
            int64_t g = d->rrow[x];
            if (g < d->t_op[k] + ps[r] || g >= d->t_op[k] + ps[r + 1] || d->tindeg[g] != 0)
                return "rrow (a root of its program)";
        }
    }
    for (int64_t q = 0; q < m; q++) {
        int64_t g = d->t_op[k] + q, kd = d->tkind[g];
        int msg = kd == K_SEND || kd == K_RECV;
        if (kd != K_SEND && kd != K_RECV && kd != K_DELAY) return "tkind (send, receive or delay)";
        if (d->tpart[g] < 0 || d->tpart[g] >= nprog || q < ps[d->tpart[g]] || q >= ps[d->tpart[g] + 1])
            return "tpart (the program of its row)";
        if (comp && msg) {
            const char *bad = check_rule(d, d->trule[g], d->tpeer[g], n);
            if (bad) return bad;
            if (d->tkey[g] < 0 || d->tkey[g] >= d->t_kstride[k]) return "tkey";
            if (kd == K_SEND && (d->tmtc[g] < 0 || d->tmtc[g] >= d->t_mtstride[k])) return "tmtc";
        } else if (comp) {
            if (d->trule[g] < -1 || d->trule[g] >= d->nrule) return "trule";
        } else {
            if (d->trule[g] != -1) return "trule (a template laid out names its peers)";
            if (d->tpeer[g] < -1 || d->tpeer[g] >= n) return "tpeer";
            if (msg && (d->tpeer[g] < 0 || d->tkey[g] < 0)) return "tpeer/tkey (a message has a peer and a key)";
            if (d->tkey[g] >= d->t_nkeys[k]) return "tkey";
            if (kd == K_SEND && (d->tmtc[g] < 0 || d->tmtc[g] >= m)) return "tmtc";
        }
        if (d->tindeg[g] < 0) return "tindeg";
        if (d->tsptr[g + 1] < d->tsptr[g]) return "tsptr";
        if (d->tsink[g] && d->tsptr[g + 1] > d->tsptr[g]) return "tsink (a sink has no successor)";
        for (int64_t e = d->tsptr[g]; e < d->tsptr[g + 1]; e++)
            if (d->tsucc[e] < d->t_op[k] || d->tsucc[e] >= d->t_op[k + 1] || d->tpart[d->tsucc[e]] != d->tpart[g])
                return "tsucc (a row of its template and rank)";
    }
    return NULL;
}

static int check(Loop *s)
{
    Defer *d = &s->d;
    const char *bad = NULL;
    for (Py_ssize_t k = 0; !bad && k < d->ntmpl; k++) bad = check_template(d, k);
    for (Py_ssize_t b = 0; !bad && b < d->nbind; b++) {
        int64_t k = d->b_tid[b];
        for (int64_t p = 0; !bad && p < d->t_n[k]; p++) {
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
        {'q', "t_comp"}, {'q', "t_kstride"}, {'q', "t_mtstride"}, {'q', "rptr"}, {'q', "rrow"},
        {'q', "trule"}, {'q', "tmtc"}, {'q', "r_mode"}, {'q', "r_dn"}, {'q', "r_stride"},
    };
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != DEFER_NBUF + 1) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: deferred collectives must be a tuple of %d", DEFER_NBUF + 1);
        return -1;
    }
    for (int q = 0; q < DEFER_NBUF; q++) {
        Py_ssize_t len = (q == D_COLLINST || q == D_COLLP) ? s->n : -1;
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
    d->nprog = LEN(D_PSTART);
    d->nroot = LEN(D_RROW);
    d->nrule = LEN(D_RMODE);
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
    d->t_comp = B64(D_TCOMP);
    d->t_kstride = B64(D_TKSTRIDE);
    d->t_mtstride = B64(D_TMTSTRIDE);
    d->rptr = B64(D_RPTR);
    d->rrow = B64(D_RROW);
    d->trule = B64(D_TRULE);
    d->tmtc = B64(D_TMTC);
    d->r_mode = B64(D_RMODE);
    d->r_dn = B64(D_RDN);
    d->r_stride = B64(D_RSTRIDE);
    /* the lengths every index below relies on */
    const char *bad = NULL;
    if (d->ntmpl < 0 || LEN(D_TNKEYS) != d->ntmpl || LEN(D_TN) != d->ntmpl || LEN(D_TPOFF) != d->ntmpl ||
        LEN(D_TCOMP) != d->ntmpl || LEN(D_TKSTRIDE) != d->ntmpl || LEN(D_TMTSTRIDE) != d->ntmpl)
        bad = "template arrays (t_op has one more entry than t_nkeys, t_n, t_poff, t_comp and the strides)";
    else if (LEN(D_TPEER) != d->ntops || LEN(D_TKEY) != d->ntops || LEN(D_TINDEG) != d->ntops ||
             LEN(D_TPART) != d->ntops || LEN(D_TSINK) != d->ntops || LEN(D_TDUR) != d->ntops ||
             LEN(D_TSIZE) != d->ntops || LEN(D_TRULE) != d->ntops || LEN(D_TMTC) != d->ntops ||
             LEN(D_TSPTR) != d->ntops + 1)
        bad = "template op arrays (one length; tsptr one more)";
    else if (d->ntops && (d->tsptr[0] != 0 || d->tsptr[d->ntops] != LEN(D_TSUCC)))
        bad = "tsptr (0 .. len(tsucc))";
    else if (LEN(D_RPTR) != d->nprog)
        bad = "rptr (one entry per pstart entry)";
    else if (LEN(D_RDN) != d->nrule || LEN(D_RSTRIDE) != d->nrule)
        bad = "rules (r_mode, r_dn and r_stride of one length)";
    else if (LEN(D_BGOFF) != d->nbind || LEN(D_BMTOFF) != d->nbind || LEN(D_IJOFF) != d->ninst)
        bad = "binding/instance arrays (one length each)";
    for (Py_ssize_t k = 0; !bad && k < d->ntmpl; k++) {
        int64_t nprog = d->t_comp[k] ? 1 : d->t_n[k];
        if (d->t_poff[k] < 0 || d->t_n[k] < 1 || d->t_poff[k] + nprog + 1 > d->nprog) bad = "t_poff";
    }
    for (Py_ssize_t b = 0; !bad && b < d->nbind; b++) {
        int64_t k = d->b_tid[b];
        if (k < 0 || k >= d->ntmpl) bad = "b_tid";
        else if (d->b_goff[b] < 0 || d->b_goff[b] + d->t_n[k] > LEN(D_GRP)) bad = "b_goff";
        else if (d->b_mtoff[b] < -1 ||
                 (d->b_mtoff[b] >= 0 &&
                  d->b_mtoff[b] + (d->t_comp[k] ? d->t_n[k] * d->t_mtstride[k] : d->t_op[k + 1] - d->t_op[k]) >
                      LEN(D_BMT)))
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
    /* per instance state, then private copies of the per-op and per-key arrays with room to grow */
    Py_ssize_t ni = d->ninst ? d->ninst : 1;
    d->i_kbase = malloc((size_t)ni * sizeof(int64_t));
    d->i_parts = calloc((size_t)ni, sizeof(int64_t));
    if (!d->i_kbase || !d->i_parts) goto nomem;
    memset(d->i_kbase, 0xff, (size_t)ni * sizeof(int64_t));
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
    size_t subs = (size_t)(cap - s->n); /* sub-op slots: their own arrays, from 0 */
    d->opart = malloc(subs * sizeof(int32_t));
    d->orow = malloc(subs * sizeof(int64_t));
    d->okey = malloc(subs * sizeof(int64_t));
    d->odst = malloc(subs * sizeof(int64_t));
    d->omt = malloc(subs * sizeof(double));
    d->t0 = malloc(subs * sizeof(double));
    d->oref = malloc(subs);
    d->sfree = malloc(subs * sizeof(int32_t));
    if (!d->opart || !d->orow || !d->okey || !d->odst || !d->omt || !d->t0 || !d->oref || !d->sfree ||
        defer_grow_ops(s, cap) < 0)
        goto nomem;
    d->top = s->n;
    d->kcap = s->nkeys;
    d->ktop = s->nkeys;
    if (defer_grow_keys(s, s->nkeys + 1024) < 0) goto nomem;
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
    for (int64_t id = 0; id < d->nptop; id++) free(d->parts[id].win); /* NULL once given back */
    free(d->parts);
    free(d->pfree);
    free(d->opart);
    free(d->orow);
    free(d->okey);
    free(d->odst);
    free(d->omt);
    free(d->t0);
    free(d->oref);
    free(d->sfree);
    free(d->fk);
    free(d->pk);
    free(d->pcount);
    free(d->pfirst);
    free(d->plast);
    free(d->pbytes);
    for (int q = 0; q < held; q++) PyBuffer_Release(&bufs[q]);
}
