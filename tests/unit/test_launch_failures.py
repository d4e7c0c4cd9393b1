"""Failure classification and the launch report, from constructed facts (no processes)."""
import signal

import pytest

from parlab.launch import failures, report, results
from parlab.launch.errors import LaunchError, LaunchTimeout, WorkerError
from parlab.launch.failures import Failure, classify
from parlab.launch.report import Facts, explain

pytestmark = pytest.mark.unit

SEGV = -signal.SIGSEGV
TERM = -signal.SIGTERM

CRASH_REPORT = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call first):\n"
                '  File "/home/me/answer.py", line 7 in crash\n'
                '  File "/x/parlab/launch/worker.py", line 140 in main\n')
GLOO_ABORT = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
              "  what():  [enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= "
              "op.nbytes. 32 vs 8. Received data size doesn't match expected size. Is there a "
              "distributed collective mismatch in your code?\n"
              "Fatal Python error: Aborted\n\nCurrent thread 0x7f (most recent call first):\n"
              '  File "/home/me/answer.py", line 3 in ring\n')


def record(rank, message, exc_type="RuntimeError", kind="raised", time=1.0):
    return {"rank": rank, "kind": kind, "exc_type": exc_type, "message": message, "time": time,
            "traceback": f"Traceback (most recent call last):\n  ...\n{exc_type}: {message}\n"}


def test_every_rank_returned_is_no_error():
    assert explain(Facts(nproc=2, returned={0, 1}, agent_code=0)) is None


def test_a_bad_exit_after_every_rank_returned_keeps_the_results_with_a_note():
    facts = Facts(nproc=3, returned={0, 1, 2}, agent_code=1, exit_codes={0: 3, 1: TERM, 2: TERM})
    assert explain(facts) is None
    note = report.late_exit(facts)
    assert "rank 0: exit code 3" in note and "rank 1: SIGTERM" in note and "kept" in note
    assert report.late_exit(Facts(nproc=2, returned={0, 1}, agent_code=0)) is None


def test_a_bad_exit_before_every_rank_returned_is_still_an_error():
    err = explain(Facts(nproc=2, returned={0}, agent_code=1))
    assert isinstance(err, LaunchError) and "rank(s) [1] never finished" in str(err)


def test_raised():
    err = explain(Facts(nproc=2, errors={1: record(1, "not yet", "NotImplementedError")}, returned={0}))
    assert isinstance(err, WorkerError) and err.rank == 1 and err.phase == "raised"
    assert str(err).startswith("rank 1 failed: NotImplementedError: not yet")
    assert classify(err) == Failure("raised", (1,), "rank 1 raised NotImplementedError: not yet")


def test_hang_by_launch_timeout_and_by_process_group_timeout():
    timeout = explain(Facts(nproc=2, timed_out=True, returned={0}, timeout=30))
    assert isinstance(timeout, LaunchTimeout)
    assert classify(timeout) == Failure("hang", (1,), "the launch did not finish within 30 s")
    waited = explain(Facts(nproc=2, returned={0}, errors={1: record(
        1, "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for recv operation to complete")}))
    assert classify(waited).kind == "hang" and classify(waited).ranks == (1,)
    assert "a collective timed out" in str(waited)


def test_deadlock_that_ends_in_connection_closed_is_a_hang_not_a_mismatch():
    # Rank 0 returned while rank 1 waited in recv for a message it never sent:
    # gloo tells rank 1 "Connection closed by peer".  No size was wrong.
    err = explain(Facts(nproc=2, returned={0}, errors={1: record(
        1, "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4100: Connection closed by peer")}))
    failure = classify(err)
    assert failure.kind == "hang" and failure.ranks == (1,) and "already left" in failure.detail
    assert "size" not in str(err).split("Hint:")[1]


def test_survivors_connection_reset_after_a_gloo_abort_is_the_aborted_ranks_mismatch():
    facts = Facts(nproc=2, dead=[0], exit_codes={0: -signal.SIGABRT}, stderr={0: GLOO_ABORT},
                  errors={1: record(1, "Read error [127.0.0.1]:42928: Connection reset by peer")})
    err = explain(facts)
    assert err.rank == 0 and err.exc_type == "SIGABRT" and "Received data size" in err.remote_traceback
    assert classify(err).kind == "mismatch" and classify(err).ranks == (0,)


def test_mismatch_raised_as_an_exception():
    err = explain(Facts(nproc=2, errors={0: record(0, "op.preamble.length <= op.nbytes. 16 vs 8. "
                                                      "Received data size doesn't match expected size.")}))
    assert classify(err).kind == "mismatch"
    assert "differ in size or dtype" in str(err)


def test_died_blames_the_crash_not_the_rank_torchrun_terminated():
    facts = Facts(nproc=2, dead=[0, 1], exit_codes={0: TERM, 1: SEGV}, root_cause=0,
                  stderr={0: "", 1: CRASH_REPORT})
    err = explain(facts)
    assert err.rank == 1 and err.exc_type == "SIGSEGV" and err.blamed == (1, 0)
    assert str(err).startswith("rank 1 died without raising a Python exception: it was killed by SIGSEGV")
    assert "rank 0: died (it was killed by SIGTERM)" in str(err)
    assert classify(err) == Failure("died", (1, 0), "rank 1 was killed by SIGSEGV")


@pytest.mark.parametrize("codes, detail", [
    ({}, "rank 0's exit status is unknown"),           # not "its exrank 0 status": "exit " holds "it "
    ({0: 3}, "rank 0 exited with code 3"),
    ({0: SEGV}, "rank 0 was killed by SIGSEGV"),
])
def test_died_detail_names_the_rank_in_plain_words(codes, detail):
    err = explain(Facts(nproc=2, dead=[0], returned={1}, exit_codes=codes))
    assert classify(err).detail == detail


@pytest.mark.parametrize("codes, stderr, first", [
    ({0: TERM, 1: SEGV}, {}, 1),                       # exit codes alone decide
    ({0: TERM}, {1: CRASH_REPORT}, 1),                 # torchrun had not listed the crash yet
    ({}, {1: CRASH_REPORT}, 1),                        # no exit codes at all
    ({0: -signal.SIGKILL, 1: TERM}, {}, 0),            # killed (OOM?) before the terminated one
    ({0: 3, 1: TERM}, {}, 0),                          # os._exit(3)
    ({0: TERM, 1: TERM}, {}, 0),                       # no evidence: the lowest rank
])
def test_blame_order_does_not_depend_on_which_death_was_seen_first(codes, stderr, first):
    for dead in ([0, 1], [1, 0]):
        assert report.blame_order(dead, codes, stderr)[0] == first


def test_transient_start_failure():
    err = explain(Facts(nproc=2, errors={0: record(0, "Gloo connectFullMesh failed with Connection refused",
                                                   kind="init")}))
    assert err.phase == "init" and str(err).startswith("rank 0 could not start")
    assert classify(err).kind == "transient"
    assert failures.transient_reason("raised", "connectFullMesh") == ""


def test_interrupted_and_other():
    assert classify(KeyboardInterrupt()).kind == "interrupted"
    killed = explain(Facts(nproc=2, agent_code=-9, agent_pid=42))
    assert "torchrun (pid 42) was killed by signal 9" in str(killed)
    assert classify(killed).kind == "other"
    assert classify(LaunchError("x")) == Failure("other", (), "x")


def test_agent_log_exit_codes_and_root_cause():
    log = ("Failures:\n[1]:\n  time : t\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 9)\n"
           "Root Cause (first observed failure):\n[0]:\n  time : t\n  rank      : 1 (local_rank: 1)\n"
           "  exitcode  : -11 (pid: 8)\n")
    assert report.parse_agent_log(log) == ({0: -15, 1: -11}, 1)


def test_stderr_tail_keeps_what_the_library_said_before_the_crash():
    tail = report.stderr_tail(GLOO_ABORT, {})
    assert "Received data size doesn't match" in tail and "Fatal Python error: Aborted" in tail


class Sub(__import__("torch").Tensor):
    pass


@pytest.mark.parametrize("value, words", [
    (Sub(), "Sub"), ({1.5: 1}, "key of type 'float'"), ([1, object()], r"result\[1\]"),
    ({"a": (1, set())}, "'set'"),
])
def test_plain_results_refuse_what_is_not_plain(value, words):
    with pytest.raises(results.NotPlainData, match=words):
        results.check_plain(value)


def test_plain_results_round_trip():
    import torch

    value = {"t": torch.arange(3), "n": [1, 2.5, True, None, "s", b"b"], 0: (torch.ones(1),)}
    back = results.decode_plain(results.encode_plain(value))
    assert back["n"] == value["n"] and torch.equal(back["t"], value["t"]) and type(back[0]) is tuple
