"""The main job, in a short configuration: its own verifications must pass."""

from __future__ import annotations

from lakestream.demo.job import DemoConfig, run


def test_the_demo_verifies_what_it_promises(tmp_path, capsys) -> None:
    cfg = DemoConfig(steps=48, checkpoint_every=8, kill_producer_at_step=8,
                     kill_trainer_at_step=26)
    assert run(str(tmp_path), cfg, plot_path=tmp_path / "demo.png")
    out = capsys.readouterr().out
    assert out.count("ok  ") == 6 and "FAIL" not in out
    assert "fault: trainer SIGKILLed" in out and "fault: rollout-1 SIGKILLed" in out
    assert (tmp_path / "demo.png").stat().st_size > 0
