"""The path table (headgeom.paths): its producers are the rules' outputs, every file maps
back to the rule that writes it, and the refusals name that rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headgeom.data.corpus import TokenFileError, read_tokens
from headgeom.hashing import ManifestMismatchError, verify_file
from headgeom.heads.cost import rule_blocks
from headgeom.paths import PRODUCERS, TEMPLATES, producing_rules, rerun_hint

REPO = Path(__file__).resolve().parents[2]
SAMPLE = {"corpus": "default", "model": "write-common-axis", "seed": "42", "task": "sva",
          "step": "000008", "mode": "mean", "edit": "random3", "table": "table2",
          "figure": "figure5"}  # fmt: skip


def rule_outputs() -> dict[str, set[str]]:
    """Template name -> the rules whose ``output:`` names PATHS[name], read from the rule
    files (a rule writing a template through a helper, the timeline's intermediate
    checkpoints, is named by its folder template)."""
    found: dict[str, set[str]] = {}
    for name, _, text in rule_blocks(REPO):
        section = re.search(r"\n    output:\n(.*?)(?=\n    \w+:|\Z)", text, re.S)
        for key in re.findall(r'PATHS\["(\w+)"\]', section[1] if section else ""):
            found.setdefault(key, set()).add(name)
    return found


def as_set(rules) -> set[str]:
    return {rules} if isinstance(rules, str) else set(rules)


def test_the_producers_are_the_rules_outputs():
    outputs = rule_outputs()
    # the timeline's intermediate checkpoints are written through PATHS["checkpoints"]
    assert outputs.pop("checkpoints") == {"train_timeline"}
    derived = {"step_checkpoint": {"train_timeline"}, "step_manifest": {"train_timeline"}}
    assert {**outputs, **derived} == {name: as_set(r) for name, r in PRODUCERS.items()}
    assert set(PRODUCERS) <= set(TEMPLATES)
    assert set(TEMPLATES) - set(PRODUCERS) == {"checkpoints", "resume"}  # folders, not files


@pytest.mark.parametrize("name", list(PRODUCERS))
def test_every_file_maps_back_to_its_own_producer(name):
    path = "results/demo/" + TEMPLATES[name].format(**SAMPLE)
    assert as_set(producing_rules(path)) == as_set(PRODUCERS[name])


def test_lookalike_names_map_to_their_own_rule():
    run = "results/demo/patching/learned/s42"
    assert producing_rules(f"{run}/sva.parquet") == ("patch_heads",)
    assert producing_rules(f"{run}/sva.mean.parquet") == ("patch_modes",)
    assert producing_rules("results/demo/concentration/learned/s42/sva.heads.parquet") == (
        "concentration",
    )
    step = "results/demo/dynamics/learned/s42/step000008"
    assert producing_rules(f"{step}/patching/sva.parquet") == ("patch_step",)
    assert producing_rules("results/demo/notes/readme.txt") == ()
    assert "rebuild" in rerun_hint("elsewhere/x.bin")


def test_a_corrupt_corpus_names_tokenize_corpus(tmp_path):
    path = tmp_path / "results" / "demo" / "corpus" / "default" / "train_tokens.parquet"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PAR1 truncated")
    with pytest.raises(TokenFileError, match="rule tokenize_corpus: rerun `snakemake --forcerun"):
        read_tokens(path)
    with pytest.raises(ManifestMismatchError) as err:
        verify_file(path, "00" * 32, tmp_path / "manifest.json")
    assert f"written by rule tokenize_corpus: rerun `snakemake --forcerun {path}`" in str(err.value)
