"""The examples in the package's docstrings run and give what they show."""

import doctest

import tensorcomm
import tensorcomm._arrays
import tensorcomm.errors


def test_docstring_examples():
    for module in (tensorcomm, tensorcomm.errors, tensorcomm._arrays):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{module.__name__}: {result.failed} of {result.attempted} examples failed"
        assert result.attempted > 0 or module is tensorcomm._arrays


def test_public_items_have_docstrings():
    for name in tensorcomm.__all__:
        item = getattr(tensorcomm, name)
        assert (item.__doc__ or "").strip(), f"tensorcomm.{name} has no docstring"
    for name in dir(tensorcomm.ProcessGroup):
        if not name.startswith("_"):
            assert getattr(tensorcomm.ProcessGroup, name).__doc__, f"ProcessGroup.{name} has no docstring"
    for cls in (tensorcomm.Store, tensorcomm.Work):
        for name in dir(cls):
            if not name.startswith("_"):
                assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"
