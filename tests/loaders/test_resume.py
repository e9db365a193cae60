"""How a saved dataset state resumes, case by case (``loaders/resume.py``): each case is
told apart once, and a DataLoader worker's own state is refused, in one check with one
message, exactly where the steps would be planned again."""

from __future__ import annotations

import pytest

from lakestream.errors import LakestreamError
from lakestream.loaders.resume import Resume, refuse_worker_state, worker_next

DESCRIBED = {"sources": [{"uri": "a", "take": None, "cycle": False}], "shuffle_window": 2,
             "seed": 0, "epochs": None, "policy": None}


@pytest.mark.parametrize("saved, policy, plain, case", [
    (None, False, True, Resume.LOG_ORDER),
    (None, True, False, Resume.POLICY_FROM_LOG_ORDER),
    (None, False, False, Resume.MIX_FROM_LOG_ORDER),
    ({**DESCRIBED, "base_step": 3, "starts": [6]}, False, False, Resume.SAME),
    ({**DESCRIBED, "seed": 1, "base_step": 3, "starts": [6]}, False, False, Resume.CHANGED),
    ({k: v for k, v in DESCRIBED.items() if k != "policy"}, False, False, Resume.SAME),
])
def test_each_saved_state_resumes_in_one_case(saved: dict[str, object] | None, policy: bool,
                                              plain: bool, case: Resume) -> None:
    assert Resume.of(saved, DESCRIBED, policy=policy, plain=plain) is case


def test_only_the_cases_that_plan_again_refuse_a_worker_state() -> None:
    assert {c for c in Resume if c.plans_again} == {Resume.POLICY_FROM_LOG_ORDER,
                                                    Resume.CHANGED}
    for saved, said in ((None, "in log order, without a read policy"),
                        ({**DESCRIBED, "seed": 1}, "with another mix or read policy")):
        error = refuse_worker_state(saved)
        assert isinstance(error, LakestreamError)
        assert said in str(error) and "workers would each take over" in str(error)


def test_a_worker_resumes_its_own_state_only() -> None:
    state = {"next_step": 7, "worker": 1, "num_workers": 2, "worker_next_step": 9}
    assert worker_next(state, (1, 2)) == 9
    assert worker_next(state, (0, 2)) is None
    assert worker_next(state, (1, 3)) is None
    assert worker_next(state, None) is None
    assert worker_next({"next_step": 7}, (1, 2)) is None
