"""What every backend shares: a log page cut at a whole UTF-8 character, and waiting for a job to finish."""

import pytest

from tradewind.cluster import JobRecord, JobSpec, JobStatus
from tradewind.cluster.jobs import decode_log_page, wait_for_finish

TEXT = "a€b\n€€c é\n"  # "€" is three bytes and "é" two, so pages of four bytes cut inside characters


def test_a_character_straddling_the_page_end_is_left_for_the_next_page():
    data = "a€".encode()
    chunk = decode_log_page("job-1", data[:3], offset=0, size=len(data), finished=False)
    assert (chunk.text, chunk.offset, chunk.next_offset, chunk.size) == ("a", 0, 1, 4)


@pytest.mark.parametrize("limit", [4, 5, 7, 64])
def test_pages_read_on_from_next_offset_join_into_the_whole_log(limit):
    data = TEXT.encode()
    pages, offset = [], 0
    while offset < len(data):
        chunk = decode_log_page("job-1", data[offset : offset + limit], offset=offset, size=len(data), finished=True)
        assert chunk.next_offset > offset, "a page must move on"
        pages.append(chunk.text)
        offset = chunk.next_offset
    assert "".join(pages) == TEXT


def test_bytes_that_are_no_utf8_at_all_are_replaced_rather_than_stalling_the_reader():
    chunk = decode_log_page("job-1", b"\xff\xfeok", offset=10, size=14, finished=True)
    assert (chunk.text, chunk.next_offset) == ("\ufffd\ufffdok", 14)


def test_a_page_past_the_end_is_empty_and_stays_at_its_offset():
    chunk = decode_log_page("job-1", b"", offset=9, size=9, finished=True)
    assert (chunk.text, chunk.offset, chunk.next_offset, chunk.finished) == ("", 9, 9, True)


def test_waiting_returns_the_last_record_when_the_job_does_not_finish_in_time():
    pending = JobRecord(id="job-1", spec=JobSpec(name="never", command=["true"]))
    assert wait_for_finish(lambda: pending, timeout=0.05, poll_interval=0.01) is pending


def test_waiting_stops_at_the_first_finished_record():
    records = iter([JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED])
    spec = JobSpec(name="job", command=["true"])
    done = wait_for_finish(lambda: JobRecord(id="job-1", spec=spec, status=next(records)), 30, poll_interval=0)
    assert done.status is JobStatus.SUCCEEDED
