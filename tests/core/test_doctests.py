"""The examples in the docstrings run and print what they show (``python -m doctest`` semantics)."""

import doctest

import pytest

import fedmcmc.core.base


@pytest.mark.parametrize("module", [fedmcmc.core.base])
def test_the_docstring_examples_run(module):
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted and not failed
