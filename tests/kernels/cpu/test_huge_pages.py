"""kernels/cpu/huge_pages.py: uninitialised byte tensors over a 2 MiB-aligned mapping advised
for transparent huge pages (whether the OS grants them is its business: not asserted)."""

from __future__ import annotations

import gc
import weakref

import torch

from kernels.cpu.huge_pages import HUGE_PAGE, empty_bytes


def test_large_requests_start_on_a_huge_page_and_hold_what_is_written():
    nbytes = 3 * HUGE_PAGE + 12345
    tensor = empty_bytes(nbytes)
    assert tensor.dtype == torch.uint8 and tensor.numel() == nbytes and tensor.is_contiguous()
    assert tensor.data_ptr() % HUGE_PAGE == 0
    tensor.copy_(torch.arange(nbytes, dtype=torch.int64).remainder(251).to(torch.uint8))
    assert int(tensor[nbytes - 1]) == (nbytes - 1) % 251
    view = tensor[HUGE_PAGE : HUGE_PAGE + 50].view(-1, 5)  # views of it are ordinary tensors
    assert view.shape[1] == 5 and int(view[0, 0]) == HUGE_PAGE % 251


def test_small_requests_are_plain_tensors():
    tensor = empty_bytes(1000)
    assert tensor.numel() == 1000 and tensor.dtype == torch.uint8


def test_the_mapping_is_freed_with_its_last_view():
    tensor = empty_bytes(2 * HUGE_PAGE)
    storage = weakref.ref(tensor.untyped_storage())
    del tensor
    gc.collect()
    assert storage() is None


def test_thp_mode_reads_the_bracketed_choice(tmp_path, monkeypatch):
    from kernels.cpu import huge_pages

    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", str(setting))
    assert huge_pages.thp_mode() == "madvise"
    setting.write_text("always madvise [never]\n")
    assert huge_pages.thp_mode() == "never"
    monkeypatch.setattr(huge_pages, "THP_SETTING", str(tmp_path / "missing"))
    assert huge_pages.thp_mode() == "unknown"
