/* The public calls' short path in C: a table of prepared calls, each run as the Python entry of
 * ``shm.short_calls`` runs it, without the Python around it.
 *
 * ``dist.broadcast(x, 0)`` of a 4-byte vector on shared memory spends most of its time before
 * the compiled kernel starts and after it returns: the public function's checks, a dictionary
 * lookup keyed by a tuple, the entry's flag tests, the sequence number, the queue's drain and
 * lock, each a few dozen to a few hundred nanoseconds of interpreter. ``Table.run(tensor,
 * how)`` does those steps here: it finds the entry by the array's dtype object, element count
 * and ``how`` (the op or the root) in a short array, tests the array's flags in its struct, and
 * makes the same calls the Python entry makes, in the same order: ``next_seq()``,
 * ``drain(op, seq)``, ``acquire()``, ``kernel(tensor, address, seq, watch.spin_polls)`` and,
 * on a status, ``finish(status, tensor, seq)``, then ``release()``, also when one raised.
 * It returns False, having done nothing, for anything it does not serve (not an ndarray, not
 * C-contiguous, aligned and writable, no entry); the caller then takes the Python path, which
 * raises where it must. An array of any number of dimensions is found by its element count,
 * as the Python tables key it, and its kernel gets a one-dimensional view of it (the kernels
 * were compiled for vectors), as the Python entry passes ``tensor.reshape(-1)``.
 * ``Table.run_alone()`` runs a table's one entry with no tensor (a barrier:
 * ``kernel(address, seq, polls)``, ``finish(status, seq)``), and ``Table.run_pair(src, out)``
 * one on two arrays (an all-gather into ``out``).
 *
 * It knows nothing of any transport: what a kernel does, and what ``finish`` settles, is the
 * business of whoever added the entry. An entry holds references to everything it calls and
 * to ``keep`` (what the kernel's address points into), and to its dtype object, so that the
 * identity it is found by cannot pass to another dtype.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030A0000  /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#endif

/* The first fields of NumPy's array object (PyArrayObject_fields in numpy/ndarraytypes.h),
 * laid out alike in NumPy 1.x and 2.x; read here without NumPy's headers, which a build
 * without NumPy installed would not find. Only arrays of exactly ``ndarray_type`` are read. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayHead;

/* What entry_table.py expects of this module; a build left from older sources (an in-place
 * build is not rebuilt by a git pull) reports another and is not used. */
#define API_VERSION 5

/* NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE, as short_entries.USABLE */
#define USABLE (0x0001 | 0x0100 | 0x0400)
#define CAPACITY 64

typedef struct {
    PyObject *descr, *how, *kernel, *address, *finish, *keep;
    Py_ssize_t count;
    Py_ssize_t how_count;  /* ``how`` as a count where it is an int (run_pair), else -1 */
} Entry;

typedef struct {
    PyObject_HEAD
    PyObject *ndarray_type, *op, *next_seq, *drain, *acquire, *release, *watch;
    int arrays;  /* what its kernels take: 1 (run), 2 (run_pair) or 0 (run_alone) */
    Entry entries[CAPACITY];
    Py_ssize_t used;
} Table;

static PyObject *spin_polls_name, *reshape_name, *minus_one;

static void clear_entry(Entry *e) {
    Py_CLEAR(e->descr);
    Py_CLEAR(e->how);
    Py_CLEAR(e->kernel);
    Py_CLEAR(e->address);
    Py_CLEAR(e->finish);
    Py_CLEAR(e->keep);
    e->count = 0;
}

static void clear_entries(Table *t) {
    for (Py_ssize_t i = 0; i < t->used; i++)
        clear_entry(&t->entries[i]);
    t->used = 0;
}

static int Table_init(Table *t, PyObject *args, PyObject *kwds) {
    static char *names[] = {"ndarray_type", "op", "next_seq", "drain", "acquire", "release",
                            "watch", "arrays", NULL};
    PyObject *v[7];
    int arrays = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!UOOOOO|i:Table", names, &PyType_Type,
                                     &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &arrays))
        return -1;
    if (arrays < 0 || arrays > 2) {
        PyErr_Format(PyExc_ValueError, "Table: arrays must be 0, 1 or 2, not %d", arrays);
        return -1;
    }
    if (t->ndarray_type != NULL) {  /* its calls run with borrowed references to these */
        PyErr_SetString(PyExc_RuntimeError, "Table: already initialised");
        return -1;
    }
    if (strcmp(((PyTypeObject *)v[0])->tp_name, "numpy.ndarray") != 0) {
        PyErr_Format(PyExc_TypeError, "Table: ndarray_type must be numpy.ndarray, not %.80s",
                     ((PyTypeObject *)v[0])->tp_name);
        return -1;
    }
    for (int i = 2; i < 6; i++) {
        if (!PyCallable_Check(v[i])) {
            PyErr_Format(PyExc_TypeError, "Table: argument %d (%s) must be callable, not %.80s",
                         i + 1, names[i], Py_TYPE(v[i])->tp_name);
            return -1;
        }
    }
    PyObject **slots[7] = {&t->ndarray_type, &t->op, &t->next_seq, &t->drain, &t->acquire,
                           &t->release, &t->watch};
    for (int i = 0; i < 7; i++)
        *slots[i] = Py_NewRef(v[i]);
    t->arrays = arrays;
    return 0;
}

static int Table_traverse(Table *t, visitproc visit, void *arg) {
    Py_VISIT(t->ndarray_type);
    Py_VISIT(t->op);
    Py_VISIT(t->next_seq);
    Py_VISIT(t->drain);
    Py_VISIT(t->acquire);
    Py_VISIT(t->release);
    Py_VISIT(t->watch);
    for (Py_ssize_t i = 0; i < t->used; i++) {
        Entry *e = &t->entries[i];
        Py_VISIT(e->descr);
        Py_VISIT(e->how);
        Py_VISIT(e->kernel);
        Py_VISIT(e->address);
        Py_VISIT(e->finish);
        Py_VISIT(e->keep);
    }
    return 0;
}

static int Table_clear_refs(Table *t) {
    clear_entries(t);
    Py_CLEAR(t->ndarray_type);
    Py_CLEAR(t->op);
    Py_CLEAR(t->next_seq);
    Py_CLEAR(t->drain);
    Py_CLEAR(t->acquire);
    Py_CLEAR(t->release);
    Py_CLEAR(t->watch);
    return 0;
}

static void Table_dealloc(Table *t) {
    PyObject_GC_UnTrack(t);
    Table_clear_refs(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* add(dtype, count, how, kernel, address, finish, keep) -> True; a full table starts afresh
 * first, as the Python tables do (short_entries.make_room): a program of ever new shapes. */
static PyObject *Table_add(Table *t, PyObject *args) {
    PyObject *descr, *how, *kernel, *address, *finish, *keep;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OnOOO!OO:add", &descr, &count, &how, &kernel, &PyLong_Type,
                          &address, &finish, &keep))
        return NULL;
    if (!PyCallable_Check(kernel) || !PyCallable_Check(finish)) {
        PyErr_SetString(PyExc_TypeError, "add: kernel and finish must be callable");
        return NULL;
    }
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "add: count must be >= 0, not %zd", count);
        return NULL;
    }
    if (t->used == CAPACITY)
        clear_entries(t);
    Entry *e = &t->entries[t->used++];
    e->count = count;
    e->how_count = -1;
    if (PyLong_CheckExact(how)) {
        e->how_count = PyLong_AsSsize_t(how);
        if (e->how_count == -1 && PyErr_Occurred())
            PyErr_Clear();  /* out of range: never a length */
    }
    e->descr = Py_NewRef(descr);
    e->how = Py_NewRef(how);
    e->kernel = Py_NewRef(kernel);
    e->address = Py_NewRef(address);
    e->finish = Py_NewRef(finish);
    e->keep = Py_NewRef(keep);
    Py_RETURN_TRUE;
}

static PyObject *Table_clear(Table *t, PyObject *unused) {
    (void)unused;
    clear_entries(t);
    Py_RETURN_NONE;
}

/* The same ``how``: the same object (an op), or ints of the same value (a root). */
static int same_how(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    return 0;
}

static PyObject *call0(PyObject *f) { return PyObject_CallNoArgs(f); }

/* Whether ``t``'s kernels take ``arrays`` arrays; else a TypeError, before anything is done
 * (a wrong method would call a kernel with the wrong arguments after taking a sequence
 * number). */
static int takes(Table *t, int arrays, const char *method) {
    if (t->arrays == arrays)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s: this table's kernels take %d arrays, not %d", method,
                 t->arrays, arrays);
    return 0;
}

/* The error being raised, taken aside while the lock is released (none: type NULL). */
typedef struct {
    PyObject *type, *value, *trace;
} Raised;

static Raised take_error(void) {
    Raised r = {NULL, NULL, NULL};
#if PY_VERSION_HEX >= 0x030C0000  /* PyErr_Fetch is deprecated from 3.12 */
    r.type = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&r.type, &r.value, &r.trace);
#endif
    return r;
}

static void restore_error(Raised r) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(r.type);
#else
    PyErr_Restore(r.type, r.value, r.trace);
#endif
}

/* Run entry ``e`` as the Python entry runs it, on ``n`` arrays (0: a barrier; 2: an
 * all-gather's input and output). */
static PyObject *run_entry(Table *t, Entry *e, PyObject *const *arrays, int n) {
    /* what the entry calls may clear the table (a failure closing the transport): hold it */
    PyObject *kernel = Py_NewRef(e->kernel), *address = Py_NewRef(e->address);
    PyObject *finish = Py_NewRef(e->finish), *keep = Py_NewRef(e->keep);
    PyObject *seq = NULL, *result = NULL, *polls = NULL, *status = NULL, *locked = NULL;
    PyObject *done = NULL;

    seq = call0(t->next_seq);
    if (seq == NULL)
        goto out;
    PyObject *drain_args[2] = {t->op, seq};
    result = PyObject_Vectorcall(t->drain, drain_args, 2, NULL);
    if (result == NULL)
        goto out;
    locked = call0(t->acquire);
    if (locked == NULL)
        goto out;
    polls = PyObject_GetAttr(t->watch, spin_polls_name);
    if (polls != NULL) {
        PyObject *kernel_args[5];
        for (int i = 0; i < n; i++)
            kernel_args[i] = arrays[i];
        kernel_args[n] = address;
        kernel_args[n + 1] = seq;
        kernel_args[n + 2] = polls;
        status = PyObject_Vectorcall(kernel, kernel_args, n + 3, NULL);
    }
    if (status != NULL) {
        long long code = PyLong_AsLongLong(status);
        if (code == -1 && PyErr_Occurred()) {
            /* not an int: left as the error */
        } else if (code != 0) {
            PyObject *finish_args[4] = {status};
            for (int i = 0; i < n; i++)
                finish_args[1 + i] = arrays[i];
            finish_args[1 + n] = seq;
            PyObject *r = PyObject_Vectorcall(finish, finish_args, n + 2, NULL);
            if (r != NULL) {
                Py_DECREF(r);
                done = Py_True;
            }
        } else {
            done = Py_True;
        }
    }
    {   /* release the lock whether or not the call raised, keeping its error */
        Raised raised = take_error();
        PyObject *r = call0(t->release);
        if (r == NULL) {
            if (raised.type != NULL) {  /* the first error wins */
                PyErr_Clear();
                restore_error(raised);
            }
            done = NULL;
        } else {
            Py_DECREF(r);
            restore_error(raised);
        }
    }
out:
    Py_XDECREF(seq);
    Py_XDECREF(result);
    Py_XDECREF(locked);
    Py_XDECREF(polls);
    Py_XDECREF(status);
    Py_DECREF(kernel);
    Py_DECREF(address);
    Py_DECREF(finish);
    Py_DECREF(keep);
    if (done == NULL)
        return NULL;
    Py_RETURN_TRUE;
}

/* The elements of ``a``: the product of its dimensions (1 for a 0-d array). An array of a
 * zero-size dtype may have dimensions whose product overflows before a zero comes: the product
 * is taken unsigned (no undefined overflow) and any zero dimension makes it 0, as NumPy's
 * size is. */
static Py_ssize_t elements(ArrayHead *a) {
    size_t n = 1;
    for (int i = 0; i < a->nd; i++) {
        if (a->dimensions[i] == 0)
            return 0;
        n *= (size_t)a->dimensions[i];
    }
    return (Py_ssize_t)n;
}

/* ``run_entry`` on one-dimensional views of ``arrays`` (``reshape(-1)``: a C-contiguous
 * array's view of the same memory, keeping its flags); a vector is passed as it is. */
static PyObject *run_flat(Table *t, Entry *e, PyObject *const *arrays, int n) {
    PyObject *flat[2] = {NULL, NULL};
    PyObject *result = NULL;
    for (int i = 0; i < n; i++) {
        if (((ArrayHead *)arrays[i])->nd == 1) {
            flat[i] = Py_NewRef(arrays[i]);
            continue;
        }
        PyObject *reshape_args[2] = {arrays[i], minus_one};
        flat[i] = PyObject_VectorcallMethod(reshape_name, reshape_args, 2, NULL);
        if (flat[i] == NULL)
            goto out;
    }
    result = run_entry(t, e, flat, n);
out:
    for (int i = 0; i < n; i++)
        Py_XDECREF(flat[i]);
    return result;
}

/* run(tensor, how) -> bool: see the top of this file. */
static PyObject *Table_run(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "run takes 2 arguments (tensor, how), %zd given", nargs);
        return NULL;
    }
    PyObject *tensor = args[0], *how = args[1];
    if (t->ndarray_type == NULL || (PyObject *)Py_TYPE(tensor) != t->ndarray_type)
        Py_RETURN_FALSE;
    if (!takes(t, 1, "run"))
        return NULL;
    ArrayHead *a = (ArrayHead *)tensor;
    if ((a->flags & USABLE) != USABLE)
        Py_RETURN_FALSE;
    Py_ssize_t count = elements(a);
    for (Py_ssize_t i = 0; i < t->used; i++) {
        Entry *e = &t->entries[i];
        if (e->descr == a->descr && e->count == count) {
            int same = same_how(e->how, how);
            if (same < 0)
                return NULL;
            if (same)
                return run_flat(t, e, args, 1);
        }
    }
    Py_RETURN_FALSE;
}

/* run_alone() -> bool: the first entry, with no tensor: kernel(address, seq, polls) and, on a
 * status, finish(status, seq) (a barrier); False where there is none. */
static PyObject *Table_run_alone(Table *t, PyObject *unused) {
    (void)unused;
    if (t->ndarray_type == NULL || t->used == 0)
        Py_RETURN_FALSE;
    if (!takes(t, 0, "run_alone"))
        return NULL;
    return run_entry(t, &t->entries[0], NULL, 0);
}

/* run_pair(src, out) -> bool: the entry of ``src``'s dtype object and element count whose
 * ``how`` is ``out``'s element count (an all-gather into ``out``, of src's dtype object), both
 * C-contiguous, aligned and writable: kernel(src, out, address, seq, polls) and
 * finish(status, src, out, seq) on their one-dimensional views; False, nothing done, for
 * anything else. */
static PyObject *Table_run_pair(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "run_pair takes 2 arguments (src, out), %zd given",
                     nargs);
        return NULL;
    }
    PyObject *src = args[0], *out = args[1];
    if (t->ndarray_type == NULL || (PyObject *)Py_TYPE(src) != t->ndarray_type
            || (PyObject *)Py_TYPE(out) != t->ndarray_type)
        Py_RETURN_FALSE;
    if (!takes(t, 2, "run_pair"))
        return NULL;
    ArrayHead *a = (ArrayHead *)src, *b = (ArrayHead *)out;
    if ((a->flags & USABLE) != USABLE || (b->flags & USABLE) != USABLE || b->descr != a->descr)
        Py_RETURN_FALSE;
    Py_ssize_t count = elements(a), out_count = elements(b);
    for (Py_ssize_t i = 0; i < t->used; i++) {
        Entry *e = &t->entries[i];
        if (e->descr == a->descr && e->count == count && e->how_count == out_count)
            return run_flat(t, e, args, 2);
    }
    Py_RETURN_FALSE;
}

static PyObject *Table_len(Table *t, void *unused) {
    (void)unused;
    return PyLong_FromSsize_t(t->used);
}

static PyMethodDef Table_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Table_run, METH_FASTCALL,
     "run(tensor, how) -> bool: run the entry of tensor's dtype object, element count and how; "
     "False, nothing done, where none serves it."},
    {"run_pair", (PyCFunction)(void (*)(void))Table_run_pair, METH_FASTCALL,
     "run_pair(src, out) -> bool: the entry of src's dtype object and element count and out's "
     "element count (how); False, nothing done, where none serves them."},
    {"run_alone", (PyCFunction)Table_run_alone, METH_NOARGS,
     "run_alone() -> bool: the first entry, with no tensor (a barrier); False where none."},
    {"add", (PyCFunction)Table_add, METH_VARARGS,
     "add(dtype, count, how, kernel, address, finish, keep) -> True; a full table starts "
     "afresh first."},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "Forget every entry."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Table_getset[] = {
    {"used", (getter)Table_len, NULL, "entries held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "neural_arch.distributed.transports._entry_table.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Table(ndarray_type, op, next_seq, drain, acquire, release, watch, arrays=1): "
              "prepared calls of one collective of one group, whose kernels take that many "
              "arrays, run from C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_traverse = (traverseproc)Table_traverse,
    .tp_clear = (inquiry)Table_clear_refs,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
};

static PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_entry_table",
    "The public calls' short path in C (see entry_table.py).", -1, NULL, NULL, NULL, NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__entry_table(void) {
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    if ((spin_polls_name = PyUnicode_InternFromString("spin_polls")) == NULL
            || (reshape_name = PyUnicode_InternFromString("reshape")) == NULL
            || (minus_one = PyLong_FromLong(-1)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "API_VERSION", API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
