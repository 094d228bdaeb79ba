"""Every duration and count of the claim model in one table (DESIGN.md "Numbers"), so none hides in a module.

The API's defaults (a startup Job's timeout, a claim's TTL, a Job's backoff and TTL) are published by the CRDs and
so live in `api.names`; the table names them too, so this is the one place to read every number. Process-level
bounds (HTTP timeouts, ports) are settings, not rules: see docs/configuration.md. tests/test_timings.py fails when
a module outside this table defines a duration of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from api import names


@dataclass(frozen=True)
class Timings:
    """The numbers; a frozen dataclass so a test or a reader sees them all at once (`dataclasses.asdict`)."""

    # A claim's boot: how long a Job may run, how often its end is polled when no watcher signal came, how long
    # a Node may take to register, then to pass the readiness gate, and the slack added to the boot budget.
    job_timeout: timedelta = names.JOB_TIMEOUT
    job_monitor_poll_interval: timedelta = timedelta(seconds=30)
    node_registration_timeout: timedelta = timedelta(seconds=90)
    readiness_gate_timeout: timedelta = timedelta(minutes=4)
    boot_budget_slack: timedelta = timedelta(minutes=1)
    # A scale-down: the uncordon retry ceiling, how long a finished shutdown Job has to show the machine off.
    max_uncordon_retry_interval: timedelta = timedelta(seconds=10)
    shutdown_verify_timeout: timedelta = timedelta(minutes=2)
    # The drain before a power-off: its first pause between rounds, doubling up to the last (a blocked drain's
    # history grows by a round a minute at most).
    drain_poll_first: timedelta = timedelta(seconds=2)
    drain_poll_max: timedelta = timedelta(minutes=1)
    # Attempts: failed boots in a row before a slot is refused, and the quiet that resets a shutdown streak.
    max_consecutive_attempts: int = 3
    shutdown_streak_reset_grace: timedelta = timedelta(minutes=30)
    # A ready claim re-reads its Node this often even when no watcher signal came (MachineGone's backstop).
    liveness_read_interval: timedelta = timedelta(minutes=5)
    # Collection of finished claims (the API default of spec.ttlSecondsAfterFinished) and of their Jobs.
    claim_ttl_seconds_after_finished: int = names.CLAIM_TTL_SECONDS_AFTER_FINISHED
    job_backoff_limit: int = names.JOB_BACKOFF_LIMIT
    job_ttl_seconds_after_finished: int = names.JOB_TTL_SECONDS_AFTER_FINISHED
    # A slot's report: the history ring, its window, and the activation ledger.
    history_ring_rows: int = 32
    history_window: timedelta = timedelta(hours=24)
    activation_ledger_rows: int = 512
    # The group: how long a failed boot shapes cluster-autoscaler's error info, the truth re-read that bounds a
    # lost watcher signal, how long a deleted group waits for its claims, the pause after a housekeeping failure.
    failure_memory: timedelta = timedelta(minutes=15)
    reload_interval: timedelta = timedelta(minutes=10)
    wind_down_timeout: timedelta = timedelta(hours=2)
    housekeeping_backoff: timedelta = timedelta(minutes=1)
    # A slot's release refused because its previous run is still closing: the first wait before it is started
    # again, doubling each time up to `reload_interval`.
    release_restart_first: timedelta = timedelta(seconds=2)
    # Activity timeouts: a write (with its retries inside the workflow) and a read that feeds a poll.
    write_timeout: timedelta = timedelta(seconds=30)
    read_timeout: timedelta = timedelta(seconds=15)
    # A local activity's retry waits in the worker up to this long; a longer backoff is a workflow timer (every retry
    # policy starts at a second, so every retry is one: in the history, and no workflow task held open meanwhile).
    local_retry_threshold: timedelta = timedelta(milliseconds=500)
    # How long a watcher waits for a workflow's answer to a Query before it moves on (the next event asks again).
    watcher_query_timeout: timedelta = timedelta(seconds=3)
    # How long a claim's local call telling its group may wait for Temporal's frontend (the call is then retried).
    tell_group_rpc_timeout: timedelta = timedelta(seconds=10)
    # Each call of the watchers' pass over stuck workflows (a list page, a describe, a history page, a terminate).
    doctor_call_timeout: timedelta = timedelta(seconds=10)
    # A claim whose slot or group does not exist is failed once it is this old: the slot applied beside it (the
    # same `kubectl apply`, another watch's stream) has had time to arrive.
    homeless_claim_grace: timedelta = timedelta(minutes=1)
    # A slot's report waits this long after the first event that made it dirty, so what changes together (a move's
    # phase, its Job, the machine's power) is written together. Reports are output only.
    report_coalesce: timedelta = timedelta(seconds=1)
    # A slot's usage figures (seconds by state, boots, energy): every slot's time is counted this often (what the
    # /metrics counters lag by at most), and written to its status at least every flush interval (else only with a
    # report write). A writer that starts credits at most one flush interval since the last write to the state
    # written then (what the writer before it saw and had not written yet); the rest of a longer outage is
    # `unobservedSeconds`, never a state.
    usage_tick: timedelta = timedelta(seconds=30)
    usage_flush_interval: timedelta = timedelta(minutes=5)


TIMINGS = Timings()
