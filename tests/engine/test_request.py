"""Request's token bookkeeping helpers."""

import pytest

from engine.request import RequestStatus
from tests.engine.factories import make_requests


def test_token_ids_between_is_a_slice_of_all_token_ids():
    (request,) = make_requests(prompt_len=5)
    request.output_token_ids = [1, 2, 3, 4]
    num_tokens = request.num_tokens
    for start in range(num_tokens + 2):
        for end in range(start, num_tokens + 3):
            assert request.token_ids_between(start, end) == request.all_token_ids[start:end]


def test_token_view_reads_like_all_token_ids_without_building_it():
    (request,) = make_requests(prompt_len=5)
    request.output_token_ids = [1, 2, 3, 4]
    expected = request.all_token_ids
    view = request.token_view()
    assert len(view) == len(expected) and list(view) == expected
    for index in range(-len(expected), len(expected)):
        assert view[index] == expected[index]
    for start in (None, -3, 0, 2, 5, 7, 20):
        for stop in (None, -1, 0, 3, 5, 9, 20):
            assert view[start:stop] == expected[start:stop]
    assert view[::2] == expected[::2]
    for bad in (len(expected), -len(expected) - 1):
        with pytest.raises(IndexError):
            view[bad]
    request.output_token_ids.append(99)  # a view is the tokens as of its creation
    assert len(view) == len(expected) and view[:] == expected


def test_finish_reasons_of_statuses():
    reasons = {status: status.finish_reason for status in RequestStatus if status.finished}
    assert reasons == {
        RequestStatus.FINISHED_STOPPED: "stop",
        RequestStatus.FINISHED_LENGTH: "length",
        RequestStatus.FINISHED_ABORTED: "abort",
        RequestStatus.FINISHED_ERROR: "error",
    }
    unfinished = [s for s in RequestStatus if not s.finished]
    assert unfinished == [RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED]
    assert all(s.finish_reason is None for s in unfinished)
