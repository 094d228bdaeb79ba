"""Every workflow patch id, and the release that introduced it: the one table the retirement rule reads.

A change to a command sequence goes behind `workflow.patched(Patch.X)` in the release that makes it (its row here
names that release). The supported upgrade is from the previous release only (docs/upgrades.md), so a patch's old
branch lives one release: once its release is older than the previous one it becomes `workflow.deprecate_patch`
(the new branch alone, still recording its marker, so a run of the previous release replays and a rollback to it
still works), and once it is older than two releases its call and its row go. tests/test_patches.py fails on a
patch id written as a string in `workflows/`, on an id missing here, and on a patch past its time.

The rows below are the patches of the 0.2 line (the last commit before 0.3.0): 0.3.0 folded each into straight-line
code and keeps only its `deprecate_patch`, because a run of that line in flight at the upgrade carries their
markers, and Temporal refuses a history with a marker the code no longer asks for unless it was deprecated.
"""

from __future__ import annotations

from enum import StrEnum


class Patch(StrEnum):
    """A patch id as histories record it: a value never changes (a recorded marker names it)."""

    # Each run of the 0.2 line chose its workflow generation with these (generation 2 was a frozen copy).
    CLAIM_GENERATION_3 = "claim-generation-3"
    GROUP_GENERATION_3 = "group-generation-3"
    RELEASE_GENERATION_3 = "release-generation-3"
    LOCAL_ACTIVITIES = "activities-run-local"
    CONTINUE_AFTER_LIVENESS_READS = "claim-continue-after-liveness-reads"
    OWNER_END_RECHECK = "owner-end-rechecks-power"
    HAND_CLAIMS_WITHIN_MAX_SIZE = "hand-claims-within-max-size"
    CREATED_HELD = "claim-created-with-finalizer"
    STARTED_WITH_JOB = "scale-down-started-with-its-job"
    ENDED_NOT_TAKEN_OVER = "ended-claims-not-taken-over"
    TAKEN_OVER_SUPERSEDED = "taken-over-claims-superseded"
    TELL_BESIDE = "claim-tells-group-beside-its-projection"
    TRUST_OPEN_GATE = "boot-trusts-an-open-gate-it-was-told"
    SERIAL_RECORDS = "claim-records-one-at-a-time"
    SETTLE_UNBOUGHT_JOB = "claim-settles-an-unbought-startup-job"
    ERRORED_IN_TARGET = "target-counts-errored-instances"
    LOST_CLAIMS_TAKEN_OVER = "lost-claims-taken-over"
    FAILED_JOB_SAYS_WHY = "boot-failure-says-why"
    SHUTDOWN_FAILURE_SAYS_WHY = "shutdown-failure-says-why"
    FAILED_NOT_READY = "claim-failure-sets-ready-false"
    COMPLETION_CITES_ITS_JOB = "claim-completion-cites-its-shutdown-job"
    FAILED_CLOSE_SAYS_WHERE = "claim-failed-close-says-where-to-look"
    TAKEN_OVER_WHOLE = "claim-taken-over-adopted-whole"
    # 0.4.0
    TELL_BY_CALL = "claim-tells-group-by-a-local-call"
    BOOKED_CLAIM_SEES_NEWEST = "booked-claim-starts-with-the-newest-observation"
    ERRORED_INSTANCE_NEVER_COMES_BACK = "errored-instance-never-comes-back"
    END_TOLD_ONCE_COMMITTED = "claim-tells-its-end-once-committed"
    GROUP_HEARS_ITS_OWN_CLAIMS = "group-hears-only-claims-it-tracks"
    DRAIN_BEFORE_DARK = "shutdown-drains-the-node-first"


# The 0.2 line's last commit called itself 0.2.0a0: every patch of that line is dated by it.
LINE_0_2 = "0.2.0a0"

#: Each patch and the release that introduced it (a release that is not out yet is the version being built).
INTRODUCED: dict[Patch, str] = {
    Patch.CLAIM_GENERATION_3: LINE_0_2,
    Patch.GROUP_GENERATION_3: LINE_0_2,
    Patch.RELEASE_GENERATION_3: LINE_0_2,
    Patch.LOCAL_ACTIVITIES: LINE_0_2,
    Patch.CONTINUE_AFTER_LIVENESS_READS: LINE_0_2,
    Patch.OWNER_END_RECHECK: LINE_0_2,
    Patch.HAND_CLAIMS_WITHIN_MAX_SIZE: LINE_0_2,
    Patch.CREATED_HELD: LINE_0_2,
    Patch.STARTED_WITH_JOB: LINE_0_2,
    Patch.ENDED_NOT_TAKEN_OVER: LINE_0_2,
    Patch.TAKEN_OVER_SUPERSEDED: LINE_0_2,
    Patch.TELL_BESIDE: LINE_0_2,
    Patch.TRUST_OPEN_GATE: LINE_0_2,
    Patch.SERIAL_RECORDS: LINE_0_2,
    Patch.SETTLE_UNBOUGHT_JOB: LINE_0_2,
    Patch.ERRORED_IN_TARGET: LINE_0_2,
    Patch.LOST_CLAIMS_TAKEN_OVER: LINE_0_2,
    Patch.FAILED_JOB_SAYS_WHY: LINE_0_2,
    Patch.SHUTDOWN_FAILURE_SAYS_WHY: LINE_0_2,
    Patch.FAILED_NOT_READY: LINE_0_2,
    Patch.COMPLETION_CITES_ITS_JOB: LINE_0_2,
    Patch.FAILED_CLOSE_SAYS_WHERE: LINE_0_2,
    Patch.TAKEN_OVER_WHOLE: LINE_0_2,
    Patch.TELL_BY_CALL: "0.4.0",
    Patch.BOOKED_CLAIM_SEES_NEWEST: "0.4.0",
    Patch.ERRORED_INSTANCE_NEVER_COMES_BACK: "0.4.0",
    Patch.END_TOLD_ONCE_COMMITTED: "0.4.0",
    Patch.GROUP_HEARS_ITS_OWN_CLAIMS: "0.4.0",
    Patch.DRAIN_BEFORE_DARK: "0.4.0",
}
