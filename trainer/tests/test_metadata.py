"""The header check every test runs (conftest.HeaderCheck) refuses what memsim would ignore."""

from __future__ import annotations

import pytest
from conftest import HEADERS


def _header(metadata: dict[str, str]) -> dict[str, object]:
    return {
        "kind": "header",
        "format_version": 1,
        "producer": {"name": "t", "version": "0"},
        "level": "allocator",
        "metadata": metadata,
    }


@pytest.mark.parametrize(
    ("metadata", "said"),
    [
        ({"uses_gem": "true"}, "not in trace::metadata::KEYS: ['uses_gem']"),
        ({"uses_gemm": "True"}, "refused by the schema"),
        ({"batch_size": "0"}, "refused by the schema"),
        ({"amp": "float16"}, "refused by the schema"),
        ({"layer_types": "Linear,"}, "refused by the schema"),
    ],
)
def test_the_header_check_refuses_what_memsim_ignores(metadata: dict[str, str], said: str) -> None:
    with pytest.raises(AssertionError, match=said.replace("[", r"\[").replace("]", r"\]")):
        HEADERS(_header(metadata))


def test_the_header_check_accepts_the_tracers_keys() -> None:
    HEADERS(_header({"uses_gemm": "true", "layer_types": "", "amp": "bf16", "world_size": "2"}))
