/* Avro binary values straight into Arrow column buffers (value_formats/avro_columns.py drives it).
 *
 * Python compiles a writer schema into a program: a list of nodes, node 0 the value's record. `decode` walks each
 * value's bytes once and appends to growable buffers per node: validity bytes (one per entry; Python packs them),
 * fixed-width data, int64 offsets, string/bytes data (map keys in the map node's own offsets and data). Every read is
 * bounds-checked; a value that fails (out of bytes, a bad varint, an index out of range, invalid UTF-8, a value that
 * does not fit its type, bytes left after the record) rolls every buffer back to its length before that value, is
 * appended as a null record and reported as (row, reason). Logical types are converted here: time-millis and
 * timestamp-millis to microseconds, decimals (big-endian two's complement) to little-endian 128-bit integers.
 * CPython C API only; little-endian hosts (Arrow's buffers are little-endian). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "_avro_columns assumes a little-endian host"
#endif

enum {
    K_BOOLEAN = 1, K_INT = 2, K_LONG = 3, K_FLOAT = 4, K_DOUBLE = 5, K_BYTES = 6, K_STRING = 7, K_FIXED = 8,
    K_ENUM = 9, K_RECORD = 10, K_ARRAY = 11, K_MAP = 12, K_DECIMAL_BYTES = 13, K_DECIMAL_FIXED = 14, K_DATE = 15,
    K_TIME_MILLIS = 16, K_TIME_MICROS = 17, K_TIMESTAMP_MILLIS = 18, K_TIMESTAMP_MICROS = 19,
};
#define K_LAST K_TIMESTAMP_MICROS

/* The range Python's date and datetime take (years 1 to 9999), which fastavro's logical types go through. */
#define MIN_DAYS (-719162LL)
#define MAX_DAYS 2932896LL
#define MIN_MICROS (-62135596800000000LL)
#define MAX_MICROS 253402300799999999LL
#define DAY_MICROS 86400000000LL
#define MAX_EMPTY_ITEMS (1LL << 20)

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

typedef struct {
    int kind;
    Py_ssize_t size;      /* fixed: bytes; enum: symbol count */
    int precision;        /* decimals */
    Py_ssize_t branches;  /* a union's branch count; 0: not a union */
    Py_ssize_t null_branch; /* the union's null branch, -1: none */
    Py_ssize_t *children; /* record: fields; array: items; map: values */
    Py_ssize_t nchildren;
    Py_ssize_t min_size;  /* fewest bytes a value takes */
    const char *path;     /* names the field in errors; owned by the program tuple */
    Buf valid, values, offsets, key_offsets, chars;
} Node;

typedef struct {
    Node *nodes;
    Py_ssize_t count;
    char error[256];
    Py_ssize_t *saved; /* buffer lengths at the start of the value being decoded */
    int64_t empty_left; /* items of no bytes the value being decoded may still have (MAX_EMPTY_ITEMS in all) */
} Program;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int buf_append(Buf *b, const void *src, Py_ssize_t n) {
    if (n == 0) return 0; /* an empty buffer has no data pointer yet: memcpy must not see it */
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_zeros(Buf *b, Py_ssize_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memset(b->data + b->len, 0, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_i64(Buf *b, int64_t v) { return buf_append(b, &v, 8); }

static inline int64_t buf_last_i64(const Buf *b) { return *(const int64_t *)(b->data + b->len - 8); }

/* Return codes of the readers: 0 read, 1 the value is invalid (Program.error says why), -1 a Python error. */
#define INVALID(prog, ...) (snprintf((prog)->error, sizeof((prog)->error), __VA_ARGS__), 1)

typedef struct {
    const uint8_t *p, *end;
} Cursor;

static int read_long(Program *prog, Cursor *c, const Node *n, int64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (c->p >= c->end) return INVALID(prog, "out of bytes in a varint at %s", n->path);
        uint8_t b = *c->p++;
        if (i == 9 && (b & 0xFE)) return INVALID(prog, "varint overflows 64 bits at %s", n->path);
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));
            return 0;
        }
    }
    return INVALID(prog, "varint overflows 64 bits at %s", n->path); /* unreachable: the 10th byte is checked */
}

static int read_length(Program *prog, Cursor *c, const Node *n, const char *what, Py_ssize_t *out) {
    int64_t length;
    int rc = read_long(prog, c, n, &length);
    if (rc) return rc;
    if (length < 0) return INVALID(prog, "negative %s length %lld at %s", what, (long long)length, n->path);
    if (length > c->end - c->p)
        return INVALID(prog, "out of bytes: %s of %lld bytes, %lld left at %s", what, (long long)length,
                       (long long)(c->end - c->p), n->path);
    *out = (Py_ssize_t)length;
    return 0;
}

/* Strict UTF-8 (as Python's codec): no overlong forms, no surrogates, nothing above U+10FFFF. */
static Py_ssize_t utf8_invalid_at(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t chunk;
            memcpy(&chunk, s + i, 8);
            if (!(chunk & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        uint8_t b = s[i];
        if (b < 0x80) { i++; continue; }
        Py_ssize_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b == 0xE0) { need = 2; lo = 0xA0; }
        else if (b == 0xED) { need = 2; hi = 0x9F; }
        else if (b >= 0xE1 && b <= 0xEF) need = 2;
        else if (b == 0xF0) { need = 3; lo = 0x90; }
        else if (b == 0xF4) { need = 3; hi = 0x8F; }
        else if (b >= 0xF1 && b <= 0xF3) need = 3;
        else return i;
        if (i + need >= n) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (Py_ssize_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return -1;
}

static int append_null(Program *prog, Py_ssize_t index);
static int read_value(Program *prog, Py_ssize_t index, Cursor *c);

/* Big-endian two's complement (n bytes) as a 128-bit integer within `precision` digits. */
static int read_decimal(Program *prog, Node *n, const uint8_t *s, Py_ssize_t len) {
    __int128 v = 0;
    if (len > 0) {
        int negative = s[0] & 0x80;
        Py_ssize_t skip = 0;
        if (len > 16) {
            skip = len - 16;
            for (Py_ssize_t i = 0; i < skip; i++)
                if (s[i] != (negative ? 0xFF : 0x00))
                    return INVALID(prog, "decimal of %zd bytes does not fit 128 bits at %s", len, n->path);
            if (((s[skip] & 0x80) != 0) != (negative != 0))
                return INVALID(prog, "decimal of %zd bytes does not fit 128 bits at %s", len, n->path);
        }
        unsigned __int128 u = negative ? ~(unsigned __int128)0 : 0;
        for (Py_ssize_t i = skip; i < len; i++) u = (u << 8) | s[i];
        v = (__int128)u;
    }
    unsigned __int128 limit = 1;
    for (int i = 0; i < n->precision; i++) limit *= 10;
    unsigned __int128 magnitude = v < 0 ? (unsigned __int128)0 - (unsigned __int128)v : (unsigned __int128)v;
    if (magnitude >= limit)
        return INVALID(prog, "decimal has more digits than its precision %d at %s", n->precision, n->path);
    return buf_append(&n->values, &v, 16) < 0 ? -1 : 0;
}

static int read_items(Program *prog, Node *n, Cursor *c, int is_map) {
    int64_t total = 0;
    for (;;) {
        int64_t count;
        int rc = read_long(prog, c, n, &count);
        if (rc) return rc;
        if (count == 0) break;
        if (count < 0) {
            if (count == INT64_MIN) return INVALID(prog, "block count out of range at %s", n->path);
            count = -count;
            int64_t block_bytes;
            rc = read_long(prog, c, n, &block_bytes);
            if (rc) return rc;
            if (block_bytes < 0)
                return INVALID(prog, "negative block size %lld at %s", (long long)block_bytes, n->path);
        }
        const Node *child = &prog->nodes[n->children[0]];
        Py_ssize_t min = child->min_size + (is_map ? 1 : 0);
        /* Items take at least `min` bytes each, so the bytes left bound the count; items of no bytes (a fixed of
         * size 0) by MAX_EMPTY_ITEMS per value, in all its arrays (per array, a few bytes of counts of arrays of
         * them would still loop for hours). */
        if (min > 0 && count > (c->end - c->p) / min)
            return INVALID(prog, "block of %lld items, more than the %lld bytes left hold, at %s", (long long)count,
                           (long long)(c->end - c->p), n->path);
        if (min == 0) {
            if (count > prog->empty_left)
                return INVALID(prog, "block of %lld items of no bytes, more than the %lld left of %lld in one value, "
                               "at %s", (long long)count, (long long)prog->empty_left, MAX_EMPTY_ITEMS, n->path);
            prog->empty_left -= count;
        }
        for (int64_t i = 0; i < count; i++) {
            if (is_map) {
                Py_ssize_t length;
                rc = read_length(prog, c, n, "map key", &length);
                if (rc) return rc;
                Py_ssize_t bad = utf8_invalid_at(c->p, length);
                if (bad >= 0) return INVALID(prog, "map key is not valid UTF-8 (byte %zd) at %s", bad, n->path);
                if (buf_append(&n->chars, c->p, length) < 0 || buf_i64(&n->key_offsets, n->chars.len) < 0)
                    return -1;
                c->p += length;
            }
            rc = read_value(prog, n->children[0], c);
            if (rc) return rc;
        }
        total += count;
    }
    return buf_i64(&n->offsets, buf_last_i64(&n->offsets) + total) < 0 ? -1 : 0;
}

static int read_body(Program *prog, Node *n, Cursor *c) {
    int64_t v;
    int rc;
    Py_ssize_t length;
    switch (n->kind) {
    case K_BOOLEAN: {
        if (c->p >= c->end) return INVALID(prog, "out of bytes reading a boolean at %s", n->path);
        uint8_t b = *c->p++;
        if (b > 1) return INVALID(prog, "boolean byte %u is neither 0 nor 1 at %s", b, n->path);
        return buf_append(&n->values, &b, 1) < 0 ? -1 : 0;
    }
    case K_INT:
    case K_DATE:
    case K_ENUM: {
        if ((rc = read_long(prog, c, n, &v))) return rc;
        if (n->kind == K_ENUM && (v < 0 || v >= n->size))
            return INVALID(prog, "enum index %lld out of range (%zd symbols) at %s", (long long)v, n->size, n->path);
        if (v < INT32_MIN || v > INT32_MAX) return INVALID(prog, "int %lld out of range at %s", (long long)v, n->path);
        if (n->kind == K_DATE && (v < MIN_DAYS || v > MAX_DAYS))
            return INVALID(prog, "date %lld days out of range (years 1 to 9999) at %s", (long long)v, n->path);
        int32_t i = (int32_t)v;
        return buf_append(&n->values, &i, 4) < 0 ? -1 : 0;
    }
    case K_TIME_MILLIS:
        if ((rc = read_long(prog, c, n, &v))) return rc;
        if (v < INT32_MIN || v > INT32_MAX) return INVALID(prog, "int %lld out of range at %s", (long long)v, n->path);
        v *= 1000;
        if (v < 0 || v >= DAY_MICROS) return INVALID(prog, "time of day out of range at %s", n->path);
        return buf_i64(&n->values, v) < 0 ? -1 : 0;
    case K_TIME_MICROS:
        if ((rc = read_long(prog, c, n, &v))) return rc;
        if (v < 0 || v >= DAY_MICROS) return INVALID(prog, "time of day out of range at %s", n->path);
        return buf_i64(&n->values, v) < 0 ? -1 : 0;
    case K_TIMESTAMP_MILLIS:
    case K_TIMESTAMP_MICROS:
        if ((rc = read_long(prog, c, n, &v))) return rc;
        if (n->kind == K_TIMESTAMP_MILLIS) {
            if (v < MIN_MICROS / 1000 || v > MAX_MICROS / 1000)
                return INVALID(prog, "timestamp out of range (years 1 to 9999) at %s", n->path);
            v *= 1000;
        }
        if (v < MIN_MICROS || v > MAX_MICROS)
            return INVALID(prog, "timestamp out of range (years 1 to 9999) at %s", n->path);
        return buf_i64(&n->values, v) < 0 ? -1 : 0;
    case K_LONG:
        if ((rc = read_long(prog, c, n, &v))) return rc;
        return buf_i64(&n->values, v) < 0 ? -1 : 0;
    case K_FLOAT:
    case K_DOUBLE: {
        Py_ssize_t width = n->kind == K_FLOAT ? 4 : 8;
        if (c->end - c->p < width) return INVALID(prog, "out of bytes reading a %s at %s",
                                                   width == 4 ? "float" : "double", n->path);
        if (buf_append(&n->values, c->p, width) < 0) return -1;
        c->p += width;
        return 0;
    }
    case K_BYTES:
    case K_STRING:
        if ((rc = read_length(prog, c, n, n->kind == K_STRING ? "string" : "bytes", &length))) return rc;
        if (n->kind == K_STRING) {
            Py_ssize_t bad = utf8_invalid_at(c->p, length);
            if (bad >= 0) return INVALID(prog, "string is not valid UTF-8 (byte %zd) at %s", bad, n->path);
        }
        if (buf_append(&n->chars, c->p, length) < 0 || buf_i64(&n->offsets, n->chars.len) < 0) return -1;
        c->p += length;
        return 0;
    case K_FIXED:
        if (c->end - c->p < n->size)
            return INVALID(prog, "out of bytes: fixed of %zd bytes, %zd left at %s", n->size, c->end - c->p, n->path);
        if (buf_append(&n->values, c->p, n->size) < 0) return -1;
        c->p += n->size;
        return 0;
    case K_DECIMAL_BYTES:
        if ((rc = read_length(prog, c, n, "decimal", &length))) return rc;
        rc = read_decimal(prog, n, c->p, length);
        c->p += length;
        return rc;
    case K_DECIMAL_FIXED:
        if (c->end - c->p < n->size)
            return INVALID(prog, "out of bytes: fixed of %zd bytes, %zd left at %s", n->size, c->end - c->p, n->path);
        rc = read_decimal(prog, n, c->p, n->size);
        c->p += n->size;
        return rc;
    case K_RECORD:
        for (Py_ssize_t i = 0; i < n->nchildren; i++)
            if ((rc = read_value(prog, n->children[i], c))) return rc;
        return 0;
    case K_ARRAY:
        return read_items(prog, n, c, 0);
    case K_MAP:
        return read_items(prog, n, c, 1);
    }
    return INVALID(prog, "unknown node kind %d at %s", n->kind, n->path);
}

static int read_value(Program *prog, Py_ssize_t index, Cursor *c) {
    Node *n = &prog->nodes[index];
    int rc;
    if (n->branches) {
        int64_t branch;
        if ((rc = read_long(prog, c, n, &branch))) return rc;
        if (branch < 0 || branch >= n->branches)
            return INVALID(prog, "union branch %lld out of range (%zd branches) at %s", (long long)branch,
                           n->branches, n->path);
        if (branch == n->null_branch) {
            uint8_t zero = 0;
            if (buf_append(&n->valid, &zero, 1) < 0) return -1;
            return append_null(prog, index);
        }
    }
    if (n->null_branch >= 0 || index == 0) {
        uint8_t one = 1;
        if (buf_append(&n->valid, &one, 1) < 0) return -1;
    }
    return read_body(prog, n, c);
}

/* A placeholder entry under a null (Arrow's children keep one entry per parent entry). */
static int append_null(Program *prog, Py_ssize_t index) {
    Node *n = &prog->nodes[index];
    switch (n->kind) {
    case K_BOOLEAN: return buf_zeros(&n->values, 1);
    case K_INT: case K_DATE: case K_ENUM: case K_FLOAT: return buf_zeros(&n->values, 4);
    case K_LONG: case K_DOUBLE: case K_TIME_MILLIS: case K_TIME_MICROS: case K_TIMESTAMP_MILLIS:
    case K_TIMESTAMP_MICROS: return buf_zeros(&n->values, 8);
    case K_FIXED: return buf_zeros(&n->values, n->size);
    case K_DECIMAL_BYTES: case K_DECIMAL_FIXED: return buf_zeros(&n->values, 16);
    case K_BYTES: case K_STRING: return buf_i64(&n->offsets, n->chars.len);
    case K_ARRAY: case K_MAP: return buf_i64(&n->offsets, buf_last_i64(&n->offsets));
    case K_RECORD:
        for (Py_ssize_t i = 0; i < n->nchildren; i++) {
            Node *child = &prog->nodes[n->children[i]];
            if (child->null_branch >= 0) {
                uint8_t zero = 0;
                if (buf_append(&child->valid, &zero, 1) < 0) return -1;
            }
            if (append_null(prog, n->children[i]) < 0) return -1;
        }
        return 0;
    }
    return 0;
}

static void program_free(Program *prog) {
    if (prog->nodes) {
        for (Py_ssize_t i = 0; i < prog->count; i++) {
            Node *n = &prog->nodes[i];
            PyMem_Free(n->children);
            PyMem_Free(n->valid.data);
            PyMem_Free(n->values.data);
            PyMem_Free(n->offsets.data);
            PyMem_Free(n->key_offsets.data);
            PyMem_Free(n->chars.data);
        }
        PyMem_Free(prog->nodes);
    }
    PyMem_Free(prog->saved);
}

static Py_ssize_t min_size(Program *prog, Py_ssize_t index, int depth) {
    Node *n = &prog->nodes[index];
    if (n->branches) return 1;
    switch (n->kind) {
    case K_FLOAT: return 4;
    case K_DOUBLE: return 8;
    case K_FIXED: case K_DECIMAL_FIXED: return n->size;
    case K_RECORD: {
        Py_ssize_t total = 0;
        if (depth > 64) return 0;
        for (Py_ssize_t i = 0; i < n->nchildren; i++) total += min_size(prog, n->children[i], depth + 1);
        return total;
    }
    default: return 1;
    }
}

/* The program tuple: per node (kind, size, precision, branches, null_branch, children tuple, path str). */
static int program_load(Program *prog, PyObject *nodes) {
    memset(prog, 0, sizeof(*prog));
    PyObject *seq = PySequence_Fast(nodes, "program must be a sequence of nodes");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count == 0) { PyErr_SetString(PyExc_ValueError, "program has no nodes"); goto fail; }
    prog->nodes = PyMem_Calloc((size_t)count, sizeof(Node));
    prog->saved = PyMem_Calloc((size_t)count * 5, sizeof(Py_ssize_t));
    if (prog->nodes == NULL || prog->saved == NULL) { PyErr_NoMemory(); goto fail; }
    prog->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        Node *n = &prog->nodes[i];
        PyObject *children, *path;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ininnO!U", &n->kind, &n->size, &n->precision,
                              &n->branches, &n->null_branch, &PyTuple_Type, &children, &path))
            goto fail;
        if (n->kind < K_BOOLEAN || n->kind > K_LAST || n->precision < 0 || n->precision > 38 || n->size < 0 ||
            n->branches < 0 || n->null_branch >= n->branches || (n->branches == 0 && n->null_branch >= 0)) {
            PyErr_Format(PyExc_ValueError, "program node %zd is malformed", i);
            goto fail;
        }
        n->path = PyUnicode_AsUTF8(path);
        if (n->path == NULL) goto fail;
        n->nchildren = PyTuple_GET_SIZE(children);
        n->children = PyMem_Calloc((size_t)(n->nchildren ? n->nchildren : 1), sizeof(Py_ssize_t));
        if (n->children == NULL) { PyErr_NoMemory(); goto fail; }
        for (Py_ssize_t k = 0; k < n->nchildren; k++) {
            Py_ssize_t child = PyLong_AsSsize_t(PyTuple_GET_ITEM(children, k));
            if (child == -1 && PyErr_Occurred()) goto fail;
            if (child <= i || child >= count) { /* children come after their parent: no cycles */
                PyErr_Format(PyExc_ValueError, "program node %zd has child %zd out of order", i, child);
                goto fail;
            }
            n->children[k] = child;
        }
        int wants = n->kind == K_RECORD ? -1 : (n->kind == K_ARRAY || n->kind == K_MAP) ? 1 : 0;
        if ((wants >= 0 && n->nchildren != wants) || (i == 0 && (n->kind != K_RECORD || n->branches))) {
            PyErr_Format(PyExc_ValueError, "program node %zd has the wrong children", i);
            goto fail;
        }
        if ((n->kind == K_ARRAY || n->kind == K_MAP) && (buf_i64(&n->offsets, 0) < 0)) goto fail;
        if ((n->kind == K_STRING || n->kind == K_BYTES) && buf_i64(&n->offsets, 0) < 0) goto fail;
        if (n->kind == K_MAP && buf_i64(&n->key_offsets, 0) < 0) goto fail;
    }
    for (Py_ssize_t i = count - 1; i >= 0; i--) prog->nodes[i].min_size = min_size(prog, i, 0);
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static void save_lengths(Program *prog) {
    for (Py_ssize_t i = 0; i < prog->count; i++) {
        Node *n = &prog->nodes[i];
        Py_ssize_t *s = prog->saved + i * 5;
        s[0] = n->valid.len; s[1] = n->values.len; s[2] = n->offsets.len; s[3] = n->key_offsets.len;
        s[4] = n->chars.len;
    }
}

static void restore_lengths(Program *prog) {
    for (Py_ssize_t i = 0; i < prog->count; i++) {
        Node *n = &prog->nodes[i];
        Py_ssize_t *s = prog->saved + i * 5;
        n->valid.len = s[0]; n->values.len = s[1]; n->offsets.len = s[2]; n->key_offsets.len = s[3];
        n->chars.len = s[4];
    }
}

static PyObject *buf_bytes(const Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
}

PyDoc_STRVAR(decode_doc,
"decode(program, data, offsets, rows, skip) -> (buffers, errors)\n\n"
"Decodes the values rows[i] of a binary array (its data buffer and int32 offsets), each from byte `skip` of the\n"
"value, with `program`. buffers: per node (validity, values, offsets, key offsets, chars) as bytes; errors: a list\n"
"of (position in rows, reason) for the values that did not decode (null records in the buffers).");

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *nodes, *result = NULL, *errors = NULL, *buffers = NULL;
    Py_buffer data = {0}, offsets = {0}, rows = {0};
    Py_ssize_t skip;
    Program prog;
    if (!PyArg_ParseTuple(args, "Oy*y*y*n", &nodes, &data, &offsets, &rows, &skip)) return NULL;
    if (program_load(&prog, nodes) < 0) goto done;
    const int32_t *offs = (const int32_t *)offsets.buf;
    Py_ssize_t noffs = offsets.len / 4, nrows = rows.len / 8;
    const int64_t *row_index = (const int64_t *)rows.buf;
    const uint8_t *bytes = (const uint8_t *)data.buf;
    errors = PyList_New(0);
    if (errors == NULL) goto done;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        int64_t row = row_index[r];
        if (row < 0 || row + 1 >= noffs || offs[row] < 0 || offs[row] > offs[row + 1] || offs[row + 1] > data.len) {
            PyErr_Format(PyExc_ValueError, "row %lld is outside the array's buffers", (long long)row);
            goto done;
        }
        Cursor c = {bytes + offs[row] + skip, bytes + offs[row + 1]};
        if (c.p > c.end) c.p = c.end; /* the caller checked the header; a short value is then out of bytes */
        save_lengths(&prog);
        prog.empty_left = MAX_EMPTY_ITEMS;
        int rc = read_value(&prog, 0, &c);
        if (rc == 0 && c.p != c.end)
            rc = INVALID(&prog, "%zd bytes left after the record", (Py_ssize_t)(c.end - c.p));
        if (rc < 0) goto done;
        if (rc) {
            restore_lengths(&prog);
            uint8_t zero = 0;
            if (buf_append(&prog.nodes[0].valid, &zero, 1) < 0 || append_null(&prog, 0) < 0) goto done;
            PyObject *entry = Py_BuildValue("(ns)", r, prog.error);
            if (entry == NULL || PyList_Append(errors, entry) < 0) { Py_XDECREF(entry); goto done; }
            Py_DECREF(entry);
        }
    }
    buffers = PyList_New(prog.count);
    if (buffers == NULL) goto done;
    for (Py_ssize_t i = 0; i < prog.count; i++) {
        Node *n = &prog.nodes[i];
        PyObject *entry = Py_BuildValue("(NNNNN)", buf_bytes(&n->valid), buf_bytes(&n->values), buf_bytes(&n->offsets),
                                        buf_bytes(&n->key_offsets), buf_bytes(&n->chars));
        if (entry == NULL) goto done;
        PyList_SET_ITEM(buffers, i, entry);
    }
    result = Py_BuildValue("(OO)", buffers, errors);
done:
    if (prog.nodes || prog.saved) program_free(&prog);
    Py_XDECREF(buffers);
    Py_XDECREF(errors);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&rows);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_avro_columns", "Avro binary values straight into Arrow column buffers.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__avro_columns(void) { return PyModule_Create(&module); }
