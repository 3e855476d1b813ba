"""What the slice does not lower is refused by name: the kernel, its file:line and the construct."""

from __future__ import annotations

import inspect
import os

import pytest

wp = pytest.importorskip("warp")

from leapp.errors import ExportError  # noqa: E402
from leapp.lowering import lower_kernel  # noqa: E402
from refused_kernels import REFUSED  # noqa: E402


@pytest.mark.parametrize("kernel", list(REFUSED), ids=lambda k: k.key)
def test_refusal_names_kernel_file_line_and_construct(kernel):
    with pytest.raises(ExportError) as caught:
        lower_kernel(kernel)
    message = str(caught.value)
    _, first_line = inspect.getsourcelines(kernel.func)
    assert f"Warp kernel `{kernel.key}`" in message
    assert f"{os.path.basename(kernel.adj.filename)}:{first_line}" in message
    assert REFUSED[kernel] in message, message
    assert f"{kernel.adj.filename}:" in message  # the construct's own file:line


def test_branch_refusal_points_at_the_if_line():
    kernel = next(k for k in REFUSED if k.key == "k_branch")
    lines, first = inspect.getsourcelines(kernel.func)
    if_line = first + next(n for n, text in enumerate(lines) if text.strip().startswith("if "))
    with pytest.raises(ExportError, match=rf"if/else on data at .*:{if_line}\b"):
        lower_kernel(kernel)
