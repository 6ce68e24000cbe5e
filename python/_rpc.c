/*
 * _rpc.c: tensorplay._rpc, the CPython extension under
 * tensorplay.distributed.rpc (issue 10; the Python layer shapes the API).
 *
 * What it does:
 * - Values cross between Python and tp_value here (to_value, from_value):
 *   None, bool, int (64-bit), float, str, bytes, list, tuple,
 *   dict with str keys, RRef. Anything else is a TypeError naming the type
 *   and where it was found. No pickle: a peer's bytes never become code.
 * - One C function, "py:call", serves every Python call: it takes the GIL
 *   on its pool thread and hands (module, qualname, args, kwargs) to the
 *   dispatcher the Python layer registered, which finds the function among
 *   modules already imported (never importing one a peer named).
 * - Every blocking call releases the GIL; nothing here runs on the I/O thread.
 * Ownership: Future and RRef objects own one tp_future / tp_rref reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tensorplay/rpc.h"

#define PY_CALL_FN "py:call"
#define PY_METHOD "py:method" /* every Python object's one method: [name, args, kwargs] */
#define NEST_MAX 64 /* values nested deeper are refused, both ways */
#define WAIT_SLICE_S 0.1 /* a blocking wait looks for Ctrl-C this often */

static PyObject *dispatcher;   /* the Python layer's: (module, qualname, args, kwargs) -> value */
/* The Python layer's: object -> (buffer, dtype name or None) for objects that
 * travel as tensors without the buffer protocol (torch, DLPack), or None. */
static PyObject *adapter;
static PyObject *method_dispatcher; /* the Python layer's: (object, name, args, kwargs) -> value */
/* The call py_call serves on this thread, for answer_later; and whether the
 * function answered that way (then its return value is not the answer). */
static _Thread_local tp_call *serving;
static _Thread_local int answered_later;
static PyObject *RemoteError;  /* raised for TP_EREMOTE, carrying the remote message */
/* Raised for TP_EPEERDOWN and TP_EIO: the destination is gone or its
 * connection broke. rpc_async turns it into a failed future, as PyTorch's
 * send errors are reported through the future. */
static PyObject *PeerDownError;
/* allow_pickle (VALUE-12): other objects travel pickled in opaque bytes, and
 * opaque bytes that arrive are unpickled. Off unless the program asks. */
static int allow_pickle;
static PyObject *pickle_module;
static PyTypeObject FutureType, RRefType, TensorType;

typedef struct {
    PyObject_HEAD tp_future *f;
} FutureObject;

typedef struct {
    PyObject_HEAD tp_rref *r;
} RRefObject;

/* ---- The GIL on pool threads -------------------------------------------------------- */

/* A pool thread's Python thread state is made once and kept: PyGILState
 * would otherwise make and delete one per call, and deleting one unmaps its
 * frame stack (a TLB shootdown on every core, most of a call's cost). */
static _Thread_local int tstate_kept;

static PyGILState_STATE gil_enter(void) {
    if (!tstate_kept) {
        PyGILState_Ensure(); /* its count of 1 keeps the thread state for the thread's life */
        PyEval_SaveThread();
        tstate_kept = 1;
    }
    return PyGILState_Ensure();
}

/* ---- Errors -------------------------------------------------------------------------- */

/* Raises the Python exception for a failed tp_ call (its message from tp_errmsg). */
static PyObject *raise_status(tp_status st, const char *msg) {
    PyObject *type = PyExc_RuntimeError;
    switch (st) {
    case TP_ETIMEDOUT:
        type = PyExc_TimeoutError;
        break;
    case TP_EINVAL:
        type = PyExc_ValueError;
        break;
    case TP_ETYPE:
        type = PyExc_TypeError;
        break;
    case TP_ENOMEM:
        type = PyExc_MemoryError;
        break;
    case TP_EREMOTE:
        type = RemoteError;
        break;
    case TP_EPEERDOWN:
    case TP_EIO:
        type = PeerDownError;
        break;
    default:
        break;
    }
    PyErr_SetString(type, msg && *msg ? msg : tp_strerror(st));
    return NULL;
}

static PyObject *raise_last(tp_status st) {
    return raise_status(st, tp_errmsg());
}

/* ---- Values ---------------------------------------------------------------------------- */

static tp_value *to_value(PyObject *o, const char *where, int depth, int objects);

static int pickle_ready(void) {
    if (!pickle_module)
        pickle_module = PyImport_ImportModule("pickle");
    return pickle_module != NULL;
}

/* An object no value kind holds, pickled (allow_pickle on this worker). */
static tp_value *pickled_value(PyObject *o, const char *where) {
    PyObject *b = pickle_ready() ? PyObject_CallMethod(pickle_module, "dumps", "Oi", o, -1) : NULL;
    if (!b) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_TypeError, "%s: a value of type '%s' cannot be pickled: %S", where,
                     Py_TYPE(o)->tp_name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    tp_value *v = tp_value_opaque(PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    return v ? v : (tp_value *)PyErr_NoMemory();
}

/* Opaque bytes that arrived: unpickled only where allow_pickle is on. */
static PyObject *unpickled(const void *p, size_t len) {
    if (!allow_pickle)
        return PyErr_Format(PyExc_TypeError,
                            "a pickled object (%zu bytes) arrived, and this worker does not "
                            "allow pickle (TensorPipeRpcBackendOptions(allow_pickle=True) "
                            "turns it on, for trusted peers only)",
                            len);
    if (!pickle_ready())
        return NULL;
    return PyObject_CallMethod(pickle_module, "loads", "y#", (const char *)p, (Py_ssize_t)len);
}

static tp_value *type_error(PyObject *o, const char *where) {
    PyErr_Format(PyExc_TypeError,
                 "%s: a value of type '%s' cannot be sent (None, bool, int, float, complex, str, "
                 "bytes, list, tuple, dict, set, tensors, torch dtypes and devices, functions "
                 "by name and RRefs can: spec/api.md PY-2); other objects travel pickled, "
                 "between trusted workers, with TensorPipeRpcBackendOptions(allow_pickle=True)",
                 where, Py_TYPE(o)->tp_name);
    return NULL;
}

static tp_value *seq_value(PyObject *o, const char *where, int depth, int objects, int tuple) {
    tp_value *list = tuple ? tp_value_tuple() : tp_value_list();
    if (!list)
        return (tp_value *)PyErr_NoMemory();
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < n; i++) {
        tp_value *v = to_value(items[i], where, depth + 1, objects);
        if (!v || tp_list_append(list, v) != TP_OK) {
            tp_value_free(list);
            return v ? (tp_value *)PyErr_NoMemory() : NULL;
        }
    }
    return list;
}

static tp_value *object_value(PyObject *o);
static tp_value *buffer_value(PyObject *o, const char *where, const char *dtype);
static tp_value *adapted_value(PyObject *o, const char *where, int *none);

static tp_value *to_value(PyObject *o, const char *where, int depth, int objects) {
    if (depth > NEST_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: values nest more than %d deep", where, NEST_MAX);
        return NULL;
    }
    tp_value *v = NULL;
    int none = 0;
    if (o == Py_None) {
        v = tp_value_nil();
    } else if (PyBool_Check(o)) {
        v = tp_value_bool(o == Py_True);
    } else if (PyLong_Check(o)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow) {
            PyErr_Format(PyExc_OverflowError, "%s: int %R does not fit in 64 bits", where, o);
            return NULL;
        }
        if (x == -1 && PyErr_Occurred())
            return NULL;
        v = tp_value_int((int64_t)x);
    } else if (PyFloat_Check(o)) {
        v = tp_value_float(PyFloat_AS_DOUBLE(o));
    } else if (PyUnicode_Check(o)) {
        Py_ssize_t len = 0;
        const char *s = PyUnicode_AsUTF8AndSize(o, &len);
        if (!s)
            return NULL;
        v = tp_value_strn(s, (size_t)len);
    } else if (PyBytes_Check(o)) {
        v = tp_value_bytes(PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
    } else if (PyList_Check(o) || PyTuple_Check(o)) {
        PyObject *fast = PySequence_Fast(o, "a list");
        if (!fast)
            return NULL;
        v = seq_value(fast, where, depth, objects, PyTuple_Check(o));
        Py_DECREF(fast);
        return v;
    } else if (PyDict_Check(o)) {
        v = tp_value_map();
        PyObject *key, *item;
        Py_ssize_t pos = 0;
        while (v && PyDict_Next(o, &pos, &key, &item)) {
            if (!PyUnicode_Check(key)) {
                tp_value_free(v);
                PyErr_Format(PyExc_TypeError, "%s: dict keys must be str, got '%s'", where,
                             Py_TYPE(key)->tp_name);
                return NULL;
            }
            const char *k = PyUnicode_AsUTF8(key);
            tp_value *x = k ? to_value(item, where, depth + 1, objects) : NULL;
            if (!x || tp_map_set(v, k, x) != TP_OK) {
                tp_value_free(v);
                return x ? (tp_value *)raise_last(TP_EINVAL) : NULL;
            }
        }
    } else if (PyObject_TypeCheck(o, &RRefType)) {
        v = tp_value_rref(((RRefObject *)o)->r);
    } else if (PyByteArray_Check(o)) {
        v = tp_value_bytes(PyByteArray_AS_STRING(o), (size_t)PyByteArray_GET_SIZE(o));
    } else if (PyObject_CheckBuffer(o)) { /* numpy arrays and other typed buffers */
        return buffer_value(o, where, NULL);
    } else if ((v = adapted_value(o, where, &none)) != NULL || !none) {
        return v; /* a tensor of another framework, or the adapter's error */
    } else if (objects) { /* a served result kept on its owner (remote) */
        return object_value(o);
    } else if (allow_pickle) {
        return pickled_value(o, where);
    } else {
        return type_error(o, where);
    }
    if (!v)
        PyErr_NoMemory();
    return v;
}

/* Objects a served function returns for remote(): kept on the owner as a
 * tp_value_object whose state is the PyObject (one reference). The last
 * reference may go on any thread, the I/O thread included, which never takes
 * the GIL: the decref is handed to the interpreter's main thread. */
static int decref_pending(void *o) {
    Py_DECREF((PyObject *)o);
    return 0;
}

static void py_object_destroy(void *state) {
    if (Py_AddPendingCall(decref_pending, state) != 0) { /* its queue is full: rare */
        PyGILState_STATE g = gil_enter();
        Py_DECREF((PyObject *)state);
        PyGILState_Release(g);
    }
}

static tp_status py_method(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data);

/* "py:<module>:<qualname>" with every character a name may not hold as '_'. */
static void class_name_of(PyObject *o, char *buf, size_t len) {
    PyTypeObject *t = Py_TYPE(o);
    PyObject *mod = PyObject_GetAttrString((PyObject *)t, "__module__");
    const char *m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : "?";
    snprintf(buf, len, "py:%s:%s", m ? m : "?", t->tp_name);
    PyErr_Clear();
    Py_XDECREF(mod);
    for (char *c = buf; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == ':' || *c == '-'))
            *c = '_';
}

static tp_value *object_value(PyObject *o) {
    char cls[TP_NAME_LEN_MAX + 1];
    class_name_of(o, cls, sizeof cls);
    tp_status st = tp_new_method(cls, PY_METHOD, py_method, NULL);
    if (st != TP_OK && st != TP_EALREADY)
        return (tp_value *)raise_last(st);
    Py_INCREF(o);
    tp_value *v = tp_value_object(cls, o, py_object_destroy);
    if (!v) {
        Py_DECREF(o);
        PyErr_NoMemory();
    }
    return v;
}

/* ---- Arrays lent to the library (VALUE-10) ---------------------------------------------- */

/*
 * A large array is sent from its own buffer: the tensor borrows the
 * Py_buffer, and the library hands it back when the value and the frame
 * that sends it are gone, on whatever thread that is, the I/O thread
 * included, which must not take the GIL. So a returned buffer waits on a
 * lock-free stack, and PyBuffer_Release runs later with the GIL: on the
 * main thread through Py_AddPendingCall (callable without the GIL), and
 * whenever this module converts an array or ends a wait slice.
 */
#define LEND_MIN (64 * 1024) /* smaller arrays are copied: cheaper than lending */

typedef struct lent {
    Py_buffer b;
    struct lent *next;
} lent;

static _Atomic(lent *) lent_returned;
static atomic_int lent_pending_call; /* one pending call scheduled at a time */

static void lent_drain(void) { /* the GIL held */
    lent *l = atomic_exchange(&lent_returned, NULL);
    while (l) {
        lent *next = l->next;
        PyBuffer_Release(&l->b);
        PyMem_RawFree(l);
        l = next;
    }
}

static int lent_pending(void *unused) {
    (void)unused;
    atomic_store(&lent_pending_call, 0);
    lent_drain();
    return 0;
}

static void lent_release(void *ctx) { /* any thread, no GIL */
    lent *l = ctx;
    l->next = atomic_load(&lent_returned);
    while (!atomic_compare_exchange_weak(&lent_returned, &l->next, l))
        ;
    if (!atomic_exchange(&lent_pending_call, 1) && Py_AddPendingCall(lent_pending, NULL) != 0)
        atomic_store(&lent_pending_call, 0); /* the queue is full: a later drain frees it */
}

/* A typed buffer (a numpy array) as a tensor: dtype from its format. 1, 0
 * when no dtype fits, -1 when its elements are in the other byte order:
 * tensors carry the native one (WIRE-5), and reading big-endian elements as
 * native would send other numbers, so such a buffer is refused (as
 * torch.from_numpy refuses it). Single bytes have no order. */
static int dtype_of(const Py_buffer *b, tp_dtype *out) {
    const char *f = b->format ? b->format : "B";
    int foreign = 0;
    for (; *f == '<' || *f == '=' || *f == '@' || *f == '!' || *f == '>'; f++) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        foreign = *f == '>' || *f == '!';
#else
        foreign = *f == '<';
#endif
    }
    if (foreign && b->itemsize > 1)
        return -1;
    static const struct {
        char c;
        Py_ssize_t size;
        tp_dtype d;
    } map[] = {{'f', 4, TP_DTYPE_FLOAT32}, {'d', 8, TP_DTYPE_FLOAT64}, {'e', 2, TP_DTYPE_FLOAT16},
               {'b', 1, TP_DTYPE_INT8},    {'h', 2, TP_DTYPE_INT16},   {'i', 4, TP_DTYPE_INT32},
               {'l', 8, TP_DTYPE_INT64},   {'q', 8, TP_DTYPE_INT64},   {'B', 1, TP_DTYPE_UINT8},
               {'?', 1, TP_DTYPE_BOOL},    {'H', 2, TP_DTYPE_UINT16},  {'I', 4, TP_DTYPE_UINT32},
               {'L', 8, TP_DTYPE_UINT64},  {'Q', 8, TP_DTYPE_UINT64}};
    if (f[0] == 'Z' && f[1] && !f[2]) { /* complex: 'Zf', 'Zd' */
        if (f[1] == 'f' && b->itemsize == 8)
            *out = TP_DTYPE_COMPLEX64;
        else if (f[1] == 'd' && b->itemsize == 16)
            *out = TP_DTYPE_COMPLEX128;
        else
            return 0;
        return 1;
    }
    if (f[0] && !f[1])
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (map[i].c == f[0] && map[i].size == b->itemsize) {
                *out = map[i].d;
                return 1;
            }
    return 0;
}

/* The dtype named name (tp_dtype_name's words), or -1. */
static int dtype_named(const char *name) {
    for (int d = 0; d < TP_DTYPE_COUNT_; d++)
        if (strcmp(tp_dtype_name((tp_dtype)d), name) == 0)
            return d;
    return -1;
}

/* An object the Python layer's adapter turns into a buffer (a torch tensor's
 * numpy view, a DLPack import): a tensor over that buffer. *none is set when
 * the adapter does not take the object (NULL returned, no error set). */
static tp_value *adapted_value(PyObject *o, const char *where, int *none) {
    *none = 1;
    if (!adapter)
        return NULL;
    PyObject *r = PyObject_CallFunction(adapter, "Os", o, where);
    if (!r) {
        *none = 0;
        return NULL;
    }
    if (r == Py_None) {
        Py_DECREF(r);
        return NULL;
    }
    *none = 0;
    PyObject *buf = NULL, *dt = NULL;
    tp_value *v = NULL;
    if (!PyTuple_Check(r) || !PyArg_ParseTuple(r, "OO", &buf, &dt)) {
        PyErr_Format(PyExc_TypeError, "%s: the tensor adapter must return (buffer, dtype)", where);
    } else if (dt != Py_None && !PyUnicode_Check(dt)) {
        PyErr_Format(PyExc_TypeError, "%s: the tensor adapter's dtype must be a str", where);
    } else {
        const char *name = dt == Py_None ? NULL : PyUnicode_AsUTF8(dt);
        if (dt == Py_None || name) /* else a str that is not UTF-8: its error is set */
            v = buffer_value(buf, where, name);
    }
    Py_DECREF(r);
    return v;
}

/* dtype, when not NULL, names the tensor's dtype over the buffer's element
 * format (bfloat16 travels from an int16 view: numpy has no bfloat16). */
static tp_value *buffer_value(PyObject *o, const char *where, const char *dtype) {
    lent_drain();
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        if (!dtype) { /* a strided array: the adapter packs it (one copy), as PyTorch does */
            int none;
            tp_value *v = adapted_value(o, where, &none);
            if (v || !none)
                return v;
        }
        return (tp_value *)PyErr_Format(PyExc_TypeError,
                                        "%s: a '%s' is sent as a tensor only when C-contiguous "
                                        "(numpy.ascontiguousarray)",
                                        where, Py_TYPE(o)->tp_name);
    }
    tp_dtype d;
    int64_t shape[64];
    tp_value *v = NULL;
    int found = 0;
    int named = dtype ? dtype_named(dtype) : -1;
    int known = named >= 0 && tp_dtype_size((tp_dtype)named) == (size_t)b.itemsize;
    if (known)
        d = (tp_dtype)named;
    if (dtype && !known) {
        PyErr_Format(PyExc_TypeError, "%s: dtype '%s' does not fit elements of %zd bytes", where,
                     dtype, b.itemsize);
    } else if (!dtype && (found = dtype_of(&b, &d)) != 1) {
        if (found < 0)
            PyErr_Format(PyExc_TypeError,
                         "%s: a '%s' of element format '%s' is not in this machine's byte "
                         "order, which tensors carry (numpy: a.astype(a.dtype.newbyteorder('=')))",
                         where, Py_TYPE(o)->tp_name, b.format);
        else
            PyErr_Format(PyExc_TypeError, "%s: a '%s' of element format '%s' has no tensor dtype",
                         where, Py_TYPE(o)->tp_name, b.format ? b.format : "B");
    } else if (b.ndim > 64) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions is too many", where, b.ndim);
    } else {
        for (int i = 0; i < b.ndim; i++)
            shape[i] = b.shape ? (int64_t)b.shape[i] : (int64_t)(b.len / b.itemsize);
        lent *l = b.len >= LEND_MIN ? PyMem_RawMalloc(sizeof *l) : NULL;
        if (l) { /* sent from the array's memory; the value keeps the buffer */
            l->b = b;
            v = tp_value_tensor_borrow(d, b.ndim, shape, b.buf, lent_release, l);
            if (v)
                return v;
            PyMem_RawFree(l); /* not borrowable (alignment): copied below */
        }
        v = tp_value_tensor(d, b.ndim, shape, NULL, b.buf);
        if (!v)
            raise_last(TP_EINVAL);
    }
    PyBuffer_Release(&b);
    return v;
}

/* A received tensor: owns its value; numpy views its bytes (the Python
 * layer makes the array, so numpy is needed only by those who send arrays). */
typedef struct {
    PyObject_HEAD tp_value *v;
} TensorObject;

static void tensor_dealloc(TensorObject *o) {
    tp_value_free(o->v);
    PyObject_Free(o);
}

static int tensor_getbuffer(TensorObject *o, Py_buffer *view, int flags) {
    size_t len = (size_t)tp_tensor_numel(o->v) * tp_dtype_size(tp_tensor_dtype(o->v));
    return PyBuffer_FillInfo(view, (PyObject *)o, tp_tensor_data(o->v), (Py_ssize_t)len, 0, flags);
}

static PyObject *tensor_dtype(TensorObject *o, void *unused) {
    (void)unused;
    return PyUnicode_FromString(tp_dtype_name(tp_tensor_dtype(o->v)));
}

static PyObject *tensor_shape(TensorObject *o, void *unused) {
    (void)unused;
    int n = tp_tensor_ndim(o->v);
    const int64_t *shape = tp_tensor_shape(o->v);
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong((long long)shape[i]));
    return t;
}

static PyBufferProcs tensor_buffer = {(getbufferproc)tensor_getbuffer, NULL};
static PyGetSetDef tensor_getset[] = {{"dtype", (getter)tensor_dtype, NULL, NULL, NULL},
                                      {"shape", (getter)tensor_shape, NULL, NULL, NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};
static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensorplay._rpc.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &tensor_buffer,
    .tp_getset = tensor_getset,
};

static PyObject *rref_wrap(tp_rref *r);

static PyObject *from_value(const tp_value *v, int depth) {
    if (depth > NEST_MAX) {
        PyErr_Format(PyExc_ValueError, "a received value nests more than %d deep", NEST_MAX);
        return NULL;
    }
    switch (tp_value_kind(v)) {
    case TP_KIND_NIL:
        Py_RETURN_NONE;
    case TP_KIND_BOOL: {
        int b = 0;
        tp_value_get_bool(v, &b);
        return PyBool_FromLong(b);
    }
    case TP_KIND_INT: {
        int64_t x = 0;
        tp_value_get_int(v, &x);
        return PyLong_FromLongLong((long long)x);
    }
    case TP_KIND_FLOAT: {
        double d = 0;
        tp_value_get_float(v, &d);
        return PyFloat_FromDouble(d);
    }
    case TP_KIND_STR: {
        const char *s = NULL;
        size_t len = 0;
        tp_value_get_str(v, &s, &len);
        return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "strict");
    }
    case TP_KIND_BYTES: {
        const void *p = NULL;
        size_t len = 0;
        tp_value_get_bytes(v, &p, &len);
        if (tp_bytes_is_opaque(v))
            return unpickled(p, len);
        return PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
    }
    case TP_KIND_LIST: { /* a tuple stays one (VALUE-11) */
        size_t n = tp_list_len(v);
        int tuple = tp_list_is_tuple(v);
        PyObject *list = tuple ? PyTuple_New((Py_ssize_t)n) : PyList_New((Py_ssize_t)n);
        for (size_t i = 0; list && i < n; i++) {
            PyObject *x = from_value(tp_list_get(v, i), depth + 1);
            if (!x) {
                Py_DECREF(list);
                return NULL;
            }
            if (tuple)
                PyTuple_SET_ITEM(list, (Py_ssize_t)i, x);
            else
                PyList_SET_ITEM(list, (Py_ssize_t)i, x);
        }
        return list;
    }
    case TP_KIND_MAP: {
        PyObject *d = PyDict_New();
        for (size_t i = 0; d && i < tp_map_len(v); i++) {
            PyObject *x = from_value(tp_map_value_at(v, i), depth + 1);
            if (!x || PyDict_SetItemString(d, tp_map_key_at(v, i), x) != 0) {
                Py_XDECREF(x);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(x);
        }
        return d;
    }
    case TP_KIND_RREF: {
        tp_rref *r = NULL;
        tp_value_get_rref(v, &r);
        return rref_wrap(tp_rref_clone(r));
    }
    case TP_KIND_TENSOR: {
        /* The array views the received elements (VALUE-13): the value they
         * came in is the library's, and the view keeps them alive after it.
         * A strided tensor (never received; a local value) is copied. */
        TensorObject *t = PyObject_New(TensorObject, &TensorType);
        if (!t)
            return NULL;
        t->v = tp_tensor_is_contiguous(v) ? tp_tensor_view(v) : tp_value_clone(v);
        if (!t->v) {
            PyObject_Free(t);
            return PyErr_NoMemory();
        }
        return (PyObject *)t;
    }
    case TP_KIND_OBJECT: {
        const char *cls = NULL;
        void *state = NULL;
        tp_value_get_object(v, &cls, &state);
        if (strncmp(cls, "py:", 3) != 0)
            return PyErr_Format(PyExc_TypeError, "an object of C class '%s' has no Python form",
                                cls);
        return Py_NewRef((PyObject *)state);
    }
    case TP_KIND_WORKER_INFO: {
        tp_worker_info info;
        tp_value_get_worker_info(v, &info);
        return Py_BuildValue("(sI)", info.name, info.id);
    }
    default:
        PyErr_Format(PyExc_TypeError, "a received value of kind '%s' has no Python form yet",
                     tp_kind_name(tp_value_kind(v)));
        return NULL;
    }
}

/* ---- The served side: "py:call" ------------------------------------------------------ */

/* Formats the current Python exception as "Type: message\n<traceback>" into call's error. */
static void exception_to_call(tp_call *call) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = NULL;
    PyObject *tbmod = PyImport_ImportModule("traceback");
    if (tbmod) {
        PyObject *lines = PyObject_CallMethod(tbmod, "format_exception", "OOO", type,
                                              value ? value : Py_None, tb ? tb : Py_None);
        if (lines) {
            PyObject *empty = PyUnicode_FromString("");
            text = empty ? PyUnicode_Join(empty, lines) : NULL;
            Py_XDECREF(empty);
            Py_DECREF(lines);
        }
        Py_DECREF(tbmod);
    }
    /* "module.Qualname" (just "Name" for builtins): the caller rebuilds the
     * exception as that class when it has it (PyTorch raises the remote type). */
    PyObject *qual = type ? PyObject_GetAttrString(type, "__qualname__") : NULL;
    PyObject *mod = type ? PyObject_GetAttrString(type, "__module__") : NULL;
    PyErr_Clear();
    const char *q = qual && PyUnicode_Check(qual) ? PyUnicode_AsUTF8(qual) : NULL;
    const char *md = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
    char name[256];
    if (q && md && strcmp(md, "builtins") != 0)
        snprintf(name, sizeof name, "%s.%s", md, q);
    else
        snprintf(name, sizeof name, "%s", q ? q : "Exception");
    PyObject *msg = value ? PyObject_Str(value) : NULL;
    const char *m = msg ? PyUnicode_AsUTF8(msg) : NULL;
    const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
    tp_call_set_error(call, "%s: %s\n%s", name, m ? m : "", t ? t : "");
    PyErr_Clear();
    Py_XDECREF(qual);
    Py_XDECREF(mod);
    Py_XDECREF(msg);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* Whether a served call's result keeps objects (remote(): the value stays
 * on its owner) or must travel (rpc_sync: pickled under allow_pickle): the
 * caller's flag at args[i], else keep. */
static int keeps_objects(const tp_value *args, size_t i) {
    int keep = 1;
    if (tp_list_len(args) > i)
        tp_value_get_bool(tp_list_get(args, i), &keep);
    return keep;
}

static tp_status py_call(tp_call *call, const tp_value *args, const tp_value *kwargs,
                         tp_value **result, void *user_data) {
    (void)user_data;
    PyGILState_STATE g = gil_enter();
    tp_status st = TP_OK;
    PyObject *pargs = NULL, *pkw = NULL, *out = NULL;
    if (!dispatcher) {
        tp_call_set_error(call, "RuntimeError: no Python dispatcher is registered");
        st = TP_EINVAL;
        goto done;
    }
    pargs = from_value(args, 0);
    pkw = pargs ? from_value(kwargs, 0) : NULL;
    if (!pkw) {
        exception_to_call(call);
        st = TP_ETYPE;
        goto done;
    }
    tp_call *outer = serving;
    serving = call;
    answered_later = 0;
    out = PyObject_CallFunctionObjArgs(dispatcher, pargs, pkw, NULL);
    int later = answered_later;
    serving = outer;
    answered_later = 0;
    if (!out) {
        exception_to_call(call);
        st = TP_EREMOTE;
        goto done;
    }
    if (later) /* FUNC-7: the future answers; the return value is not the answer */
        goto done;
    *result = to_value(out, "the result", 0, keeps_objects(args, 4));
    if (!*result) { /* the callee's own error, rebuilt as its class at the caller */
        exception_to_call(call);
        st = TP_EREMOTE;
    }
done:
    Py_XDECREF(pargs);
    Py_XDECREF(pkw);
    Py_XDECREF(out);
    PyGILState_Release(g);
    return st;
}

/* Every Python object's method: args [name, args, kwargs, keep] on tp_call_self's object. */
static tp_status py_method(tp_call *call, const tp_value *args, const tp_value *kwargs,
                           tp_value **result, void *user_data) {
    (void)kwargs, (void)user_data;
    PyGILState_STATE g = gil_enter();
    tp_status st = TP_OK;
    PyObject *self = NULL, *wire = NULL, *out = NULL;
    const tp_value *obj = tp_call_self(call);
    self = obj ? from_value(obj, 0) : NULL;
    wire = self ? from_value(args, 0) : NULL;
    if (!wire || !PyList_Check(wire) || PyList_GET_SIZE(wire) < 3 || PyList_GET_SIZE(wire) > 4 ||
        !PyUnicode_Check(PyList_GET_ITEM(wire, 0)) ||
        !(PyList_Check(PyList_GET_ITEM(wire, 1)) || PyTuple_Check(PyList_GET_ITEM(wire, 1))) ||
        !PyDict_Check(PyList_GET_ITEM(wire, 2))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a method call is [name, args, kwargs, keep]");
        exception_to_call(call);
        st = TP_EPROTO;
        goto done;
    }
    if (!method_dispatcher) {
        tp_call_set_error(call, "RuntimeError: no Python method dispatcher is registered");
        st = TP_EINVAL;
        goto done;
    }
    tp_call *outer = serving;
    serving = call;
    answered_later = 0;
    out = PyObject_CallFunctionObjArgs(method_dispatcher, self, PyList_GET_ITEM(wire, 0),
                                       PyList_GET_ITEM(wire, 1), PyList_GET_ITEM(wire, 2), NULL);
    int later = answered_later;
    serving = outer;
    answered_later = 0;
    if (!out) {
        exception_to_call(call);
        st = TP_EREMOTE;
        goto done;
    }
    if (later) /* FUNC-7, METHOD-4: the future answers */
        goto done;
    *result = to_value(out, "the result", 0, keeps_objects(args, 3));
    if (!*result) {
        exception_to_call(call);
        st = TP_ETYPE;
    }
done:
    Py_XDECREF(self);
    Py_XDECREF(wire);
    Py_XDECREF(out);
    PyGILState_Release(g);
    return st;
}

/* ---- Futures ----------------------------------------------------------------------- */

static PyObject *future_wrap(tp_future *f) {
    FutureObject *o = PyObject_New(FutureObject, &FutureType);
    if (!o) {
        tp_future_free(f);
        return NULL;
    }
    o->f = f;
    return (PyObject *)o;
}

static void future_dealloc(FutureObject *o) {
    tp_future_free(o->f);
    PyObject_Free(o);
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* wait(cancel=False): the value, or raises; waits as long as the call lasts
 * (its own timeout ends it), in slices so Ctrl-C in the main thread
 * interrupts it within one. cancel: rpc_sync's wait, where Ctrl-C also
 * gives the call up (CANCEL-1). */
static PyObject *future_wait(FutureObject *o, PyObject *args) {
    int cancel = 0;
    if (!PyArg_ParseTuple(args, "|p", &cancel))
        return NULL;
    tp_status st;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS st = tp_future_wait(o->f, WAIT_SLICE_S);
        Py_END_ALLOW_THREADS
        lent_drain();
        if (tp_future_done(o->f)) {
            /* It may have completed just as the slice ran out: its own
             * status, not the slice's timeout (returns at once). */
            st = tp_future_wait(o->f, TP_TIMEOUT_INFINITE);
            break;
        }
        if (st != TP_ETIMEDOUT)
            break; /* the worker is shutting down, or the wait was refused */
        if (PyErr_CheckSignals() < 0) {
            if (cancel) /* nobody will wait for it again: the drain need not either */
                tp_future_cancel(o->f);
            return NULL; /* KeyboardInterrupt */
        }
    }
    if (st != TP_OK)
        return raise_last(st);
    const tp_value *v = tp_future_value(o->f);
    return v ? from_value(v, 0) : Py_NewRef(Py_None);
}

/* _wait_done(slice_s): waits up to slice_s for completion (the GIL released);
 * whether it is complete. Never raises the future's error. */
static PyObject *future_wait_done(FutureObject *o, PyObject *args) {
    double slice = WAIT_SLICE_S;
    if (!PyArg_ParseTuple(args, "|d", &slice))
        return NULL;
    if (!tp_future_done(o->f)) {
        Py_BEGIN_ALLOW_THREADS tp_future_wait(o->f, slice > 0 ? slice : WAIT_SLICE_S);
        Py_END_ALLOW_THREADS
    }
    lent_drain();
    return PyBool_FromLong(tp_future_done(o->f));
}

static void done_trampoline(tp_future *f, void *user_data) {
    (void)f;
    PyGILState_STATE g = gil_enter();
    PyObject *cb = user_data;
    PyObject *r = PyObject_CallNoArgs(cb);
    if (!r)
        PyErr_WriteUnraisable(cb);
    Py_XDECREF(r);
    Py_DECREF(cb);
    PyGILState_Release(g);
}

/* _add_done_callback(cb): cb() runs on a pool thread once the future completes. */
static PyObject *future_add_done(FutureObject *o, PyObject *cb) {
    if (!PyCallable_Check(cb))
        return PyErr_Format(PyExc_TypeError, "add_done_callback needs a callable");
    Py_INCREF(cb);
    tp_status st = tp_future_add_done_callback(o->f, done_trampoline, cb);
    if (st != TP_OK) {
        Py_DECREF(cb);
        return raise_last(st);
    }
    Py_RETURN_NONE;
}

/* _set_result(value) / _set_exception(text): completes a future made by
 * future_new (FUTURE-9); a second completion raises ValueError. */
static PyObject *future_set_result(FutureObject *o, PyObject *value) {
    tp_value *v = to_value(value, "set_result", 0, 0);
    if (!v)
        return NULL;
    tp_status st = tp_future_set_result(o->f, v); /* takes v */
    if (st != TP_OK)
        return raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *future_set_exception(FutureObject *o, PyObject *args) {
    const char *text;
    if (!PyArg_ParseTuple(args, "s", &text))
        return NULL;
    tp_status st = tp_future_set_error(o->f, TP_EREMOTE, text);
    if (st != TP_OK)
        return raise_last(st);
    Py_RETURN_NONE;
}

static PyMethodDef future_methods[] = {
    {"wait", (PyCFunction)future_wait, METH_VARARGS, "wait(cancel=False): the value, or raises"},
    {"_wait_done", (PyCFunction)future_wait_done, METH_VARARGS, NULL},
    {"_add_done_callback", (PyCFunction)future_add_done, METH_O, NULL},
    {"_set_result", (PyCFunction)future_set_result, METH_O, NULL},
    {"_set_exception", (PyCFunction)future_set_exception, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject FutureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensorplay._rpc.Future",
    .tp_basicsize = sizeof(FutureObject),
    .tp_dealloc = (destructor)future_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = future_methods,
};

/* ---- RRefs ------------------------------------------------------------------------ */

static PyObject *rref_wrap(tp_rref *r) {
    if (!r)
        return PyErr_NoMemory();
    RRefObject *o = PyObject_New(RRefObject, &RRefType);
    if (!o) {
        tp_rref_release(r);
        return NULL;
    }
    o->r = r;
    return (PyObject *)o;
}

static void rref_dealloc(RRefObject *o) {
    tp_rref *r = o->r;
    /* The release may send a delete: never with the GIL held across a wait,
     * and it does not wait. */
    tp_rref_release(r);
    PyObject_Free(o);
}

static PyObject *rref_to_here(RRefObject *o, PyObject *args) {
    double timeout = TP_TIMEOUT_DEFAULT;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    tp_value *v = NULL;
    tp_status st;
    Py_BEGIN_ALLOW_THREADS st = tp_rref_to_here(o->r, timeout, &v);
    Py_END_ALLOW_THREADS if (st != TP_OK) return raise_last(st);
    PyObject *out = from_value(v, 0);
    tp_value_free(v);
    return out;
}

static PyObject *rref_local_value(RRefObject *o, PyObject *unused) {
    (void)unused;
    const tp_value *v = NULL;
    tp_status st;
    Py_BEGIN_ALLOW_THREADS st = tp_rref_local_value(o->r, &v);
    Py_END_ALLOW_THREADS if (st != TP_OK) return raise_last(st);
    return from_value(v, 0);
}

static PyObject *rref_owner(RRefObject *o, PyObject *unused) {
    (void)unused;
    tp_worker_info info;
    tp_status st = tp_rref_owner(o->r, &info);
    if (st != TP_OK)
        return raise_last(st);
    return Py_BuildValue("(sI)", info.name, info.id);
}

static PyObject *rref_is_owner(RRefObject *o, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(tp_rref_is_owner(o->r));
}

/* _ids(): ((worker, local), (worker, local)): the value's id and this fork's. */
static PyObject *rref_ids(RRefObject *o, PyObject *unused) {
    (void)unused;
    tp_rref_gid id, fork;
    tp_status st = tp_rref_ids(o->r, &id, &fork);
    if (st != TP_OK)
        return raise_last(st);
    return Py_BuildValue("((IK)(IK))", id.worker, (unsigned long long)id.local, fork.worker,
                         (unsigned long long)fork.local);
}

static PyObject *rref_confirmed(RRefObject *o, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(tp_rref_confirmed_by_owner(o->r));
}

static PyMethodDef rref_methods[] = {
    {"to_here", (PyCFunction)rref_to_here, METH_VARARGS, "to_here(timeout=-1): a copy"},
    {"local_value", (PyCFunction)rref_local_value, METH_NOARGS, NULL},
    {"_owner", (PyCFunction)rref_owner, METH_NOARGS, NULL},
    {"is_owner", (PyCFunction)rref_is_owner, METH_NOARGS, NULL},
    {"confirmed_by_owner", (PyCFunction)rref_confirmed, METH_NOARGS, NULL},
    {"_ids", (PyCFunction)rref_ids, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RRefType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensorplay._rpc.RRef",
    .tp_basicsize = sizeof(RRefObject),
    .tp_dealloc = (destructor)rref_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = rref_methods,
};

/* ---- Module functions ------------------------------------------------------------- */

static int parse_dest(PyObject *to, tp_dest *d) {
    if (PyUnicode_Check(to)) {
        const char *s = PyUnicode_AsUTF8(to);
        if (!s)
            return 0;
        *d = tp_to_name(s);
        return 1;
    }
    if (PyLong_Check(to)) {
        long r = PyLong_AsLong(to);
        if (r == -1 && PyErr_Occurred())
            return 0;
        if (r < INT_MIN || r > INT_MAX) { /* as an int it would name another rank */
            PyErr_Format(PyExc_RuntimeError, "no worker with rank %ld: a rank is an int", r);
            return 0;
        }
        *d = tp_to_rank((int)r);
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "to must be a worker name, rank or WorkerInfo, not '%s'",
                 Py_TYPE(to)->tp_name);
    return 0;
}

/* The wire arguments of a Python call: [module, qualname, args, kwargs,
 * keep, timeout_s]. keep is 1 for remote(), whose result stays on the callee
 * as an object when no value kind holds it; timeout_s is the call's deadline
 * (0: none), which bounds the callee's wait for a name still being defined.
 * A callable that travels pickled (allow_pickle) is module None and the
 * callable itself in qualname's place. */
static tp_value *call_args(PyObject *module, PyObject *qualname, PyObject *args,
                           PyObject *kwargs, int keep, double timeout_s) {
    tp_value *m = to_value(module, "the function's module", 1, 0);
    tp_value *q = m ? to_value(qualname, "the function", 1, 0) : NULL;
    tp_value *a = q ? to_value(args, "args", 1, 0) : NULL;
    tp_value *k = a ? to_value(kwargs, "kwargs", 1, 0) : NULL;
    if (!k) {
        tp_value_free(m);
        tp_value_free(q);
        tp_value_free(a);
        return NULL;
    }
    tp_value *v = tp_value_list_of(6, m, q, a, k, tp_value_bool(keep), tp_value_float(timeout_s));
    if (!v)
        PyErr_NoMemory();
    return v;
}

/* call(to, module, qualname, args, kwargs, deadline_s, timeout, remote): a
 * Python function on worker `to`: a Future, or (remote) an RRef to its
 * result. deadline_s is the timeout in effect (the default resolved). */
static PyObject *m_call(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *to, *pargs, *pkw, *module, *qualname;
    double deadline_s, timeout;
    int remote;
    if (!PyArg_ParseTuple(args, "OOOO!O!ddp", &to, &module, &qualname, &PyTuple_Type, &pargs,
                          &PyDict_Type, &pkw, &deadline_s, &timeout, &remote))
        return NULL;
    tp_dest d;
    if (!parse_dest(to, &d))
        return NULL;
    tp_value *wire = call_args(module, qualname, pargs, pkw, remote, deadline_s);
    if (!wire)
        return NULL;
    tp_future *f = NULL;
    tp_rref *r = NULL;
    tp_status st;
    Py_BEGIN_ALLOW_THREADS st = remote ? tp_remote(d, PY_CALL_FN, wire, NULL, timeout, &r)
                                       : tp_rpc_async(d, PY_CALL_FN, wire, NULL, timeout, &f);
    Py_END_ALLOW_THREADS tp_value_free(wire);
    if (st != TP_OK)
        return raise_last(st);
    return remote ? rref_wrap(r) : future_wrap(f);
}

/* ---- Init and shutdown that Ctrl-C interrupts (INTERRUPT-1) ---------------------- */

/*
 * tp_init_rpc and a graceful tp_shutdown block for seconds. They run on a
 * thread of their own while the calling thread, without the GIL, wakes every
 * WAIT_SLICE_S to look for Ctrl-C (and, for shutdown(timeout=), for the
 * deadline); either one makes the library give the call up with
 * tp_interrupt, again each slice until it returns (an interrupt that comes
 * before the call blocks is dropped by the library).
 */
typedef struct lifecycle_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int init; /* 1: tp_init_rpc; 0: tp_shutdown(graceful) */
    const char *name, *backend;
    int rank, world, graceful;
    tp_options *opts;
    tp_status st;
    char msg[TP_ERRMSG_LEN_MAX];
} lifecycle_job;

static void lifecycle_run(lifecycle_job *j) {
    tp_status st = j->init ? tp_init_rpc(j->name, j->backend, j->rank, j->world, j->opts)
                           : tp_shutdown(j->graceful);
    snprintf(j->msg, sizeof j->msg, "%s", st != TP_OK ? tp_errmsg() : ""); /* thread-local */
    pthread_mutex_lock(&j->mu);
    j->st = st;
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void *lifecycle_thread(void *arg) {
    lifecycle_run(arg);
    return NULL;
}

/* Runs j; returns 1 when Ctrl-C interrupted it (KeyboardInterrupt is set),
 * and sets *timed_out when deadline_s (> 0) passed first. */
static int lifecycle_call(lifecycle_job *j, double deadline_s, int *timed_out) {
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->done = 0;
    *timed_out = 0;
    pthread_t t;
    int threaded = pthread_create(&t, NULL, lifecycle_thread, j) == 0;
    if (!threaded) { /* no thread to be had: the call as it is, not interruptible */
        Py_BEGIN_ALLOW_THREADS lifecycle_run(j);
        Py_END_ALLOW_THREADS
    }
    double end = deadline_s > 0 ? monotonic_s() + deadline_s : 0;
    int signalled = 0, interrupting = 0;
    for (int done = !threaded; !done;) {
        Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&j->mu);
        if (!j->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts); /* the condvar's clock */
            long ns = ts.tv_nsec + (long)(WAIT_SLICE_S * 1e9);
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        done = j->done;
        pthread_mutex_unlock(&j->mu);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        if (!signalled && PyErr_CheckSignals() < 0)
            signalled = interrupting = 1;
        if (!interrupting && end > 0 && monotonic_s() >= end)
            *timed_out = interrupting = 1;
        if (interrupting)
            tp_interrupt();
    }
    if (threaded)
        pthread_join(t, NULL);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    return signalled;
}

static PyObject *m_init_rpc(PyObject *self, PyObject *args) {
    (void)self;
    const char *name, *backend;
    int rank, world;
    double rpc_timeout, init_timeout;
    int threads;
    const char *init_method;
    double shutdown_timeout;
    PyObject *keys;
    if (!PyArg_ParseTuple(args, "ssiiddizdO!", &name, &backend, &rank, &world, &rpc_timeout,
                          &init_timeout, &threads, &init_method, &shutdown_timeout, &PyDict_Type,
                          &keys))
        return NULL;
    tp_options *o = tp_options_new();
    if (!o)
        return PyErr_NoMemory();
    tp_status st = tp_options_set_rpc_timeout(o, rpc_timeout);
    if (st == TP_OK && init_timeout >= 0)
        st = tp_options_set_init_timeout(o, init_timeout);
    if (st == TP_OK && shutdown_timeout >= 0)
        st = tp_options_set_shutdown_timeout(o, shutdown_timeout);
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (st == TP_OK && PyDict_Next(keys, &pos, &key, &val)) { /* backend keys (OPT-6) */
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        const char *v = PyUnicode_Check(val) ? PyUnicode_AsUTF8(val) : NULL;
        if (!k || !v) {
            tp_options_free(o);
            return PyErr_Format(PyExc_TypeError, "backend options are str keys and str values");
        }
        st = tp_options_set(o, k, v);
    }
    if (st == TP_OK && threads > 0)
        st = tp_options_set_num_worker_threads(o, threads);
    if (st == TP_OK && init_method)
        st = tp_options_set_init_method(o, init_method);
    if (st == TP_OK) {
        st = tp_register_function(PY_CALL_FN, py_call, NULL);
        if (st == TP_EALREADY)
            st = TP_OK;
    }
    if (st != TP_OK) {
        tp_options_free(o);
        return raise_last(st);
    }
    lifecycle_job j = {.init = 1, .name = name, .backend = backend, .rank = rank, .world = world,
                       .opts = o};
    int timed_out;
    int signalled = lifecycle_call(&j, 0, &timed_out);
    tp_options_free(o);
    if (signalled) {
        if (j.st == TP_OK) { /* Ctrl-C came after init committed: leave again */
            Py_BEGIN_ALLOW_THREADS tp_shutdown(0);
            Py_END_ALLOW_THREADS
        }
        return NULL; /* KeyboardInterrupt; the worker is down, a later init_rpc works */
    }
    if (j.st != TP_OK)
        return raise_status(j.st, j.msg);
    Py_RETURN_NONE;
}

static PyObject *m_shutdown(PyObject *self, PyObject *args) {
    (void)self;
    int graceful = 1;
    double timeout = 0;
    if (!PyArg_ParseTuple(args, "|pd", &graceful, &timeout))
        return NULL;
    lifecycle_job j = {.init = 0, .graceful = graceful};
    int timed_out;
    int signalled = lifecycle_call(&j, graceful ? timeout : 0, &timed_out);
    lent_drain(); /* every frame is gone: every lent array is back */
    if (signalled)
        return NULL; /* KeyboardInterrupt; the worker was torn down all the same */
    if (timed_out && j.st == TP_ECANCELED) {
        char m[TP_ERRMSG_LEN_MAX + 160]; /* PyErr_Format has no %g */
        snprintf(m, sizeof m,
                 "shutdown: the graceful shutdown did not finish within its timeout of %g s, so "
                 "this worker shut down locally (%s)",
                 timeout, j.msg);
        PyErr_SetString(PyExc_RuntimeError, m);
        return NULL;
    }
    if (j.st != TP_OK)
        return raise_status(j.st, j.msg);
    Py_RETURN_NONE;
}

static PyObject *m_get_worker_info(PyObject *self, PyObject *args) {
    (void)self;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "|z", &name))
        return NULL;
    tp_worker_info info;
    tp_status st = tp_get_worker_info(name, &info);
    if (st != TP_OK)
        return raise_last(st);
    return Py_BuildValue("(sI)", info.name, info.id);
}

static PyObject *m_is_initialized(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(tp_is_initialized());
}

static PyObject *m_is_available(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(tp_is_available());
}

static PyObject *m_future_new(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    tp_future *f = NULL;
    tp_status st = tp_future_new(&f);
    if (st != TP_OK)
        return raise_last(st);
    return future_wrap(f);
}

/* rref_from_value(value): an rref this worker owns holding value (RREF-17,
 * PyTorch's RRef(value)); objects stay Python objects on this worker. */
static PyObject *m_rref_from_value(PyObject *self, PyObject *value) {
    (void)self;
    tp_value *v = to_value(value, "RRef(value)", 0, 1);
    if (!v)
        return NULL;
    tp_rref *r = NULL;
    tp_status st = tp_rref_from_value(v, &r); /* takes v */
    if (st != TP_OK)
        return raise_last(st);
    return rref_wrap(r);
}

/* answer_later(future): the function being served on this thread answers
 * with that future's outcome (FUNC-7, @async_execution). */
static PyObject *m_answer_later(PyObject *self, PyObject *fut) {
    (void)self;
    if (!PyObject_TypeCheck(fut, &FutureType))
        return PyErr_Format(PyExc_TypeError, "answer_later needs a Future, not '%s'",
                            Py_TYPE(fut)->tp_name);
    if (!serving)
        return PyErr_Format(PyExc_RuntimeError, "answer_later: no served call on this thread");
    tp_status st = tp_call_answer_later(serving, ((FutureObject *)fut)->f);
    if (st != TP_OK)
        return raise_last(st);
    answered_later = 1;
    Py_RETURN_NONE;
}

/* serving_caller(): the name of the worker whose call this thread serves,
 * None outside a served call (who sent a gather contribution, not who it
 * says it is). */
static PyObject *m_serving_caller(PyObject *self, PyObject *noargs) {
    (void)self, (void)noargs;
    if (!serving)
        Py_RETURN_NONE;
    return PyUnicode_FromString(tp_call_caller(serving)->name);
}

/* set_dispatcher(functions, methods): the Python layer's two entry points. */
static PyObject *m_set_allow_pickle(PyObject *self, PyObject *on) {
    (void)self;
    int v = PyObject_IsTrue(on);
    if (v < 0)
        return NULL;
    allow_pickle = v;
    Py_RETURN_NONE;
}

static PyObject *m_set_dispatcher(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fn, *meth;
    if (!PyArg_ParseTuple(args, "OO", &fn, &meth))
        return NULL;
    if (!PyCallable_Check(fn) || !PyCallable_Check(meth))
        return PyErr_Format(PyExc_TypeError, "the dispatchers must be callable");
    Py_XSETREF(dispatcher, Py_NewRef(fn));
    Py_XSETREF(method_dispatcher, Py_NewRef(meth));
    Py_RETURN_NONE;
}

/* set_adapter(fn): fn(object, where) -> (buffer, dtype or None) or None. */
static PyObject *m_set_adapter(PyObject *self, PyObject *fn) {
    (void)self;
    if (!PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "the adapter must be callable");
    Py_XSETREF(adapter, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *m_set_rpc_timeout(PyObject *self, PyObject *args) {
    (void)self;
    double s;
    if (!PyArg_ParseTuple(args, "d", &s))
        return NULL;
    tp_status st = tp_set_rpc_timeout(s);
    if (st != TP_OK)
        return raise_last(st);
    Py_RETURN_NONE;
}

/* job_secret_new(): a fresh job secret as hex (what tprun gives its processes). */
static PyObject *m_job_secret_new(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    char hex[129];
    tp_status st = tp_job_secret_new(hex, sizeof hex);
    if (st != TP_OK)
        return raise_last(st);
    return PyUnicode_FromString(hex);
}

/* get_worker_infos(): [(name, id), ...] of every worker in the job. */
static PyObject *m_get_worker_infos(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    tp_worker_info *infos = NULL;
    size_t n = 0;
    tp_status st = tp_get_worker_infos(&infos, &n);
    if (st != TP_OK)
        return raise_last(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(sI)", infos[i].name, infos[i].id);
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    free(infos);
    return list;
}

/* get_debug_info(): this worker's rref and call counters (RREF-16) as a dict. */
static PyObject *m_get_debug_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    tp_debug_info d;
    tp_status st = tp_get_debug_info(&d);
    if (st != TP_OK)
        return raise_last(st);
    return Py_BuildValue("{sKsKsKsKsKsKsK}", "num_owner_rrefs", (unsigned long long)d.owned_values,
                         "num_forks", (unsigned long long)d.owner_forks, "num_user_rrefs",
                         (unsigned long long)d.user_rrefs, "num_pending_users",
                         (unsigned long long)d.pending_users, "num_pending_children",
                         (unsigned long long)d.pending_children, "num_pending_protocol",
                         (unsigned long long)d.pending_protocol, "num_pending_requests",
                         (unsigned long long)d.calls_in_flight);
}

/* shutdown_leaks(): what the last graceful shutdown could not settle (RREF-18),
 * one line each as PyTorch words it ("Leaking RRef 1:3 with fork Id 2:4"). */
static PyObject *m_shutdown_leaks(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    tp_rref_leak *leaks = NULL;
    size_t n = 0;
    if (tp_shutdown_leaks(&leaks, &n) != TP_OK)
        return PyList_New(0); /* no graceful shutdown yet: nothing to report */
    static const char *const kinds[] = {"", "a fork never deleted", "a child never accepted",
                                        "a delete never acknowledged", "a value no reference holds"};
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n; i++) {
        const tp_rref_leak *l = &leaks[i];
        PyObject *s = PyUnicode_FromFormat(
            "RRef %u:%llu with fork Id %u:%llu (%s; owner rank %u, holder rank %u)",
            l->rref_worker, (unsigned long long)l->rref_n, l->fork_worker,
            (unsigned long long)l->fork_n,
            l->kind >= 1 && l->kind <= 4 ? kinds[l->kind] : "unknown", l->owner, l->holder);
        if (!s || PyList_Append(list, s) != 0)
            Py_CLEAR(list);
        Py_XDECREF(s);
    }
    free(leaks);
    return list;
}

static PyMethodDef module_methods[] = {
    {"set_adapter", m_set_adapter, METH_O, NULL},
    {"set_rpc_timeout", m_set_rpc_timeout, METH_VARARGS, NULL},
    {"job_secret_new", m_job_secret_new, METH_NOARGS, NULL},
    {"get_worker_infos", m_get_worker_infos, METH_NOARGS, NULL},
    {"get_debug_info", m_get_debug_info, METH_NOARGS, NULL},
    {"shutdown_leaks", m_shutdown_leaks, METH_NOARGS, NULL},
    {"init_rpc", m_init_rpc, METH_VARARGS, NULL},
    {"shutdown", m_shutdown, METH_VARARGS, NULL},
    {"call", m_call, METH_VARARGS, NULL},
    {"get_worker_info", m_get_worker_info, METH_VARARGS, NULL},
    {"is_available", m_is_available, METH_NOARGS, NULL},
    {"is_initialized", m_is_initialized, METH_NOARGS, NULL},
    {"set_dispatcher", m_set_dispatcher, METH_VARARGS, NULL},
    {"set_allow_pickle", m_set_allow_pickle, METH_O, NULL},
    {"future_new", m_future_new, METH_NOARGS, NULL},
    {"rref_from_value", m_rref_from_value, METH_O, NULL},
    {"answer_later", m_answer_later, METH_O, NULL},
    {"serving_caller", m_serving_caller, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tensorplay._rpc",
                                        "The C core of tensorplay.distributed.rpc", -1,
                                        module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rpc(void); /* the one symbol the module exports */
PyMODINIT_FUNC PyInit__rpc(void) {
    if (PyType_Ready(&FutureType) < 0 || PyType_Ready(&RRefType) < 0 ||
        PyType_Ready(&TensorType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    RemoteError = PyErr_NewException("tensorplay._rpc.RemoteError", PyExc_RuntimeError, NULL);
    PeerDownError = PyErr_NewException("tensorplay._rpc.PeerDownError", PyExc_RuntimeError, NULL);
    if (!RemoteError || PyModule_AddObjectRef(m, "RemoteError", RemoteError) < 0 ||
        !PeerDownError || PyModule_AddObjectRef(m, "PeerDownError", PeerDownError) < 0 ||
        PyModule_AddObjectRef(m, "Future", (PyObject *)&FutureType) < 0 ||
        PyModule_AddObjectRef(m, "RRef", (PyObject *)&RRefType) < 0 ||
        PyModule_AddObjectRef(m, "Tensor", (PyObject *)&TensorType) < 0 ||
        PyModule_AddIntConstant(m, "TIMEOUT_DEFAULT", -1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
