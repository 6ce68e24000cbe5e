"""PyTorch's rpc.functions: async_execution."""
import functools


def async_execution(fn):
    """Marks fn as answering with the Future it returns (ours or a
    torch.futures.Future): the reply goes when that future completes, and no
    pool thread waits for it. Works on functions, staticmethods and
    classmethods (put it innermost, as in PyTorch)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper._tp_async_execution = True
    wrapper._wrapped_async_rpc_function = fn  # PyTorch's attribute, for code that looks
    return wrapper
