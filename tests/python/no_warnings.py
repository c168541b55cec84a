"""no_warnings.py: a call that must raise no Python warning (the tests of model families)."""
import warnings


def quiet(fn, *args, **kwargs):
    """fn's result; fails on any warning raised while it runs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    assert [str(w.message) for w in caught] == []
    return result
