"""The main job, in a short configuration: its own verifications must pass."""

from __future__ import annotations

from lakestream.demo.job import run


def test_the_demo_verifies_exactly_once_and_in_order(tmp_path, capsys) -> None:
    assert run(str(tmp_path), prompts=120)
    out = capsys.readouterr().out
    assert "every prompt committed exactly once: yes" in out
    assert "trainer read every step once, in order, as committed: yes" in out
