/* One-pass scanner for MSCCL-IR XML in its usual shape: <algo> <gpu> <tb> <step/>.
 *
 * scan(data, types, buffers) walks the document once and returns the step
 * attributes as int64 columns, or None for anything outside the shape it knows
 * (entities, <op> elements, unknown step types or step attributes, missing or
 * duplicate attributes, integers it cannot read exactly, DOCTYPE, ...). None is not an error: the
 * caller then parses with expat, which reports real errors with file and line.
 * So this file only has to be right about what it accepts.
 *
 * Returned tuple (all int64, native byte order):
 *   elements  3 per algo/gpu/tb start tag: depth, offset of '<', offset of '>'
 *   steps     9 columns of n values: s type srcbuf srcoff dstbuf dstoff cnt depid deps
 *             (type and buffers as indexes into the given tuples)
 *   at        offset of each step's '<'
 *   tb        index of each step's threadblock among the <tb> start tags
 *   n         number of steps
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCOLS 9
#define MAX_NAMES 32

enum { A_S, A_TYPE, A_SRCBUF, A_SRCOFF, A_DSTBUF, A_DSTOFF, A_CNT, A_DEPID, A_DEPS, A_HASDEP, A_OTHER };

typedef struct {
    int64_t *p;
    size_t len, cap;
} vec;

static int vec_push(vec *v, int64_t x) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4096;
        int64_t *p = realloc(v->p, cap * sizeof(int64_t));
        if (!p) return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->len++] = x;
    return 0;
}

typedef struct {
    const char *s[MAX_NAMES];
    size_t n[MAX_NAMES];
    int count;
} names;

static int names_from(PyObject *seq, names *out) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of bytes");
    if (!fast) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > MAX_NAMES) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(b)) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            return -1;
        }
        out->s[i] = PyBytes_AS_STRING(b); /* kept alive by the caller's tuple */
        out->n[i] = (size_t)PyBytes_GET_SIZE(b);
    }
    out->count = (int)k;
    Py_DECREF(fast);
    return 0;
}

static int lookup(const names *t, const unsigned char *v, size_t len) {
    for (int i = 0; i < t->count; i++)
        if (t->n[i] == len && memcmp(t->s[i], v, len) == 0) return i;
    return -1;
}

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline int is_name_start(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static inline int is_name_char(unsigned char c) {
    return is_name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ':';
}

/* What Python's int(value.strip()) gives, for optional sign and 1..18 digits; else -1. */
static int parse_int(const unsigned char *v, size_t len, int64_t *out) {
    size_t i = 0, j = len;
    while (i < j && (is_ws(v[i]) || v[i] == '\v' || v[i] == '\f')) i++;
    while (j > i && (is_ws(v[j - 1]) || v[j - 1] == '\v' || v[j - 1] == '\f')) j--;
    int neg = 0;
    if (i < j && (v[i] == '-' || v[i] == '+')) neg = v[i++] == '-';
    if (i == j || j - i > 18) return -1;
    int64_t x = 0;
    for (; i < j; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (v[i] - '0');
    }
    *out = neg ? -x : x;
    return 0;
}

static int attr_code(const unsigned char *s, size_t n) {
    static const char *known[] = {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"};
    for (int i = 0; i < 10; i++)
        if (strlen(known[i]) == n && memcmp(known[i], s, n) == 0) return i;
    return A_OTHER;
}

static const char *ELEMENTS[] = {"algo", "gpu", "tb", "step"};

static int element_code(const unsigned char *s, size_t n) {
    for (int i = 0; i < 4; i++)
        if (strlen(ELEMENTS[i]) == n && memcmp(ELEMENTS[i], s, n) == 0) return i;
    return -1;
}

/* 1: scanned; 0: outside the known shape; -1: out of memory. */
static int scan_doc(const unsigned char *b, size_t len, const names *types, const names *bufs, vec *elems,
                    vec *cols, vec *at, vec *tb) {
    size_t i = 0;
    int depth = 0, roots = 0;
    int open_code[4];
    int64_t tbs = -1;
    if (len >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) i = 3;
    while (i < len && is_ws(b[i])) i++;
    if (i + 5 <= len && memcmp(b + i, "<?xml", 5) == 0) { /* declaration, first thing only */
        const unsigned char *e = NULL;
        for (size_t k = i + 5; k + 1 < len; k++)
            if (b[k] == '?' && b[k + 1] == '>') {
                e = b + k;
                break;
            }
        if (!e) return 0;
        i = (size_t)(e - b) + 2;
    }
    while (i < len) {
        unsigned char c = b[i];
        if (c != '<') {
            if (c == '&' || c == '>') return 0;
            if (!is_ws(c) && depth == 0) return 0; /* text outside the root */
            i++;
            continue;
        }
        size_t lt = i;
        if (i + 1 >= len) return 0;
        if (b[i + 1] == '!') { /* comments only; DOCTYPE and CDATA go to expat */
            if (i + 4 > len || memcmp(b + i, "<!--", 4) != 0) return 0;
            size_t k = i + 4;
            while (k + 2 < len && !(b[k] == '-' && b[k + 1] == '-' && b[k + 2] == '>')) k++;
            if (k + 2 >= len) return 0;
            i = k + 3;
            continue;
        }
        if (b[i + 1] == '?') return 0;
        if (b[i + 1] == '/') { /* end tag */
            size_t k = i + 2, s0 = k;
            if (k >= len || !is_name_start(b[k])) return 0;
            while (k < len && is_name_char(b[k])) k++;
            int code = element_code(b + s0, k - s0);
            while (k < len && is_ws(b[k])) k++;
            if (k >= len || b[k] != '>' || depth == 0 || code != open_code[depth - 1]) return 0;
            depth--;
            i = k + 1;
            continue;
        }
        /* start tag */
        size_t k = i + 1, s0 = k;
        if (k >= len || !is_name_start(b[k])) return 0;
        while (k < len && is_name_char(b[k])) k++;
        int code = element_code(b + s0, k - s0);
        if (code != depth || (depth == 0 && roots++)) return 0;
        int64_t vals[NCOLS];
        unsigned seen = 0;
        for (;;) {
            size_t w = k;
            while (k < len && is_ws(b[k])) k++;
            if (k >= len) return 0;
            if (b[k] == '>' || b[k] == '/') break;
            if (k == w || !is_name_start(b[k])) return 0; /* attributes are separated by space */
            size_t a0 = k;
            while (k < len && is_name_char(b[k])) k++;
            size_t a1 = k;
            while (k < len && is_ws(b[k])) k++;
            if (k >= len || b[k] != '=') return 0;
            k++;
            while (k < len && is_ws(b[k])) k++;
            if (k >= len || (b[k] != '"' && b[k] != '\'')) return 0;
            unsigned char q = b[k++];
            size_t v0 = k;
            while (k < len && b[k] != q) {
                if (b[k] == '<' || b[k] == '&') return 0;
                k++;
            }
            if (k >= len) return 0;
            size_t v1 = k++;
            if (code != 3) continue; /* algo/gpu/tb attributes: read by the caller */
            int a = attr_code(b + a0, a1 - a0);
            if (a == A_OTHER) return 0;     /* unknown attribute: expat sees duplicates and all */
            if (seen & (1u << a)) return 0; /* duplicate attribute: not well-formed */
            seen |= 1u << a;
            const unsigned char *v = b + v0;
            size_t vl = v1 - v0;
            int64_t x;
            switch (a) {
            case A_TYPE:
                if ((x = lookup(types, v, vl)) < 0) return 0;
                break;
            case A_SRCBUF:
            case A_DSTBUF:
                if ((x = lookup(bufs, v, vl)) < 0) return 0;
                break;
            case A_HASDEP:
                continue; /* derived from the dependencies */
            default:
                if (parse_int(v, vl, &x) < 0) return 0;
            }
            vals[a] = x;
        }
        int self_closing = b[k] == '/';
        if (self_closing) {
            if (k + 1 >= len || b[k + 1] != '>') return 0;
            k++;
        }
        size_t gt = k;
        i = k + 1;
        if (code == 3) {
            if (!self_closing || (seen & 0x1FFu) != 0x1FFu || tbs < 0) return 0;
            for (int col = 0; col < NCOLS; col++)
                if (vec_push(&cols[col], vals[col]) < 0) return -1;
            if (vec_push(at, (int64_t)lt) < 0 || vec_push(tb, tbs) < 0) return -1;
            continue;
        }
        if (code == 2) tbs++;
        if (vec_push(elems, depth) < 0 || vec_push(elems, (int64_t)lt) < 0 || vec_push(elems, (int64_t)gt) < 0)
            return -1;
        if (!self_closing) open_code[depth++] = code;
    }
    return depth == 0 && roots == 1;
}

static PyObject *as_bytes(const vec *v) {
    return PyBytes_FromStringAndSize((const char *)v->p, (Py_ssize_t)(v->len * sizeof(int64_t)));
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *type_seq, *buf_seq;
    if (!PyArg_ParseTuple(args, "y*OO", &view, &type_seq, &buf_seq)) return NULL;
    names types, bufs;
    if (names_from(type_seq, &types) < 0 || names_from(buf_seq, &bufs) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    vec elems = {0}, cols[NCOLS] = {{0}}, at = {0}, tb = {0};
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scan_doc((const unsigned char *)view.buf, (size_t)view.len, &types, &bufs, &elems, cols, &at, &tb);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (ok < 0) {
        PyErr_NoMemory();
    } else if (ok == 0) {
        result = Py_NewRef(Py_None);
    } else {
        size_t n = at.len;
        PyObject *steps = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * NCOLS * sizeof(int64_t)));
        PyObject *e = as_bytes(&elems), *a = as_bytes(&at), *t = as_bytes(&tb);
        if (steps && e && a && t) {
            char *dst = PyBytes_AS_STRING(steps);
            for (int c = 0; c < NCOLS; c++)
                if (n) memcpy(dst + c * n * sizeof(int64_t), cols[c].p, n * sizeof(int64_t));
            result = Py_BuildValue("(OOOOn)", e, steps, a, t, (Py_ssize_t)n);
        }
        Py_XDECREF(steps);
        Py_XDECREF(e);
        Py_XDECREF(a);
        Py_XDECREF(t);
    }
    free(elems.p);
    for (int c = 0; c < NCOLS; c++) free(cols[c].p);
    free(at.p);
    free(tb.p);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(data, types, buffers) -> (elements, steps, at, tb, n) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_xmlscan", "MSCCL-IR XML step scanner.", -1, methods};

PyMODINIT_FUNC PyInit__xmlscan(void) { return PyModule_Create(&module); }
