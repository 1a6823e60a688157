"""Which process a crash seam kills (`SEAM[@FAMILY or SERVICE]`), and `CRASHSAFE_CRASH_AT` read by `crashsafe up`
as one `--crash`, never dropped without a word (issue 32, item 1)."""

from __future__ import annotations

import pytest

from crashsafe.cli_arguments import build_parser
from crashsafe.crash_targets import (
    CrashAt,
    CrashTargetError,
    check_armable,
    crash_for_up,
    crash_map,
    every_crash,
    parse_crash,
)
from crashsafe.services.platform.crashpoints import SEAMS

ONE = ("deposits",)
STAYHUB = ("booking", "memory", "notify", "payment")


def test_an_executor_seam_names_its_family_or_the_registrys_only_one() -> None:
    assert parse_crash("executor.after_provider_ack@deposits", ONE) == CrashAt(
        "executor.after_provider_ack", "executor-deposits"
    )
    assert parse_crash("executor.after_intent@executor-payment", STAYHUB).service == "executor-payment"
    assert parse_crash("executor.after_receipt", ONE).service == "executor-deposits"
    with pytest.raises(CrashTargetError, match="which executor.*one of booking, memory, notify, payment"):
        parse_crash("executor.after_receipt", STAYHUB)
    with pytest.raises(CrashTargetError, match="no tool family 'rooms'"):
        parse_crash("executor.after_receipt@rooms", STAYHUB)


def test_another_process_seam_needs_no_target_and_refuses_a_wrong_one() -> None:
    assert parse_crash("runtime.after_model_answer", STAYHUB) == CrashAt(
        "runtime.after_model_answer", "runtime"
    )
    assert parse_crash("projector.before_ack@projector", ONE).service == "projector"
    with pytest.raises(CrashTargetError, match="a seam of the gateway, not of runtime"):
        parse_crash("gateway.after_publish@runtime", ONE)
    with pytest.raises(CrashTargetError, match="'runtime.after_lunch' is not a seam"):
        parse_crash("runtime.after_lunch", ONE)


def test_every_seam_of_the_failure_modes_is_run_an_executors_at_each_family() -> None:
    crashes = every_crash(("b", "a"))
    assert {c.seam for c in crashes} == set(SEAMS)
    executor_seams = [s for s in SEAMS if s.startswith("executor.")]
    assert len(crashes) == len(SEAMS) + len(executor_seams)
    assert [c.service for c in crashes if c.seam == "executor.after_intent"] == ["executor-a", "executor-b"]


def test_one_process_dies_at_one_seam() -> None:
    assert crash_map([CrashAt("runtime.after_model_answer", "runtime")]) == {
        "runtime": "runtime.after_model_answer"
    }
    with pytest.raises(CrashTargetError, match="a process dies once"):
        crash_map(
            [
                CrashAt("runtime.after_model_answer", "runtime"),
                CrashAt("runtime.after_turn_journaled", "runtime"),
            ]
        )


def test_a_stacks_crash_must_name_one_of_its_services_at_a_seam_of_that_process() -> None:
    services = {
        "gateway": "gateway",
        "runtime-0": "runtime",
        "runtime-1": "runtime",
        "executor-x": "executor-x",
    }
    check_armable({"runtime": "runtime.after_model_answer", "executor-x": "executor.after_intent"}, services)
    check_armable({"runtime-1": "runtime.after_model_answer"}, services)
    with pytest.raises(CrashTargetError, match="no such service"):
        check_armable({"projector": "projector.before_ack"}, services)
    with pytest.raises(CrashTargetError, match="that seam is in the executor"):
        check_armable({"runtime": "executor.after_intent"}, services)


def test_up_arms_its_crash_flag_and_reads_the_variable_as_one_never_silently() -> None:
    crashes, notes = crash_for_up(["executor.after_provider_ack@deposits"], None, ONE)
    assert crashes == [CrashAt("executor.after_provider_ack", "executor-deposits")]
    assert notes == [
        "executor.after_provider_ack in executor-deposits: SIGKILL once there, restarted without it by the supervisor"
    ]
    crashes, notes = crash_for_up([], "executor.after_intent", ONE)
    assert crashes == [CrashAt("executor.after_intent", "executor-deposits")]
    assert "(from CRASHSAFE_CRASH_AT)" in notes[0]
    crashes, notes = crash_for_up(["runtime.after_model_answer"], "executor.after_intent", ONE)
    assert [c.service for c in crashes] == ["runtime"]
    assert notes[0] == "CRASHSAFE_CRASH_AT=executor.after_intent not used: --crash names the seams"
    with pytest.raises(CrashTargetError, match="which executor"):
        crash_for_up([], "executor.after_intent", STAYHUB)
    assert crash_for_up([], None, ONE) == ([], [])


def test_up_and_crash_test_take_their_seams_on_the_command_line() -> None:
    up = build_parser().parse_args(
        ["up", "--crash", "executor.after_intent@deposits", "--crash", "gateway.after_publish"]
    )
    assert up.crash == ["executor.after_intent@deposits", "gateway.after_publish"]
    test = build_parser().parse_args(
        ["crash-test", "--registry", "m:r", "--say", "hello", "--seam", "runtime.after_model_answer"]
    )
    assert (test.registry, test.say, test.seam) == ("m:r", ["hello"], ["runtime.after_model_answer"])
