/* triage._speedups: the bulk paths' per-line checks in C, one loop over a block's lines.
 *
 * Each function answers exactly what its Python original (named below) answers, or says it cannot
 * (None, or a line left as a miss) and the Python path decides: it reads only lines that are compact
 * ASCII strings, and every match is the deterministic parse its regex's one possible match takes (the
 * patterns never need backtracking: each optional part starts with a character its alternative
 * cannot take). tests/triage/test_triage_speedups.py checks them against the originals with
 * hypothesis; `triage.speedups.C` is None when the module was not built (or its API number is not
 * the one triage/speedups.py expects), and then the Python paths run alone.
 *
 *   engine_block(block) -> (list[int], list[str]) | None
 *       parsers._engine_split's common case, before the block is split into lines: every line an engine
 *       JSON line that wanted_lines drops except request.finished ones, whose indices and lines it
 *       returns; None for any other block.
 *   shape_rows(lines, ops, max_int_digits) -> (columns, misses)
 *       FinishedShape.lines.findall: the five FINISHED_COLUMNS for the lines the shape matches (the
 *       token counts as int(text), ttft_s as float(text), the others as texts), and the positions of
 *       the lines it does not match.
 *   access_columns(lines) -> [client, time, status, duration, addr]
 *       UPSTREAMINFO_BULK.findall's first five columns, "" in every column where a line does not match.
 *   count_lines(text) -> int
 *       text.count("\n"), by memchr (the reader counts every block's lines).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE  /* memmem */
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#define LIT(s) s, (Py_ssize_t)(sizeof(s) - 1)
#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

static int
starts(const char *s, const char *end, const char *lit, Py_ssize_t m)
{
    return end - s >= m && memcmp(s, lit, m) == 0;
}

static const char *
ascii_line(PyObject *line, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(line) || !PyUnicode_IS_COMPACT_ASCII(line))
        return NULL;
    *n = PyUnicode_GET_LENGTH(line);
    return (const char *)PyUnicode_DATA(line);
}

static int append_text(PyObject *list, const char *s, Py_ssize_t n);
static int append_index(PyObject *list, Py_ssize_t i);
static int append_value(PyObject *list, int kind, const char *s, Py_ssize_t n);

/* ---- engine_block ---------------------------------------------------------------------------- */

static const char FINISHED[] = "\"event\":\"request.finished\"";
static const char SCHEDULED_QUEUE[] = "\"event\":\"request.scheduled\",\"queue_s\":";
static const char *const SKIPPED[] = {"\"event\":\"request.first_token\"", "\"event\":\"http.access\"",
                                      "\"event\":\"request.received\""};

/* _SHORT_QUEUE after its key: -?0(?:\.\d*)?(?![\d.eE+\-]) on ASCII text */
static int
short_queue(const char *p, const char *end)
{
    if (p < end && *p == '-')
        p++;
    if (p >= end || *p != '0')
        return 0;
    p++;
    if (p < end && *p == '.') {
        p++;
        while (p < end && IS_DIGIT(*p))
            p++;
    }
    return p >= end || !(IS_DIGIT(*p) || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-');
}

#define PROMPT_KEY "\"prompt\":"
#define QUEUE_KEY "\"queue_s\":"

/* 1: dropped, 0: a request.finished candidate, -1: neither (the block is not the common case), for a
 * line without a "prompt" key (the callers check that: a line that logs a prompt is kept whole) */
static int
engine_line(const char *s, Py_ssize_t n)
{
    const char *end = s + n, *at, *queue;
    if (n == 0 || s[0] != '{' || (at = memmem(s, n, LIT("\"event\":\""))) == NULL)
        return -1;
    if (starts(at, end, LIT(FINISHED)))
        return 0;
    for (int k = 0; k < 3; k++)
        if (starts(at, end, SKIPPED[k], (Py_ssize_t)strlen(SKIPPED[k])))
            return 1;
    /* a request.scheduled line whose only "queue_s" (the one _quick_number reads) follows its key */
    if (!starts(at, end, LIT(SCHEDULED_QUEUE)))
        return -1;
    queue = at + sizeof(SCHEDULED_QUEUE) - 1 - 10;
    if (memmem(s, n, LIT(QUEUE_KEY)) != queue || memmem(queue + 10, end - queue - 10, LIT(QUEUE_KEY)) != NULL)
        return -1;
    return short_queue(queue + 10, end) ? 1 : -1;
}

/* parsers._engine_split's common case on a whole block (lines ending in "\n"), before it is split: every
 * line an engine JSON line that wanted_lines drops except request.finished ones, whose indices and lines
 * it returns; None for any other block */
static PyObject *
engine_block(PyObject *self, PyObject *block)
{
    PyObject *fin_idx, *fin_lines;
    const char *s, *end, *p;
    Py_ssize_t n = 0, i = 0;
    if (!PyUnicode_Check(block)) {
        PyErr_SetString(PyExc_TypeError, "engine_block: block must be a str");
        return NULL;
    }
    if ((s = ascii_line(block, &n)) == NULL || (n > 0 && s[n - 1] != '\n') || memmem(s, n, LIT(PROMPT_KEY)))
        Py_RETURN_NONE;  /* not whole ASCII lines, or a prompt logged: the Python split reads it */
    fin_idx = PyList_New(0);
    fin_lines = PyList_New(0);
    if (fin_idx == NULL || fin_lines == NULL)
        goto fail;
    for (p = s, end = s + n; p < end; p++, i++) {
        const char *line = p;
        int kind;
        p = memchr(p, '\n', end - p);  /* not NULL: the block ends in "\n" */
        kind = engine_line(line, p - line);
        if (kind < 0) {
            Py_DECREF(fin_idx);
            Py_DECREF(fin_lines);
            Py_RETURN_NONE;
        }
        if (kind == 0 && (append_index(fin_idx, i) < 0 || append_text(fin_lines, line, p - line) < 0))
            goto fail;
    }
    return Py_BuildValue("(NN)", fin_idx, fin_lines);
fail:
    Py_XDECREF(fin_idx);
    Py_XDECREF(fin_lines);
    return NULL;
}

/* ---- shape_rows ------------------------------------------------------------------------------ */

/* FinishedShape's value patterns, numbered as batch.py's K_NONE ... K_LIST */
enum { K_NONE, K_TS, K_INT, K_FLOAT, K_NUM, K_BOOL, K_STR, K_STR_NOT, K_LIST };
#define MAX_OPS 256
#define NUM_COLUMNS 5

typedef struct {
    const char *lit;      /* the text before the value: ',"key":' */
    Py_ssize_t lit_len;
    int kind, column;     /* column: where the value's text goes in FINISHED_COLUMNS order, or -1 */
    Py_ssize_t arg;       /* K_TS: its number of fraction digits */
    const char *not;      /* K_STR_NOT: the text the string must not be */
    Py_ssize_t not_len;
} Op;

/* a JSON string without escapes, "[^"\\\x00-\x1f]*": the end after its closing quote, or NULL */
static const char *
plain_string(const char *p, const char *end)
{
    if (p >= end || *p != '"')
        return NULL;
    for (p++; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c == '\\' || c < 0x20)
            return NULL;
    }
    return NULL;
}

static const char *
digits(const char *p, const char *end, Py_ssize_t min, Py_ssize_t max)
{
    Py_ssize_t k = 0;
    while (p < end && IS_DIGIT(*p) && (max < 0 || k < max)) {
        p++;
        k++;
    }
    return k >= min ? p : NULL;
}

/* -?(?:0|[1-9][0-9]{0,more})(?:\.[0-9]+|)(?:[eE][-+]?[0-9]+|), more < 0 for no limit */
static const char *
number(const char *p, const char *end, Py_ssize_t more)
{
    if (p < end && *p == '-')
        p++;
    if (p >= end || !IS_DIGIT(*p))
        return NULL;
    if (*p == '0')
        p++;
    else
        p = digits(p + 1, end, 0, more);
    if (p < end && *p == '.' && (p = digits(p + 1, end, 1, -1)) == NULL)
        return NULL;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '-' || *p == '+'))
            p++;
        p = digits(p, end, 1, -1);
    }
    return p;
}

/* [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{frac})?Z */
static const char *
iso_z(const char *p, const char *end, Py_ssize_t frac)
{
    static const char layout[] = "dddd-dd-ddTdd:dd:dd";
    for (const char *q = layout; *q; q++, p++) {
        if (p >= end || (*q == 'd' ? !IS_DIGIT(*p) : *p != *q))
            return NULL;
    }
    if (frac > 0) {
        if (p >= end || *p != '.')
            return NULL;
        p++;
        for (Py_ssize_t k = 0; k < frac; k++, p++)
            if (p >= end || !IS_DIGIT(*p))
                return NULL;
    }
    return p < end && *p == 'Z' ? p + 1 : NULL;
}

/* one value of the op's kind at p: its end, and in *v0, *v1 the text a column takes */
static const char *
value(const Op *op, const char *p, const char *end, Py_ssize_t max_digits, const char **v0, const char **v1)
{
    const char *q;
    *v0 = p;
    switch (op->kind) {
    case K_NONE:
        *v1 = p;
        return p;
    case K_TS:
        if (p >= end || *p != '"' || (q = iso_z(p + 1, end, op->arg)) == NULL || q >= end || *q != '"')
            return NULL;
        *v0 = p + 1;
        *v1 = q;
        return q + 1;
    case K_INT:
        q = number(p, end, 17);
        if (q == NULL || memchr(p, '.', q - p) || memchr(p, 'e', q - p) || memchr(p, 'E', q - p))
            return NULL;
        *v1 = q;
        return q;
    case K_FLOAT:  /* (?!-0(?![.eE])) then a number with at most 18 integer digits */
        if (end - p >= 2 && p[0] == '-' && p[1] == '0' &&
            (end - p == 2 || !(p[2] == '.' || p[2] == 'e' || p[2] == 'E')))
            return NULL;
        *v1 = q = number(p, end, 17);
        return q;
    case K_NUM:
        if (starts(p, end, LIT("null")))
            return *v1 = p + 4;
        *v1 = q = number(p, end, max_digits < 0 ? -1 : max_digits - 1);
        return q;
    case K_BOOL:
        if (starts(p, end, LIT("true")))
            return *v1 = p + 4;
        if (starts(p, end, LIT("false")))
            return *v1 = p + 5;
        return NULL;
    case K_STR:
        return *v1 = plain_string(p, end);
    case K_STR_NOT:
        q = plain_string(p, end);
        if (q != NULL && q - p - 2 == op->not_len && memcmp(p + 1, op->not, op->not_len) == 0)
            return NULL;
        return *v1 = q;
    case K_LIST:
        if (p >= end || *p != '[')
            return NULL;
        q = p + 1;
        if (q < end && *q != ']') {
            while ((q = plain_string(q, end)) != NULL && q < end && *q == ',')
                q++;
            if (q == NULL)
                return NULL;
        }
        if (q >= end || *q != ']')
            return NULL;
        *v0 = p + 1;
        *v1 = q;
        return q + 1;
    }
    return NULL;
}

static int
read_ops(PyObject *seq, Op *ops, Py_ssize_t *num_ops)
{
    Py_ssize_t n = PyTuple_Check(seq) ? PyTuple_GET_SIZE(seq) : -1;
    int seen[NUM_COLUMNS] = {0};
    if (n < 1 || n > MAX_OPS) {
        PyErr_SetString(PyExc_ValueError, "shape_rows: ops must be a tuple of 1 to 256 ops");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i), *lit, *not;
        Op *op = &ops[i];
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "shape_rows: each op must be a tuple");
            return -1;
        }
        if (!PyArg_ParseTuple(item, "UiinU:shape op", &lit, &op->kind, &op->column, &op->arg, &not))
            return -1;
        op->lit = PyUnicode_AsUTF8AndSize(lit, &op->lit_len);
        op->not = PyUnicode_AsUTF8AndSize(not, &op->not_len);
        if (op->lit == NULL || op->not == NULL)
            return -1;
        if (op->kind < K_NONE || op->kind > K_LIST || op->column < -1 || op->column >= NUM_COLUMNS ||
            op->arg < 0) {
            PyErr_SetString(PyExc_ValueError, "shape_rows: bad op");
            return -1;
        }
        if (op->column >= 0)
            seen[op->column]++;
    }
    for (int c = 0; c < NUM_COLUMNS; c++) {
        if (seen[c] != 1) {
            PyErr_SetString(PyExc_ValueError, "shape_rows: each of the five columns must come from one op");
            return -1;
        }
    }
    *num_ops = n;
    return 0;
}

static int
append_text(PyObject *list, const char *s, Py_ssize_t n)
{
    PyObject *text = PyUnicode_FromStringAndSize(s, n);
    int rc = text == NULL ? -1 : PyList_Append(list, text);
    Py_XDECREF(text);
    return rc;
}

static int
append_index(PyObject *list, Py_ssize_t i)
{
    PyObject *index = PyLong_FromSsize_t(i);
    int rc = index == NULL ? -1 : PyList_Append(list, index);
    Py_XDECREF(index);
    return rc;
}

static PyObject *
shape_rows(PyObject *self, PyObject *args)
{
    PyObject *lines, *ops_seq, *columns = NULL, *misses = NULL, *cols[NUM_COLUMNS] = {NULL};
    Py_ssize_t max_digits, num_ops;
    Op ops[MAX_OPS];
    int kinds[NUM_COLUMNS];
    if (!PyArg_ParseTuple(args, "O!On:shape_rows", &PyList_Type, &lines, &ops_seq, &max_digits))
        return NULL;
    if (read_ops(ops_seq, ops, &num_ops) < 0)
        return NULL;
    for (Py_ssize_t k = 0; k < num_ops; k++)
        if (ops[k].column >= 0)
            kinds[ops[k].column] = ops[k].kind;
    columns = PyList_New(NUM_COLUMNS);
    misses = PyList_New(0);
    if (columns == NULL || misses == NULL)
        goto fail;
    for (int c = 0; c < NUM_COLUMNS; c++) {
        if ((cols[c] = PyList_New(0)) == NULL)
            goto fail;
        PyList_SET_ITEM(columns, c, cols[c]);
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        Py_ssize_t n = 0;
        const char *s = ascii_line(PyList_GET_ITEM(lines, i), &n), *p = s, *end;
        const char *v0[NUM_COLUMNS], *v1[NUM_COLUMNS];
        int c;
        if (s == NULL) {  /* not ASCII: the Python path reads it */
            if (append_index(misses, i) < 0)
                goto fail;
            continue;
        }
        end = s + n;
        for (Py_ssize_t k = 0; p != NULL && k < num_ops; k++) {
            const Op *op = &ops[k];
            const char *a, *b;
            if (!starts(p, end, op->lit, op->lit_len)) {
                p = NULL;
                break;
            }
            p = value(op, p + op->lit_len, end, max_digits, &a, &b);
            if (p != NULL && op->column >= 0) {
                v0[op->column] = a;
                v1[op->column] = b;
            }
        }
        if (p != end) {
            if (append_index(misses, i) < 0)
                goto fail;
            continue;
        }
        for (c = 0; c < NUM_COLUMNS; c++)
            if (append_value(cols[c], kinds[c], v0[c], v1[c] - v0[c]) < 0)
                goto fail;
    }
    return Py_BuildValue("(NN)", columns, misses);
fail:
    Py_XDECREF(columns);
    Py_XDECREF(misses);
    return NULL;
}

/* a column's value: int(text) for K_INT, float(text) for K_FLOAT (by the parser float() calls), else
 * the text */
static int
append_value(PyObject *list, int kind, const char *s, Py_ssize_t n)
{
    char small[64], *buf;
    PyObject *value;
    int rc;
    if (kind != K_INT && kind != K_FLOAT)
        return append_text(list, s, n);
    buf = n < (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc(n + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (kind == K_INT) {  /* -?(?:0|[1-9][0-9]{0,17}): at most 18 digits, exact in a long long */
        value = PyLong_FromLongLong(strtoll(buf, NULL, 10));
    }
    else {
        double d = PyOS_string_to_double(buf, NULL, NULL);  /* overflow: +-inf, as float() */
        value = d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
    }
    if (buf != small)
        PyMem_Free(buf);
    rc = value == NULL ? -1 : PyList_Append(list, value);
    Py_XDECREF(value);
    return rc;
}

/* ---- access_columns -------------------------------------------------------------------------- */

/* \s for str patterns on ASCII: space, \t \n \v \f \r and the separators 0x1c-0x1f */
#define IS_SPACE(c) ((c) == ' ' || ((c) >= '\t' && (c) <= '\r') || ((c) >= 0x1c && (c) <= 0x1f))

static const char *
nonspace(const char *p, const char *end)  /* \S+ */
{
    const char *q = p;
    while (q < end && !IS_SPACE(*q))
        q++;
    return q > p ? q : NULL;
}

static const char *
space(const char *p, const char *end)  /* one " " */
{
    return p != NULL && p < end && *p == ' ' ? p + 1 : NULL;
}

static const char *
enclosed(const char *p, const char *end, char open, char close, Py_ssize_t min)  /* \[[^\]]{min,}\] */
{
    const char *q;
    if (p == NULL || p >= end || *p != open)
        return NULL;
    q = memchr(p + 1, close, end - p - 1);
    return q != NULL && q - p - 1 >= min ? q + 1 : NULL;
}

static const char *
seconds(const char *p, const char *end, int dash)  /* [0-9]+\.?[0-9]*|\.[0-9]+ (|- with dash) */
{
    if (p == NULL || p >= end)
        return NULL;
    if (dash && *p == '-')
        return p + 1;
    if (*p == '.')
        return digits(p + 1, end, 1, -1);
    if ((p = digits(p, end, 1, -1)) != NULL && p < end && *p == '.')
        p = digits(p + 1, end, 0, -1);
    return p;
}

/* UPSTREAMINFO_BULK's first alternative on one line: 1 and the five groups' spans when it matches */
static int
access_line(const char *s, const char *end, const char **g0, const char **g1)
{
    const char *p = s;
    if (p >= end || !(IS_DIGIT(*p) || *p == '['))
        return 0;
#define NEED(x) do { if ((p = (x)) == NULL) return 0; } while (0)
    g0[0] = p;
    NEED(nonspace(p, end));
    g1[0] = p;
    NEED(space(p, end));
    NEED(nonspace(p, end));
    NEED(space(p, end));
    NEED(nonspace(p, end));
    NEED(space(p, end));
    g0[1] = p + 1;
    NEED(enclosed(p, end, '[', ']', 1));
    g1[1] = p - 1;
    NEED(space(p, end));
    NEED(enclosed(p, end, '"', '"', 0));
    NEED(space(p, end));
    g0[2] = p;
    NEED(digits(p, end, 3, 3));
    g1[2] = p;
    NEED(space(p, end));
    if (p < end && *p == '-')
        p++;
    else
        NEED(digits(p, end, 1, 18));
    if (end - p >= 2 && p[0] == ' ' && p[1] == '"') {
        NEED(enclosed(p + 1, end, '"', '"', 0));
        NEED(space(p, end));
        NEED(enclosed(p, end, '"', '"', 0));
    }
    NEED(space(p, end));
    NEED(digits(p, end, 1, -1));
    NEED(space(p, end));
    g0[3] = p;
    NEED(seconds(p, end, 0));
    g1[3] = p;
    NEED(space(p, end));
    NEED(enclosed(p, end, '[', ']', 0));
    NEED(space(p, end));
    NEED(enclosed(p, end, '[', ']', 0));
    NEED(space(p, end));
    g0[4] = p;
    NEED(nonspace(p, end));
    g1[4] = p;
    NEED(space(p, end));
    NEED(nonspace(p, end));
    NEED(space(p, end));
    NEED(seconds(p, end, 1));
    NEED(space(p, end));
    NEED(nonspace(p, end));
    if (p < end && *p == ' ')
        NEED(nonspace(p + 1, end));
#undef NEED
    return p == end;
}

static PyObject *
access_columns(PyObject *self, PyObject *lines)
{
    PyObject *columns, *cols[NUM_COLUMNS], *empty;
    if (!PyList_Check(lines)) {
        PyErr_SetString(PyExc_TypeError, "access_columns: lines must be a list");
        return NULL;
    }
    if ((columns = PyList_New(NUM_COLUMNS)) == NULL)
        return NULL;
    for (int c = 0; c < NUM_COLUMNS; c++) {
        if ((cols[c] = PyList_New(0)) == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, c, cols[c]);
    }
    empty = PyUnicode_New(0, 0);
    if (empty == NULL) {
        Py_DECREF(columns);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        Py_ssize_t n = 0;
        const char *s = ascii_line(PyList_GET_ITEM(lines, i), &n), *g0[NUM_COLUMNS], *g1[NUM_COLUMNS];
        int hit = s != NULL && access_line(s, s + n, g0, g1);
        for (int c = 0; c < NUM_COLUMNS; c++) {
            int rc = hit ? append_text(cols[c], g0[c], g1[c] - g0[c]) : PyList_Append(cols[c], empty);
            if (rc < 0) {
                Py_DECREF(empty);
                Py_DECREF(columns);
                return NULL;
            }
        }
    }
    Py_DECREF(empty);
    return columns;
}

/* ---- count_lines ----------------------------------------------------------------------------- */

static PyObject *
count_lines(PyObject *self, PyObject *text)
{
    Py_ssize_t n, count = 0;
    int kind;
    const void *data;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "count_lines: text must be a str");
        return NULL;
    }
    n = PyUnicode_GET_LENGTH(text);
    kind = PyUnicode_KIND(text);
    data = PyUnicode_DATA(text);
    if (kind == PyUnicode_1BYTE_KIND) {
        const char *p = data, *end = p + n;
        while (p < end && (p = memchr(p, '\n', end - p)) != NULL) {
            count++;
            p++;
        }
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++)
            count += PyUnicode_READ(kind, data, i) == '\n';
    }
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"engine_block", engine_block, METH_O, "parsers._engine_split's common case on a whole block, unsplit: "
     "(the request.finished candidates' indices, their lines), or None."},
    {"shape_rows", shape_rows, METH_VARARGS, "FinishedShape.lines.findall as (the five columns' texts of "
     "matching lines, positions of the other lines)."},
    {"access_columns", access_columns, METH_O, "UPSTREAMINFO_BULK.findall's first five columns, \"\" where "
     "a line does not match."},
    {"count_lines", count_lines, METH_O, "text.count(\"\\n\")"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "triage._speedups", NULL, -1, methods};

/* batch.py uses the module only when API is the number it expects (a stale build is left alone) */
#define API 4

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "API", API) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
