"""Request's token bookkeeping helpers."""

from engine.request import RequestStatus
from tests.engine.factories import make_requests


def test_token_ids_between_is_a_slice_of_all_token_ids():
    (request,) = make_requests(prompt_len=5)
    request.output_token_ids = [1, 2, 3, 4]
    num_tokens = request.num_tokens
    for start in range(num_tokens + 2):
        for end in range(start, num_tokens + 3):
            assert request.token_ids_between(start, end) == request.all_token_ids[start:end]


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
