"""The lm-evaluation-harness environment of the SA-MoE downstream suite (rule samoe_harness),
outside the workspace's lock: a virtual environment cached under ``.lm-eval/`` (git-ignored)
with the pins of ``envs/lm-eval.yaml`` (the rule's conda environment) plus pytest and
accelerate (:data:`TEST_ONLY`), so the tests that need the harness run in it. Our environment
and ``requirements/lock.txt`` are never touched; the lock constrains every package both
install (numpy, torch, transformers...).

    python requirements/lm_eval_env.py              # the harness at the pinned commit (GitHub)
    python requirements/lm_eval_env.py --registry   # no GitHub: the registry release nearest
                                                    # the pin (REGISTRY_RELEASE)
    .lm-eval/bin/python -m pytest tests/unit/samoe/test_samoe_harness.py

A harness installed from the registry carries no commit: samoe_harness then refuses to run
(the requests must be the pinned commit's) unless told ``--allow-other-harness``; the tests
use it as it is. Which harness an environment holds is in ``.lm-eval/installed.txt``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".lm-eval"
ENV_FILE = ROOT / "envs" / "lm-eval.yaml"
LOCK = ROOT / "requirements" / "lock.txt"
#: The registry's lm-eval release nearest the pinned commit (b954108c, 2026-09-01: after
#: 0.4.13, the last release before it), for machines that cannot reach GitHub.
REGISTRY_RELEASE = "lm-eval==0.4.13"
#: What the tests add (not the rule's environment): pytest, and accelerate, which the
#: harness's own Hugging Face model (the adapter's reference in the tests) imports.
TEST_ONLY = ("pytest", "accelerate")
PYTHON = HOME / "bin" / "python"
MARKER = HOME / "installed.txt"


def requirements(registry: bool = False) -> list[str]:
    """envs/lm-eval.yaml's pip lines (the harness as the registry release with ``registry``)
    and the lock's pins of :data:`TEST_ONLY`."""
    env = yaml.safe_load(ENV_FILE.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    if registry:
        pip = [REGISTRY_RELEASE if p.startswith("lm_eval @ ") else p for p in pip]
    lock = LOCK.read_text().splitlines()
    return [*pip, *(next(x for x in lock if x.startswith(f"{name}==")) for name in TEST_ONLY)]


def create(registry: bool = False) -> tuple[bool, str]:
    """Create the environment unless it is there; (ok, pip's last lines on failure)."""
    if MARKER.exists():
        return True, ""
    venv.EnvBuilder(with_pip=True, clear=True).create(HOME)
    cmd = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check",
           "-c", str(LOCK), *requirements(registry)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return False, "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
    freeze = subprocess.run([str(PYTHON), "-m", "pip", "freeze"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    MARKER.write_text(freeze)
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--registry",
        action="store_true",
        help=f"install {REGISTRY_RELEASE} instead of the pinned commit",
    )
    args = parser.parse_args(argv)
    ok, why = create(args.registry)
    print(f"{HOME}: {'ready' if ok else 'did not install'}" + (f"\n{why}" if why else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
