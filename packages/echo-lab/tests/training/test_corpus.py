"""Offline text sources and the benchmark-overlap filter."""

from __future__ import annotations

import itertools

from echo_lab.training.corpus import OverlapFilter, excerpts, stdlib_functions


def test_overlap_filter_drops_texts_sharing_an_n_word_run() -> None:
    bench = OverlapFilter(["Write a function that returns the sum of two integers a and b"], n=6)
    assert not bench.clean("please: returns the SUM of two integers, a and b!")
    assert bench.clean("returns the sum of three integers")


def test_excerpts_are_paragraph_aligned_and_bounded() -> None:
    text = "\n\n".join(f"para {i} " + "x" * 40 for i in range(10))
    chunks = excerpts(text, 100)
    assert all(len(c) <= 100 for c in chunks)
    assert "".join(chunks).count("para") == 10


def test_stdlib_stubs_end_with_their_docstring() -> None:
    stubs = list(itertools.islice(stdlib_functions(), 20))
    assert len(stubs) == 20
    for s in stubs:
        assert s.source.startswith("def ")
        assert s.source.rstrip().endswith(('"""', "'''", '"'))
