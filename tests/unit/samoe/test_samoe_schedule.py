"""The SA-MoE workflow's job order (headgeom.samoe.schedule): chains by hand, and every
rule that asks for a priority has a demo time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headgeom.samoe import schedule

ROOT = Path(__file__).resolve().parents[3]


def test_chains_by_hand():
    # persistent: upcycle 4 + train 35 + probes 90 (longer than capture 8 + interventions 22)
    assert schedule.chain_seconds("samoe_upcycle", "persistent") == 4 + 35 + 90
    assert schedule.chain_seconds("samoe_train", "latest") == 35 + max(30, 8 + 22, 9)
    # ordinary: no probes or capture; Li (30) is its longest analysis
    assert schedule.chain_seconds("samoe_train", "ordinary") == 35 + 30
    assert schedule.chain_seconds("samoe_probes", "ordinary") == 0
    assert schedule.chain_seconds("samoe_li", "persistent") == 0
    assert schedule.chain_seconds("samoe_capture", "latest") == 8 + 22


def test_the_persistent_chain_starts_first():
    order = sorted(("ordinary", "latest", "persistent"),
                   key=lambda v: -schedule.chain_seconds("samoe_train", v))  # fmt: skip
    assert order[0] == "persistent"
    # a ready persistent probes job goes before any other ready analysis
    others = [schedule.chain_seconds(r, v) for r in ("samoe_capture", "samoe_li",
              "samoe_quality", "samoe_interventions") for v in ("ordinary", "latest",
              "persistent")]  # fmt: skip
    assert schedule.chain_seconds("samoe_probes", "persistent") > max(others)


def test_every_prioritised_rule_has_a_time():
    rules = set()
    for smk in (ROOT / "workflow" / "samoe").glob("*.smk"):
        rules |= set(re.findall(r'priority: chain_priority\("(\w+)"\)', smk.read_text()))
    assert rules == set(schedule.OWN_SECONDS)
    with pytest.raises(KeyError, match="samoe_paper"):
        schedule.chain_seconds("samoe_paper", "latest")
