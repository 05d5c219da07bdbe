"""One virtual environment per peer, with that peer's own pins from the package registry,
created once and cached under ``.peers/<name>/`` (git-ignored); our environment and lock are
never touched. Every peer environment also gets numpy and pyarrow (to read the exchange,
benchmarks/peers/exchange.py) and the same torch release as ours (2.13.0, the CPU build
where this machine has the wheel), so a speed ratio compares the tools, not two torch
builds.

    python benchmarks/peers/envs.py                 # create every missing environment
    python benchmarks/peers/envs.py nnsight pyvene  # only these

A peer that does not install is reported with pip's own last lines (which requirement
failed); the harness then skips it and says so. The naive reference (plain ``torch`` hooks on
the ``transformers`` model) needs nothing beyond our own environment, so it runs with our
python: its numbers are those of the same torch and transformers our engine runs on.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".peers"
#: The torch every peer runs on (ours: requirements/lock.txt).
TORCH = "torch==2.13.0"
EXCHANGE = ("numpy", "pyarrow")


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]  # the peer's own pins
    script: str  # benchmarks/peers/<script>, run with the peer's python
    what: str  # the API the script uses, for the report
    task: str = "heads"  # what its script computes: head patching or edge patching
    models: tuple[str, ...] = ("gpt2",)  # the exchange model_types its script loads
    own_env: bool = True  # False: run with our python (nothing to install)

    @property
    def python(self) -> Path:
        return HOME / self.name / "bin" / "python" if self.own_env else Path(sys.executable)

    @property
    def marker(self) -> Path:
        return HOME / self.name / "installed.txt"

    def ready(self) -> bool:
        return not self.own_env or self.marker.exists()


PEERS = {
    p.name: p
    for p in (
        Peer("transformer_lens-3.9", ("transformer_lens==3.9.0",), "patch_transformer_lens.py",
             "HookedTransformer + patching.get_act_patch_attn_head_out_all_pos",
             models=("gpt2", "llama")),
        Peer("transformer_lens-4.3", ("transformer_lens==4.3.0",), "patch_transformer_lens4.py",
             "TransformerBridge.boot_transformers + the same patching helper"),
        Peer("nnsight-0.8", ("nnsight==0.8.1",), "patch_nnsight.py",
             "NNsight(model).trace, one trace per head (output projection's input slice)",
             models=("gpt2", "llama")),
        Peer("pyvene-0.1", ("pyvene==0.1.8",), "patch_pyvene.py",
             "IntervenableModel, VanillaIntervention per head (reruns the source)"),
        # auto-circuit imports HookedTransformerKeyValueCache (gone in TransformerLens 3, as
        # is HookedTransformer in 4): TL 2, whose numpy < 2 needs a pyarrow built for it.
        Peer("auto-circuit-1.0",
             ("auto-circuit==1.0.1", "transformer_lens==2.18.0", "pyarrow==21.0.0"),
             "edges_auto_circuit.py",
             "patchable_model(factorized, separate_qkv) + patch_mode, one edge mask at a time",
             task="edges"),
        Peer("torch-hooks", (), "patch_torch_hooks.py",
             "naive: forward pre-hook on the output projection, one forward per head",
             models=("gpt2", "llama"), own_env=False),
    )
}  # fmt: skip


def create(peer: Peer, quiet: bool = True) -> tuple[bool, str]:
    """Create ``peer``'s environment unless it is ready; (ok, pip's last lines on failure)."""
    if peer.ready():  # made before, or one that runs with our python
        return True, ""
    where = HOME / peer.name
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    cmd = [str(peer.python), "-m", "pip", "install", "--disable-pip-version-check",
           *peer.requirements, *EXCHANGE, TORCH]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return False, "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    freeze = subprocess.run([str(peer.python), "-m", "pip", "freeze"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    peer.marker.write_text(freeze)
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"peers (default all: {', '.join(PEERS)})")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.names or PEERS:
        ok, why = create(PEERS[name])
        print(f"{name}: {'ready' if ok else 'did not install'}" + (f"\n{why}" if why else ""))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
