"""The claims commands: the visibility filter, the timeline a person reads in ten seconds (from recorded
histories), and the commands as processes beside a running operator (no port bound, unknown claims said)."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from api import contracts as c
from homelab_autoscaler.claims import ClaimRow, age, format_rows, pending_timers, timeline, visibility_query
from homelab_autoscaler.cli import BROKEN_PIPE_EXIT
from homelab_autoscaler.devserver import DevServer, _frontend_answers
from tests.procs import BIN, ROOT, free_port
from tests.releases import history_tag
from tests.test_cli import quiet_into_a_closed_pipe

HISTORIES = Path(__file__).parent / "histories"
TAG = history_tag()  # this release's recorded histories


def claim_history(prefix: str) -> WorkflowHistory:
    for f in sorted(HISTORIES.glob(f"{prefix}-*.json")):
        h = WorkflowHistory.from_json(f.stem, f.read_text())
        if h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow":
            return h
    raise AssertionError(f"no claim history recorded for {prefix}")


def test_timeline_of_a_scale_down_reads_as_the_claims_story() -> None:
    lines = timeline(claim_history(f"{TAG}-scale_down_ready"))  # the Kubernetes calls are local activities (markers)
    text = "\n".join(lines)
    order = ["started: claim", "phase pending", "phase booting", "phase ready", "signal: mark_for_deletion",
             "cordon the node", "shutdown Job", "phase completed (NodeDeleted)"]  # fmt: skip
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in order]
    assert positions == sorted(positions), text
    assert "timer fired: startup Job" in text


def claim_history_files(prefix: str) -> list[Path]:
    """The recorded claim histories whose name starts with `prefix`, their type read as plain JSON: the list is made
    at collection, in every pytest-xdist worker, and the protobuf parse of them all took seconds there."""

    def workflow_type(f: Path) -> str:
        return str(
            json.loads(f.read_text())["events"][0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]
        )

    return [f for f in sorted(HISTORIES.glob(f"{prefix}*.json")) if workflow_type(f) == "NodeClaimWorkflow"]


def claim_histories(prefix: str) -> list[WorkflowHistory]:
    return [WorkflowHistory.from_json(f.stem, f.read_text()) for f in claim_history_files(prefix)]


def times(lines: list[str]) -> list[datetime]:
    """The time of every entry line, with the date of the header above it."""
    out, day = [], ""
    for line in lines:
        if m := re.fullmatch(r"(\d{4}-\d\d-\d\d) \(UTC\)", line):
            day = m.group(1)
        else:
            out.append(datetime.fromisoformat(f"{day}T{line.split()[0]}"))
    return out


@pytest.mark.parametrize("recorded", claim_history_files(f"{TAG}-"), ids=lambda f: f.stem)
def test_a_timeline_is_in_time_order_without_internal_or_repeated_lines(recorded: Path) -> None:
    lines = timeline(WorkflowHistory.from_json(recorded.stem, recorded.read_text()))
    text = "\n".join(lines)
    assert times(lines) == sorted(times(lines)), text
    for internal in ("marker:", "observe slot", "done: record ", "read startup Job", "continued as new"):
        assert internal not in text, text
    entries = [line.split(maxsplit=1)[1] for line in lines if not line.endswith("(UTC)")]
    assert all(a != b for a, b in itertools.pairwise(entries)), text


def test_a_poll_is_one_line_saying_how_often_and_until_when() -> None:
    text = "\n".join(timeline(claim_histories(f"{TAG}-shutdown_streak")))
    assert re.search(r"timer fired: shutdown verification \(10s\) ×12 \(until \d\d:\d\d:\d\d\)", text), text
    assert text.count("event: ShutdownNotObserved") == 6 and "update: reset_shutdown_streak" in text


def test_a_claim_that_continued_as_new_is_one_story() -> None:
    runs = claim_histories(f"{TAG}-claim_continue_as_new")
    assert len(runs) >= 2
    lines = timeline(runs)
    text = "\n".join(lines)
    assert text.count("started:") == 1 and times(lines) == sorted(times(lines)), text
    assert text.index("phase ready") < text.index("signal: mark_for_deletion") < text.index("closed: completed")


def test_a_closed_claim_shows_its_outcome() -> None:
    lines = timeline(claim_histories(f"{TAG}-startup_job_failed-"))
    closed = (
        r"closed: failed \(StartupJobFailed\): startup Job (\S+) failed: exit code 1 \(Error\)\. The Pod's last words "
        r"\(its termination message, kept out of this history: it may hold secrets\) are the claim's status.message: "
    )
    m = re.search(
        closed + r"kubectl -n \S+ describe nodeclaim \S+; its whole output: kubectl -n \S+ logs job/(\S+)$", lines[-1]
    )
    assert m and m[1] == m[2], lines


T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def event(kind: EventType.ValueType, seconds: float, event_id: int) -> HistoryEvent:
    e = HistoryEvent(event_id=event_id, event_type=kind)
    e.event_time.FromDatetime((T0 + timedelta(seconds=seconds)).replace(tzinfo=None))
    return e


def synthetic() -> WorkflowHistory:
    """A claim booting, observed nine times by the watchers, waiting on its readiness gate."""
    events = [event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 0, 1)]
    events[0].workflow_execution_started_event_attributes.workflow_type.name = "NodeClaimWorkflow"
    upsert = event(EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES, 1, 2)
    fields = upsert.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    fields["ClaimPhase"].CopyFrom(Payload(data=json.dumps("booting").encode()))
    events.append(upsert)
    for i in range(9):
        signal = event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, 10 + i, 3 + i)
        signal.workflow_execution_signaled_event_attributes.signal_name = c.ClaimSignal.OBSERVE
        events.append(signal)
    timer = event(EventType.EVENT_TYPE_TIMER_STARTED, 20, 12)
    timer.timer_started_event_attributes.start_to_fire_timeout.FromTimedelta(timedelta(minutes=4))
    timer.user_metadata.summary.CopyFrom(Payload(data=json.dumps("readiness gate").encode()))
    events.append(timer)
    return WorkflowHistory("nodeclaim/ns/s1-abc", events)


def test_observations_are_one_line_and_pending_timers_say_when_they_fire() -> None:
    history = synthetic()
    lines = timeline(history)
    assert lines[-1] == "  12:00:10  9 observations (until 12:00:18)", lines
    assert sum("observ" in line for line in lines) == 1
    assert pending_timers(history, T0 + timedelta(minutes=1)) == [
        "timer readiness gate (4m) fires at 12:04:20 UTC (in 3m20s)"
    ]


def test_timeline_names_the_timers_of_a_readiness_gate_timeout() -> None:
    text = "\n".join(timeline(claim_history(f"{TAG}-readiness_gate_times_out")))
    assert "timer fired: readiness gate" in text
    assert "phase failed (ReadinessGateTimeout)" in text


def test_visibility_query_filters_and_refuses_quotes() -> None:
    assert visibility_query() == "WorkflowType = 'NodeClaimWorkflow'"
    q = visibility_query(group="g", slot="s1", phase="ready")
    assert q == (
        "WorkflowType = 'NodeClaimWorkflow' AND HomelabGroup = 'g' AND HomelabSlot = 's1' AND ClaimPhase = 'ready'"
    )
    with pytest.raises(ValueError, match="HomelabGroup"):
        visibility_query(group="g' OR 1=1")


def test_rows_and_ages() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert [age(now - timedelta(seconds=s), now) for s in (5, 120, 7200, 200000)] == ["5s", "2m", "2h", "2d"]
    rows = [ClaimRow("s1-abc", "g", "s1", "ready", "", 1, now - timedelta(minutes=3), "running")]
    out = format_rows(rows, now).splitlines()
    assert out[0].split() == ["NAME", "GROUP", "SLOT", "PHASE", "REASON", "ATTEMPT", "AGE", "WORKFLOW"]
    assert out[1].split() == ["s1-abc", "g", "s1", "ready", "-", "1", "3m", "running"]


# --- the commands as processes --------------------------------------------------------------------------------------
@contextlib.contextmanager
def held(port: int) -> Iterator[None]:
    """Hold a port as a running `make run` holds it (already held by something else is as good)."""
    with socket.socket() as s:
        with contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            s.listen()
        yield


def claims(*args: str) -> subprocess.CompletedProcess[str]:
    cli = str(BIN / "homelab-autoscaler")
    return subprocess.run([cli, "claims", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.long
@pytest.mark.system
# Fourteen CLI processes, each a Python start beside a Temporal server: ~60 s alone, past the suite's 120 s default
# under a load of 10 on 2 cores. Every wait inside has its own bound (60 s a command).
@pytest.mark.timeout(360)
def test_claims_commands_bind_no_port_and_say_an_unknown_claim_in_one_line(tmp_path: Path) -> None:
    assert not _frontend_answers(f"127.0.0.1:{free_port()}")
    server = DevServer(port=free_port(), ui_port=free_port(), headless=True, db_file=tmp_path / "temporal.db")
    with server, held(9464), held(8081):
        # Started means answering: its port opens before the frontend is healthy, and a client connecting in
        # between was refused ("Frontend is not healthy yet"; a bench run died of it).
        assert _frontend_answers(server.address)
        listing = claims("list", "--temporal-address", server.address)
        assert listing.returncode == 0 and not listing.stderr, listing.stderr
        assert listing.stdout.split() == ["NAME", "GROUP", "SLOT", "PHASE", "REASON", "ATTEMPT", "AGE", "WORKFLOW"]
        # `claims list | head` once head has gone: no `[Errno 32] Broken pipe`, the status of a writer SIGPIPE ended.
        piped = quiet_into_a_closed_pipe(["claims", "list", "--temporal-address", server.address])
        assert piped.returncode == BROKEN_PIPE_EXIT and not piped.stderr, piped.stderr
        for command in ("show", "reset-shutdown-streak"):
            unknown = claims(command, "nope-123", "--temporal-address", server.address)
            assert unknown.returncode == 2, unknown.stderr
            err = unknown.stderr.strip()
            assert err.count("\n") == 0 and "Traceback" not in err, err
            assert "nope-123" in err and "claims list" in err, err
            by_id = claims(command, "nodeclaim/elsewhere/nope-123", "--temporal-address", server.address)
            assert by_id.returncode == 2 and "nope-123 in namespace elsewhere" in by_id.stderr, by_id.stderr
        # A namespace Temporal does not have is a setting's mistake: one line naming it (it was 69 lines of SDK).
        for args in (["list"], ["show", "c1"], ["reset-shutdown-streak", "c1"]):
            wrong = claims(*args, "--temporal-address", server.address, "--temporal-namespace", "nosuchns")
            assert wrong.returncode == 2, wrong.stderr
            assert wrong.stderr.count("\n") == 1 and "Traceback" not in wrong.stderr, wrong.stderr
            assert "no namespace 'nosuchns'" in wrong.stderr and "--temporal-namespace" in wrong.stderr, wrong.stderr
        not_a_claim = claims("show", "group/ns/workers", "--temporal-address", server.address)
        assert not_a_claim.returncode == 2 and "is no claim" in not_a_claim.stderr, not_a_claim.stderr
    down = claims("list", "--temporal-address", f"127.0.0.1:{free_port()}")
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "cannot reach Temporal" in down.stderr
