/*
 * Native event loop of the simulator (etstore.sim._simloop).
 *
 * Why this exists: the reference loop, `_run` in etstore/sim/_loop.py, is pure CPython and
 * costs about 1.5 us per event on traces whose ops are spread out in time; the
 * simulator's budget is >= 1M events/s. This module runs the same loop over the
 * same integer-indexed arrays (numpy buffers, CSR successors) and must produce
 * bit-identical results: tests/sim/test_simloop.py runs both on every workload
 * shape of the test-suite and compares every output array.
 *
 * Event order. The reference keeps a calendar of distinct times (a heap of floats)
 * with one bucket of items per time; a popped bucket runs its items in the order
 * they were scheduled, and items scheduled for the current time while it runs go
 * into a *new* bucket for the same time, run after the current one. Here every
 * item is a heap entry keyed by (time, insertion sequence); one round pops every
 * entry of the minimal time, in sequence order, into `items` and runs them. Items
 * scheduled at that time during the round get larger sequence numbers and are
 * popped by the next round: the same order as the reference's buckets. A matched
 * receive that completes with its message's arrival is appended to the running
 * round, as the reference appends it to the running bucket.
 *
 * Queues. Each op sits in at most one queue at a time (a slot wait queue before it
 * starts, a send or receive matching queue after), so all queues are singly linked
 * lists through one `qnext` array. Matching queues are FIFO, one per distinct
 * message key `mkey` (renumbered densely here: mkey is a mixed-radix code whose
 * range can be far larger than the number of messages). A slot's ready queue is kept
 * sorted by (prio, op): ASTRA-sim issues a rank's dependency-free nodes in ascending node
 * id each time a node finishes, so after every item the touched slots are handed out,
 * lowest first, while places are free (the reference's heap pops the same order).
 *
 * Hops (congestion-aware). A message walks the links of the network's aware graph
 * (etstore.sim.network.Network.hop_graph: the topology's links plus, per switch, an
 * uplink and a downlink per NPU), one event per hop. Store-and-forward (ASTRA-sim's
 * congestion-aware Link): a link serializes one message for trunc(size / bw); the next node
 * has it trunc(latency + size / bw) after the hop started; a message that finds the link
 * busy waits in the link's FIFO (`phead`), and an item ~(LINK_ITEM + link) frees the link
 * and starts the next one. A send's first hop is taken as it starts. Items are scheduled
 * in ASTRA-sim's order, so messages meeting at a link queue as they do there. The reference
 * schedules every free item; here a free item takes its sequence number when the hop starts
 * but enters the heap (or the running round, where it is due now) only once a message
 * waits for it, which gives the same order with one heap item per hop. Cut-through
 * (`cut_through`): the head is at the next node trunc(latency) after the hop started, the
 * link is held until the tail has passed (`tail`, `lfree`), and the destination waits for
 * the tail.
 *
 * Progress. A round pops at least one item, so the loop ends once every op has; an item
 * whose time is not a number would pop none, and the loop stops with ERR_TIME naming it.
 *
 * The loop runs without the GIL: it only touches the input buffers and malloc'd
 * memory. Input errors raise ValueError before the loop starts.
 */
#include "_simstate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ heap */

static inline int item_less(const Item *p, const Item *q)
{
    return p->t < q->t || (p->t == q->t && p->seq < q->seq);
}

static int heap_push(Heap *h, double t, uint64_t seq, int64_t x)
{
    if (h->len == h->cap) {
        Py_ssize_t cap = h->cap ? h->cap * 2 : 1024;
        Item *a = realloc(h->a, (size_t)cap * sizeof(Item));
        if (!a) return -1;
        h->a = a;
        h->cap = cap;
    }
    Item it = {t, seq, x};
    Py_ssize_t i = h->len++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!item_less(&it, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = it;
    return 0;
}

static Item heap_pop(Heap *h)
{
    Item top = h->a[0];
    Item last = h->a[--h->len];
    Py_ssize_t n = h->len, i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && item_less(&h->a[c + 1], &h->a[c])) c++;
        if (!item_less(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (n) h->a[i] = last;
    return top;
}

/* ------------------------------------------------------------------ state */

/* FIFO list append / pop (matching queues and FIFO wait queues). */
static inline void fifo_push(Loop *s, int64_t *head, int64_t *tail, int64_t key, int64_t j)
{
    s->qnext[j] = -1;
    if (tail[key] < 0)
        head[key] = j;
    else
        s->qnext[tail[key]] = j;
    tail[key] = j;
}

static inline int64_t fifo_pop(Loop *s, int64_t *head, int64_t *tail, int64_t key)
{
    int64_t j = head[key];
    head[key] = s->qnext[j];
    if (head[key] < 0) tail[key] = -1;
    return j;
}

/* (prio, op) order of two ops: ties in prio (never within one rank's trace ops) fall back to the op. */
static inline int wait_before(const Loop *s, int64_t a, int64_t b)
{
    return s->prio[a] < s->prio[b] || (s->prio[a] == s->prio[b] && a < b);
}

/* Op j joins slot c's ready queue in (prio, op) order; ops mostly arrive in order, so look at the tail first. */
static inline void wait_push(Loop *s, int64_t c, int64_t j)
{
    int64_t tail = s->wtail[c];
    if (tail < 0 || wait_before(s, tail, j)) {
        fifo_push(s, s->whead, s->wtail, c, j);
        return;
    }
    int64_t prev = -1, cur = s->whead[c];
    while (cur >= 0 && wait_before(s, cur, j)) {
        prev = cur;
        cur = s->qnext[cur];
    }
    s->qnext[j] = cur;
    if (prev < 0)
        s->whead[c] = j;
    else
        s->qnext[prev] = j;
}

static inline void touch(Loop *s, int64_t c)
{
    if (!s->touched[c]) {
        s->touched[c] = 1;
        s->dirty[s->ndirty++] = c;
    }
}

static inline int schedule(Loop *s, double t2, int64_t x)
{
    if (heap_push(&s->heap, t2, s->seq++, x) < 0) {
        s->err = ERR_MEMORY;
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ links (store-and-forward) */

static int items_append(Loop *s, int64_t x);

/* The item that frees link `link` is not yet due at (t, key): the link is still serializing. */
static inline int link_busy(const Loop *s, int64_t link, double t)
{
    return s->lfin[link] > t || (s->lfin[link] == t && s->lseq[link] > s->key);
}

/* Link `link` starts serializing message snd at t, as ASTRA-sim's Link::schedule_chunk_transmission:
 * the message is at the far end trunc(latency + size / bw) later, and the link is free again
 * trunc(size / bw) later. That free item takes its sequence number now, after the arrival's,
 * as in ASTRA-sim, but enters the heap only if a message comes to wait for it (`forward`):
 * alone it would change nothing, and most hops find their link free. */
static inline int transmit(Loop *s, int64_t link, int64_t snd, double t)
{
    double sz = op_size(s, snd), raw = sz / s->lbw[link];
    double fin = t + (s->integer_ns ? trunc(raw) : raw), delay = s->llat[link] + raw;
    s->lbusy[link] += fin - t;
    s->lbytes[link] += sz;
    s->lmsgs[link] += 1;
    s->cur[snd] = s->ldst[link];
    if (schedule(s, t + (s->integer_ns ? trunc(delay) : delay), ~snd) < 0) return -1;
    s->lfin[link] = fin;
    s->lseq[link] = (int64_t)s->seq++;
    s->lpush[link] = 0;
    return 0;
}

/* Put link `link`'s free item where the reference, which schedules every one, has it: in the
 * heap, or, when it is due in the running round (its time is now and its number was taken
 * before the round began), among the round's heap items in sequence order. */
static int schedule_free(Loop *s, int64_t link, double t)
{
    int64_t x = ~(LINK_ITEM + link), q = s->lseq[link];
    s->lpush[link] = 1;
    if (!(s->lfin[link] == t && (uint64_t)q < s->s0)) {
        if (heap_push(&s->heap, s->lfin[link], (uint64_t)q, x) < 0) {
            s->err = ERR_MEMORY;
            return -1;
        }
        return 0;
    }
    if (items_append(s, x) < 0) return -1; /* grows items and iseq */
    int64_t p = s->npopped;
    while (p > 0 && s->iseq[p - 1] > q) p--;
    memmove(s->items + p + 1, s->items + p, (size_t)(s->nitems - 1 - p) * sizeof(int64_t));
    memmove(s->iseq + p + 1, s->iseq + p, (size_t)(s->npopped - p) * sizeof(int64_t));
    s->items[p] = x;
    s->iseq[p] = q;
    s->npopped++;
    return 0;
}

/* Message snd is at NPU cur[snd], short of its destination d: onto its next link, or into its FIFO. */
/* Two arrays of the same length grown together: double ``*cap`` (``first`` when empty). */
static int grow_pair(Loop *s, int64_t **a, int64_t **b, int64_t *cap, int64_t first)
{
    int64_t n = *cap ? 2 * *cap : first;
    int64_t *x = realloc(*a, (size_t)n * sizeof(int64_t));
    if (x) *a = x;
    int64_t *y = x ? realloc(*b, (size_t)n * sizeof(int64_t)) : NULL;
    if (!y) {
        s->err = ERR_MEMORY;
        return -1;
    }
    *b = y;
    *cap = n;
    return 0;
}

static inline int forward(Loop *s, int64_t snd, int64_t d, double t)
{
    int64_t u = s->cur[snd];
    int64_t link = s->hop[d * s->nn + u];
    if (link < 0 || link >= s->nl) {
        s->err = ERR_ROUTE;
        s->err_u = u;
        s->err_d = d;
        return -1;
    }
    if (!link_busy(s, link, t)) return transmit(s, link, snd, t);
    int64_t c = s->pfree;
    if (c >= 0) {
        s->pfree = s->pnext[c];
    } else {
        if (s->ptop == s->pcap && grow_pair(s, &s->pmsg, &s->pnext, &s->pcap, 256) < 0) return -1;
        c = s->ptop++;
    }
    s->pmsg[c] = snd;
    s->pnext[c] = -1;
    if (s->ptail[link] >= 0)
        s->pnext[s->ptail[link]] = c;
    else
        s->phead[link] = c;
    s->ptail[link] = c;
    return s->lpush[link] ? 0 : schedule_free(s, link, t);
}

/* Link `link`'s free item runs at t (a message waits for it): the first waiting message goes. */
static int link_free(Loop *s, int64_t link, double t)
{
    int64_t c = s->phead[link];
    s->phead[link] = s->pnext[c];
    if (s->phead[link] < 0) s->ptail[link] = -1;
    int64_t snd = s->pmsg[c];
    s->pnext[c] = s->pfree;
    s->pfree = c;
    if (transmit(s, link, snd, t) < 0) return -1;
    return s->phead[link] >= 0 ? schedule_free(s, link, t) : 0;
}

/* Op j starts at time t: match its message, schedule its end (or its message's first move).
 * A deferred collective's send is matched here or by a later receive: its part may then go. */
static int begin_op(Loop *s, int64_t j, double t)
{
    int64_t k = op_kind(s, j);
    double t2;
    int64_t x;
    if (k == K_SEND) {
        int64_t mk = op_dkey(s, j);
        if (s->rhead[mk] >= 0) {
            s->partner[j] = fifo_pop(s, s->rhead, s->rtail, mk);
            if (j >= s->n) defer_release(s, j); /* its op is still running: the part stays */
        } else {
            if (mk < s->nkeys && s->sorder[mk] < 0) s->sorder[mk] = s->screated++;
            fifo_push(s, s->shead, s->stail, mk, j);
        }
        if (j >= s->n) s->d.t0[SUB(s, j)] = t;
        /* store-and-forward: the first hop is taken as the send starts, as ASTRA-sim's sim_send */
        if (s->aware && !s->cut_through && s->overhead == 0) {
            int64_t d = op_dstn(s, j);
            if (s->cur[j] != d) return forward(s, j, d, t);
        }
        t2 = t + (s->aware ? s->overhead : op_mt(s, j));
        x = ~j;
    } else if (k == K_RECV) {
        int64_t mk = op_dkey(s, j);
        if (s->shead[mk] >= 0) {
            int64_t snd = fifo_pop(s, s->shead, s->stail, mk);
            int landed = s->arrived[snd];
            if (!landed) s->partner[snd] = j; /* finishes when the message arrives */
            if (snd >= s->n) defer_release(s, snd); /* last use of a send that has landed */
            if (!landed) return 0;
            t2 = t; /* the message is already here */
            x = j;
        } else {
            if (mk < s->nkeys && s->rorder[mk] < 0) s->rorder[mk] = s->rcreated++;
            fifo_push(s, s->rhead, s->rtail, mk, j);
            return 0;
        }
    } else {
        t2 = t + op_dur(s, j);
        x = j;
    }
    return schedule(s, t2, x);
}

/* Op j's dependencies are done: start it, or queue it for its slot (handed out by dispatch). */
static inline int ready_op(Loop *s, int64_t j, double t)
{
    int64_t c = op_acq(s, j);
    if (c < 0) return begin_op(s, j, t);
    wait_push(s, c, j);
    touch(s, c);
    return 0;
}

/* Every touched slot's free places go to its ready ops, lowest (prio, op) first; same as the reference. */
static int dispatch(Loop *s, double t)
{
    for (int64_t q = 0; q < s->ndirty; q++) {
        int64_t c = s->dirty[q];
        s->touched[c] = 0;
        while (s->whead[c] >= 0 && s->free_[c] > 0) {
            s->free_[c] -= 1;
            int64_t j = fifo_pop(s, s->whead, s->wtail, c);
            s->start[j] = t;
            if (begin_op(s, j, t) < 0) return -1;
        }
    }
    s->ndirty = 0;
    return 0;
}

static int items_append(Loop *s, int64_t x)
{
    if (s->nitems == s->items_cap && grow_pair(s, &s->iseq, &s->items, &s->items_cap, 1024) < 0) return -1;
    s->items[s->nitems++] = x;
    return 0;
}

/* Collective op y has started its part (rank coll_p) of an instance: make the part's roots
 * and ready them in row order, as a loop given every sub-op up front would (the collective's
 * root edges come first among its successors). The part's other ops are made as they
 * become due (sub_op_done). */
static int start_part(Loop *s, int64_t y, double t)
{
    Defer *d = &s->d;
    int64_t id = defer_open(s, d->coll_inst[y], d->coll_p[y]);
    if (id == -2) return 0; /* nothing to do on this rank: its join follows the collective op */
    if (id < 0) {
        s->err = ERR_MEMORY;
        return -1;
    }
    int64_t prog = d->parts[id].prog, g0 = d->parts[id].g0;
    for (int64_t r = d->rptr[prog]; r < d->rptr[prog + 1]; r++) {
        int64_t j = defer_make(s, id, d->rrow[r] - g0);
        if (j < 0) {
            s->err = ERR_MEMORY;
            return -1;
        }
        if (--s->indeg[j]) continue;
        if (ready_op(s, j, t) < 0) return -1;
    }
    return 0;
}

/* Sub-op y has ended: its template successors (made now if not yet due), then, for a sink,
 * its rank's join. */
static int sub_op_done(Loop *s, int64_t y, double t)
{
    Defer *d = &s->d;
    int64_t id = d->opart[SUB(s, y)], g = d->orow[SUB(s, y)], g0 = d->parts[id].g0;
    for (int64_t e = d->tsptr[g]; e < d->tsptr[g + 1]; e++) {
        int64_t j = defer_make(s, id, d->tsucc[e] - g0);
        if (j < 0) {
            s->err = ERR_MEMORY;
            return -1;
        }
        if (--s->indeg[j]) continue;
        if (ready_op(s, j, t) < 0) return -1;
    }
    if (d->tsink[g]) {
        int64_t j = d->parts[id].join;
        if (--s->indeg[j] == 0 && ready_op(s, j, t) < 0) return -1;
    }
    defer_release(s, y);
    return 0;
}

static int run_loop(Loop *s)
{
    double t = 0.0;
    s->key = -1;
    for (int64_t i = 0; i < s->n; i++)
        if (s->indeg[i] == 0 && ready_op(s, i, t) < 0) return -1;
    if (dispatch(s, t) < 0) return -1;
    for (;;) {
        if (s->heap.len == 0) break;
        /* one round: every item of the earliest time, in the order scheduled */
        t = s->heap.a[0].t;
        s->nitems = 0;
        s->s0 = s->seq;
        while (s->heap.len && s->heap.a[0].t == t) {
            Item it = heap_pop(&s->heap);
            if (items_append(s, it.x) < 0) return -1;
            s->iseq[s->nitems - 1] = (int64_t)it.seq;
        }
        s->npopped = s->nitems;
        if (s->nitems == 0) { /* a NaN time equals nothing: stop rather than spin on it */
            s->err = ERR_TIME;
            s->err_u = s->heap.a[0].x;
            return -1;
        }
        int64_t freed = 0; /* link items: not events of the trace */
        for (int64_t k = 0; k < s->nitems; k++) { /* nitems grows with matched receives */
            int64_t x = s->items[k], y;
            /* appended receives run after every heap item of the round, before anything scheduled in it */
            s->key = k < s->npopped ? s->iseq[k] : (int64_t)s->s0 - 1;
            if (x < 0) {
                int64_t snd = ~x;
                if (snd >= LINK_ITEM) {
                    if (link_free(s, snd - LINK_ITEM, t) < 0) return -1;
                    freed++;
                    continue;
                }
                if (s->aware) {
                    int64_t u = s->cur[snd], d = op_dstn(s, snd);
                    if (u != d && !s->cut_through) {
                        if (forward(s, snd, d, t) < 0) return -1;
                        continue;
                    }
                    if (u != d) { /* cut-through: one hop, queued behind earlier messages on the link */
                        int64_t link = s->hop[d * s->nn + u];
                        if (link < 0 || link >= s->nl) {
                            s->err = ERR_ROUTE;
                            s->err_u = u;
                            s->err_d = d;
                            return -1;
                        }
                        double st = s->lfree[link];
                        if (st < t) st = t;
                        double sz = op_size(s, snd);
                        double raw = sz / s->lbw[link];
                        double ser = s->integer_ns ? trunc(raw) : raw; /* Python's int(): toward zero */
                        double fin = st + ser, t2;
                        int64_t nxt = s->ldst[link];
                        /* the head moves on after the latency, the tail follows */
                        if (fin < s->tail[snd]) fin = s->tail[snd];
                        double lat = s->integer_ns ? trunc(s->llat[link]) : s->llat[link];
                        s->tail[snd] = fin + lat;
                        t2 = nxt == d ? s->tail[snd] : st + lat;
                        s->lfree[link] = fin;
                        s->lbusy[link] += fin - st;
                        s->lbytes[link] += sz;
                        s->lmsgs[link] += 1;
                        s->cur[snd] = nxt;
                        if (schedule(s, t2, x) < 0) return -1;
                        continue;
                    }
                }
                s->arrived[snd] = 1;
                if (snd >= s->n && defer_pair(s, snd, t) < 0) {
                    s->err = ERR_MEMORY;
                    return -1;
                }
                int64_t r = s->partner[snd];
                if (r >= 0 && items_append(s, r) < 0) return -1; /* its receive ends now too */
                y = snd;
            } else {
                y = x;
            }
            int64_t c = op_rel(s, y);
            if (c >= 0) {
                s->free_[c] += 1;
                if (s->whead[c] >= 0) touch(s, c);
            }
            if (y >= s->n) {
                if (sub_op_done(s, y, t) < 0) return -1;
            } else {
                s->end[y] = t;
                if (s->d.on && s->d.coll_inst[y] >= 0 && start_part(s, y, t) < 0) return -1;
                for (int64_t e = s->sptr[y]; e < s->sptr[y + 1]; e++) {
                    int64_t j = s->succ[e];
                    if (--s->indeg[j]) continue;
                    if (ready_op(s, j, t) < 0) return -1;
                }
            }
            if (s->ndirty && dispatch(s, t) < 0) return -1;
        }
        s->events += s->nitems - freed;
    }
    s->t = t;
    return 0;
}

/* Dense ids 0..nkeys-1 for the message keys, in order of first appearance (a hash table). */
static int dense_keys(Loop *s)
{
    int64_t nmsg = 0;
    for (Py_ssize_t i = 0; i < s->n; i++) nmsg += s->mkey[i] >= 0;
    int bits = 4;
    while (((int64_t)1 << bits) < 2 * nmsg) bits++;
    size_t cap = (size_t)1 << bits, mask = cap - 1;
    int64_t *hk = malloc(cap * sizeof(int64_t)), *hv = malloc(cap * sizeof(int64_t));
    s->dkey = malloc((size_t)(s->n ? s->n : 1) * sizeof(int64_t));
    s->keyval = malloc((size_t)(nmsg ? nmsg : 1) * sizeof(int64_t));
    if (!hk || !hv || !s->dkey || !s->keyval) {
        free(hk);
        free(hv);
        return -1;
    }
    memset(hk, 0xff, cap * sizeof(int64_t)); /* -1: empty (keys are >= 0) */
    s->nkeys = 0;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        int64_t k = s->mkey[i];
        if (k < 0) {
            s->dkey[i] = -1;
            continue;
        }
        size_t h = (size_t)(((uint64_t)k * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
        while (hk[h] != -1 && hk[h] != k) h = (h + 1) & mask;
        if (hk[h] == -1) {
            hk[h] = k;
            hv[h] = s->nkeys;
            s->keyval[s->nkeys++] = k;
        }
        s->dkey[i] = hv[h];
    }
    free(hk);
    free(hv);
    return 0;
}

/* ------------------------------------------------------------------ glue */

#define NBUF 21 /* op and link buffers before the scalars; prio follows them */

/* Every index the loop follows is checked once here, so bad input cannot crash it. */
static int check_indices(Loop *s, Py_ssize_t m)
{
    const char *bad = NULL;
    if (s->sptr[0] != 0 || s->sptr[s->n] != m) bad = "sptr (must start at 0 and end at len(succ))";
    for (Py_ssize_t i = 0; !bad && i < s->n; i++) {
        if (s->sptr[i + 1] < s->sptr[i]) bad = "sptr (must not decrease)";
        else if (s->acq[i] < -1 || s->acq[i] >= s->nres) bad = "acq (a slot index or -1)";
        else if (s->rel[i] < -1 || s->rel[i] >= s->nres) bad = "rel (a slot index or -1)";
        else if (s->indeg[i] < 0) bad = "indeg (negative)";
        else if ((s->kind[i] == K_SEND || s->kind[i] == K_RECV) && s->mkey[i] < 0)
            bad = "mkey (a message has no key)";
        else if (s->aware && s->kind[i] == K_SEND &&
                 (s->cur[i] < 0 || s->cur[i] >= s->nn || s->dstn[i] < 0 || s->dstn[i] >= s->nn))
            bad = "cur/dstn (outside the routing table)";
    }
    for (Py_ssize_t e = 0; !bad && e < m; e++)
        if (s->succ[e] < 0 || s->succ[e] >= s->n) bad = "succ (an op index)";
    for (Py_ssize_t l = 0; !bad && s->aware && l < s->nl; l++)
        if (s->ldst[l] < 0 || s->ldst[l] >= s->nn) bad = "ldst (an NPU index)";
    if (bad) {
        PyErr_Format(PyExc_ValueError, "_simloop.run: bad %s", bad);
        return -1;
    }
    return 0;
}

/* The non-empty queues of one kind, in the order the reference's dict created them. */
static PyObject *queues_dict(Loop *s, const int64_t *head, const int64_t *order, int64_t created)
{
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int64_t *by_order = malloc((size_t)(created ? created : 1) * sizeof(int64_t));
    if (!by_order) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    memset(by_order, 0xff, (size_t)(created ? created : 1) * sizeof(int64_t));
    for (int64_t k = 0; k < s->nkeys; k++) /* the trace's own keys (sub-op keys are not reported) */
        if (order[k] >= 0) by_order[order[k]] = k;
    for (int64_t o = 0; o < created; o++) {
        int64_t k = by_order[o];
        if (k < 0 || head[k] < 0) continue;
        PyObject *lst = PyList_New(0);
        PyObject *key = PyLong_FromLongLong(s->keyval[k]);
        int bad = !lst || !key;
        for (int64_t j = head[k]; !bad && j >= 0; j = s->qnext[j]) {
            PyObject *v = PyLong_FromLongLong(j);
            bad = !v || PyList_Append(lst, v) < 0;
            Py_XDECREF(v);
        }
        if (!bad) bad = PyDict_SetItem(d, key, lst) < 0;
        Py_XDECREF(lst);
        Py_XDECREF(key);
        if (bad) {
            free(by_order);
            Py_DECREF(d);
            return NULL;
        }
    }
    free(by_order);
    return d;
}

/* Every slot's ready queue in (prio, op) order, like the reference's sorted heaps. */
static PyObject *wait_lists(Loop *s)
{
    PyObject *out = PyList_New(s->nres);
    for (Py_ssize_t c = 0; out && c < s->nres; c++) {
        PyObject *lst = PyList_New(0);
        if (!lst) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, c, lst);
        for (int64_t j = s->whead[c]; j >= 0; j = s->qnext[j]) {
            PyObject *v = PyLong_FromLongLong(j);
            if (!v || PyList_Append(lst, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return out;
}

PyDoc_STRVAR(run_doc,
             "run(kind, dur, sptr, succ, indeg, acq, rel, free, mkey, mt, cur, dstn, size, hop, ldst, llat,\n"
             "    lbw, start, end, lfree, lbusy, lbytes, lmsgs, aware, integer_ns, overhead, prio, cut_through,\n"
             "    deferred)\n"
             "--\n\n"
             "The simulator's event loop over numpy arrays (see engine._run, the reference).\n"
             "indeg, free, cur, start, end, lfree, lbusy, lbytes and lmsgs are updated in place; start\n"
             "and end must come filled with -1, lfree/lbusy/lbytes/lmsgs with 0. Returns (events, t, send_q, recv_q, waitq),\n"
             "plus (sub-ops made, most alive at once, NPU-pair message totals) when `deferred` (collectives expanded\n"
             "as they start, see _simdefer.c) is given.");

static PyObject *simloop_run(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[NBUF + 3], *deferred = Py_None;
    Py_buffer db[DEFER_NBUF];
    int dheld = 0;
    int aware, integer_ns, cut_through = 0;
    double overhead;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOOOOOpidO|pO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16],
                          &o[17], &o[18], &o[19], &o[20], &o[21], &o[22], &aware, &integer_ns, &overhead,
                          &o[23], &cut_through, &deferred))
        return NULL;
    enum { KIND, DUR, SPTR, SUCC, INDEG, ACQ, REL, FREE, MKEY, MT, CUR, DSTN, SIZE, HOP, LDST, LLAT, LBW,
           START, END, LFREE, LBUSY, LBYTES, LMSGS, PRIO, NB };
    Py_buffer b[NB];
    int held = 0;
    PyObject *result = NULL;
    Loop s;
    memset(&s, 0, sizeof s);

    /* op arrays first: their length is n */
    if (simloop_buf(o[KIND], &b[KIND], 'q', 0, -1, "kind") < 0) return NULL;
    held = 1;
    Py_ssize_t n = b[KIND].len / 8;
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_simloop.run: more than 2^31 - 1 ops");
        goto done;
    }
    static const struct {
        int i;
        char type;
        int writable;
        int len; /* 0: n, 1: n + 1, 2: any (succ, free, hop), 3: number of links */
        const char *name;
    } spec[] = {
        {DUR, 'd', 0, 0, "dur"},       {SPTR, 'q', 0, 1, "sptr"},     {SUCC, 'q', 0, 2, "succ"},
        {INDEG, 'q', 1, 0, "indeg"},   {ACQ, 'q', 0, 0, "acq"},       {REL, 'q', 0, 0, "rel"},
        {FREE, 'd', 1, 2, "free"},     {MKEY, 'q', 0, 0, "mkey"},     {MT, 'd', 0, 0, "mt"},
        {CUR, 'q', 1, 0, "cur"},       {DSTN, 'q', 0, 0, "dstn"},     {SIZE, 'd', 0, 0, "size"},
        {HOP, 'i', 0, 2, "hop"},       {LDST, 'q', 0, 2, "ldst"},     {LLAT, 'd', 0, 3, "llat"},
        {LBW, 'd', 0, 3, "lbw"},       {START, 'd', 1, 0, "start"},   {END, 'd', 1, 0, "end"},
        {LFREE, 'd', 1, 3, "lfree"},   {LBUSY, 'd', 1, 3, "lbusy"},   {LBYTES, 'd', 1, 3, "lbytes"},
        {LMSGS, 'q', 1, 3, "lmsgs"},   {PRIO, 'q', 0, 0, "prio"},
    };
    Py_ssize_t nl = -1;
    for (size_t q = 0; q < sizeof spec / sizeof spec[0]; q++) {
        Py_ssize_t len = spec[q].len == 0 ? n : spec[q].len == 1 ? n + 1 : spec[q].len == 3 ? nl : -1;
        if (simloop_buf(o[spec[q].i], &b[spec[q].i], spec[q].type, spec[q].writable, len, spec[q].name) < 0)
            goto done;
        held++;
        if (spec[q].i == LDST) nl = b[LDST].len / 8;
    }
    s.n = n;
    s.nl = nl;
    s.nres = b[FREE].len / 8;
    s.kind = b[KIND].buf;
    s.dur = b[DUR].buf;
    s.sptr = b[SPTR].buf;
    s.succ = b[SUCC].buf;
    s.indeg = b[INDEG].buf;
    s.acq = b[ACQ].buf;
    s.rel = b[REL].buf;
    s.free_ = b[FREE].buf;
    s.mkey = b[MKEY].buf;
    s.mt = b[MT].buf;
    s.cur = b[CUR].buf;
    s.dstn = b[DSTN].buf;
    s.size = b[SIZE].buf;
    s.hop = b[HOP].buf;
    s.ldst = b[LDST].buf;
    s.llat = b[LLAT].buf;
    s.lbw = b[LBW].buf;
    s.start = b[START].buf;
    s.end = b[END].buf;
    s.lfree = b[LFREE].buf;
    s.lbusy = b[LBUSY].buf;
    s.lbytes = b[LBYTES].buf;
    s.lmsgs = b[LMSGS].buf;
    s.aware = aware;
    s.integer_ns = integer_ns;
    s.cut_through = aware && cut_through;
    s.prio = b[PRIO].buf;
    s.overhead = overhead;
    /* the routing table is square: nn NPUs */
    Py_ssize_t nhop = b[HOP].len / 4;
    s.nn = (Py_ssize_t)floor(sqrt((double)nhop) + 0.5);
    if (aware && s.nn * s.nn != nhop) {
        PyErr_SetString(PyExc_ValueError, "_simloop.run: hop must be a flattened square [dst, src] table");
        goto done;
    }
    if (check_indices(&s, b[SUCC].len / 8) < 0) goto done;
    if (dense_keys(&s) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    size_t nk = (size_t)(s.nkeys ? s.nkeys : 1), nr = (size_t)(s.nres ? s.nres : 1),
           nn1 = (size_t)(n ? n : 1);
    s.partner = malloc(nn1 * sizeof(int32_t));
    s.qnext = malloc(nn1 * sizeof(int32_t));
    s.touched = calloc(nr, 1);
    s.dirty = malloc(nr * sizeof(int64_t));
    s.arrived = calloc(nn1, 1);
    s.tail = s.cut_through ? calloc(nn1, sizeof(double)) : NULL; /* all 0.0: no tail before injection */
    int sf = s.aware && !s.cut_through;
    size_t nl1 = (size_t)(nl > 0 ? nl : 1);
    s.lfin = sf ? malloc(nl1 * sizeof(double)) : NULL;
    s.lseq = sf ? calloc(nl1, sizeof(int64_t)) : NULL;
    s.lpush = sf ? calloc(nl1, 1) : NULL;
    s.phead = sf ? malloc(nl1 * sizeof(int64_t)) : NULL;
    s.ptail = sf ? malloc(nl1 * sizeof(int64_t)) : NULL;
    s.pfree = -1;
    if (sf && (!s.lfin || !s.lseq || !s.lpush || !s.phead || !s.ptail)) {
        PyErr_NoMemory();
        goto done;
    }
    if (sf) {
        for (size_t l = 0; l < nl1; l++) s.lfin[l] = -1.0; /* never busy before its first message */
        memset(s.phead, 0xff, nl1 * sizeof(int64_t));
        memset(s.ptail, 0xff, nl1 * sizeof(int64_t));
    }
    s.whead = malloc(nr * sizeof(int64_t));
    s.wtail = malloc(nr * sizeof(int64_t));
    s.shead = malloc(nk * sizeof(int64_t));
    s.stail = malloc(nk * sizeof(int64_t));
    s.sorder = malloc(nk * sizeof(int64_t));
    s.rhead = malloc(nk * sizeof(int64_t));
    s.rtail = malloc(nk * sizeof(int64_t));
    s.rorder = malloc(nk * sizeof(int64_t));
    if (!s.partner || !s.qnext || !s.touched || !s.dirty || !s.arrived || (s.cut_through && !s.tail) || !s.whead || !s.wtail || !s.shead || !s.stail ||
        !s.sorder || !s.rhead || !s.rtail || !s.rorder) {
        PyErr_NoMemory();
        goto done;
    }
    /* all bytes 0xff: every int64 and int32 is -1 (empty queue, no partner, never created) */
    memset(s.partner, 0xff, nn1 * sizeof(int32_t));
    memset(s.whead, 0xff, nr * sizeof(int64_t));
    memset(s.wtail, 0xff, nr * sizeof(int64_t));
    memset(s.shead, 0xff, nk * sizeof(int64_t));
    memset(s.stail, 0xff, nk * sizeof(int64_t));
    memset(s.sorder, 0xff, nk * sizeof(int64_t));
    memset(s.rhead, 0xff, nk * sizeof(int64_t));
    memset(s.rtail, 0xff, nk * sizeof(int64_t));
    memset(s.rorder, 0xff, nk * sizeof(int64_t));
    if (deferred != Py_None && defer_setup(&s, deferred, db, &dheld) < 0) goto done;

    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_loop(&s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        if (s.err == ERR_ROUTE) {
            PyErr_Format(PyExc_ValueError, "_simloop.run: no route from NPU %lld to NPU %lld",
                         (long long)s.err_u, (long long)s.err_d);
        } else if (s.err == ERR_TIME) { /* (message, item): the caller names the op */
            PyObject *ea = Py_BuildValue("(sL)", "_simloop.run: an event's time is not a number",
                                         (long long)s.err_u);
            if (ea) {
                PyErr_SetObject(PyExc_ValueError, ea);
                Py_DECREF(ea);
            }
        } else
            PyErr_NoMemory();
        goto done;
    }
    PyObject *sq = queues_dict(&s, s.shead, s.sorder, s.screated);
    PyObject *rq = sq ? queues_dict(&s, s.rhead, s.rorder, s.rcreated) : NULL;
    PyObject *wq = rq ? wait_lists(&s) : NULL;
    PyObject *ds = NULL;
    if (wq && s.d.on) {
        memcpy(b[INDEG].buf, s.indeg, (size_t)n * sizeof(int64_t)); /* the static ops' in-degrees left */
        ds = defer_stats(&s);
        if (ds) result = Py_BuildValue("(LdNNNN)", (long long)s.events, s.t, sq, rq, wq, ds);
    } else if (wq) {
        result = Py_BuildValue("(LdNNN)", (long long)s.events, s.t, sq, rq, wq);
    }
    if (!result) {
        Py_XDECREF(ds);
        Py_XDECREF(sq);
        Py_XDECREF(rq);
        Py_XDECREF(wq);
    }

done:
    defer_free(&s, db, dheld); /* before the caller's buffers below: it frees the copies it made */
    free(s.partner);
    free(s.qnext);
    free(s.dkey);
    free(s.keyval);
    free(s.touched);
    free(s.dirty);
    free(s.arrived);
    free(s.tail);
    free(s.lfin);
    free(s.lseq);
    free(s.lpush);
    free(s.phead);
    free(s.ptail);
    free(s.pmsg);
    free(s.pnext);
    free(s.whead);
    free(s.wtail);
    free(s.shead);
    free(s.stail);
    free(s.sorder);
    free(s.rhead);
    free(s.rtail);
    free(s.rorder);
    free(s.items);
    free(s.iseq);
    free(s.heap.a);
    /* release in the order acquired: kind, then spec[0 .. held-2] */
    PyBuffer_Release(&b[KIND]);
    for (int q = 0; q < held - 1; q++) PyBuffer_Release(&b[spec[q].i]);
    return result;
}

static PyMethodDef methods[] = {
    {"run", simloop_run, METH_VARARGS, run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_simloop", "Native event loop of the simulator (reference: engine._run).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__simloop(void) { return PyModule_Create(&moduledef); }
